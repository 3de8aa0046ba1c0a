"""The 7B preflight's rank traces: one round per configuration, or one queue of all their parts?

The planner used to ask for the ZeRO-2 rank at 8 ranks without checkpointing (micro-batch 1),
read it, and then ask for it with selective checkpointing (sizes 1 and 2): two rounds of the
trace child, each two workers (the rank's two depths), each with a core idle while the shallower
depth waited for the deeper one. ``preflight`` now asks for both ahead (``footprints.Ahead``) and
the child runs their four parts from one queue, two at a time, longest first
(``_trace_protocol.answer_all``). This runs both ways in forks of one process warmed as the
trace child is when the ranks come (torch, the warm-up, the single-device round's cache
entries), alternately, and reports each way's wall seconds and whether the answers agree.

    .venv/bin/python bench/bench_trace_queue.py --pairs 6
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
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_trace_queue_"))
    recipe = write_recipe("llama", folder, **llama_7b_config(kv_heads=8))
    os.chdir(folder)
    from launcher.estimate import traced

    def request(checkpointing: Any, sizes: list[int], **extra: Any) -> dict[str, Any]:
        # what the 7B preflight sends (bench/bench_preflight.py)
        made = traced._request(recipe, micro_batch_sizes=sizes, precision="bf16_mixed",
                               optimizer="adamw", activation_checkpointing=checkpointing,
                               **extra)
        return traced._forking(made, 2)

    single = [request(False, [1, 2, 4], grad_accum_steps=2, count_flops=True),
              request("selective", [1, 2, 4], grad_accum_steps=2)]
    zero2 = {"name": "fsdp", "world_size": 8, "reshard_after_forward": False}
    ranks = [request(False, [1], strategy=zero2), request("selective", [1, 2], strategy=zero2)]
    from launcher.estimate.child import (
        _trace_child,
        _trace_dist,
        _trace_protocol,
        _trace_run,
        _workers,
    )

    _workers.prepare()
    _trace_child._warm_up()
    _workers.preimport(recipe)
    started = time.perf_counter()
    _trace_protocol.answer_all(single, _trace_run.run)  # its cache entries, taken in here
    single_s = time.perf_counter() - started
    _trace_dist.preimport()

    def way(queue: bool) -> Any:
        def run() -> bytes:
            started = time.perf_counter()
            if queue:
                found = _trace_protocol.answer_all(ranks, _trace_run.run)
            else:  # a round per configuration, as before
                found = [_trace_protocol.answer_all([r], _trace_run.run)[0] for r in ranks]
            wall = time.perf_counter() - started
            answers = [[untimed(part) for part in item["depths"]]
                       for item in json.loads(_trace_protocol.encode(found))]
            return json.dumps({"wall": wall, "answer": json.dumps(answers, sort_keys=True)}
                              ).encode()
        return run

    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.pairs):
        for queue in (False, True):
            results[queue].append(json.loads(in_fork(way(queue))))
    answers = {r["answer"] for rows in results.values() for r in rows}
    print(json.dumps({
        "single_device_round_s": round(single_s, 2),
        **{("one_queue" if k else "round_per_configuration"): {
            "wall_s_median": round(statistics.median(r["wall"] for r in rows), 3),
            "wall_s": [round(r["wall"], 2) for r in rows]} for k, rows in results.items()},
        "identical_answers": len(answers) == 1}, indent=1))


if __name__ == "__main__":
    main()
