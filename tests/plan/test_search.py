"""A search over a provider's machines for a big model (issue 25 items 3 and 7): priced machines
first, the runner-up's loss in a line, SMP v2 beside FSDP on SageMaker, one line per distinct
reason, and ``--all`` that reads in a screen or two. Described by ``--params`` alone: no child
process, milliseconds each."""

from __future__ import annotations

from launcher.status import ExitStatus


def _rejected(data) -> dict[str, str]:
    return {r["option"]: r["reason"] for r in data["rejected"]}


def test_a_priced_machine_is_chosen_over_an_unpriced_one_that_fits_on_fewer_nodes(cli):
    # issue 25: 70B on Vertex chose 1 x a3-ultragpu-8g ($/h unknown) over priced H100s
    data = cli("plan", "--provider", "vertex", "--params", "70B", "--json").json()
    chosen = data["chosen"]
    assert chosen["fits"] is True and chosen["total_cost_usd"] is not None
    unpriced = [p for p in data["plans"] if p["fits"] and p["total_cost_usd"] is None]
    assert unpriced  # there were unpriced machines that fit, on fewer nodes even
    assert min(p["nodes"] for p in unpriced) < chosen["nodes"]
    reasons = _rejected(data)
    runner = [k for k in reasons if k.startswith("runner-up ")]
    assert len(runner) == 1 and "more than the chosen" in reasons[runner[0]]
    faster = [k for k in reasons if k.startswith("faster ")]
    assert faster and "has no price in the catalog" in reasons[faster[0]]
    assert all("\n" not in r for r in reasons.values())  # a line each
    assert not any("has no price" in n for n in data["notes"])  # the chosen one has a price


def test_an_unpriced_machine_is_chosen_when_nothing_priced_fits_and_the_plan_says_so(cli):
    data = cli("plan", "--provider", "sagemaker", "--params", "40B", "--nodes", "1",
               "--json").json()
    chosen = data["chosen"]
    assert chosen["total_cost_usd"] is None and chosen["machine"].startswith("ml.p5e")
    assert not any(p["fits"] and p["total_cost_usd"] is not None for p in data["plans"])
    note = next(n for n in data["notes"] if "has no price in the catalog" in n)
    assert "no priced machine fits" in note
    reasons = _rejected(data)
    cheaper = next(k for k in reasons if k.startswith("cheaper: "))
    assert "usable" in reasons[cheaper] or "alone need" in reasons[cheaper]


def test_a_pinned_unpriced_machine_says_its_cost_is_unknown(cli):
    data = cli("plan", "--provider", "vertex", "--machine", "a3-ultragpu-8g", "--params", "7B",
               "--json").json()
    assert data["chosen"]["total_cost_usd"] is None
    assert any("it is the machine asked for" in n for n in data["notes"])
    result = cli("plan", "--provider", "vertex", "--machine", "a3-ultragpu-8g", "--params",
                 "7B", "--budget", "5", "--json")
    assert result.status == ExitStatus.OVER_BUDGET


def test_the_seed_30b_gets_a_yes_bf16_mixed_and_smp_v2_beside_fsdp(cli):
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes",
               "2", "--params", "30B", "--json").json()
    chosen = data["chosen"]
    assert chosen["fits"] is True and chosen["precision"] == "bf16_mixed"
    assert chosen["strategy"] in ("fsdp", "hybrid_shard")
    smp = [p for p in data["plans"] if p["strategy"] == "smp_v2"]
    assert len(smp) == 1 and (smp[0]["nodes"], smp[0]["gpus_per_node"]) == (2, 8)
    reason = next(v for k, v in _rejected(data).items() if k.startswith("smp_v2 on 2 x 8"))
    assert "SageMaker's model-parallel library" in next(
        k for k in _rejected(data) if k.startswith("smp_v2"))
    # its default shard groups are one node: twice FSDP-over-16's model states per GPU
    assert smp[0]["memory"]["optimizer"] == 2 * chosen["memory"]["optimizer"]
    assert ("shard groups of one node" in reason) == (smp[0]["fits"] is False)


def test_smp_v2_is_shown_on_the_chosen_plans_own_settings_with_why_it_does_not_fit(cli):
    """Like for like: the chosen ZeRO-2 plan reduce-scatters on every micro-step; SMP v2 as
    rendered holds the whole gradient through the accumulation, which the reason says, and it
    is not searched on with more checkpointing (for a traced recipe that was a trace of its
    own)."""
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4d.24xlarge", "--params",
               "7B", "--global-batch-size", "64", "--seq-len", "2048", "--json").json()
    chosen = data["chosen"]
    assert chosen["reduce_every_micro_step"] and chosen["grad_accum_steps"] > 1
    (smp,) = [p for p in data["plans"] if p["strategy"] == "smp_v2"]
    same = ("micro_batch_size", "grad_accum_steps", "checkpointing", "nodes", "gpus_per_node")
    assert {k: smp[k] for k in same} == {k: chosen[k] for k in same}
    assert smp["fits"] is False
    reason = next(v for k, v in _rejected(data).items() if k.startswith("smp_v2"))
    assert f"through the {chosen['grad_accum_steps']} micro-steps" in reason
    assert "reduce-scatters on every one" in reason


def test_no_smp_v2_off_sagemaker_nor_when_a_strategy_is_pinned(cli):
    vertex = cli("plan", "--provider", "vertex", "--machine", "a2-ultragpu-8g", "--nodes", "2",
                 "--params", "30B", "--json").json()
    assert not any(p["strategy"] == "smp_v2" for p in vertex["plans"])
    pinned = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes",
                 "2", "--params", "30B", "--strategy", "fsdp", "--json").json()
    assert not any(p["strategy"] == "smp_v2" for p in pinned["plans"])


def test_one_line_per_distinct_reason(cli):
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes",
               "2", "--params", "30B", "--json").json()
    ddp = [r for r in data["rejected"] if r["option"].startswith("ddp on 2 x 8")]
    assert len(ddp) == 1  # it was one line per checkpointing level
    assert ddp[0]["option"].endswith("with no, selective or full activation checkpointing")
    reasons = [r["reason"] for r in data["rejected"]]
    assert len(reasons) == len(set(reasons))


def test_all_reads_by_gpu_type_in_a_screen_or_two(cli):
    result = cli("plan", "--provider", "vertex", "--params", "70B", "--all")
    lines = result.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("   ", "→  "))]
    assert len(rows) < 100  # it was 3,344 lines
    headers = [line for line in rows if " fit" in line and " of " in line]
    assert any(line.split()[0] == "H100-80GB" for line in headers)
    assert "--json lists every one" in result.stdout
    assert max(len(line.rstrip()) for line in lines if not line.startswith("█")) <= 100
    chosen = [line for line in rows if line.startswith("→")]
    assert len(chosen) == 1
