"""The advisor on the three seeds and on bad input: the right first move, and why not the others.

Plain scripts described by a config or --params, planned for the clouds: no torch import, no
child process, so these run in milliseconds through the in-process CLI.
"""

from __future__ import annotations

import json

import pytest

from launcher.status import ExitStatus
from launcher.units import format_bytes

GPT2_MEDIUM = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16,
               "vocab_size": 50257, "n_positions": 1024}


@pytest.fixture
def plain(write_script):
    return write_script("print('training')\n")


@pytest.fixture
def gpt2_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2_MEDIUM))
    return path


def _rejected(data) -> dict[str, str]:
    return {r["option"]: r["reason"] for r in data["rejected"]}


def _per_sample(phases):
    """``phases_at`` for phases given at micro-batch 1, whose activations grow with the
    micro-batch as a trace's do (none of them is autocast's weight cache)."""
    import dataclasses

    def at(b: int, accum: int = 1):
        return {k: dataclasses.replace(m, activations=m.activations * b,
                                       peak_allocated=m.peak_allocated + m.activations * (b - 1))
                for k, m in phases.items()}
    return at


def test_seed_vertex_single_gpu_oom_gets_a_smaller_micro_batch(cli, plain, gpt2_config):
    # One L4 (24 GB), global batch 64 of 1024 tokens: the activations of 64 sequences overflow.
    result = cli("plan", str(plain), "--provider", "vertex", "--machine", "g2-standard-8",
                 "--model-config", str(gpt2_config), "--global-batch-size", "64", "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    chosen = data["chosen"]
    assert chosen["machine"] == "g2-standard-8" and chosen["strategy"] == "single"
    assert chosen["fits"] is True
    assert chosen["micro_batch_size"] < 64
    assert chosen["micro_batch_size"] * chosen["grad_accum_steps"] == 64  # global batch kept
    assert chosen["activation_checkpointing"] is False and chosen["precision"] == "fp32"
    first = data["plans"][0]
    assert first["micro_batch_size"] == 64 and first["fits"] is False
    # The first (as asked) plan overflows by activations, not model states.
    assert first["memory"]["activations"] > first["memory"]["capacity"] / 2
    reasons = _rejected(data)
    assert "model parallelism or sharding (FSDP)" in reasons
    assert "single GPU" in reasons["model parallelism or sharding (FSDP)"]
    assert "gradient accumulation alone" in reasons
    assert "fp16 / bf16 mixed precision" in reasons
    memory = chosen["memory"]
    assert memory["total"] <= memory["capacity"]
    assert memory["peak_reserved"] >= memory["peak_allocated"]


def test_seed_30b_ddp_is_rejected_with_its_numbers_and_sharded(cli, plain):
    result = cli("plan", str(plain), "--provider", "sagemaker", "--machine",
                 "ml.p4de.24xlarge", "--nodes", "2", "--micro-batch-size", "1",
                 "--global-batch-size", "16", "--params", "30B", "--layers", "60",
                 "--hidden-size", "6656", "--heads", "52", "--vocab-size", "32000",
                 "--seq-len", "2048", "--precision", "bf16_mixed", "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    chosen = data["chosen"]
    assert chosen["strategy"] in ("fsdp", "hybrid_shard", "smp_v2")
    assert (chosen["nodes"], chosen["gpus_per_node"]) == (2, 8)
    assert chosen["fits"] is True
    ddp = [p for p in data["plans"] if p["strategy"] == "ddp"]
    assert ddp and all(p["fits"] is False for p in ddp)
    reasons = _rejected(data)
    ddp_reason = next(v for k, v in reasons.items() if k.startswith("ddp on 2 x 8"))
    assert "16 bytes per parameter x 30.00B = 480 GB" in ddp_reason
    assert "5.6x the 80.0 GiB" in ddp_reason
    assert "SMDDP (SageMaker's data-parallel library)" in reasons
    assert "more nodes or GPUs under DDP" in reasons
    assert "a smaller micro-batch or gradient accumulation" in reasons
    states = chosen["memory"]["parameters"] + chosen["memory"]["gradients"] + \
        chosen["memory"]["optimizer"]
    assert states * 16 >= 480e9 * 0.99 or states * 8 >= 480e9 * 0.99  # sharded 16- or 8-way


def test_params_alone_assume_a_published_shape_and_answer_yes_or_no(cli, plain):
    # issue 25: "30B, Llama-like, 4k context" gets a yes or no, and the plan says what it
    # assumed and how to give the real shape
    data = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge",
               "--nodes", "2", "--micro-batch-size", "1", "--global-batch-size", "16",
               "--params", "30B", "--json").json()
    assert data["model"] == {"parameters": 30_000_000_000, "source": "declared"}
    assert data["chosen"]["fits"] is True
    assert data["chosen"]["memory"]["activations"] > 0
    assert data["chosen"]["seq_len"] == 4096
    assert all(p["fits"] is not None for p in data["plans"])
    assert not any("activations unknown" in note for note in data["notes"])
    assumed = next(n for n in data["notes"] if n.startswith("shape assumed"))
    assert "LLaMA 30B" in assumed and "--model-config" in assumed
    assert "--seq-len" in data["origins"]["seq_len"]


def test_params_with_part_of_a_shape_say_activations_are_unknown(cli, plain):
    # a shape the user began is theirs: nothing is assumed for the flags they left out
    data = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge",
               "--nodes", "2", "--micro-batch-size", "1", "--global-batch-size", "16",
               "--params", "30B", "--layers", "60", "--json").json()
    assert data["chosen"]["fits"] is None
    assert data["chosen"]["memory"]["activations"] is None
    assert any("activations unknown" in note for note in data["notes"])


def test_unpinned_machine_picks_the_cheapest_that_fits(cli, plain, gpt2_config):
    data = cli("plan", str(plain), "--provider", "sagemaker", "--model-config",
               str(gpt2_config), "--global-batch-size", "8", "--json").json()
    chosen = data["chosen"]
    assert chosen["fits"] is True
    fitting = [p for p in data["plans"] if p["fits"] and p["total_cost_usd"] is not None]
    assert chosen["total_cost_usd"] == min(p["total_cost_usd"] for p in fitting)


def test_budget_rejects_and_exits_4(cli, plain, gpt2_config):
    result = cli("plan", str(plain), "--provider", "sagemaker", "--model-config",
                 str(gpt2_config), "--global-batch-size", "8", "--budget", "0.0001", "--json")
    assert result.status == ExitStatus.OVER_BUDGET
    assert "over the $0.00 budget" in result.json()["rejected"][-1]["reason"]


def test_nothing_fits_exits_3(cli, plain):
    result = cli("plan", str(plain), "--provider", "vertex", "--machine", "g2-standard-8",
                 "--params", "70B", "--json")
    assert result.status == ExitStatus.NO_PLAN_FITS
    assert result.json()["chosen"] is None


def test_unknown_machine_suggests_names(cli, plain):
    result = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p4.24xlarge",
                 "--params", "1B")
    assert result.status == ExitStatus.USAGE
    assert "did you mean ml.p4d.24xlarge" in result.stderr


def test_more_gpus_per_node_than_the_machine_has(cli, plain):
    result = cli("plan", str(plain), "--provider", "vertex", "--machine", "g2-standard-8",
                 "--gpus-per-node", "4", "--params", "1B")
    assert result.status == ExitStatus.USAGE
    assert "has 1 GPUs" in result.stderr


def test_zero_budget_is_refused(cli, plain):
    result = cli("plan", str(plain), "--provider", "vertex", "--params", "1B", "--budget", "0")
    assert result.status == ExitStatus.USAGE
    assert "--budget must be a positive" in result.stderr


def test_pins_stay_pinned(cli, plain, gpt2_config):
    data = cli("plan", str(plain), "--provider", "vertex", "--machine", "g2-standard-8",
               "--model-config", str(gpt2_config), "--global-batch-size", "64",
               "--micro-batch-size", "64", "--json")
    assert data.status == ExitStatus.NO_PLAN_FITS
    assert all(p["micro_batch_size"] == 64 for p in data.json()["plans"])


def test_html_report_escapes_and_shows_the_plan(cli, write_script, gpt2_config, tmp_path):
    plain = write_script("print('x')\n", name="<img src=x onerror=alert(1)>.py")
    report = tmp_path / "plan.html"
    result = cli("plan", str(plain), "--provider", "vertex", "--machine", "g2-standard-8",
                 "--model-config", str(gpt2_config), "--global-batch-size", "64",
                 "--report", str(report))
    assert result.status == 0, result.stderr
    html = report.read_text()
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;.py" in html
    assert "Chosen: single on 1 x 1 x g2-standard-8" in html
    assert "gradient accumulation alone" in html
    assert 'class="bar"' in html


def test_calibration_from_earlier_runs_raises_the_estimate(cli, plain, gpt2_config, tmp_path):
    from launcher.estimate.calibration import Record, model_key, record

    args = ("plan", str(plain), "--provider", "vertex", "--machine", "g2-standard-8",
            "--model-config", str(gpt2_config), "--global-batch-size", "64", "--json")
    before = cli(*args).json()["chosen"]["memory"]
    record(tmp_path / "state", Record(
        gpu="g2-standard-8", model=model_key(plain), predicted_allocated=100,
        measured_allocated=110, measured_reserved=143, at=0.0))
    after = cli(*args).json()["chosen"]["memory"]
    assert after["peak_allocated"] > before["peak_allocated"]  # x 1.1: this model's own record
    ratio = after["peak_reserved"] / after["peak_allocated"]
    assert 1.29 < ratio < 1.31  # 143 / 110: the machine's measured allocator slack


def test_sharding_moves_a_traced_peak_from_the_optimizer_step_to_backward():
    """One GPU peaks in the optimizer step (16 B/param of states, activations gone); sharded 8
    ways the states shrink and the backward pass, with its activations, is the peak. The
    planner must shard each traced phase before taking the maximum (the bug this replaces took
    the single-device peak's breakdown, where activations are 0: 62% under a traced FSDP rank).
    """
    from launcher.estimate.footprint import Footprint
    from launcher.plan.memory import Target, per_gpu_memory
    from launcher.plan.plan import Memory

    gib = 2**30
    phases = {
        "backward": Memory(parameters=4 * gib, gradients=2 * gib, optimizer=8 * gib,
                           activations=6 * gib, temporary=1 * gib, peak_allocated=21 * gib),
        "optimizer": Memory(parameters=4 * gib, gradients=4 * gib, optimizer=8 * gib,
                            activations=0, temporary=4 * gib, peak_allocated=20 * gib),
    }
    fp = Footprint(kind="traced", precision="bf16_mixed", optimizer="adamw",
                   activation_checkpointing=False, parameters=gib, unit_parameters=0,
                   memory_at=lambda b, a=1: phases["backward"],
                   phases_at=_per_sample(phases))
    target = Target(name="t", gpus=8, memory_bytes=None, cpu=True)
    memory = per_gpu_memory(fp, target, "fsdp", 1, 8, micro=1)
    # backward: (4 + 2 + 8) / 8 of states + 6 of activations + 1 of activation gradients
    assert memory.peak_allocated == (4 + 2 + 8) * gib // 8 + 6 * gib + 1 * gib
    assert memory.activations == 6 * gib
    # while accumulating, the whole gradient stays unsharded until the last micro-step
    accumulating = per_gpu_memory(fp, target, "fsdp", 1, 8, micro=1, accum=4)
    assert accumulating.peak_allocated == (4 + 8) * gib // 8 + 2 * gib + 6 * gib + 1 * gib
    # without the phases (the old scaling), the optimizer-step breakdown would lose them
    single = per_gpu_memory(fp, Target(name="t", gpus=1, memory_bytes=None, cpu=True),
                            "single", 1, 1, micro=1)
    assert single.peak_allocated == 21 * gib


def test_a_sharded_plan_near_capacity_is_sized_by_its_own_ranks_trace():
    """Sharding the single-device trace is on the safe side by tens of percent: near the
    machine's capacity (either side) that decides whether a plan fits, so the rank is traced
    at its world size; far from it the scaled estimate stands and nothing is traced."""
    from launcher.estimate.footprint import Footprint
    from launcher.plan.memory import Target, per_gpu_memory
    from launcher.plan.plan import Memory

    gib = 2**30
    single = Memory(parameters=8 * gib, gradients=8 * gib, optimizer=16 * gib,
                    activations=20 * gib, temporary=0, peak_allocated=52 * gib)
    asked: list[tuple[str, int, int, int, int]] = []

    def rank_memory_at(strategy: str, nodes: int, gpus: int, micro: int, accum: int) -> Memory:
        asked.append((strategy, nodes, gpus, micro, accum))
        return Memory(parameters=1 * gib, gradients=1 * gib, optimizer=2 * gib,
                      activations=10 * gib, temporary=1 * gib, peak_allocated=15 * gib)

    fp = Footprint(kind="traced", precision="bf16_mixed", optimizer="adamw",
                   activation_checkpointing=False, parameters=4 * gib, unit_parameters=0,
                   memory_at=lambda b, a=1: single, rank_memory_at=rank_memory_at)
    from launcher.estimate.overheads import SAFETY_MARGIN

    far = Target(name="big", gpus=8, memory_bytes=400 * gib, generation="hopper")
    scaled = per_gpu_memory(fp, far, "fsdp", 1, 8, micro=4, accum=2)
    assert asked == [] and scaled.peak_allocated > 15 * gib  # far from capacity: not traced
    # a machine on which the scaled estimate is 10% over the usable memory
    usable = scaled.total / 1.10
    near = Target(name="tight", gpus=8, memory_bytes=round(usable / (1 - SAFETY_MARGIN)),
                  generation="hopper")
    memory = per_gpu_memory(fp, near, "fsdp", 1, 8, micro=4, accum=2)
    assert asked == [("fsdp", 1, 8, 4, 2)]
    assert memory.peak_allocated == 15 * gib and memory.activations == 10 * gib
    assert memory.total > memory.peak_allocated  # the GPU overheads still on top
    per_gpu_memory(fp, near, "ddp", 1, 8, micro=4, accum=2)
    assert len(asked) == 1  # DDP: the single device's estimate is the rank's


def test_the_chosen_sharded_plan_is_sized_per_rank_however_far_from_capacity():
    """Far from capacity the sharded estimate is tens of percent off either way; the plan that
    would be chosen is sized from its rank's trace all the same (issue 25), and a rank that
    does not fit sends the search on: on this machine to full sharding, across machines to
    the next one."""
    from pathlib import Path

    from launcher.estimate.footprint import Footprint
    from launcher.plan.memory import Target
    from launcher.plan.plan import Memory
    from launcher.plan.planner import plan
    from launcher.spec import Spec

    gib = 2**30
    # 5 Gi parameters, fp32 AdamW: 80 GiB of states; DDP overflows an 80 GiB GPU
    single = Memory(parameters=20 * gib, gradients=20 * gib, optimizer=40 * gib,
                    activations=4 * gib, temporary=0, peak_allocated=84 * gib)
    asked: list[tuple[str, int, int, bool]] = []

    def rank_memory_at(strategy: str, nodes: int, gpus: int, micro: int, accum: int,
                       reshard_after_forward: bool = True) -> Memory:
        asked.append((strategy, nodes * gpus, micro, reshard_after_forward))
        # ZeRO-2's rank holds more than its estimate said; at 4 ranks nothing fits
        peak = 90 * gib if not reshard_after_forward or nodes * gpus == 4 else 15 * gib
        return Memory(parameters=3 * gib, gradients=3 * gib, optimizer=5 * gib,
                      activations=peak - 11 * gib, temporary=0, peak_allocated=peak)

    fp = Footprint(kind="traced", precision="fp32", optimizer="adamw",
                   activation_checkpointing=False, parameters=5 * gib, unit_parameters=gib // 8,
                   memory_at=lambda b, a=1: single, rank_memory_at=rank_memory_at,
                   flops_per_sample=1e12)
    spec = Spec(script=Path("train.py"), mode="recipe", global_batch_size=8,
                activation_checkpointing=False)

    def machine(name: str, gpus: int, price: float) -> Target:
        return Target(name=name, gpus=gpus, memory_bytes=80 * gib, generation="hopper",
                      price_per_hour=price, fp32_tflops=60.0, bf16_tflops=900.0)

    result = plan(spec, lambda p, o, c: fp, [machine("eight", 8, 10.0)], "sagemaker",
                  parameters=5 * gib, source="traced", can_checkpoint=False)
    chosen = result.chosen
    assert (chosen.strategy, chosen.reshard_after_forward) == ("fsdp", True)
    assert chosen.memory.rank_traced and chosen.memory.peak_allocated == 15 * gib
    assert chosen.memory.headroom == chosen.memory.usable - chosen.memory.total
    # ZeRO-2 was the estimate's choice (far from capacity): its rank said no
    assert ("fsdp", 8, 1, False) in asked and ("fsdp", 8, 1, True) in asked
    zero2 = [p for p in result.plans if p.zero2]
    assert zero2 and not zero2[-1].fits and zero2[-1].memory.rank_traced

    # Across machines: the cheaper four-GPU machine's ranks do not fit, the eight-GPU one's do
    asked.clear()
    result = plan(spec, lambda p, o, c: fp,
                  [machine("four", 4, 1.0), machine("eight", 8, 10.0)], "sagemaker",
                  parameters=5 * gib, source="traced", can_checkpoint=False)
    assert result.chosen.machine == "eight" and result.chosen.memory.rank_traced
    assert {a[1] for a in asked} == {4, 8}


# -- reduce-scatter on every micro-step (issue 14, item 3) ---------------------------------------

LLAMA_13B = ("--params", "13B", "--layers", "40", "--hidden-size", "5120", "--heads", "40",
             "--vocab-size", "32000", "--seq-len", "4096", "--precision", "bf16_mixed",
             "--global-batch-size", "64")


def test_held_gradient_that_overflows_is_reduce_scattered_every_micro_step(cli, plain):
    """13B on 8 x H100 (80 GB), no activation checkpointing: fully sharded, its states are
    24 GiB per GPU, but accumulating 8 micro-batches the plain way holds the whole 48 GiB fp32
    gradient on every GPU through the micro-steps (105 GiB). Reduce-scattering every micro-step
    keeps each GPU's shard only: it fits, for 8 x the gradient's reduce-scatter."""
    data = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p5.48xlarge",
               "--no-activation-checkpointing", *LLAMA_13B, "--json").json()
    chosen = data["chosen"]
    assert (chosen["strategy"], chosen["micro_batch_size"], chosen["grad_accum_steps"]) == (
        "fsdp", 1, 8)
    assert chosen["reduce_every_micro_step"] is True and chosen["fits"] is True
    assert chosen["note"] == "fsdp, reduce-scatter every micro-step"
    [same] = [p for p in data["plans"] if p["strategy"] == "fsdp" and p["micro_batch_size"] == 1
              and not p["reduce_every_micro_step"]]
    assert same["fits"] is False
    gib = 2**30
    assert same["memory"]["gradients"] == pytest.approx(48.4 * gib, rel=0.01)  # whole, fp32
    assert chosen["memory"]["gradients"] == -(-same["memory"]["gradients"] // 8)  # its shard
    assert chosen["memory"]["total"] < same["memory"]["total"] - 40 * gib
    # 7 reduce-scatters more per step: slower, but by little next to the compute
    assert same["step_time_s"] < chosen["step_time_s"] < same["step_time_s"] * 1.05
    reasons = _rejected(data)
    trade = reasons["fsdp on 8 x ml.p5.48xlarge, gradients reduced on the last micro-step only"]
    assert trade.startswith("reduce-scatter every micro-step: gradients 48.4 GiB -> 6.1 GiB per "
                            "GPU, 8 x the gradient communication (step 7.37 s -> 7.54 s)")
    needs = format_bytes(same["memory"]["total"])
    assert needs.startswith("10")  # about 105 GiB (GPU overheads included)
    assert f"needs {needs}, more than the 75.2 GiB usable" in trade
    # the plain plan's own line says what it needs
    assert f"needs {needs} per GPU" in reasons["fsdp on 8 x ml.p5.48xlarge, micro-batch 1"]
    # ZeRO-2 came first (less communication) and did not fit even reducing every micro-step:
    # it keeps the whole model's bf16 weights (26 GB) gathered through forward and backward
    zero2 = [p for p in data["plans"] if not p["reshard_after_forward"]]
    assert zero2 and not any(p["fits"] for p in zero2)
    assert data["plans"].index(zero2[-1]) < data["plans"].index(same)
    assert "ZeRO-2 keeps every block's gathered weights" in reasons[
        "fsdp zero2 on 8 x ml.p5.48xlarge, micro-batch 1, reduce-scatter every micro-step"]


def test_reduce_scatter_every_micro_step_rather_than_a_bigger_machine(cli, plain):
    """Unpinned, the same job either holds the whole gradient on H200s (141 GB) or reduces
    every micro-step on H100s: the cheaper machine wins."""
    data = cli("plan", str(plain), "--provider", "sagemaker", "--no-activation-checkpointing",
               *LLAMA_13B, "--json").json()
    chosen = data["chosen"]
    assert chosen["machine"] == "ml.p5.48xlarge" and chosen["reduce_every_micro_step"] is True
    bigger = [p for p in data["plans"] if p["machine"] == "ml.p5e.48xlarge"
              and p["strategy"] == "fsdp" and p["grad_accum_steps"] > 1]
    assert bigger and bigger[-1]["fits"] and not bigger[-1]["reduce_every_micro_step"]


def test_plain_accumulation_stays_where_it_fits(cli, plain):
    """7B: the plain sharded plan with accumulation fits (the held 26 GiB gradient included),
    so nothing reduces every micro-step, and that option is not even evaluated."""
    data = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p5.48xlarge",
               "--params", "7B", "--layers", "32", "--hidden-size", "4096", "--heads", "32",
               "--vocab-size", "32000", "--seq-len", "4096", "--precision", "bf16_mixed",
               "--global-batch-size", "64", "--json").json()
    chosen = data["chosen"]
    assert (chosen["strategy"], chosen["grad_accum_steps"], chosen["fits"]) == ("fsdp", 8, True)
    assert chosen["reduce_every_micro_step"] is False
    assert chosen["memory"]["gradients"] > 25 * 2**30  # the whole gradient, and it fits
    assert not any(p["reduce_every_micro_step"] for p in data["plans"])
    assert not any("micro-step" in r["option"] for r in data["rejected"])


def test_reducing_every_micro_step_holds_the_gradient_shards_in_the_estimate():
    """Traced phases: while accumulating, the plain plan keeps the whole gradient; reducing
    every micro-step keeps gradients sharded in every phase. Near capacity the rank's own trace
    (which cannot reduce every micro-step: the trace writes the script's plan values) is taken
    without accumulation, plus the gradient shards the later micro-steps hold."""
    from launcher.estimate.footprint import Footprint
    from launcher.estimate.overheads import SAFETY_MARGIN
    from launcher.plan.memory import Target, per_gpu_memory
    from launcher.plan.plan import Memory

    gib = 2**30
    phases = {
        "backward": Memory(parameters=4 * gib, gradients=2 * gib, optimizer=8 * gib,
                           activations=6 * gib, temporary=1 * gib, peak_allocated=21 * gib),
        "accum_backward": Memory(parameters=4 * gib, gradients=4 * gib, optimizer=8 * gib,
                                 activations=6 * gib, temporary=1 * gib,
                                 peak_allocated=23 * gib),
        "optimizer": Memory(parameters=4 * gib, gradients=4 * gib, optimizer=8 * gib,
                            activations=0, temporary=4 * gib, peak_allocated=20 * gib),
    }
    asked: list[tuple[str, int, int, int, int]] = []

    def rank_memory_at(strategy: str, nodes: int, gpus: int, micro: int, accum: int) -> Memory:
        asked.append((strategy, nodes, gpus, micro, accum))
        return Memory(parameters=gib // 2, gradients=gib // 4, optimizer=1 * gib,
                      activations=6 * gib, temporary=1 * gib, peak_allocated=8 * gib)

    fp = Footprint(kind="traced", precision="bf16_mixed", optimizer="adamw",
                   activation_checkpointing=False, parameters=gib, unit_parameters=0,
                   memory_at=lambda b, a=1: phases["accum_backward"],
                   phases_at=_per_sample(phases), rank_memory_at=rank_memory_at)
    cpu = Target(name="t", gpus=8, memory_bytes=None, cpu=True)
    held = per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=1, accum=4)
    assert held.gradients == 4 * gib
    assert held.peak_allocated == (4 + 8) * gib // 8 + 4 * gib + 6 * gib + 1 * gib
    every = per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=1, accum=4, reduce_every=True)
    assert every.gradients == gib // 2
    assert every.peak_allocated == (4 + 4 + 8) * gib // 8 + 6 * gib + 1 * gib
    # no accumulation, or nothing sharded: the option changes nothing
    assert per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=1, accum=1, reduce_every=True) == \
        per_gpu_memory(fp, cpu, "fsdp", 1, 8, micro=1, accum=1)
    assert per_gpu_memory(fp, cpu, "ddp", 1, 8, micro=1, accum=4, reduce_every=True) == \
        per_gpu_memory(fp, cpu, "ddp", 1, 8, micro=1, accum=4)
    assert asked == []  # the CPU target has no capacity: nothing is near it

    far = Target(name="far", gpus=8, memory_bytes=400 * gib, generation="hopper")
    scaled = per_gpu_memory(fp, far, "fsdp", 1, 8, micro=1, accum=4, reduce_every=True)
    near = Target(name="near", gpus=8, generation="hopper",
                  memory_bytes=round(scaled.total / 1.05 / (1 - SAFETY_MARGIN)))
    memory = per_gpu_memory(fp, near, "fsdp", 1, 8, micro=1, accum=4, reduce_every=True)
    assert asked == [("fsdp", 1, 8, 1, 1)]  # traced without accumulation
    assert memory.peak_allocated == 8 * gib + 4 * gib // 8  # + the shards of the gradient
    assert memory.gradients == gib // 4 + gib // 2


def test_plans_list_each_candidate_once_with_what_reducing_every_micro_step_replaces(cli, plain):
    data = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p5.48xlarge",
               "--no-activation-checkpointing", *LLAMA_13B, "--json").json()
    # SMP v2, tried on the chosen layout after the choice (issue 25), comes after the ladder
    assert data["plans"][-1]["strategy"] == "smp_v2"
    keys = [(p["strategy"], p["reshard_after_forward"], p["micro_batch_size"],
             p["activation_checkpointing"], p["reduce_every_micro_step"]) for p in data["plans"]
            if p["strategy"] != "smp_v2"]
    assert len(keys) == len(set(keys))
    assert keys[-2:] == [("fsdp", True, 1, False, False), ("fsdp", True, 1, False, True)]
