"""How long `launch --help` takes, end to end, as a user's shell sees it.

    .venv/bin/python bench/bench_cli_startup.py [--runs 20]

Runs the installed console script in a fresh process each time (so imports are not cached in
memory across runs) and reports the median and the worst run. Target: under 0.3 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    launch = shutil.which("launch", path=str(Path(sys.executable).parent)) or "launch"
    subprocess.run([launch, "--help"], capture_output=True, check=True)  # warm the disk cache
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([launch, "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    print(f"launch --help over {args.runs} runs: median {statistics.median(times) * 1000:.0f} ms, "
          f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")
    return 0 if statistics.median(times) < 0.3 else 1


if __name__ == "__main__":
    sys.exit(main())
