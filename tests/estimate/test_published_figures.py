"""The launcher against published memory figures (bench/bench_published.py holds them, cited).

ZeRO's Table 1 first: the launcher's model-state arithmetic reproduces it to the printed digits.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
arXiv 1910.02054, Section 5, Table 1: per-device model-state memory of mixed-precision Adam
(2 + 2 + K bytes per parameter, K = 12) for Psi = 7.5B, 128B and 1T parameters at data-parallel
degree Nd, under P_os, P_os+g and P_os+g+p. Its "GB" is 1e9 bytes. The cells, as
printed, live in bench/bench_published.py with the other published figures.
The paper rounds most cells (41.25 -> 41.3) and truncates some (4187.5 -> 4187, 513.5 -> 513):
a value matches when it rounds half-up or truncates to the printed string.
"""

from __future__ import annotations

import re
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from launcher.estimate.footprint import from_shape
from launcher.estimate.model_config import shape_from_params
from launcher.estimate.states import model_states
from launcher.plan.memory import Target, per_gpu_memory

#: Table 1 as printed, and the rounding rule: one copy, in the benchmark that reports them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_published  # noqa: E402
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


# ----------------------------------------------------------------------------------------------
# The other published figures: the launcher's computed side, at the tolerance each row supports.


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return bench_published.all_rows()


def _one(rows: list[dict], where: str, config: str = "") -> dict:
    found = [r for r in rows if r["where"] == where and config in r["configuration"]]
    assert len(found) == 1, [r["where"] for r in found]
    return found[0]


def test_every_row_cites_and_classifies(rows):
    assert len(rows) >= 40
    for r in rows:
        assert r["kind"] in bench_published.KINDS
        assert r["source"] and r["url"].startswith("https://") and r["where"]
        assert r["published"] > 0 and r["published_measures"]
        if r["kind"] == "needs_feature":
            # Nothing made up for a setting the launcher cannot express.
            assert r["launcher"] is None and r["error_pct"] is None and r["needs"]
        else:
            assert r["launcher"] is not None and r["launcher_quantity"]
            assert r["error_pct"] == pytest.approx(
                100 * (r["launcher"] - r["published"]) / r["published"], abs=0.01)


def test_hf_bert_on_a_v100_within_what_nvml_readings_support(rows):
    """bert-large-uncased + a 2-class head, fp32 AdamW, batch 4 (and 1 x 4): NVML used after
    training, 14949 MiB (8681 MiB), against the plan's total (peak reserved + the CUDA 11.2
    context). The rows compute the run's classifier (``architectures``), not an MLM head; the
    vanilla run is then 5% under (the reserve its reading implies, in the row)."""
    vanilla = _one(rows, "Vanilla training (also on the anatomy page)")
    assert vanilla["kind"] == "measured" and vanilla["published"] == 14949
    assert -8 < vanilla["error_pct"] < 0
    accumulation = _one(rows, "section: gradient accumulation")
    assert accumulation["published"] == 8681 and abs(accumulation["error_pct"]) < 5
    weights = _one(rows, "from_pretrained(...).to('cuda'), print_gpu_utilization")
    assert weights["published"] == 2631 - 1343 and abs(weights["error_pct"]) < 1
    # BertForSequenceClassification with 2 labels: BertModel with its pooler, and the classifier
    assert weights["launcher"] == pytest.approx(4 * (335_141_888 + 1024 * 2 + 2) / 2**20,
                                                abs=1e-3)
    # The launcher's default (fused attention) is a different setting from this eager 2022 run,
    # and the difference is the attention scores: well under the measurement.
    fused = _one(rows, "Vanilla training", "fused SDPA")
    assert fused["kind"] == "measured_other_setting" and fused["launcher"] < vanilla["launcher"]


def test_torchtitan_sharding_difference_and_selective_ac_bracket(rows):
    """Llama 3.1 8B FSDP2, local batch 2: 82.4 GiB on 8 H100s and 67.0 on 128 (torchtitan
    Tables 1 and 3). Their difference is the model-state sharding alone."""
    difference = _one(rows, "Table 1 minus Table 3 (FSDP rows)")
    assert difference["published"] == pytest.approx(15.4)
    assert abs(difference["error_pct"]) < 3
    selective = next(r for r in rows if r["where"] == "Table 1, FSDP row"
                     and r["kind"] != "measured_other_setting")
    if selective["kind"] == "needs_feature":
        pytest.skip("this launcher has no selective activation checkpointing")
    brackets = {r["launcher"] for r in rows if r["where"] == "Table 1, FSDP row"
                and r["kind"] == "measured_other_setting"}
    assert len(brackets) == 2
    assert min(brackets) < selective["launcher"] < max(brackets)
    # Under by 4.6% today (reason in the row); more than 10% would be a regression.
    assert -10 < selective["error_pct"] < 5


def test_korthikanti_formulas_are_what_the_analytic_model_computes(rows):
    for where in ("Eq. (1)", "Table 2, full recomputation"):
        assert _one(rows, where)["error_pct"] == 0
    assert _one(rows, "Table 2, selective recomputation (t = 1)", "never stored")[
        "error_pct"] == 0


def test_zero_r_activation_figures_are_estimates_the_launcher_exceeds(rows):
    """ZeRO's "about 60 GB" (8 GB with checkpointing) for the 1.5B GPT-2 at 1K x 32 leaves
    out the attention scores and the logits: the launcher's figure is larger, never smaller."""
    found = [r for r in rows if r["where"] == "Section 3.2, residual states: activations"]
    assert [r["published"] for r in found] == [60, 8]
    assert all(r["kind"] == "estimate" and r["error_pct"] > 0 for r in found)


def test_summary_median_is_over_measured_rows_only(rows):
    summary = bench_published.summarize(rows, [])
    measured = [abs(r["error_pct"]) for r in rows if r["kind"] == "measured"
                and r["error_pct"] is not None]
    assert summary["measured_rows_compared"] == len(measured) >= 5
    assert summary["median_abs_error_pct_measured"] == pytest.approx(
        sorted(measured)[len(measured) // 2] if len(measured) % 2 else
        (sorted(measured)[len(measured) // 2 - 1] + sorted(measured)[len(measured) // 2]) / 2,
        abs=0.01)
    under = summary["under_5pct"]
    assert all(u["error_pct"] < -5 and u["why"] for u in under)
    assert {u["row"] for u in under} >= {
        f"{r['source']}, {r['where']}: {r['configuration']}" for r in rows
        if r["kind"] == "measured" and r["error_pct"] is not None and r["error_pct"] < -5}


def test_rows_are_analytic_without_traces(rows):
    """The test's rows are the ``--no-trace`` table: no traced figure, the analytic answer, and
    the reason in ``traced_how`` for every row that a trace would fill."""
    assert not bench_published.TRACE["on"]
    assert all(r["traced"] is None and r["answer"] == "analytic" for r in rows)
    bert = _one(rows, "section: fp16")
    assert bert["traced_how"] == "not traced (--no-trace)"
    assert bert["answer_error_pct"] == bert["error_pct"]


def test_hf_batch_4_runs_are_under_by_the_reserve_their_readings_imply(rows):
    """bert-large + its 2-class head at batch 4 (fp32 14949 MiB, fp16 13939, 8-bit Adam 13085):
    with the run's classifier computed (no MLM logits), the analytic plan is 5-10% under, and
    each row says the reserve the reading implies over the launcher's allocated peak (1.15-1.21
    against the fixed 1.08). The micro-batch-1 runs imply 1.01-1.07: one fixed ratio cannot
    serve both (docs/estimator.md, Not done yet)."""
    implied = {}
    for where in ("Vanilla training (also on the anatomy page)", "section: fp16",
                  "section: 8-bit Adam (bitsandbytes Adam8bit)",
                  "section: accumulation + gradient checkpointing"):
        row = _one(rows, where)
        match = re.search(r"implies (\d\.\d\d) x", row["explanation"])
        assert match, row["explanation"]
        implied[where] = float(match.group(1))
        if "checkpointing" not in where:
            assert -12 < row["error_pct"] < 0, (where, row["error_pct"])
            assert row["explanation"].startswith("under, missing feature")
    assert min(v for k, v in implied.items() if "checkpointing" not in k) > 1.1
    assert implied["section: accumulation + gradient checkpointing"] < 1.08


def test_torchtitan_pr165_fsdp2_rows(rows):
    """torchtitan PR #165: Llama 7B, FSDP2 over 8 H100s, batch 8 x 2048, full and selective AC,
    in percent of 95.0396 GiB. The allocated side (peak active) is within 5%; the reserved side
    is under by what the run reserved beyond its active peak (1.36 and 1.20), which the rows
    name as the missing feature."""
    got = {r["configuration"].rsplit(": ", 1)[1] + (" (SAC)" if "(SAC)" in r["where"] else
                                                     " (AC)"): r
           for r in rows if r["source"].startswith("torchtitan PR #165")}
    assert len(got) == 4
    active, reserved = got["peak active (AC)"], got["peak reserved (AC)"]
    assert active["published"] == pytest.approx(0.2392 * 95.0396, abs=0.01)
    assert reserved["published"] == pytest.approx(0.3264 * 95.0396, abs=0.01)
    for key, row in got.items():
        assert row["kind"] == "measured"
        if "active" in key:
            assert abs(row["error_pct"]) < 5, (key, row["error_pct"])
        else:
            assert row["error_pct"] < -5 and row["explanation"].startswith("missing feature")


def test_hf_2022_adamw_rows_run_the_trainers_for_loop_adamw(rows):
    """Trainer's 2022 default optimizer, adamw_hf (transformers.AdamW), steps one parameter at
    a time: the rows say so and the launcher computes it (``optimizer_implementation``). At
    micro-batch 1 with checkpointing foreach's 4 B/param temporary put them +22% and +14% over."""
    for where in ("section: accumulation + gradient checkpointing",
                  "section: accumulation + checkpointing + fp16"):
        row = _one(rows, where)
        assert any("adamw_hf" in a and "'for-loop'" in a for a in row["assumptions"])
        assert 0 < row["error_pct"] < 10


@pytest.mark.slow
def test_traced_column_is_launch_plans_trace(monkeypatch):
    """The traced column runs ``footprints.hf_traced``, as preflight plans with it (a tiny BERT
    here, for time) and caches each setting's trace for the run."""
    pytest.importorskip("transformers")
    monkeypatch.setitem(bench_published.TRACE, "on", True)
    monkeypatch.setattr(bench_published, "_TRACED", {})
    tiny = {**bench_published.BERT_LARGE_UNCASED, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000}
    target = Target(name="V100", gpus=1, memory_bytes=16 * 2**30, generation="volta")
    memory, how = bench_published.traced_memory(tiny, 64, "bf16_mixed", "adamw", False, target,
                                                "single", 1, 1, 2)
    assert memory is not None and memory.total is not None, how
    assert how.startswith("traced single device")
    assert len(bench_published._TRACED) == 1
    again, _ = bench_published.traced_memory(tiny, 64, "bf16_mixed", "adamw", False, target,
                                             "single", 1, 1, 4)
    assert len(bench_published._TRACED) == 1 and again.total > memory.total


def test_torchtune_packed_llama32_3b_in_pure_bf16(rows):
    """torchtune's Llama 3.2 3B full fine-tune, batch 2 x 4096 packed tokens, pure bf16 AdamW on
    one A100 (60.0 GiB peak active): the launcher's 'bf16' precision (8 B/param of model states,
    no master copy) within 5%; the later rows of the table need compile or a chunked loss."""
    (row,) = [r for r in rows if r["source"].startswith("torchtune") and r["kind"] == "measured"]
    assert row["published"] == 60.0 and abs(row["error_pct"]) < 5, row["error_pct"]
    later = [r for r in rows if r["source"].startswith("torchtune") and r is not row]
    assert len(later) == 3 and all(r["kind"] == "needs_feature" for r in later)
