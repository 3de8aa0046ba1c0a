"""The rendered training scripts, run for real on the CPU.

Every claim the templates make is checked by running them: metrics and checkpoints, exact resume,
gradient accumulation (alone and under DDP), precision, activation checkpointing, and a real
out-of-memory failure under an address-space cap. Runs are shared through module fixtures and
started concurrently where independent; see ``harness.py``.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch

from tests.trainer_templates.harness import REPO, Run, copy_checkpoint, start

pytestmark = pytest.mark.slow

METRICS_KEYS = {
    "launch", "rank", "step", "loss", "samples_per_s", "peak_allocated_bytes",
    "peak_reserved_bytes", "rss_bytes", "device", "micro_batch_size", "grad_accum_steps",
}
OOM_KEYS = {
    "launch", "rank", "phase", "step", "micro_step", "micro_batch_size", "grad_accum_steps",
    "batch_shapes", "device", "message", "requested_bytes", "allocated_bytes", "reserved_bytes",
    "max_allocated_bytes", "capacity_bytes", "free_bytes",
}
MIB = 2**20


TINYGPT = REPO / "examples" / "tinygpt" / "train.py"
LOADER = {"recipe": "tiny_loader.py", "steps": 8}
# The out-of-memory recipe's runs: micro-batch 2, 2 accumulation steps.
OOM_PLAN = {"recipe": "oom.py", "micro_batch_size": 2, "grad_accum_steps": 2, "steps": 3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every run that needs nothing from another, started together (most of a run is importing
    torch on one core, so concurrent runs cost far less wall time than one after another).

    - ``tiny``: one process, synthetic data with dropout, micro-batch 4 x 2 accumulation, 6 steps,
      a checkpoint every 2 steps, the newest 2 kept.
    - ``4x2`` / ``8x1``: one process, the recipe's own fixed data (no dropout), 8 steps.
    - ``ddp``: 2 processes x micro-batch 2 x 2 accumulation on the same data, i.e. the same 8
      samples per step as ``8x1``, with a recipe that counts DDP's all-reduces.
    - ``bf16``: ``tiny`` for 3 steps in pure bf16, under torchrun with one process.
    - ``oom_probe``: the out-of-memory recipe without its scratch memory, to measure a baseline.
    - ``tinygpt``: the example recipe with its LAUNCH defaults, in bf16_mixed.
    """
    base = tmp_path_factory.mktemp("runs")
    launch = recipe_launch_defaults(TINYGPT)
    started = {
        "tiny": start(base / "tiny", checkpoint_every=2, keep_checkpoints=2),
        "4x2": start(base / "4x2", micro_batch_size=4, grad_accum_steps=2, **LOADER),
        "8x1": start(base / "8x1", micro_batch_size=8, grad_accum_steps=1, **LOADER),
        "ddp": start(base / "ddp", nproc=2, micro_batch_size=2, grad_accum_steps=2,
                     **{**LOADER, "recipe": "ddp_probe.py"}),
        "bf16": start(base / "bf16", precision="bf16", steps=3, nproc=1),
        "oom_probe": start(base / "oom_probe", **OOM_PLAN),
        "tinygpt": start(
            base / "tinygpt", recipe=str(TINYGPT), micro_batch_size=launch["global_batch_size"],
            grad_accum_steps=1, steps=launch["steps"], lr=launch["lr"],
            seq_len=launch["seq_len"], checkpoint_every=0, precision="bf16_mixed",
        ),
    }
    return {name: pending.wait() for name, pending in started.items()}


@pytest.fixture(scope="module")
def followups(runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Runs that start from what ``runs`` left behind, started together.

    - ``resume_tiny``: ``tiny``'s checkpoint of step 4, next to a newer file that does not load
      (as a cut-short copy leaves), resumed to step 6 with activation checkpointing on (the
      launcher's other fix for memory; it must change memory, not results).
    - ``resume_tiny_selective``: the same with selective checkpointing (each block keeps its
      matmul's output and recomputes tanh and dropout).
    - ``resume_loader``: ``4x2``'s checkpoint of step 6, resumed to step 8. Step 6 is 48 samples
      into a 40-sample dataset: the rebuilt loader is fast-forwarded into its second epoch.
    - ``resume_smaller``: ``8x1``'s checkpoint of step 6, resumed as micro-batch 4 x 2
      accumulation: the launcher's fix for running out of memory.
    - ``oom``: the out-of-memory recipe under an address-space cap set from ``oom_probe``.
    """
    base = tmp_path_factory.mktemp("followups")
    tiny_checkpoints = copy_checkpoint(runs["tiny"].check(), 4, base / "tiny_checkpoints")
    (tiny_checkpoints / "step_00000005.pt").write_bytes(b"truncated")
    started = {
        "resume_tiny": start(base / "resume_tiny", checkpoint_dir=tiny_checkpoints,
                             checkpoint_every=2, activation_checkpointing=True),
        "resume_tiny_selective": start(
            base / "resume_tiny_selective", checkpoint_dir=copy_checkpoint(
                runs["tiny"], 4, base / "tiny_checkpoints_selective"),
            checkpoint_every=2, activation_checkpointing=True, checkpointing="selective"),
        "resume_loader": start(
            base / "resume_loader", micro_batch_size=4, grad_accum_steps=2, **LOADER,
            checkpoint_dir=copy_checkpoint(runs["4x2"].check(), 6, base / "loader_checkpoints"),
        ),
        "resume_smaller": start(
            base / "resume_smaller", micro_batch_size=4, grad_accum_steps=2, **LOADER,
            checkpoint_dir=copy_checkpoint(runs["8x1"].check(), 6, base / "smaller_checkpoints"),
        ),
        "oom": start(base / "oom", address_space_limit=oom_cap(runs["oom_probe"].check()),
                     env={"OOM_SCRATCH_MIB": "256"}, **OOM_PLAN),
    }
    return {name: pending.wait() for name, pending in started.items()}


def oom_cap(probe: Run) -> int:
    """The address-space cap for the out-of-memory run: the probe's peak virtual size plus
    1.25 GiB. The oom recipe allocates 2 x call x 256 MiB per forward pass at micro-batch 2:
    512 MiB and 1 GiB fit, the third call's 1.5 GiB (step 2, micro-step 1) does not."""
    baseline = max(json.loads(line)["vm_peak_bytes"] for line in probe.stderr.splitlines()
                   if line.startswith('{"vm_peak_bytes"'))
    return baseline + 1280 * MIB


def recipe_launch_defaults(path: Path) -> dict:
    """A recipe's LAUNCH dict, read without importing the recipe."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["LAUNCH"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no LAUNCH")


def load_checkpoint(run: Run, step: int) -> dict:
    return torch.load(run.checkpoint_dir / f"step_{step:08d}.pt", weights_only=True)


def assert_same_losses(actual: dict[int, float], expected: dict[int, float], tol: float) -> None:
    assert actual.keys() == expected.keys()
    for step, loss in actual.items():
        assert abs(loss - expected[step]) <= tol, f"step {step}: {loss} != {expected[step]}"


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=tol), name


def test_single_process_reports_metrics_checkpoints_and_done(runs: dict[str, Run]) -> None:
    run = runs["tiny"]
    metrics = run.of("metrics")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    for m in metrics:
        assert m.keys() == METRICS_KEYS
        assert m["rank"] == 0 and m["device"] == "cpu"
        assert m["micro_batch_size"] == 4 and m["grad_accum_steps"] == 2
        assert math.isfinite(m["loss"]) and m["samples_per_s"] > 0
        # On the CPU the process's peak RSS stands in for the GPU allocator's peaks.
        assert m["peak_allocated_bytes"] is None and m["peak_reserved_bytes"] is None
        assert m["rss_bytes"] > 50 * MIB

    assert [(c["step"], Path(c["path"]).name) for c in run.of("checkpoint")] == [
        (2, "step_00000002.pt"), (4, "step_00000004.pt"), (6, "step_00000006.pt")]
    # keep_checkpoints=2: the oldest is gone, and no temporary file is left behind.
    assert sorted(p.name for p in run.checkpoint_dir.iterdir()) == [
        "step_00000004.pt", "step_00000006.pt"]
    [done] = run.of("done")
    assert done == {"launch": "done", "rank": 0, "step": 6, "loss": metrics[-1]["loss"],
                    "checkpoint": str(run.checkpoint_dir / "step_00000006.pt")}

    saved = load_checkpoint(run, 6)
    assert saved["step"] == 6 and saved["world_size"] == 1 and len(saved["rng"]) == 1
    assert saved["data"] == {"samples_per_rank": 6 * 4 * 2}
    assert {"0.linear.weight", "2.weight"} <= saved["model"].keys()


def test_loss_decreases(runs: dict[str, Run]) -> None:
    losses = runs["8x1"].losses()
    assert all(math.isfinite(v) for v in losses.values())
    assert (losses[7] + losses[8]) / 2 < 0.8 * (losses[1] + losses[2]) / 2


def test_resume_continues_exactly_as_an_uninterrupted_run(
    runs: dict[str, Run], followups: dict[str, Run]
) -> None:
    """Resumed from step 4, the run has the uninterrupted run's losses for steps 5 and 6 and ends
    with its weights: weights, optimizer, data position and the dropout random state continue.
    The newer file that does not load is skipped with a warning. (This run also recomputes
    activations; see the activation checkpointing test.)"""
    run, reference = followups["resume_tiny"].check(), runs["tiny"]
    assert "skipping checkpoint" in run.stderr and "step_00000005.pt" in run.stderr
    assert run.of("resume") == [{"launch": "resume", "rank": 0, "step": 4,
                                 "path": str(run.checkpoint_dir / "step_00000004.pt")}]
    expected = {s: v for s, v in reference.losses().items() if s > 4}
    assert_same_losses(run.losses(), expected, tol=1e-6)
    assert_same_weights(load_checkpoint(run, 6)["model"], load_checkpoint(reference, 6)["model"],
                        tol=1e-6)


def test_resume_fast_forwards_the_recipe_loader_across_an_epoch(
    runs: dict[str, Run], followups: dict[str, Run]
) -> None:
    """The rebuilt loader skips the 12 micro-batches already trained on, into its second epoch,
    whose shuffle is the one the uninterrupted run drew."""
    run = followups["resume_loader"].check()
    assert run.of("resume")[0]["step"] == 6
    expected = {s: v for s, v in runs["4x2"].losses().items() if s > 6}
    assert_same_losses(run.losses(), expected, tol=1e-6)


def test_resume_with_a_smaller_micro_batch_keeps_the_trajectory(
    runs: dict[str, Run], followups: dict[str, Run]
) -> None:
    """Micro-batch 8 replanned as 4 x 2 accumulation: the data position is kept in samples, so
    the resumed run continues 8x1's trajectory (up to float rounding)."""
    run = followups["resume_smaller"].check()
    assert run.of("resume")[0]["step"] == 6
    assert "resumes near" not in run.stderr
    assert {m["micro_batch_size"] for m in run.of("metrics")} == {4}
    expected = {s: v for s, v in runs["8x1"].losses().items() if s > 6}
    assert_same_losses(run.losses(), expected, tol=1e-5)


def test_gradient_accumulation_matches_one_large_micro_batch(runs: dict[str, Run]) -> None:
    """4 x 2 accumulation sees the same 8 samples per step as one micro-batch of 8, so every
    step's loss (the mean of its micro-batch losses) and the final weights agree."""
    assert_same_losses(runs["4x2"].losses(), runs["8x1"].losses(), tol=1e-5)
    assert_same_weights(load_checkpoint(runs["4x2"], 8)["model"],
                        load_checkpoint(runs["8x1"], 8)["model"], tol=1e-5)


def test_ddp_with_accumulation_matches_one_process(runs: dict[str, Run]) -> None:
    """2 ranks x micro-batch 2 x 2 accumulation: both ranks report, the mean of their losses is
    the single process's loss, and the weights end the same."""
    run, reference = runs["ddp"], runs["8x1"]
    by_rank = {rank: run.losses(rank) for rank in (0, 1)}
    assert list(by_rank[0]) == list(by_rank[1]) == list(range(1, 9))
    assert by_rank[0] != by_rank[1]  # each rank trained on its own shard
    mean = {step: (by_rank[0][step] + by_rank[1][step]) / 2 for step in by_rank[0]}
    assert_same_losses(mean, reference.losses(), tol=1e-5)
    assert_same_weights(load_checkpoint(run, 8)["model"], load_checkpoint(reference, 8)["model"],
                        tol=1e-5)
    assert {m["rank"] for m in run.of("metrics")} == {0, 1}
    assert {c["rank"] for c in run.of("checkpoint")} == {0}
    assert sorted(d["rank"] for d in run.of("done")) == [0, 1]
    assert len(load_checkpoint(run, 8)["rng"]) == 2  # both ranks' random states


def test_ddp_reduces_gradients_only_on_the_last_micro_step(runs: dict[str, Run]) -> None:
    """The probe recipe counts DDP all-reduces: none may happen during the first micro-step of a
    step (no_sync), and they happen on the last."""
    probes = [json.loads(line) for line in runs["ddp"].stderr.splitlines()
              if line.startswith('{"rank"')]
    for rank in (0, 1):
        before = [p["allreduces_before"] for p in probes if p["rank"] == rank]
        assert len(before) == 16  # 8 steps x 2 micro-steps
        per_step = before[2] - before[0]
        assert per_step >= 1
        for step in range(8):
            first, second = before[2 * step], before[2 * step + 1]
            assert second == first == step * per_step


def test_bf16_mixed_and_pure_bf16_train_on_the_cpu(runs: dict[str, Run]) -> None:
    """bf16_mixed (the tinygpt run) keeps fp32 weights and autocasts; bf16 stores the weights in
    bf16. The pure bf16 run goes through torchrun with one process, as a single-GPU job does."""
    mixed, pure = runs["tinygpt"].check(), runs["bf16"].check()
    assert list(pure.losses()) == [1, 2, 3]
    for run in (mixed, pure):
        assert all(math.isfinite(v) for v in run.losses().values())
    assert {t.dtype for t in load_checkpoint(mixed, 30)["model"].values()} == {torch.float32}
    assert {t.dtype for t in load_checkpoint(pure, 3)["model"].values()} == {torch.bfloat16}


@pytest.mark.parametrize("name", ["resume_tiny", "resume_tiny_selective"])
def test_activation_checkpointing_gives_the_same_losses(
    runs: dict[str, Run], followups: dict[str, Run], name: str
) -> None:
    """Recomputing the blocks' activations changes memory, not results (dropout included: the
    recomputation replays the same random numbers). The resumed run recomputes; the run that
    wrote its checkpoint did not, and the checkpoint loads all the same (the wrappers leave the
    state dict's keys alone)."""
    run, reference = followups[name].check(), runs["tiny"]
    plan = json.loads((run.job_dir / "plan.json").read_text())
    assert plan["activation_checkpointing"]
    assert plan["checkpointing"] == ("selective" if name.endswith("selective") else "full")
    expected = {s: v for s, v in reference.losses().items() if s > 4}
    assert_same_losses(run.losses(), expected, tol=1e-6)
    assert load_checkpoint(run, 6)["model"].keys() == load_checkpoint(reference, 6)["model"].keys()


def test_out_of_memory_is_one_json_line_and_exit_status_1(followups: dict[str, Run]) -> None:
    """A real CPU out-of-memory error under an address-space cap (see ``oom_cap``): one ``oom``
    line saying where (forward pass of step 2, micro-step 1) and how much, then exit status 1."""
    run = followups["oom"]
    assert run.returncode == 1, run.stderr
    [oom] = run.of("oom")
    assert oom.keys() == OOM_KEYS
    assert (oom["phase"], oom["step"], oom["micro_step"]) == ("forward", 2, 1)
    assert (oom["rank"], oom["device"]) == (0, "cpu")
    assert (oom["micro_batch_size"], oom["grad_accum_steps"]) == (2, 2)
    assert "DefaultCPUAllocator: can't allocate memory" in oom["message"]
    assert oom["requested_bytes"] == 2 * 3 * 256 * MIB  # parsed from the allocator's message
    # The CUDA allocator's numbers do not exist on the CPU.
    assert oom["allocated_bytes"] is oom["capacity_bytes"] is oom["free_bytes"] is None
    assert [e["step"] for e in run.of("metrics")] == [1]
    assert run.of("done") == []
    assert "DefaultCPUAllocator" in run.stderr  # the original error, for a person


def test_tinygpt_example_trains(runs: dict[str, Run]) -> None:
    """The demo recipe with its LAUNCH defaults (16 sequences of 64 bytes, 30 steps, its own
    text data; bf16_mixed here): the loss falls well below its starting value."""
    run = runs["tinygpt"].check()
    steps = recipe_launch_defaults(TINYGPT)["steps"]
    losses = run.losses()
    assert list(losses) == list(range(1, steps + 1))
    assert losses[steps] < losses[1] - 1.0
