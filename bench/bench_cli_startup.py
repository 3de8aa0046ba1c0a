"""How long `launch --help` takes, end to end, as a user's shell sees it, and which heavy modules
it and `launch machines --provider sagemaker` import (none may: the SageMaker SDK alone takes
about 1.4 s to import, and only a SageMaker request needs it).

    .venv/bin/python bench/bench_cli_startup.py [--runs 20]

Runs the installed console script in a fresh process each time (so imports are not cached in
memory across runs) and reports the median and the worst run. Target: under 0.3 s, and no heavy
module imported.
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
    clean = True
    for command in (["--help"], ["machines", "--provider", "sagemaker"]):
        heavy = heavy_imports(command)
        clean = clean and not heavy
        shown = ", ".join(heavy) or "none of " + ", ".join(HEAVY)
        print(f"launch {' '.join(command)} imports: {shown}")
    return 0 if statistics.median(times) < 0.3 and clean else 1


#: What `launch --help` and the catalog listing must not import.
HEAVY = ("sagemaker", "boto3", "botocore", "torch", "google.cloud.aiplatform", "pandas")
_PROBE = """
import contextlib, io, sys
from launcher.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(sys.argv[1:])
print(" ".join(m for m in {heavy!r} if m in sys.modules))
"""


def heavy_imports(command: list[str]) -> list[str]:
    """The modules of ``HEAVY`` that `launch COMMAND` has imported when it is done."""
    out = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *command],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


if __name__ == "__main__":
    sys.exit(main())
