"""Framework scripts planned as written: the traced peak against the framework's own real step.

The check is the tests' own (``tests/estimate/test_frameworks.py``:
``launch plan SCRIPT --json`` on a Hugging Face Trainer, accelerate or Lightning script, against
``frameworks.measure_step``, the CPU allocator's record of the real Trainer / accelerate loop /
Lightning fit, within 2%). The tests take four of the nine scripts; this reruns the check over
all nine (``LAUNCH_TEST_ALL_FRAMEWORK_SCRIPTS=1``) and prints each script's peaks and error, which
the test records when ``LAUNCH_BENCH_RECORD`` names a file (tests/fakes/record.py).

    .venv/bin/python bench/bench_frameworks.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = ("tests/estimate/test_frameworks.py::"
        "test_plan_is_traced_and_matches_the_frameworks_own_step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.jsonl"
        env = {**os.environ, "LAUNCH_BENCH_RECORD": str(out),
               "LAUNCH_TEST_ALL_FRAMEWORK_SCRIPTS": "1"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               TEST], cwd=ROOT, env=env, capture_output=True, text=True)
        rows = ([json.loads(line) for line in out.read_text().splitlines()]
                if out.exists() else [])
    print("| script | framework | micro-batch | traced peak | real step peak | error |")
    print("|---|---|---:|---:|---:|---:|")
    for row in sorted(rows, key=lambda r: r["script"]):
        error = (row["traced_peak"] - row["real_peak"]) / row["real_peak"]
        print(f"| {row['script']} | {row['framework']} | {row['micro_batch_size']} | "
              f"{row['traced_peak']:,} B | {row['real_peak']:,} B | {error:+.2%} |")
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no pytest output)")
    print(json.dumps(rows))
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
