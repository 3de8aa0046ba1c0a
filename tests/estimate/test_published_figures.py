"""The launcher's model-state arithmetic reproduces ZeRO's Table 1 to the paper's printed digits.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
arXiv 1910.02054, Section 5, Table 1: per-device model-state memory of mixed-precision Adam
(2 + 2 + K bytes per parameter, K = 12) for Psi = 7.5B, 128B and 1T parameters at data-parallel
degree Nd, under P_os, P_os+g and P_os+g+p. Its "GB" is 1e9 bytes. The cells, as
printed, live in bench/bench_published.py with the other published figures.
The paper rounds most cells (41.25 -> 41.3) and truncates some (4187.5 -> 4187, 513.5 -> 513):
a value matches when it rounds half-up or truncates to the printed string.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

from launcher.estimate.analytic import shape_from_params
from launcher.estimate.footprint import from_shape
from launcher.estimate.states import model_states
from launcher.plan.planner import Target, per_gpu_memory

#: Table 1 as printed, and the rounding rule: one copy, in the benchmark that reports them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_published import GB, matches_printed  # noqa: E402
from bench_published import ZERO_TABLE1 as TABLE1  # noqa: E402

CELLS = [(model, psi, nd, printed) for model, (psi, rows) in TABLE1.items()
         for nd, printed in rows.items()]
IDS = [f"{model}-Nd{nd}" for model, _, nd, _ in CELLS]


def matches(nbytes: int, printed: str) -> bool:
    return matches_printed(Decimal(nbytes) / GB, printed)


def test_matching_is_strict():
    assert matches(41_250_000_000, "41.3") and matches(4_187_500_000_000, "4187")
    assert not matches(41_400_000_000, "41.3")
    assert not matches(75_000_000_000, "52.5")


@pytest.mark.parametrize("model", list(TABLE1))
def test_baseline_is_16_bytes_per_param_and_gb_is_1e9(model):
    psi, rows = TABLE1[model]
    total = model_states(psi, "bf16_mixed", "adamw").total
    assert total == 16 * psi
    assert all(matches(total, printed) for printed in rows[1])
    # The paper's GB is 10^9 bytes: in GiB the same bytes would print differently.
    assert not matches(round(total * GB / 2**30), rows[1][0])


@pytest.mark.parametrize(("model", "psi", "nd", "printed"), CELLS, ids=IDS)
def test_fsdp_sharding_reproduces_p_os_g_p(model, psi, nd, printed):
    """P_os+g+p is the planner's fsdp: weights, gradients and Adam state divided by Nd."""
    assert matches(model_states(psi, "bf16_mixed", "adamw", shard_degree=nd).total,
                   printed[2])
    footprint = from_shape(shape_from_params(psi), precision="bf16_mixed", optimizer="adamw",
                           checkpointing=False, kind="declared")
    nodes, gpus = (1, nd) if nd <= 8 else (nd // 8, 8)
    target = Target(name="v100", gpus=gpus, memory_bytes=32 * GB, generation="volta",
                    max_nodes=nodes)
    memory = per_gpu_memory(footprint, target, "fsdp" if nd > 1 else "single", nodes, gpus, 1)
    assert memory.model_states is not None and matches(memory.model_states, printed[2])


@pytest.mark.parametrize(("model", "psi", "nd", "printed"), CELLS, ids=IDS)
def test_zero_split_rebuilt_from_model_states_reproduces_p_os_and_p_os_g(model, psi, nd,
                                                                          printed):
    """ZeRO's 2 + 2 + K split from the launcher's per-state bytes: the 16-bit weights and
    gradients are the ``bf16`` states, K = 12 the ``bf16_mixed`` fp32 weights + Adam moments."""
    half = model_states(psi, "bf16", "adamw")
    sharded = model_states(psi, "bf16_mixed", "adamw", shard_degree=nd)
    k = sharded.parameters + sharded.optimizer
    assert k * nd == 12 * psi
    g16 = model_states(psi, "bf16", "adamw", shard_degree=nd).gradients
    assert matches(half.parameters + half.gradients + k, printed[0])  # P_os
    assert matches(half.parameters + g16 + k, printed[1])  # P_os+g


def test_ddp_is_the_baseline_row():
    """DDP replicates the model states: every GPU holds the Nd = 1 figure (120 GB for 7.5B)."""
    psi, rows = TABLE1["7.5B"]
    footprint = from_shape(shape_from_params(psi), precision="bf16_mixed", optimizer="adamw",
                           checkpointing=False, kind="declared")
    target = Target(name="8 GPUs", gpus=8, memory_bytes=32 * GB, generation="volta")
    memory = per_gpu_memory(footprint, target, "ddp", 1, 8, 1)
    assert memory.model_states is not None and matches(memory.model_states, rows[1][0])
