"""The entry point: ``python -m launcher.capture.child --script train.py --out DIR --kind K``.

Patches the framework's entry points (``hf``, ``lightning``, ``accelerate``), runs the script as
``__main__`` and turns how it ended (a hook's ``Stop``, an exit, an error) into the answer's notes.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from launcher.capture.child.accelerate import patch_accelerate
from launcher.capture.child.answer import ANSWER, STATE, Stop, note, write_answer
from launcher.capture.child.hf import patch_transformers
from launcher.capture.child.lightning import patch_lightning
from launcher.capture.child.plain import patch_plain


def _user_line(exc: BaseException, script: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve().parent == script.parent]
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def _hardware() -> dict[str, Any]:
    from launcher.recipe import hardware

    return hardware()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.capture.child")
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--modules", default="")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--no-hardware", action="store_true")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    script: Path = options.script.resolve()
    script_args = options.args[1:] if options.args[:1] == ["--"] else options.args
    STATE.update(out=options.out, measure=options.measure, script=script)
    ANSWER.update(framework=options.kind, script=str(script), script_dir=str(script.parent),
                   argv=script_args)
    if not options.no_hardware:
        ANSWER["hardware"] = _hardware()
    write_answer()
    modules = [m for m in options.modules.split(",") if m]
    where = {"hf_trainer": "Trainer.train()", "lightning": "Trainer.fit()",
             "accelerate": "Accelerator.prepare()",
             "plain": "its first optimizer step"}[options.kind]
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.parent))
    try:
        if options.kind == "hf_trainer" or "transformers" in script.read_text(encoding="utf-8"):
            patch_transformers()
        if options.kind == "lightning":
            patch_lightning(modules)
        elif options.kind == "accelerate":
            patch_accelerate()
        elif options.kind == "plain":
            patch_plain()
    except ImportError as exc:
        note(f"{options.kind} cannot be imported here ({exc}): install it to trace the script")
        write_answer()
        return 0
    try:
        runpy.run_path(str(script), run_name="__main__")
        if not ANSWER["reached"]:
            note(f"{script.name} ended without reaching {where}")
    except Stop:
        pass
    except SystemExit as exc:
        if not ANSWER["reached"]:
            note(f"{script.name} exited (status {exc.code}) before reaching {where}")
    except BaseException as exc:  # noqa: BLE001 - the user's error, as one line
        if not ANSWER["reached"]:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            note(f"{script.name} raised {type(exc).__name__}: {first}{_user_line(exc, script)}"
                  f" before reaching {where}")
    write_answer()
    sys.stdout.flush()
    _end_children()
    os._exit(0)  # the script's threads and atexit hooks (loggers, pools) are not waited for


def _end_children() -> None:
    """Kill every process the script started (a dataloader worker, a daemon in a session of
    its own: this process is their subreaper) before this one ends without waiting for them."""
    from launcher.processes import end_preflight

    end_preflight(None, os.getpid(), keep_root=True)


if __name__ == "__main__":
    from launcher.processes import become_subreaper

    become_subreaper()  # the script's orphans come back to this process, not to init
    try:
        sys.exit(main(sys.argv[1:]))
    finally:
        _end_children()
