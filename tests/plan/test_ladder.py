"""The ladder's rungs between "as asked" and full sharding (issue 13): selective activation
checkpointing before full, ZeRO-2 (FSDP keeping its gathered parameters from forward to backward)
before full sharding; their memory, cost and reasons, and the bf16 weights counted once.

Footprints here are made up so that each rung's fit is decided by arithmetic the test can redo;
``tests/plan/test_planner.py`` covers the seeds with real shapes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.estimate.analytic import ModelShape
from launcher.estimate.footprint import Footprint
from launcher.estimate.overheads import SAFETY_MARGIN
from launcher.plan.cost import ASSUMED_MFU, RECOMPUTE, Hardware, step_cost
from launcher.plan.memory import Target, per_gpu_memory
from launcher.plan.plan import Memory, Plan, checkpointing_key, checkpointing_mode
from launcher.plan.planner import ladder, plan
from launcher.spec import Spec
from launcher.status import ExitStatus

GIB = 2**30
#: Activation bytes per sample of the made-up model under each checkpointing (the estimator's key).
ACTIVATIONS = {False: 8 * GIB, "selective": 4 * GIB, True: 1 * GIB}


def _footprint(key: bool | str, *, parameters: int = GIB // 16, unit: int | None = GIB // 256,
               per_sample: dict[bool | str, int] = ACTIVATIONS) -> Footprint:
    """fp32 AdamW: 4 + 4 + 8 bytes per parameter, and ``per_sample`` activations."""

    def memory_at(micro: int, accum: int = 1) -> Memory:
        states = dict(parameters=4 * parameters, gradients=4 * parameters,
                      optimizer=8 * parameters)
        activations = per_sample[key] * micro
        return Memory(**states, activations=activations, temporary=0,
                      peak_allocated=sum(states.values()) + activations)

    return Footprint(kind="traced", precision="fp32", optimizer="adamw",
                     activation_checkpointing=key, parameters=parameters, memory_at=memory_at,
                     unit_parameters=unit, flops_per_sample=1e12)


def _plan(memory_gib: float, gpus: int = 1, global_batch: int = 1, **spec: object):
    usable = memory_gib * GIB
    target = Target(name="box", gpus=gpus, memory_bytes=round(usable / (1 - SAFETY_MARGIN)),
                    cpu=True, fp32_tflops=100.0)
    values = dict(script=Path("train.py"), mode="recipe", global_batch_size=global_batch * gpus)
    return plan(Spec(**{**values, **spec}), lambda p, o, c: _footprint(c), [target], "local",
                parameters=GIB // 16, source="traced", can_checkpoint=True)


def _rejected(result) -> dict[str, str]:
    return {r.option: r.reason for r in result.rejected}


# -- the order ------------------------------------------------------------------------------------


def test_the_ladder_tries_selective_before_full_and_zero2_before_full_sharding():
    spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=16)
    target = Target(name="box", gpus=8, memory_bytes=80 * GIB, max_nodes=2)
    rungs = [(r.level, r.label) for r in ladder(spec, target, "sagemaker", can_checkpoint=True)]
    assert rungs[:9] == [
        (0, "as asked"), (1, "smaller micro-batch"),
        (2, "selective activation checkpointing"), (2, "activation checkpointing"),
        (3, "fsdp zero2"), (3, "fsdp zero2 + selective checkpointing"),
        (3, "fsdp"), (3, "fsdp + selective checkpointing"), (3, "fsdp + checkpointing")]
    assert (4, "2 nodes, hybrid_shard zero2") in rungs
    assert rungs.index((4, "2 nodes, hybrid_shard zero2")) < rungs.index(
        (4, "2 nodes, hybrid_shard"))
    # no checkpointing to offer: neither kind; pinned full: ZeRO-2 with full checkpointing too
    plain = [r.label for r in ladder(spec, target, "sagemaker", can_checkpoint=False)]
    assert not any("checkpointing" in label for label in plain)
    full = [r.label for r in ladder(dataclasses.replace(spec, checkpointing="full"), target,
                                    "sagemaker", can_checkpoint=True)]
    assert "fsdp zero2 + checkpointing" in full and not any("selective" in x for x in full)


# -- selective activation checkpointing -------------------------------------------------------


def test_selective_checkpointing_is_chosen_when_it_fits_and_full_is_not_needed():
    # 1 GiB of model states; per sample 8 GiB of activations, 4 selective, 1 full; 6 usable
    result = _plan(6)
    chosen = result.chosen
    assert (chosen.checkpointing, chosen.activation_checkpointing, chosen.fits) == (
        "selective", True, True)
    assert chosen.note == "selective activation checkpointing"
    assert [p.checkpointing for p in result.plans] == ["none", "selective"]
    assert "selective checkpointing fits" in _rejected(result)["full activation checkpointing"]
    # selective's recomputation costs less step time than full's would
    assert chosen.step_time_s == pytest.approx(
        result.plans[0].step_time_s * RECOMPUTE["selective"])


def test_full_checkpointing_when_selective_does_not_fit():
    result = _plan(3)
    assert result.chosen.checkpointing == "full"
    reasons = _rejected(result)
    selective = reasons["single on 1 x box, micro-batch 1 with selective activation checkpointing"]
    assert selective.startswith("needs 5.0 GiB per GPU (4.0 GiB of it activations")
    assert "full activation checkpointing" not in reasons


def test_a_pinned_checkpointing_is_the_only_one_tried():
    result = _plan(6, checkpointing="full")
    assert {p.checkpointing for p in result.plans} == {"full"}
    old = _plan(6, activation_checkpointing=False)  # the older flag: no checkpointing at all
    assert {p.checkpointing for p in old.plans} == {"none"}
    assert old.status == ExitStatus.NO_PLAN_FITS


# -- ZeRO-2 ---------------------------------------------------------------------------------------


def test_zero2_is_chosen_when_it_fits_and_full_sharding_is_not_needed():
    # 4 GPUs, 1 GiB of model states: DDP holds 1 GiB + activations; ZeRO-2 a quarter of the
    # states plus the whole model's weights gathered (0.25 GiB, fp32) and one unit's gradient
    per_sample = {False: GIB // 8, "selective": GIB // 16, True: GIB // 64}
    states = 16 * (GIB // 16)

    def run(usable_gib: float):
        target = Target(name="box", gpus=4, cpu=True,
                        memory_bytes=round(usable_gib * GIB / (1 - SAFETY_MARGIN)))
        spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=4)
        return plan(spec, lambda p, o, c: _footprint(c, per_sample=per_sample), [target],
                    "local", parameters=GIB // 16, source="traced", can_checkpoint=True)

    # DDP: 1 GiB + 0.125 of activations; ZeRO-2: 0.25 + 0.25 + 0.125 + 1/64: 0.64 GiB
    result = run(0.8)
    chosen = result.chosen
    assert (chosen.strategy, chosen.reshard_after_forward, chosen.checkpointing) == (
        "fsdp", False, "none")
    assert chosen.zero2 and chosen.strategy_label == "fsdp zero2"
    weights = 4 * (GIB // 16)
    assert chosen.memory.parameters == weights // 4 + weights  # its shard + all of them gathered
    assert chosen.memory.gradients == states // 4 // 4 and chosen.memory.optimizer == states // 8
    reasons = _rejected(result)
    assert "ZeRO-2 fits" in reasons["full sharding (fsdp, parameters resharded after forward)"]
    assert "1.5 x the communication" in reasons[
        "full sharding (fsdp, parameters resharded after forward)"]
    # too small for the gathered weights: full sharding, and ZeRO-2's tries in the reasons
    tight = run(0.55)
    assert (tight.chosen.strategy, tight.chosen.reshard_after_forward) == ("fsdp", True)
    assert tight.chosen.checkpointing == "none"
    zero2 = [r for r in tight.rejected if r.option.startswith("fsdp zero2 on 4 x box")]
    assert len(zero2) == 2  # without and with selective checkpointing
    assert all("keeps every block's gathered weights" in r.reason for r in zero2)


def test_zero2_holds_the_whole_model_gathered_in_forward_and_backward_only():
    """Traced phases: ZeRO-2 = full sharding + the model's compute-dtype weights as parameters
    in forward and backward, and one unit's unsharded gradient instead of three units."""
    n, unit = GIB // 8, GIB // 64
    phases = {
        "forward": Memory(parameters=4 * n, gradients=0, optimizer=8 * n,
                          activations=3 * GIB, temporary=0, peak_allocated=15 * GIB // 2),
        "backward": Memory(parameters=4 * n, gradients=2 * n, optimizer=8 * n,
                           activations=2 * GIB, temporary=GIB // 2, peak_allocated=7 * GIB),
        "optimizer": Memory(parameters=4 * n, gradients=4 * n, optimizer=8 * n,
                            activations=0, temporary=4 * n, peak_allocated=10 * GIB // 2),
    }

    def phases_at(b: int, accum: int = 1) -> dict[str, Memory]:
        return {k: dataclasses.replace(m, activations=m.activations * b) for k, m in phases.items()}

    fp = Footprint(kind="traced", precision="fp32", optimizer="adamw",
                   activation_checkpointing=False, parameters=n, unit_parameters=unit,
                   memory_at=lambda b, a=1: phases["optimizer"], phases_at=phases_at)
    cpu = Target(name="t", gpus=8, memory_bytes=None, cpu=True)
    fsdp = per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=1)
    zero2 = per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=1, reshard_after_forward=False)
    # the forward's peak is the largest either way: 0.5 + 1 GiB of shards, 3 of activations
    assert fsdp.peak_allocated == (4 * n + 8 * n) // 8 + 3 * GIB + 3 * unit * 4
    assert zero2.peak_allocated == (4 * n + 8 * n) // 8 + 3 * GIB + unit * 4 + 4 * n
    assert zero2.parameters == 4 * n // 8 + 4 * n and fsdp.parameters == 4 * n // 8
    # replicated strategies: the option changes nothing
    assert per_gpu_memory(fp, cpu, "ddp", 1, 8, micro=1, reshard_after_forward=False) == \
        per_gpu_memory(fp, cpu, "ddp", 1, 8, micro=1)


def test_zero2_gathers_once_per_step():
    hw = Hardware(peak_tflops=100.0, intra_node_gbytes_per_s=100.0, inter_node_gbps=None,
                  price_per_hour=1.0)
    common = dict(flops_per_sample=1e12, global_batch=8, world=8, nodes=1, strategy="fsdp",
                  checkpointing=False, gradient_bytes=None, parameter_bytes_compute=10**10,
                  steps=1, hw=hw)
    zero2, fsdp = step_cost(**common, gathers=1), step_cost(**common)
    compute = 8 * 1e12 / (8 * 100.0 * 1e12 * ASSUMED_MFU)
    comm = 3 * 7 / 8 * 10**10 / 100e9  # two all-gathers and a reduce-scatter
    assert fsdp.step_time_s == pytest.approx(compute + comm)
    assert zero2.step_time_s == pytest.approx(compute + comm * 2 / 3)  # one all-gather less
    assert RECOMPUTE["none"] < RECOMPUTE["selective"] < RECOMPUTE["full"]
    assert step_cost(**{**common, "checkpointing": "selective"}).step_time_s < step_cost(
        **{**common, "checkpointing": True}).step_time_s


# -- bf16_mixed under sharding: each byte once ------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16_mixed", "fp32"])
def test_autocast_weight_copies_are_not_counted_again_as_fsdp_gathers(precision):
    """On one device bf16_mixed keeps autocast's bf16 copy of each weight until the backward:
    activations that do not grow with the micro-batch. A sharded rank gathers its weights in
    bf16 instead (counted as the gather), so the copies leave its activations; fp32 has none."""
    n, unit = GIB // 8, GIB // 64
    casts, per_sample = 2 * n * 3 // 4, GIB  # three quarters of the weights are matmuls'

    def phases_at(b: int, accum: int = 1) -> dict[str, Memory]:
        acts = casts + b * per_sample
        return {"backward": Memory(parameters=4 * n, gradients=2 * n, optimizer=8 * n,
                                   activations=acts, temporary=0,
                                   peak_allocated=14 * n + acts),
                "optimizer": Memory(parameters=4 * n, gradients=4 * n, optimizer=8 * n,
                                    activations=0, temporary=0, peak_allocated=16 * n)}

    fp = Footprint(kind="traced", precision=precision, optimizer="adamw",
                   activation_checkpointing=False, parameters=n, unit_parameters=unit,
                   memory_at=lambda b, a=1: phases_at(b)["backward"], phases_at=phases_at)
    cpu = Target(name="t", gpus=8, memory_bytes=None, cpu=True)
    sharded = per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=2)
    expected = 2 * per_sample + (0 if precision == "bf16_mixed" else casts)
    assert sharded.activations == expected
    compute_bytes = 2 if precision == "bf16_mixed" else 4
    assert sharded.temporary == 3 * unit * compute_bytes  # the gathers, once
    # one device (and DDP) does hold the copies
    assert per_gpu_memory(fp, Target(name="t", gpus=1, memory_bytes=None, cpu=True), "single",
                          1, 1, micro=2).activations == casts + 2 * per_sample


# -- the plan's JSON ------------------------------------------------------------------------------


def test_plan_json_keeps_the_boolean_and_adds_the_mode():
    base = dict(strategy="single", machine="m", nodes=1, gpus_per_node=1, micro_batch_size=1,
                grad_accum_steps=1, global_batch_size=1, precision="fp32", optimizer="adamw",
                steps=1, lr=1e-3)
    old = {**base, "activation_checkpointing": True}  # a plan.json from before
    assert Plan.from_dict(old).checkpointing == "full"
    assert Plan.from_dict({**base, "activation_checkpointing": False}).checkpointing == "none"
    selective = Plan(**base, activation_checkpointing=True, checkpointing="selective")
    data = json.loads(json.dumps(selective.to_dict()))
    assert data["activation_checkpointing"] is True and data["checkpointing"] == "selective"
    assert Plan.from_dict(data) == selective
    with pytest.raises(ValueError, match="contradicts"):
        Plan(**base, activation_checkpointing=False, checkpointing="selective")
    # changing either keeps the other in step
    assert selective.replace(activation_checkpointing=False).checkpointing == "none"
    assert selective.replace(checkpointing="none").activation_checkpointing is False
    assert Plan(**base, activation_checkpointing=False).replace(
        checkpointing="selective").activation_checkpointing is True
    assert [checkpointing_key(m) for m in ("none", "selective", "full")] == [
        False, "selective", True]
    assert checkpointing_mode(True) == "full"
    with pytest.raises(ValueError):
        checkpointing_mode("partial")


# -- the command line -----------------------------------------------------------------------------

LLAMA_7B = ("--params", "7B", "--layers", "32", "--hidden-size", "4096", "--heads", "32",
            "--vocab-size", "32000", "--seq-len", "4096", "--precision", "bf16_mixed",
            "--global-batch-size", "8", "--micro-batch-size", "1")


def test_checkpointing_is_pinned_from_the_command_line(cli, write_script):
    script = write_script("print('plain')\n")
    data = cli("plan", str(script), "--provider", "sagemaker", "--machine", "ml.p5.48xlarge",
               "--checkpointing", "selective", *LLAMA_7B, "--json").json()
    assert data["plans"] and {p["checkpointing"] for p in data["plans"]} == {"selective"}
    assert all(p["activation_checkpointing"] is True for p in data["plans"])
    clash = cli("plan", str(script), "--provider", "sagemaker", "--activation-checkpointing",
                "--checkpointing", "none", *LLAMA_7B)
    assert clash.status == ExitStatus.USAGE and "contradict" in clash.stderr
    unknown = cli("plan", str(script), "--provider", "sagemaker", "--checkpointing", "some",
                  *LLAMA_7B)
    assert unknown.status == ExitStatus.USAGE and "none, selective, full" in unknown.stderr


# -- the analytic activations -------------------------------------------------------------------


def test_analytic_selective_keeps_the_policy_s_outputs():
    """A Llama-shaped layer runs q, k, v, o, gate, up, down: the policy keeps q, v, gate and
    down, the attention output and the layer's input; the rest is recomputed a layer at a
    time."""
    s, h, a, i, v, n = 128, 64, 4, 176, 1000, 4
    shape = ModelShape(parameters=10**6, model_type="llama", layers=n, hidden=h, heads=a,
                       kv_heads=2, intermediate=i, vocab=v, seq_len=s)
    none, full = (shape.activation_bytes_per_sample(checkpointing=c) for c in (False, True))
    selective = shape.activation_bytes_per_sample(checkpointing="selective")
    assert full < selective < none
    kv = h * 2 // a
    kept = (s * h + s * h + s * h + s * kv + s * i + s * h) * 2  # input, attn, q, v, gate, down
    layer = (11 * s * h + 2 * s * h + 8 * s * i + 4 * s * h)
    loss = s * v * 12  # the loss: 12 B per logit (LOSS_BYTES_PER_LOGIT)
    edges = 4 * s * h  # the embedding output and the final norm
    # the loss's backward is over before the last layer is recomputed: the larger of the two
    assert selective == n * kept + max(layer - kept, loss) + edges
    assert none == n * layer + loss + edges
    longer = dataclasses.replace(shape, vocab=10)  # a layer's recomputation outweighs the loss
    assert (longer.activation_bytes_per_sample(checkpointing="selective")
            == n * kept + (layer - kept) + edges)


def test_replan_after_an_out_of_memory_at_micro_batch_1_goes_from_selective_to_full():
    from launcher.remedies import replan

    selective = Plan(strategy="single", machine="m", nodes=1, gpus_per_node=1,
                     micro_batch_size=1, grad_accum_steps=4, global_batch_size=4,
                     precision="fp32", optimizer="adamw", activation_checkpointing=True,
                     checkpointing="selective", steps=1, lr=1e-3)
    fixed, why = replan(selective, {"phase": "backward", "cause": "activations"})
    assert (fixed.checkpointing, fixed.activation_checkpointing) == ("full", True)
    assert "full instead of selective" in why
    assert replan(fixed, {"phase": "backward", "cause": "activations"}) is None


def test_a_zero2_plan_near_capacity_is_traced_as_zero2():
    asked: list[tuple] = []

    def rank_memory_at(strategy, nodes, gpus, micro, accum, **kept):
        asked.append((strategy, micro, kept))
        return Memory(parameters=GIB, gradients=GIB // 8, optimizer=GIB // 4, activations=GIB,
                      temporary=0, peak_allocated=3 * GIB)

    fp = dataclasses.replace(_footprint(False), rank_memory_at=rank_memory_at)
    far = Target(name="far", gpus=8, memory_bytes=1000 * GIB, generation="hopper")
    scaled = per_gpu_memory(fp, far, "fsdp", 1, 8, micro=1, reshard_after_forward=False)
    assert asked == []
    near = Target(name="near", gpus=8, generation="hopper",
                  memory_bytes=round(scaled.total / 1.05 / (1 - SAFETY_MARGIN)))
    traced = per_gpu_memory(fp, near, "fsdp", 1, 8, micro=1, reshard_after_forward=False)
    assert asked == [("fsdp", 1, {"reshard_after_forward": False})]
    assert traced.peak_allocated == 3 * GIB
    per_gpu_memory(fp, near, "fsdp", 1, 8, micro=1)
    assert asked[-1] == ("fsdp", 1, {})  # full sharding: asked as before


def test_a_selective_trace_that_fails_skips_its_rungs_unless_pinned():
    from launcher.status import UsageError

    def estimator(precision: str, optimizer: str, key: bool | str) -> Footprint:
        if key == "selective":
            raise UsageError("tracing the recipe failed: the policy could not replay an op")
        return _footprint(key)

    target = Target(name="box", gpus=1, memory_bytes=round(3 * GIB / (1 - SAFETY_MARGIN)),
                    cpu=True)
    spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=1)
    result = plan(spec, estimator, [target], "local", parameters=GIB // 16, source="traced",
                  can_checkpoint=True)
    assert [p.checkpointing for p in result.plans] == ["none", "full"]
    with pytest.raises(UsageError, match="replay"):
        plan(dataclasses.replace(spec, checkpointing="selective"), estimator, [target], "local",
             parameters=GIB // 16, source="traced", can_checkpoint=True)


def test_a_sharded_plan_whose_accumulated_gradients_overflow_is_not_told_nothing_helps():
    """Model states do not depend on the micro-batch, except gradients a sharded plan holds
    unsharded until its last micro-step; the reason must not say "no micro-batch changes that"
    when reduce-scattering every micro-step (a rung the planner tries, and may choose) does."""
    from launcher.plan.reasons import for_failed

    def failed(**kw):
        base = dict(strategy="fsdp", machine="ml.p4d.24xlarge", nodes=1, gpus_per_node=8,
                    micro_batch_size=4, grad_accum_steps=2, global_batch_size=64,
                    precision="bf16_mixed", optimizer="adamw", activation_checkpointing=False,
                    steps=10, lr=1e-4, fits=False,
                    memory=Memory(parameters=20 << 30, gradients=20 << 30, optimizer=10 << 30,
                                  capacity=40 << 30))
        return Plan(**{**base, **kw})

    held = for_failed([failed()], 7_000_000_000)[0].reason
    assert "reduce-scattering on every micro-step shards them" in held
    assert "no micro-batch changes that" not in held
    for other in (failed(grad_accum_steps=1), failed(reduce_every_micro_step=True),
                 failed(strategy="ddp")):
        assert for_failed([other], 7_000_000_000)[0].reason.endswith("no micro-batch changes that")


def test_reshard_after_forward_pins_full_sharding_or_zero2(cli):
    """issue 25: --strategy fsdp always gave ZeRO-2 where it fitted (the whole model's bf16
    weights held: 15 GB of a 7.5B model per GPU); the pin chooses."""
    base = ("plan", "--params", "7.5e9", "--provider", "sagemaker", "--machine",
            "ml.p4de.24xlarge", "--nodes", "8", "--gpus-per-node", "8", "--strategy", "fsdp",
            "--precision", "bf16_mixed", "--micro-batch-size", "1", "--json")
    full = cli(*base, "--reshard-after-forward").json()
    zero2 = cli(*base, "--no-reshard-after-forward").json()
    assert all(p["reshard_after_forward"] for p in full["plans"])
    assert not any(p["reshard_after_forward"] for p in zero2["plans"])
    shard = 7.5e9 * 4 / 64  # the fp32 weights' shard
    assert full["chosen"]["memory"]["parameters"] == pytest.approx(shard, rel=1e-3)
    assert zero2["chosen"]["memory"]["parameters"] == pytest.approx(shard + 7.5e9 * 2,
                                                                    rel=1e-3)
    refused = cli("plan", "--params", "7B", "--provider", "sagemaker", "--strategy", "ddp",
                  "--reshard-after-forward")
    assert refused.status == 2 and "is for fsdp and hybrid_shard" in refused.stderr


# -- a replan is priced by the planner (issue 26 item 4) -----------------------------------------


def test_a_remedy_s_plan_is_priced_for_what_it_changed():
    """A remedy changes a failed plan's settings; ``reevaluate`` works out the memory, fit,
    step time and cost of the plan that will run (they used to be kept from the old plan, and
    the budget was checked against them)."""
    from launcher.plan.planner import reevaluate
    from launcher.remedies import replan

    target = Target(name="box", gpus=1, cpu=True, fp32_tflops=100.0, price_per_hour=3.0,
                    memory_bytes=round(20 * GIB / (1 - SAFETY_MARGIN)))
    spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=2, steps=10)

    def estimator(p, o, c):
        return _footprint(c)

    chosen = plan(spec, estimator, [target], "local", parameters=GIB // 16, source="traced",
                  can_checkpoint=True).chosen
    assert (chosen.micro_batch_size, chosen.checkpointing) == (2, "none")
    # it died at micro-batch 1 of its activations: the remedy is full checkpointing
    failed = chosen.replace(micro_batch_size=1, grad_accum_steps=2)
    fixed, _ = replan(failed, {"cause": "activations", "phase": "forward"})
    assert fixed.checkpointing == "full" and fixed.memory == failed.memory  # as it comes
    priced = reevaluate(spec, estimator, target, fixed)
    assert priced.memory.activations == ACTIVATIONS[True] * 1
    assert priced.memory.peak_allocated < failed.memory.peak_allocated
    unchanged = reevaluate(spec, estimator, target, failed)
    assert priced.step_time_s == pytest.approx(unchanged.step_time_s * RECOMPUTE["full"])
    assert priced.total_cost_usd == pytest.approx(unchanged.total_cost_usd * RECOMPUTE["full"])
    assert priced.fits is True
    assert (priced.note, priced.checkpointing) == (fixed.note, "full")


# -- rungs rejected on the model states counted without a trace ---------------------------------


def test_replica_rungs_whose_counted_states_overflow_ask_for_no_footprint():
    """1 GiB of fp32 AdamW states (16 B x 64M) on GPUs of 0.9 GiB usable: every DDP rung
    overflows on them alone, so none asks the estimator (for a recipe, a trace each); FSDP over
    8 holds 128 MiB of them and is planned from its footprint as before."""
    asked: list[object] = []

    def estimator(precision: str, optimizer: str, checkpointing: object) -> Footprint:
        asked.append(checkpointing)
        return _footprint(checkpointing, per_sample={False: GIB // 8, "selective": GIB // 16,
                                                     True: GIB // 32})

    def floor(precision: str, optimizer: str) -> Footprint:
        return _footprint(False, per_sample={False: 0})

    usable = 0.9 * GIB
    target = Target(name="box", gpus=8, memory_bytes=round(usable / (1 - SAFETY_MARGIN)),
                    cpu=True, fp32_tflops=100.0)
    spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=16)
    result = plan(spec, estimator, [target], "local", parameters=GIB // 16, source="traced",
                  can_checkpoint=True, floor=floor)
    assert result.chosen.strategy == "fsdp" and result.chosen.fits
    ddp = [p for p in result.plans if p.strategy == "ddp"]
    assert ddp and all(p.fits is False and p.memory.model_states == GIB for p in ddp)
    assert set(asked) == {False}  # the sharded rung's only: no DDP checkpointing rung asked
    reasons = [r for o, r in _rejected(result).items() if o.startswith("ddp")]
    assert reasons and all("alone need 1.0 GiB" in r for r in reasons)
    # the same search without the floor asks the estimator on the DDP rungs (and rejects them)
    asked.clear()
    unfloored = plan(spec, estimator, [target], "local", parameters=GIB // 16,
                     source="traced", can_checkpoint=True)
    assert unfloored.chosen == result.chosen
    assert {"selective", True} <= set(asked)


def test_a_floor_that_fits_leaves_the_replica_to_its_footprint():
    """Model states that fit by the count say nothing about activations: the rung is planned
    from its (traced) footprint, as without a floor."""
    asked: list[object] = []

    def estimator(precision: str, optimizer: str, checkpointing: object) -> Footprint:
        asked.append(checkpointing)
        return _footprint(checkpointing)

    result = plan(Spec(script=Path("train.py"), mode="recipe", global_batch_size=1),
                  estimator, [Target(name="box", gpus=1, memory_bytes=round(
                      6 * GIB / (1 - SAFETY_MARGIN)), cpu=True, fp32_tflops=100.0)],
                  "local", parameters=GIB // 16, source="traced", can_checkpoint=True,
                  floor=lambda p, o: _footprint(False, per_sample={False: 0}))
    assert result.chosen.checkpointing == "selective"  # as without a floor (above)
    assert asked[:3] == [False, False, "selective"] and True not in asked  # no full tried
