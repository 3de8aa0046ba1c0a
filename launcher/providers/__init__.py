"""Providers: one small class per place a job can run. Looked up by name, imported lazily."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from launcher.status import UsageError

if TYPE_CHECKING:
    from launcher.providers.base import Provider

#: name -> "module:Class"; a module is imported only when its provider is used (cloud SDKs are
#: slow to import and optional extras).
REGISTRY = {
    "local": "launcher.providers.local:LocalProvider",
    "sagemaker": "launcher.providers.sagemaker:SageMakerProvider",
    "vertex": "launcher.providers.vertex:VertexProvider",
}
#: Providers the design names whose adapter is not in this version.
PLANNED: tuple[str, ...] = ()


def get_provider(name: str, settings: dict[str, Any] | None = None,
                 environ: dict[str, str] | None = None) -> Provider:
    """The provider called ``name``, configured from ``settings`` (region, bucket, role ...)."""
    if name not in REGISTRY:
        if name in PLANNED:
            raise UsageError(f"the {name} provider is not available in this version of launch",
                             "use --provider local (`launch plan` shows the local plan)")
        raise UsageError(f"unknown provider {name!r}",
                         f"choose one of {', '.join([*REGISTRY, *PLANNED])}")
    module, _, cls = REGISTRY[name].partition(":")
    provider_class = getattr(importlib.import_module(module), cls)
    return provider_class.from_settings(settings or {}, environ)
