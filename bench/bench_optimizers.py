"""Does every optimizer the planner offers trace in seconds?

``launch plan`` in a fresh process for a BERT-large ``--model-config`` (transformers' BertConfig:
24 layers, 1024 wide, 16 heads, 4096 intermediate, vocab 30522; built by transformers and traced,
docs/estimator.md "Hugging Face configs"), sequence 512, on Vertex AI's ``a2-highgpu-1g``
(one A100 40 GB), once per ``--optimizer``. It reports the wall time, whether the config was traced
(a trace that fails or runs out of time falls back to the analytic estimate, with a note), and
the chosen plan's peak.

    .venv/bin/python bench/bench_optimizers.py --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPTIMIZERS = ("adamw", "sgd", "adafactor", "adam8bit")
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 4096, "vocab_size": 30522, "max_position_embeddings": 512}


def write_config(directory: Path) -> Path:
    from transformers import BertConfig  # the benchmark needs the dev extra

    path = directory / "bert-large.json"
    path.write_text(json.dumps(BertConfig(**BERT_LARGE).to_dict()))
    return path


def run_once(config: Path, optimizer: str, launch: str) -> dict[str, object]:
    script = config.parent / "train.py"
    script.write_text("print('a plain script: the config describes the model')\n")
    env = {**os.environ, "LAUNCH_STATE_DIR": tempfile.mkdtemp(prefix="bench_optimizers_"),
           "LAUNCH_TRACE_TIMEOUT": "600"}
    env.pop("LAUNCH_NO_TRACE", None)
    started = time.perf_counter()
    proc = subprocess.run(
        [launch, "plan", str(script), "--model-config", str(config), "--seq-len", "512",
         "--provider", "vertex", "--region", "us-central1", "--machine", "a2-highgpu-1g",
         "--global-batch-size", "8",
         "--optimizer", optimizer, "--json"],
        capture_output=True, text=True, env=env, cwd=config.parent, check=False)
    wall = time.perf_counter() - started
    row: dict[str, object] = {"optimizer": optimizer, "exit": proc.returncode,
                              "wall_s": round(wall, 1)}
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row["stderr"] = proc.stderr.strip().splitlines()[-3:]
        return row
    chosen = out.get("chosen") or {}
    row["source"] = out["model"]["source"]
    row["notes"] = out.get("notes", [])
    # a config that transformers could not trace in time falls back to the analytic estimate
    row["traced"] = not any("analytic" in str(n) for n in row["notes"])  # type: ignore[union-attr]
    row["peak_gib"] = round((chosen.get("memory") or {}).get("peak_allocated", 0) / 2**30, 2)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    args = parser.parse_args(argv)
    launch = str(Path(sys.executable).parent / "launch")
    config = write_config(Path(tempfile.mkdtemp(prefix="bench_optimizers_")))
    print("| optimizer | wall (s), each run | median | traced | chosen peak (GiB) | notes |")
    print("| --- | --- | ---: | --- | ---: | --- |")
    for optimizer in args.optimizers.split(","):
        rows = [run_once(config, optimizer, launch) for _ in range(args.runs)]
        for row in rows:
            print(json.dumps(row), file=sys.stderr, flush=True)
        walls = [float(r["wall_s"]) for r in rows]  # type: ignore[arg-type]
        last = rows[-1]
        notes = "; ".join(str(n) for n in last.get("notes", []))[:160]  # type: ignore[union-attr]
        print(f"| {optimizer} | {' / '.join(f'{w:.1f}' for w in walls)} | "
              f"{statistics.median(walls):.1f} | {last.get('traced')} | {last.get('peak_gib')} "
              f"| {notes} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
