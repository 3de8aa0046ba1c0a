"""How long a full plan search takes: both clouds' catalogs, every strategy and micro-batch.

    .venv/bin/python bench/bench_planner.py [--repeat 5]
    .venv/bin/python bench/bench_planner.py --repeat 1 --dump plans.json   # every plan, as JSON

``--dump`` writes both searches' whole answers (`launch plan --json`'s contract: every candidate
with its memory and cost, the choice, every rejection and note): a change meant to keep the plans
as they were (a refactor) is checked by comparing two dumps byte for byte (``cmp``).

Plans a Llama-2-7B-shaped model (analytic footprint, from its config.json values) for every
machine of the Vertex AI and SageMaker catalogs, with nothing pinned, so the planner walks every
rung (micro-batch, checkpointing, sharding, more nodes) on every machine. Candidates reuse the
scaled footprint instead of re-tracing. Target: under 2 s for both providers together.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.estimate.footprint import from_shape  # noqa: E402
from launcher.estimate.model_config import shape_from_config  # noqa: E402
from launcher.plan.planner import plan  # noqa: E402
from launcher.plan.targets import cloud_targets  # noqa: E402
from launcher.spec import Spec  # noqa: E402

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 4096}


def search(provider: str, dump: dict[str, object] | None = None) -> tuple[int, str]:
    shape = shape_from_config(LLAMA2_7B, seq_len=4096)
    spec = Spec(script=Path("train.py"), mode="script", provider=provider, global_batch_size=256,
                steps=1000, params=shape.parameters, precision="bf16_mixed")

    def estimator(precision: str, optimizer: str, checkpointing: bool):
        return from_shape(shape, precision=precision, optimizer=optimizer,
                          checkpointing=checkpointing)

    result = plan(spec, estimator, cloud_targets(provider, spec), provider,
                  parameters=shape.parameters, source="config", can_checkpoint=True)
    if dump is not None:
        dump[provider] = result.to_dict()
    chosen = result.chosen
    what = "none" if chosen is None else (
        f"{chosen.strategy} {chosen.nodes}x{chosen.gpus_per_node} {chosen.machine} "
        f"micro {chosen.micro_batch_size} x {chosen.grad_accum_steps}, "
        f"${chosen.total_cost_usd:,.0f}" if chosen.total_cost_usd else "")
    return len(result.plans), what


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dump", type=Path, help="write every plan of both searches here (JSON)")
    args = parser.parse_args()
    times = []
    dump: dict[str, object] = {}
    for _ in range(args.repeat):
        start = time.perf_counter()
        counts = [search(p, dump) for p in ("vertex", "sagemaker")]
        times.append(time.perf_counter() - start)
    if args.dump:
        args.dump.write_text(json.dumps(dump, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for provider, (n, what) in zip(("vertex", "sagemaker"), counts, strict=True):
        print(f"{provider}: {n} candidates recorded; chosen: {what}")
    print(f"full search, both providers: median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms over {args.repeat} runs (target < 2000 ms)")
    return 0 if statistics.median(times) < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
