"""Providers: one package per place a job can run, owning everything about it (its cloud's client
code, its in-container bootstrap, its log reading, its `launch doctor` checks, its error strings).

The registry below is the one list of them: ``launch --provider`` choices (spec.py), `launch
doctor` and the run commands (cli.py) all read it. A provider is imported only when it is used
(cloud SDKs are slow to import and optional extras), so ``launch --help`` imports none.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from launcher.status import UsageError

if TYPE_CHECKING:
    from launcher.providers.base import Provider

#: name -> "module:Class", in the order the providers are offered; a module is imported only
#: when its provider is used. Tests register a provider of their own here (monkeypatch.setitem).
REGISTRY = {
    "local": "launcher.providers.local:LocalProvider",
    "vertex": "launcher.providers.vertex:VertexProvider",
    "sagemaker": "launcher.providers.sagemaker:SageMakerProvider",
}
#: Providers the design names whose adapter is not in this version.
PLANNED: tuple[str, ...] = ()


def names() -> tuple[str, ...]:
    """Every provider's name, in the registry's order (nothing is imported)."""
    return tuple(REGISTRY)


def provider_class(name: str) -> type[Provider]:
    """The class of the provider called ``name`` (its package imported now)."""
    if name not in REGISTRY:
        if name in PLANNED:
            raise UsageError(f"the {name} provider is not available in this version of launch",
                             "use --provider local (`launch plan` shows the local plan)")
        raise UsageError(f"unknown provider {name!r}",
                         f"choose one of {', '.join([*REGISTRY, *PLANNED])}")
    module, _, cls = REGISTRY[name].partition(":")
    found: type[Provider] = getattr(importlib.import_module(module), cls)
    return found


def get_provider(name: str, settings: dict[str, Any] | None = None,
                 environ: dict[str, str] | None = None) -> Provider:
    """The provider called ``name``, configured from ``settings`` (region, bucket, role ...)."""
    return provider_class(name).from_settings(settings or {}, environ)
