"""How much does a trace worker gain from the fake-tensor cache entries of the round before?

The 7B preflight's third round (the ZeRO-2 rank with selective checkpointing at 8 ranks, sizes
1 and 2, one of its two depths) is traced in forks of one warmed process (as the trace child
forks its workers), alternately with and without the entries a worker of the round before (the
same rank without checkpointing) exported (``launcher/estimate/child/_shared_cache.py``).
Reports each arm's CPU seconds, the cache's misses, and whether the answers are identical.

    .venv/bin/python bench/bench_shared_cache.py --pairs 4 --depth-part 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from forked import in_fork, untimed  # noqa: E402
from models_zoo import llama_7b_config, write_recipe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--depth-part", type=int, default=1, choices=(0, 1))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_shared_cache_"))
    recipe = write_recipe("llama", folder, **llama_7b_config(kv_heads=8))
    os.chdir(folder)
    from launcher.estimate import traced

    def request(checkpointing: Any, sizes: list[int]) -> dict[str, Any]:
        made = traced._request(recipe, micro_batch_sizes=sizes, precision="bf16_mixed",
                               activation_checkpointing=checkpointing,
                               strategy={"name": "fsdp", "world_size": 8,
                                         "reshard_after_forward": False})
        return {**traced._forking(made, 2), "depth_part": args.depth_part,
                "fork_depths": False, "threads": 1}

    before_round, this_round = request(False, [1]), request("selective", [1, 2])
    from launcher.estimate.child import (
        _shared_cache,
        _trace_child,
        _trace_dist,
        _trace_run,
        _workers,
    )

    _workers.prepare()
    _trace_child._warm_up()
    _trace_dist.preimport()
    _workers.preimport(recipe)
    from torch._subclasses.fake_tensor import FakeTensorMode

    shipped = folder / "entries"

    def donor() -> bytes:
        before = _shared_cache.keys()
        _trace_run.run(dict(before_round))
        return str(_shared_cache.export(before, shipped)).encode()

    exported = int(in_fork(donor))

    def arm(with_entries: bool) -> Any:
        def run() -> bytes:
            if with_entries:
                _shared_cache.absorb(shipped)
            misses = FakeTensorMode.cache_misses
            started = time.process_time()
            answer = _trace_run.run(dict(this_round))
            cpu = time.process_time() - started
            return json.dumps({"cpu": cpu, "misses": FakeTensorMode.cache_misses - misses,
                               "answer": json.dumps(untimed(answer), sort_keys=True)}).encode()
        return run

    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.pairs):
        for with_entries in (False, True):
            results[with_entries].append(json.loads(in_fork(arm(with_entries))))
    answers = {r["answer"] for rows in results.values() for r in rows}
    print(json.dumps({
        "exported": exported,
        **{("with" if k else "without") + "_entries": {
            "cpu_s_median": round(statistics.median(r["cpu"] for r in rows), 3),
            "cpu_s": [round(r["cpu"], 2) for r in rows], "misses": rows[0]["misses"]}
           for k, rows in results.items()},
        "identical_answers": len(answers) == 1}, indent=1))


if __name__ == "__main__":
    main()
