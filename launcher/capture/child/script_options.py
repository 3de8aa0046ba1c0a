"""The other ways a plain script takes its settings: click (and typer, built on it) options and
environment variables, recorded in the shape ``plain._patch_argparse`` records argparse's, so that
one rule (``plain._learn_flags``: the option whose value is the traced batch's rows, by name
first) learns the script's own flag whichever way it reads it.

- **click**: ``Command.parse_args`` fills the context's ``params``; each ``click.Option`` is
  recorded with its option strings and the value it parsed (a default included). The plan
  reaches it as argparse's: ``--batch-size 16`` in the job's arguments.
- **Environment variables**: a read of ``os.environ`` made by the script's own code (its file's
  frames; not torch's ``RANK`` or a library's), ``os.environ["BATCH_SIZE"]``,
  ``os.environ.get("BATCH_SIZE", 32)`` or ``os.getenv(...)``, is recorded as an option named
  ``$BATCH_SIZE`` with the value read, or the default where the variable was not set. The plan
  reaches it through the job's environment (``script_info.env_flags``), never its arguments.
  ``LAUNCH_*`` variables are this project's contract and are read another way
  (``script_info.launch_variables``).

HfArgumentParser is an ``argparse.ArgumentParser``: its options are argparse's already.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from launcher.capture.child.answer import ANSWER, STATE
from launcher.script_info import ENV_PREFIX  # ``$BATCH_SIZE``: how the plan names it too


def patch_click(parsed: list[dict[str, Any]]) -> None:
    """Record each click command's options as it parses them (nothing where click is not
    installed: the script then does not use it)."""
    try:
        import click
    except ImportError:
        return
    parse = click.Command.parse_args

    def recording_parse(self: Any, ctx: Any, args: list[str]) -> list[str]:
        rest = parse(self, ctx, args)
        options = [{"options": [s for s in param.opts if s.startswith("-")], "dest": param.name,
                    "type": getattr(param.type, "name", None), "default": _plain(param.default),
                    "value": _plain(ctx.params.get(param.name))}
                   for param in self.params
                   if isinstance(param, click.Option) and param.name and not param.is_flag
                   and any(s.startswith("-") for s in param.opts)]
        parsed.append({"prog": ctx.info_name or self.name, "options": options})
        ANSWER["argparse"] = parsed
        return rest

    click.Command.parse_args = recording_parse  # type: ignore[method-assign]


def patch_environ(script: Path) -> None:
    """Record the environment variables ``script``'s own code reads (the last read of each
    wins), as options named ``$NAME`` (``env_options``)."""
    read: dict[str, dict[str, Any]] = {}
    STATE["plain_env_read"] = read
    environ_class = type(os.environ)
    getitem = environ_class.__getitem__
    here = str(script)

    def by_the_script() -> bool:
        # 0 this, 1 remember, 2 the patched read, 3 its caller: the script, or os.getenv
        frame = sys._getframe(3)
        while frame is not None and frame.f_globals.get("__name__") == "os":  # "<frozen os>"
            frame = frame.f_back
        return frame is not None and frame.f_code.co_filename == here

    def remember(key: Any, value: Any) -> None:
        if isinstance(key, str) and not key.startswith("LAUNCH_") and by_the_script():
            read[key] = {"options": [ENV_PREFIX + key], "dest": key.lower(), "env": key,
                         "type": None, "default": _plain(value), "value": _number(value)}

    def recording_getitem(self: Any, key: Any) -> Any:
        value = getitem(self, key)  # a KeyError is the script's to handle
        remember(key, value)
        return value

    def recording_get(self: Any, key: Any, default: Any = None) -> Any:
        try:
            value = getitem(self, key)
        except KeyError:
            value = default
        remember(key, value)
        return value

    environ_class.__getitem__ = recording_getitem  # type: ignore[method-assign]
    environ_class.get = recording_get  # type: ignore[method-assign]


def env_options() -> list[dict[str, Any]]:
    """What ``patch_environ`` recorded, as options for ``plain._learn_flags``."""
    return list((STATE.get("plain_env_read") or {}).values())


def _number(value: Any) -> Any:
    """A variable's text as the script would convert it (``int(os.environ["BATCH_SIZE"])``):
    the number it spells, else the value as it is."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                continue
    return _plain(value)


def _plain(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
