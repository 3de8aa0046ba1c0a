"""A few rows of the third-party zoo (bench/zoo_hf.py, bench/bench_zoo.py has them all):
transformers' own classes at random init, traced against a real CPU step of the rendered
script, at accumulation 1 and 4 from one trace."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import zoo_hf  # noqa: E402

from launcher.estimate.traced import measure_recipe, trace_recipe  # noqa: E402

#: mixtral: grouped_mm experts (a meta kernel that takes only bf16); whisper: a frozen weight;
#: vit: trunc_normal_ initialisation (a rejection loop that reads values); gemma2: sliding-window
#: and global layers in turn, soft-capped scores and logits (an architecture launch has no
#: formula for, which a --model-config of it is now traced as). BERT, an encoder with nothing
#: of these, is a row of the benchmark only (bench/bench_zoo.py), with the rest of the zoo.
MODELS = ("mixtral", "whisper", "vit", "gemma2")


@pytest.mark.parametrize("name", MODELS)
def test_traced_within_one_percent_of_the_real_step(name: str, tmp_path: Path) -> None:
    recipe = zoo_hf.write_recipe(name, tmp_path)
    with ThreadPoolExecutor(3) as pool:
        trace = pool.submit(trace_recipe, recipe, device="cpu", micro_batch_sizes=(1, 2, 4),
                            grad_accum_steps=2)
        real = {a: pool.submit(measure_recipe, recipe, micro_batch=4, grad_accum_steps=a)
                for a in (1, 4)}
        result = trace.result()
        assert result.kind == "traced", result.notes  # on fake tensors, not a real rerun
        for accum, future in real.items():
            peak = future.result().peak_allocated
            assert abs(result.peak_at(4, accum) - peak) <= 0.01 * peak, (accum, peak)
