"""Providers: one package per place a job can run, owning everything about it (its cloud's client
code, its settings and their flags, its machine catalog and training images, its in-container
bootstrap, its log reading, its `launch doctor` checks, its error strings).

The registry below is the one list of them: ``launch --provider`` choices (spec.py), the cloud
flags and config keys (options.py), the catalogs (plan/catalog.py), `launch doctor` and the run
commands (cli.py) all read it. A provider's class is imported only when it is used (cloud SDKs
are slow to import and optional extras); what `launch --help` and the planner need of it, its
settings class and its catalog file, is read from its package without importing that class
(a provider package's ``__init__`` imports its provider class lazily).
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.status import UsageError


@dataclass(frozen=True)
class Registered:
    """Where one provider is: ``module`` (its package, or a module of its own), and by name in
    it: its :class:`~launcher.providers.base.Provider` class, its settings dataclass (whose
    fields are its config keys and whose ``flags.flag()`` fields are its own flags), and its
    machine catalog (a JSON file in the package: ``plan/catalogs/README.md`` has the schema).
    A provider with no settings class takes only the options every provider does; one with no
    catalog (local) runs on the machine at hand."""

    module: str
    provider: str
    settings: str | None = None
    catalog: str | None = None


#: name -> where it is, in the order the providers are offered. Tests register a provider of
#: their own here (monkeypatch.setitem).
REGISTRY: dict[str, Registered] = {
    "local": Registered("launcher.providers.local", "LocalProvider"),
    "vertex": Registered("launcher.providers.vertex", "VertexProvider", "VertexSettings",
                         "catalog.json"),
    "sagemaker": Registered("launcher.providers.sagemaker", "SageMakerProvider",
                            "SageMakerSettings", "catalog.json"),
}
#: The provider that runs jobs on this machine: the default, free, and sent no request.
LOCAL = "local"
#: Providers the design names whose adapter is not in this version.
PLANNED: tuple[str, ...] = ()


def names() -> tuple[str, ...]:
    """Every provider's name, in the registry's order (nothing is imported)."""
    return tuple(REGISTRY)


def clouds() -> tuple[str, ...]:
    """The providers a job can run on other than this machine, in the registry's order."""
    return tuple(name for name in REGISTRY if name != LOCAL)


def catalogued() -> tuple[str, ...]:
    """The providers with a machine catalog (their entry names one), in the registry's order."""
    return tuple(name for name, entry in REGISTRY.items() if entry.catalog)


def _entry(name: str) -> Registered:
    if name not in REGISTRY:
        if name in PLANNED:
            raise UsageError(f"the {name} provider is not available in this version of launch",
                             f"use --provider {LOCAL} (`launch plan` shows the local plan)")
        raise UsageError(f"unknown provider {name!r}",
                         f"choose one of {', '.join([*REGISTRY, *PLANNED])}")
    return REGISTRY[name]


def provider_class(name: str) -> Any:
    """The class of the provider called ``name`` (a ``base.Provider``; its package imported now).
    Typed loosely: the registry sits below every provider module, ``base`` included, and names
    none of them."""
    entry = _entry(name)
    return getattr(importlib.import_module(entry.module), entry.provider)


def settings_class(name: str) -> type | None:
    """The settings dataclass of the provider called ``name``, None if it has none. Imports its
    package but not its provider class."""
    entry = _entry(name)
    if entry.settings is None:
        return None
    found: type = getattr(importlib.import_module(entry.module), entry.settings)
    return found


def catalog_data(name: str) -> dict[str, Any] | None:
    """The parsed machine catalog of the provider called ``name``, None if it has none: read
    once per registry entry, and the one reader of the file (the flags' titles, the vendor
    strategies, the images and ``plan.catalog``'s machines all ask here). Not to be changed."""
    entry = _entry(name)
    return None if entry.catalog is None else _parsed(entry.module, entry.catalog)


@functools.cache
def _parsed(module: str, file: str) -> dict[str, Any]:
    from importlib import resources

    found: dict[str, Any] = json.loads(
        resources.files(module).joinpath(file).read_text(encoding="utf-8"))
    return found


def lazy_names(package: str, modules: dict[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A provider package's ``__getattr__`` (PEP 562): each name of ``modules`` (the package's
    module -> the names it exports) imported from its module on first use, so that importing
    the package for its settings class imports no client code."""
    where = {name: module for module, listed in modules.items() for name in listed}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)  # once: the next lookup finds it
        return value

    return __getattr__


def get_provider(name: str, settings: dict[str, Any] | None = None,
                 environ: dict[str, str] | None = None) -> Any:
    """The provider called ``name`` (a ``base.Provider``), configured from ``settings``
    (region, bucket, role ...)."""
    return provider_class(name).from_settings(settings or {}, environ)
