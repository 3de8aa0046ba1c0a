"""Selective activation checkpointing as the estimator sees it: the trace runs the rendered
script's own ``build_model`` (and so its selective policy) on fake tensors, and must count what a
real CPU step of the same script allocates (``measure_recipe``: the CPU allocator's record).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from launcher.estimate.traced import measure_recipe, trace_recipe
from tests.estimate._recipes import GPT

#: The traced estimate's tolerance against a real CPU step (tests/estimate/test_script.py's).
TOLERANCE = 0.01


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16_mixed"])
def test_trace_of_selective_checkpointing_matches_a_real_step(tmp_path: Path,
                                                              precision: str) -> None:
    recipe = tmp_path / "gpt.py"
    recipe.write_text(GPT)
    with ThreadPoolExecutor(2) as pool:
        real = {mode: pool.submit(measure_recipe, recipe, micro_batch=4, precision=precision,
                                  activation_checkpointing=mode)
                for mode in ("selective", False)}
        trace = trace_recipe(recipe, device="cpu", micro_batch_sizes=(1, 2, 4),
                             precision=precision, activation_checkpointing="selective")
        real_selective, real_plain = real["selective"].result(), real[False].result()
    assert trace.activation_checkpointing == "selective"
    peak = real_selective.peak_allocated
    assert abs(trace.peak_at(4) - peak) <= TOLERANCE * peak, (trace.peak_at(4), peak)
    assert peak < real_plain.peak_allocated  # it did keep less


@pytest.mark.slow
def test_the_planner_sizes_a_pinned_selective_plan_from_its_own_trace(cli, tmp_path: Path
                                                                       ) -> None:
    recipe = tmp_path / "gpt.py"
    recipe.write_text(GPT)
    traced = {"LAUNCH_NO_TRACE": "0"}
    plans = {mode: cli("plan", str(recipe), "--checkpointing", mode, "--global-batch-size", "8",
                       "--gpus-per-node", "1", "--json", environ=traced).json()["chosen"]
             for mode in ("none", "selective")}
    assert {m: p["checkpointing"] for m, p in plans.items()} == {
        "none": "none", "selective": "selective"}
    assert plans["selective"]["memory"]["activations"] < plans["none"]["memory"]["activations"]
