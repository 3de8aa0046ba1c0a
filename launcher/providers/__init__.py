"""Providers: one small class per place a job can run. Looked up by name, imported lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.status import UsageError

if TYPE_CHECKING:
    from launcher.providers.base import Provider

#: Providers that have an adapter today; the others are named so the error can say so.
AVAILABLE = ("local",)
PLANNED = ("vertex", "sagemaker")


def get_provider(name: str) -> Provider:
    if name == "local":
        from launcher.providers.local import LocalProvider

        return LocalProvider()
    if name in PLANNED:
        raise UsageError(f"the {name} provider is not available in this version of launch",
                         "use --provider local (`launch plan` shows the local plan)")
    raise UsageError(f"unknown provider {name!r}", f"choose one of {', '.join(AVAILABLE)}")
