"""How fast a flooding 16-rank cloud job is stopped after its OOM, against the fakes (issue 18).

The scenarios are the tests' own (the real Vertex and SageMaker client libraries against the
loopback fakes with their read quotas on: Cloud Logging's 60 reads a minute, CloudWatch
throttling GetLogEvents): 16 ranks write 5,000 lines a second in total, one rank runs out of
memory, the others hang until stopped. The tests assert what must hold (the stop came through
the event channel, every line once); this reruns them and reports the seconds from the OOM
line's write to the fake receiving the cancel/stop, which each scenario records when
``LAUNCH_BENCH_RECORD`` names a file (tests/fakes/record.py). Target: one event poll + 2 s.

    .venv/bin/python bench/bench_cloud_stop.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = (
    "tests/providers/test_vertex.py::"
    "test_a_16_rank_job_flooding_its_log_is_stopped_within_a_poll_of_its_oom",
    "tests/providers/test_sagemaker.py::"
    "test_a_flooding_16_rank_job_is_stopped_within_a_poll_of_its_oom_and_logged_whole",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.jsonl"
        env = {**os.environ, "LAUNCH_BENCH_RECORD": str(out)}
        for _ in range(args.repeat):
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   *SCENARIOS], cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
                return 1
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    by: dict[str, list[dict]] = {}
    for row in rows:
        by.setdefault(row["scenario"], []).append(row)
    print("| scenario | runs | stop after the OOM (s) | median | limit (poll + 2 s) |")
    print("|---|---|---|---|---|")
    for name, runs in by.items():
        stops = [r["stop_after_oom_s"] for r in runs]
        poll = runs[0].get("event_poll_s", runs[0].get("events_interval_s"))
        print(f"| {name} | {len(runs)} | {', '.join(f'{s:.2f}' for s in stops)} | "
              f"{statistics.median(stops):.2f} | {poll + 2:.1f} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
