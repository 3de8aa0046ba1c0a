"""How a command-line option and a config key are declared: the records ``options.py``'s tables
are made of, and ``flag()``, with which a provider's settings class declares its own flags.

Apart from ``options.py`` because a provider package declares its settings with these (Vertex's
``--project``, SageMaker's ``--role``) while ``options.py`` gathers every provider's: the tables
import the providers' settings, the settings import only this. Nothing here imports click.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

#: What an option's or config key's value must be: ``count`` and ``size`` are numbers or text
#: like ``7B`` and ``2GiB``; ``path`` is text; ``args`` a list of strings (``script_args``).
Kind = Literal["int", "float", "bool", "str", "path", "count", "size", "args"]


@dataclass(frozen=True)
class ConfigKey:
    """A key a config file may hold: ``name`` as written (``-`` or ``_``), what its value must be,
    and the command-line option it is the default of (``None``: a provider setting only, like
    SageMaker's ``s3_prefix``, which reaches the provider as it is)."""

    name: str
    kind: Kind
    param: str | None = None


@dataclass(frozen=True)
class Option:
    """One command-line option: its flag (``--spot/--no-spot`` for an on/off pair, which is
    unset unless given), the parameter it is passed as when that is not the flag's name
    (``--report``: ``report_path``), the kind of its value, and what ``--help`` says of it."""

    flag: str
    help: str
    kind: Kind = "str"
    param_name: str | None = None
    envvar: str | None = None
    default: str | None = None
    show_default: bool = False
    required: bool = False

    @property
    def key(self) -> str:
        """Its name in a config file (and click's parameter name, unless ``param_name``)."""
        return self.flag.split("/")[0].removeprefix("--").replace("-", "_")

    @property
    def param(self) -> str:
        return self.param_name or self.key


def either(words: tuple[str, ...]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, (", ".join(words[:-1]), words[-1])))


#: The field metadata key under which ``flag()`` keeps a setting's flag.
FLAG = "launch_flag"


@dataclass(frozen=True)
class FlagHelp:
    """What ``flag()`` records on a settings field: its ``--help`` text and its variable."""

    help: str
    envvar: str | None = None


def flag(help: str, envvar: str | None = None, default: Any = None) -> Any:
    """A settings dataclass field that is also a flag of `launch plan`, `launch run` and `launch
    doctor` (``--`` and the field's name with ``-`` for ``_``; its kind from the field's type):
    declared once, where the provider's settings are, and read from there by ``options.py``."""
    return dataclasses.field(default=default, metadata={FLAG: FlagHelp(help, envvar)})


def settings_kinds(cls: type) -> dict[str, Kind]:
    """The config keys a settings dataclass takes, each with its kind, from the dataclass's own
    field types (``int | None`` is ``int``)."""
    hints = typing.get_type_hints(cls)
    kinds: dict[str, Kind] = {}
    for f in dataclasses.fields(cls):
        types = {t for t in typing.get_args(hints[f.name]) or (hints[f.name],)
                 if t is not type(None)}
        for python, kind in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
            if python in types:
                kinds[f.name] = kind  # type: ignore[assignment]
                break
    return kinds


def settings_flags(cls: type, title: str) -> tuple[Option, ...]:
    """The flags a settings dataclass declares with ``flag()``, in field order, each one's help
    followed by whose setting it is (``Google Cloud project (Vertex AI).``)."""
    kinds = settings_kinds(cls)
    found = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(FLAG)
        if declared is None:
            continue
        kind = kinds.get(f.name, "str")
        name = f"--{f.name.replace('_', '-')}"
        if kind == "bool":
            name = f"{name}/--no-{f.name.replace('_', '-')}"
        help = f"{declared.help.rstrip().removesuffix('.')} ({title})."
        found.append(Option(name, help, kind, envvar=declared.envvar))
    return tuple(found)
