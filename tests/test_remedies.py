"""The remedies: the replanner's first moves, as the seeds teach them, and the one order the
planner, the replanner and the failure advice share."""

from launcher.plan.plan import Plan
from launcher.remedies import replan


def _plan(micro=8, accum=1, procs=1, ckpt=False) -> Plan:
    return Plan(strategy="single" if procs == 1 else "ddp", machine="m", nodes=1,
                gpus_per_node=procs, micro_batch_size=micro, grad_accum_steps=accum,
                global_batch_size=micro * accum * procs, precision="fp32", optimizer="adamw",
                activation_checkpointing=ckpt, steps=10, lr=1e-3)


def test_forward_oom_halves_micro_batch_and_keeps_global_batch():
    fixed, why = replan(_plan(micro=8), {"phase": "forward"})
    assert (fixed.micro_batch_size, fixed.grad_accum_steps) == (4, 2)
    assert fixed.global_batch_size == 8
    assert "global batch 8 unchanged" in why


def test_micro_batch_that_does_not_halve_evenly_takes_the_next_divisor():
    plan = _plan(micro=6, procs=2)  # 6 per rank: half is 3
    fixed, _ = replan(plan, {"phase": "backward"})
    assert fixed.micro_batch_size == 3 and fixed.grad_accum_steps == 2
    assert fixed.micro_batch_size * fixed.grad_accum_steps * 2 == plan.global_batch_size


def test_micro_batch_one_turns_on_checkpointing():
    fixed, why = replan(_plan(micro=1, accum=8), {"phase": "forward"})
    assert fixed.activation_checkpointing and fixed.micro_batch_size == 1
    assert "activation checkpointing" in why
    assert replan(_plan(micro=1, ckpt=True), {"phase": "forward"}) is None
    assert replan(_plan(micro=1), {"phase": "forward"}, can_checkpoint=False) is None


def test_model_states_are_not_fixed_by_batch_size():
    assert replan(_plan(micro=8), {"phase": "optimizer"}) is None
    assert replan(_plan(micro=8), {"phase": "forward", "cause": "model_states"}) is None


def test_the_allocators_figures_pick_the_micro_batch_that_fits():
    from launcher.plan.plan import Memory

    GiB = 1024**3
    plan = _plan(micro=16).replace(memory=Memory(
        parameters=2 * GiB, gradients=2 * GiB, optimizer=4 * GiB, framework_overhead=GiB,
        capacity=24 * GiB))
    # At micro-batch 16 the step held 22 GiB and asked for 4 more: 26 GiB. Model states and the
    # context (9 GiB) are fixed; the other 18 GiB are 16 samples' worth, 1.125 GiB a sample.
    failure = {"phase": "forward", "requested_bytes": 4 * GiB, "reserved_bytes": 22 * GiB,
               "capacity_bytes": 24 * GiB}
    fixed, why = replan(plan, failure)
    # 9 + 1.125 m <= 22.8 GiB usable -> m <= 12.3; the largest divisor of 16 below 16 is 8.
    assert fixed.micro_batch_size == 8 and fixed.grad_accum_steps == 2
    assert "allocator's figures" in why
    # A failure far over capacity needs a bigger cut than halving.
    failure["reserved_bytes"], failure["requested_bytes"] = 23 * GiB, 40 * GiB
    fixed, _ = replan(plan, failure)
    assert fixed.micro_batch_size < 8


def test_seed_oom_partway_tells_fragmentation_from_activations():
    """cuda-oom-partway: the log decides. Fragmentation gets expandable segments on the same
    plan; a second OOM (or an activations one) gets the smaller micro-batch."""
    from launcher.failures import explain_lines
    from launcher.render import TrainSettings, plan_env

    # A real fragmentation message (litgpt#303's shape): 8.65 GiB reserved but unallocated,
    # more than the 8.06 GiB asked for.
    log = ["step 57 loss 2.31",
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.06 GiB. GPU 0 has a "
           "total capacity of 23.70 GiB of which 1.27 GiB is free. Of the allocated memory "
           "12.62 GiB is allocated by PyTorch, and 8.65 GiB is reserved by PyTorch but "
           "unallocated."]
    diagnosis = explain_lines(log).to_dict()
    assert diagnosis["cause"] == "fragmentation"
    fixed, why = replan(_plan(micro=8), diagnosis)
    assert fixed.expandable_segments and fixed.micro_batch_size == 8
    assert "expandable_segments:True" in why
    env = plan_env(fixed, TrainSettings(recipe_file="train.py", mode="recipe", run_id="r",
                                        attempt=2))
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    again, _ = replan(fixed, diagnosis)
    assert again.micro_batch_size < 8 and again.expandable_segments


def test_a_failure_is_the_diagnosis_with_the_oom_event_over_it():
    from launcher.events import OomEvent, parse_event, parse_oom
    from launcher.remedies import Failure

    diagnosis = {"failure": "gpu_oom", "cause": "activations", "phase": "forward",
                 "requested_bytes": 2048, "reserved_bytes": 4096, "capacity_bytes": 8192}
    line = ('[rank0]: {"launch": "oom", "rank": 0, "phase": "backward", "micro_batch_size": 8, '
            '"requested_bytes": null, "batch_shapes": [[8, 16]]}')
    event = parse_event(line)
    # as the supervisor records it: every key of the event over the diagnosis's, None included
    record = {**diagnosis, **{k: v for k, v in event.items() if k != "launch"}}
    expected = Failure(phase="backward", cause="activations", requested_bytes=None,
                       reserved_bytes=4096, capacity_bytes=8192, batch_shapes=[[8, 16]])
    assert Failure.of(record) == expected
    assert Failure.of(diagnosis, event) == expected
    oom = parse_oom(line)
    assert oom == OomEvent.from_event(event)
    assert (oom.rank, oom.phase, oom.micro_batch_size, oom.requested_bytes) == (
        0, "backward", 8, None)
    assert Failure.of(diagnosis, oom) == expected
    assert parse_oom('{"launch": "metrics", "step": 3}') is None
    assert parse_oom("no event here") is None
    # the replanner reads a Failure and a record alike
    plan = _plan(micro=8)
    assert replan(plan, expected) == replan(plan, record)
    assert Failure.of(None) == Failure()


def test_one_rule_for_whether_blocks_can_be_checkpointed():
    from launcher.remedies import can_checkpoint

    assert can_checkpoint(("build_model", "wrap_modules"))
    assert not can_checkpoint(("build_model",))
    # a model described by a config or --params is planned by its layers
    assert can_checkpoint((), described=True)


def test_the_planner_and_the_advice_follow_the_remedies_order():
    from pathlib import Path

    from launcher.failures._diagnosis import advice
    from launcher.plan.memory import Target
    from launcher.plan.planner import ladder
    from launcher.remedies import (
        CHECKPOINTING,
        EXPANDABLE_SEGMENTS,
        LADDER,
        REMEDIES,
        SMALLER_MICRO_BATCH,
    )
    from launcher.spec import Spec

    assert [r.name for r in REMEDIES] == [
        "expandable_segments", "smaller_micro_batch", "checkpointing", "sharding", "more_nodes"]
    spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=16)
    target = Target(name="box", gpus=8, memory_bytes=80 * 2**30, max_nodes=2)
    levels = [r.level for r in ladder(spec, target, "sagemaker", can_checkpoint=True)]
    assert levels == sorted(levels) and set(levels) == {r.level for r in LADDER}
    text = advice("gpu_oom", "fragmentation", "forward", "", "")
    assert text.startswith(EXPANDABLE_SEGMENTS.advice)
    assert text.index(EXPANDABLE_SEGMENTS.advice) < text.index(SMALLER_MICRO_BATCH.advice)
    text = advice("gpu_oom", "activations", "forward", "", "")
    assert text.index(SMALLER_MICRO_BATCH.advice) < text.index(CHECKPOINTING.advice)


def test_an_evaluation_oom_gets_no_micro_batch_change_but_the_evaluation_advice():
    """The evaluation loop runs at its own batch (eval_batch_size=32): halving the training
    micro-batch leaves it as it was, so the replanner changes nothing and says what to lower."""
    from launcher.remedies import NoPlanChange

    for failure in ({"phase": "evaluation", "cause": "activations"}, {"phase": "evaluation"},
                    {"phase": "eval", "cause": "activations"},
                    {"phase": "evaluation", "cause": "fragmentation",
                     "requested_bytes": 2**30}):
        plan = _plan(micro=8)
        if failure.get("cause") == "fragmentation":
            plan = plan.replace(expandable_segments=True)
        answer = replan(plan, failure)
        assert isinstance(answer, NoPlanChange), (failure, answer)
        assert "evaluation batch" in answer and "per_device_eval_batch_size" in answer
        assert "eval_accumulation_steps" in answer and "Lightning" in answer
    # Nor checkpointing at micro-batch 1: evaluation keeps nothing for a backward pass.
    assert isinstance(replan(_plan(micro=1), {"phase": "evaluation"}), NoPlanChange)
    # A fragmented allocator is still the allocator's: the same plan with expandable segments.
    fixed, _ = replan(_plan(micro=8), {"phase": "evaluation", "cause": "fragmentation"})
    assert fixed.expandable_segments and fixed.micro_batch_size == 8
