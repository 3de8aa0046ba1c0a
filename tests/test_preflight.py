"""Preflight's traced footprints: one rank of a sharded plan traced at its world size."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "estimate"))
from _recipes import GPT  # noqa: E402

from launcher.estimate.traced import trace_recipe  # noqa: E402
from launcher.preflight import _rank_traces  # noqa: E402

OPTIONS = {"micro_batch_sizes": (1, 2, 4), "precision": "fp32", "optimizer": None,
           "activation_checkpointing": False, "device": "cpu", "timeout_s": 120.0}


def test_rank_memory_is_the_ranks_own_trace(tmp_path: Path) -> None:
    recipe = tmp_path / "gpt.py"
    recipe.write_text(textwrap.dedent(GPT))
    rank_memory_at = _rank_traces(recipe, dict(OPTIONS))
    for accum in (1, 4):
        memory = rank_memory_at("fsdp", 1, 2, 2, accum)
        trace = trace_recipe(recipe, **{**OPTIONS, "grad_accum_steps": min(accum, 2)},
                             strategy={"name": "fsdp", "world_size": 2})
        assert memory == trace.memory_at(2, accum)
    # hybrid sharding: a shard group per node, the nodes replicas
    hybrid = rank_memory_at("hybrid_shard", 2, 2, 2, 1)
    assert hybrid == trace_recipe(recipe, **{**OPTIONS, "grad_accum_steps": 1}, strategy={
        "name": "hybrid_shard", "world_size": 4, "replicas": 2}).memory_at(2, 1)


def test_a_recipe_that_cannot_be_traced_leaves_the_scaled_estimate(tmp_path: Path) -> None:
    recipe = tmp_path / "broken.py"
    recipe.write_text("def build_model(): raise ValueError('no')\n"
                      "def example_batch(b): ...\ndef training_step(m, b): ...\n")
    assert _rank_traces(recipe, dict(OPTIONS))("fsdp", 1, 2, 2, 1) is None
