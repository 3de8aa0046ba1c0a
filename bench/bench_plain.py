"""Plain PyTorch scripts planned as written: the traced peak against the script's own real steps.

The scripts are the tests' (``tests/estimate/test_plain_capture.py``: pytorch/examples' mnist
with its argparse, and a nanoGPT-style train.py with module-level settings). Each is planned
with ``launch plan SCRIPT --json`` (no --params: captured at its first optimizer step and traced)
and run for real by ``frameworks.measure_step`` (the CPU allocator's record of the script's own
first two optimizer steps, from its first forward, above the weights it had built).

    .venv/bin/python bench/bench_plain.py
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    from launcher.cli import main as launch
    from launcher.context import Environment
    from launcher.frameworks import Detected, measure_step
    from tests.estimate.test_plain_capture import MNIST, NANOGPT

    print("| script | micro-batch | traced peak | real step peak | error |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in (("mnist", MNIST), ("nanogpt", NANOGPT)):
            folder = Path(tmp) / name
            folder.mkdir()
            script = folder / "train.py"
            script.write_text(source)
            out, err = io.StringIO(), io.StringIO()
            env = Environment(stdout=out, stderr=err, cwd=folder,
                              environ={**os.environ, "LAUNCH_STATE_DIR": str(folder / "state"),
                                       "LAUNCH_NO_TRACE": "0"}, python=sys.executable)
            status = launch(["plan", str(script), "--json", "--precision", "fp32"], env)
            if status != 0:
                print(f"| {name} | plan failed: {err.getvalue().strip()[:200]} |")
                continue
            chosen = json.loads(out.getvalue())["chosen"]
            traced = chosen["memory"]["peak_allocated"]
            real = measure_step(script, Detected("plain"))["peak_allocated"]
            print(f"| {name} | {chosen['micro_batch_size']} | {traced:,} B | {real:,} B | "
                  f"{(traced - real) / real:+.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
