"""The sharded templates (fsdp, hybrid_shard), run for real on the CPU with 2 gloo processes.

FSDP2 computes the same function as DDP, only with the model states split across ranks, so the
reference for every sharded run is a DDP run of the same seed and data: per rank, step by step,
the losses must agree (up to float summation order), and so must the final weights. Then the
sharded checkpoints: the same world size resumes exactly, one process resumes the two-process
checkpoint (DCP reshards it), and half-written or cut-short checkpoints are skipped. Runs are
shared through module fixtures and started concurrently (see ``harness.py``); the tests that need
no run import the rendered script in this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pickle
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader, state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from launcher.render import PLAN_NAME, render
from tests.trainer_templates import harness
from tests.trainer_templates.harness import Pending, Run, import_script, start
from tests.trainer_templates.test_training import (
    METRICS_KEYS,
    OOM_KEYS,
    assert_same_losses,
    assert_same_weights,
)

# The recipe's own fixed data (no dropout): 2 ranks x micro-batch 2 x 2 accumulation steps.
LOADER = {"recipe": "tiny_loader.py", "steps": 8, "micro_batch_size": 2, "grad_accum_steps": 2}
# fp32 sums in another order: DDP all-reduces whole gradients, FSDP reduce-scatters shards.
TOLERANCE = 1e-5
GIB = 2**30
MIB = 2**20


def start_with_plan_keys(job_dir: Path, keys: dict[str, Any], **kwargs: Any) -> Pending:
    """``start`` with extra plan.json keys: the ones the templates read with a default that the
    Plan dataclass does not carry (yet)."""

    def render_with_keys(plan: Any, settings: Any) -> Any:
        job = render(plan, settings)
        document = {**json.loads(job.files[PLAN_NAME]), **keys}
        files = {**job.files, PLAN_NAME: json.dumps(document, indent=2) + "\n"}
        return dataclasses.replace(job, files=files)

    with mock.patch.object(harness, "render", render_with_keys):
        return start(job_dir, **kwargs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every run that needs nothing from another, started together.

    - ``ddp``: the reference, DDP on the recipe's fixed data, 8 steps, checkpoints every 3.
    - ``fsdp``: the same under full sharding, with activation checkpointing on (it must change
      memory, not results) and a recipe that counts reduce-scatters.
    - ``hybrid_2x1`` / ``hybrid_1x2``: hybrid sharding on the two meshes 2 processes allow: two
      "nodes" of one GPU (2 replicas of 1 shard, the plan's nodes x gpus_per_node), and one node
      of two (1 replica of 2 shards, from hybrid_shard_degree, with reshard_after_forward off).
      2x1 keeps only its newest 2 checkpoints.
    - ``zero2_selective``: fsdp keeping gathered weights until the backward (ZeRO-2) with
      selective activation checkpointing.
    - ``fsdp_bf16`` / ``ddp_bf16``: bf16_mixed on a recipe without wrap_modules() (the template
      finds its repeated layers), with dropout, 6 steps.
    - ``oom``: rank 1 runs out of memory in step 2.
    """
    base = tmp_path_factory.mktemp("sharded")
    bf16 = {"recipe": "blocks.py", "precision": "bf16_mixed", "steps": 6, "checkpoint_every": 0}
    started = {
        "ddp": start(base / "ddp", nproc=2, **LOADER),
        "fsdp": start(base / "fsdp", nproc=2, strategy="fsdp", activation_checkpointing=True,
                      **{**LOADER, "recipe": "fsdp_probe.py"}),
        "hybrid_2x1": start(base / "hybrid_2x1", nproc=2, strategy="hybrid_shard", nodes=2,
                            gpus_per_node=1, global_batch_size=8, keep_checkpoints=2, **LOADER),
        "hybrid_1x2": start_with_plan_keys(
            base / "hybrid_1x2", {"hybrid_shard_degree": 2, "reshard_after_forward": False},
            nproc=2, strategy="hybrid_shard", **LOADER),
        "zero2_selective": start(base / "zero2_selective", nproc=2, strategy="fsdp",
                                 reshard_after_forward=False, activation_checkpointing=True,
                                 checkpointing="selective", **LOADER),
        "fsdp_bf16": start(base / "fsdp_bf16", nproc=2, strategy="fsdp", **bf16),
        "ddp_bf16": start(base / "ddp_bf16", nproc=2, strategy="ddp", **bf16),
        "oom": start(base / "oom", nproc=2, strategy="fsdp", recipe="oom_rank1.py", steps=3),
    }
    return {name: pending.wait() for name, pending in started.items()}


@pytest.fixture(scope="module")
def followups(runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Runs that resume from ``fsdp``'s checkpoint of step 3, started together.

    - ``resume``: 2 processes again, without activation checkpointing. Next to step 3 lie a
      newer checkpoint whose shard file of rank 1 is gone (an S3 sync cut short), a newer
      step directory without launch.pt (a killed writer's), and two newer copies of step 3 that
      another job of the account planted (the folder is a bucket prefix they can write): one
      whose .metadata, one whose launch.pt is a pickle that would create a sentinel file.
    - ``resume_on_one``: one process with micro-batch 4: the same 8 samples per step, so its
      loss is the mean of the two ranks' losses. DCP reads both ranks' shards into one.
    """
    base = tmp_path_factory.mktemp("sharded_followups")
    source = runs["fsdp"].check().checkpoint_dir
    decoyed = copy_checkpoint(source, 3, base / "decoyed")
    shutil.copytree(source / "step_00000006", decoyed / "step_00000006")
    (decoyed / "step_00000006" / "__1_0.distcp").unlink()
    (decoyed / "step_00000007").mkdir()
    (decoyed / "step_00000007" / "__0_0.distcp").write_bytes(b"half")
    planted_launch = shutil.copytree(decoyed / "step_00000003", decoyed / "step_00000004")
    torch.save({"step": Planted(base / "launch_pt_ran")}, planted_launch / "launch.pt")
    planted_metadata = shutil.copytree(decoyed / "step_00000003", decoyed / "step_00000005")
    (planted_metadata / ".metadata").write_bytes(pickle.dumps(Planted(base / "metadata_ran")))
    started = {
        "resume": start(base / "resume", nproc=2, strategy="fsdp", checkpoint_dir=decoyed,
                        **LOADER),
        "resume_on_one": start(
            base / "resume_on_one", nproc=1, strategy="fsdp",
            checkpoint_dir=copy_checkpoint(source, 3, base / "on_one"),
            **{**LOADER, "micro_batch_size": 4}),
    }
    return {name: pending.wait() for name, pending in started.items()}


class Planted:
    """A pickle that, unpickled without restriction, creates ``sentinel``."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.sentinel,))


def copy_checkpoint(source: Path, step: int, directory: Path) -> Path:
    """A fresh checkpoint directory holding only ``source``'s checkpoint of ``step``."""
    name = f"step_{step:08d}"
    shutil.copytree(source / name, directory / name)
    return directory


def load_sharded(run: Run, step: int, tmp_path: Path) -> dict[str, Any]:
    """A sharded checkpoint as one state dict ({"model": ..., "optimizer": ...})."""
    out = tmp_path / f"{run.job_dir.name}_{step}.pt"
    dcp_to_torch_save(run.checkpoint_dir / f"step_{step:08d}", out)
    return torch.load(out, weights_only=False)


def load_replicated(run: Run, step: int) -> dict[str, Any]:
    return torch.load(run.checkpoint_dir / f"step_{step:08d}.pt", weights_only=True)


def mean_losses(run: Run) -> dict[int, float]:
    by_rank = [run.losses(rank) for rank in (0, 1)]
    return {step: (by_rank[0][step] + by_rank[1][step]) / 2 for step in by_rank[0]}


# -- training: the same losses and weights as DDP -------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp", "hybrid_2x1", "hybrid_1x2", "zero2_selective"])
def test_sharded_training_matches_ddp_step_by_step(
    runs: dict[str, Run], name: str, tmp_path: Path
) -> None:
    """Every rank's loss of every step, and the final weights, are DDP's. The fsdp run also
    recomputes activations; hybrid_1x2 also keeps gathered weights until the backward;
    zero2_selective (the planner's ZeRO-2 rung) keeps them too and recomputes selectively."""
    run, reference = runs[name].check(), runs["ddp"].check()
    for rank in (0, 1):
        assert list(run.losses(rank)) == list(range(1, 9))
        assert_same_losses(run.losses(rank), reference.losses(rank), tol=TOLERANCE)
    assert run.losses(0) != run.losses(1)  # each rank trained on its own data
    assert_same_weights(load_sharded(run, 8, tmp_path)["model"],
                        load_replicated(reference, 8)["model"], tol=TOLERANCE)


@pytest.mark.slow
def test_accumulation_reduce_scatters_only_on_the_last_micro_step(runs: dict[str, Run]) -> None:
    """The probe recipe counts reduce-scatters before each micro-step: none may happen during the
    first micro-step of a step (set_requires_gradient_sync(False)); one per FSDP unit (2 blocks
    and the root) happens during the last."""
    probes = [json.loads(line) for line in runs["fsdp"].stderr.splitlines()
              if line.startswith('{"rank"')]
    for rank in (0, 1):
        before = [p["reduce_scatters_before"] for p in probes if p["rank"] == rank]
        assert len(before) == 16  # 8 steps x 2 micro-steps
        for step in range(8):
            assert before[2 * step] == before[2 * step + 1] == 3 * step


# A model whose fp32 gradient dwarfs everything else that differs between plans (wide.py: 8
# blocks of 2048 x 2048), 2 ranks x micro-batch 2 x 2 accumulation steps. glibc is told to map
# every block over 64 KiB on its own (MALLOC_MMAP_THRESHOLD_, which also stops it from raising
# that threshold as it frees): a freed tensor then leaves the resident set at once, so the peak
# RSS the metrics report is the peak of live tensors plus a constant runtime. With glibc's
# defaults freed blocks stay in its heap, and these runs' peaks came out in the wrong order.
WIDE = {"recipe": "wide.py", "steps": 4, "micro_batch_size": 2, "grad_accum_steps": 2,
        "lr": 1e-5, "checkpoint_every": 0, "env": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
WIDE_PARAMETERS = 16 * 2048 + 2048 + 8 * (2048 * 2048 + 2048) + 2048 * 16 + 16


@pytest.fixture(scope="module")
def accumulation_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The wide recipe under DDP (the reference), under full sharding reducing on the last
    micro-step only, and under full sharding reducing on every micro-step."""
    base = tmp_path_factory.mktemp("accumulation")
    started = {
        "ddp": start(base / "ddp", nproc=2, strategy="ddp", **WIDE),
        "last": start(base / "last", nproc=2, strategy="fsdp", **WIDE),
        "every": start(base / "every", nproc=2, strategy="fsdp", reduce_every_micro_step=True,
                       **WIDE),
    }
    return {name: pending.wait() for name, pending in started.items()}


@pytest.mark.slow
def test_reducing_every_micro_step_matches_ddp_and_holds_only_gradient_shards(
    accumulation_runs: dict[str, Run],
) -> None:
    """With ``reduce_every_micro_step`` every micro-step reduce-scatters and each rank adds into
    its shard: the same losses as DDP on every rank and step, and a peak lower by the part of
    the unsharded gradient the plain plan holds through the micro-steps and this one never does
    (half of it on 2 ranks), less the transients of the unit being reduced (one 2048 x 2048
    block's 16 MiB unsharded gradient, and its shard as it is added in): measured 56 of 64 MiB.
    """
    every, last = accumulation_runs["every"].check(), accumulation_runs["last"].check()
    ddp = accumulation_runs["ddp"].check()
    for rank in (0, 1):
        assert list(every.losses(rank)) == [1, 2, 3, 4]
        assert_same_losses(every.losses(rank), ddp.losses(rank), tol=TOLERANCE)
    assert every.losses(0) != every.losses(1)
    not_held = 4 * WIDE_PARAMETERS // 2  # the fp32 gradient less this rank's shard
    for rank in (0, 1):
        peak_last = max(m["rss_bytes"] for m in last.of("metrics", rank))
        peak_every = max(m["rss_bytes"] for m in every.of("metrics", rank))
        assert 0.6 * not_held < peak_last - peak_every < 1.1 * not_held, (
            rank, peak_last / MIB, peak_every / MIB, not_held / MIB)


@pytest.mark.slow
def test_every_rank_reports_metrics_and_rank_0_writes_sharded_checkpoints(
    runs: dict[str, Run],
) -> None:
    run = runs["fsdp"]
    for rank in (0, 1):
        metrics = run.of("metrics", rank)
        assert [m["step"] for m in metrics] == list(range(1, 9))
        for m in metrics:
            assert m.keys() == METRICS_KEYS
            assert (m["device"], m["micro_batch_size"], m["grad_accum_steps"]) == ("cpu", 2, 2)
            assert math.isfinite(m["loss"]) and m["rss_bytes"] > 0
    assert [(c["rank"], c["step"], Path(c["path"]).name) for c in run.of("checkpoint")] == [
        (0, 3, "step_00000003"), (0, 6, "step_00000006"), (0, 8, "step_00000008")]
    assert sorted(d["rank"] for d in run.of("done")) == [0, 1]
    assert run.of("done", 0)[0]["checkpoint"] == str(run.checkpoint_dir / "step_00000008")

    # One shard file per rank, DCP's index, and launch.pt: nothing else (no temporary files).
    step_8 = run.checkpoint_dir / "step_00000008"
    assert sorted(p.name for p in step_8.iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "launch.pt"]
    saved = torch.load(step_8 / "launch.pt", weights_only=True)
    assert saved["step"] == 8 and saved["world_size"] == 2 and len(saved["rng"]) == 2
    assert saved["data"] == {"samples_per_rank": 8 * 2 * 2}
    # keep_checkpoints=2 on the hybrid run: step 3 is gone.
    assert sorted(p.name for p in runs["hybrid_2x1"].checkpoint_dir.iterdir()) == [
        "step_00000006", "step_00000008"]


@pytest.mark.slow
def test_bf16_mixed_precision_matches_ddp_autocast(runs: dict[str, Run], tmp_path: Path) -> None:
    """MixedPrecisionPolicy gathers bf16 weights where DDP's autocast casts them: the same bf16
    matmuls, so the losses agree to bf16 rounding. The shards stay fp32, and the layers the
    recipe did not name were found and sharded one by one."""
    run, reference = runs["fsdp_bf16"].check(), runs["ddp_bf16"].check()
    for rank in (0, 1):
        assert_same_losses(run.losses(rank), reference.losses(rank), tol=1e-2)
    losses = mean_losses(run)
    assert all(math.isfinite(v) for v in losses.values())
    assert losses[6] < losses[1]
    assert "sharding each of the 3 Layer blocks" in run.stderr
    state = load_sharded(run, 6, tmp_path)
    assert {t.dtype for t in state["model"].values()} == {torch.float32}
    assert {"layers.0.up.weight", "head.weight"} <= state["model"].keys()


@pytest.mark.slow
def test_out_of_memory_on_one_rank_is_its_json_line(runs: dict[str, Run]) -> None:
    """Rank 1 runs out in the forward pass of step 2: its ``oom`` line says where and how much,
    the job fails, and rank 0 (waiting in a collective) is stopped without a report of its own."""
    run = runs["oom"]
    assert run.returncode != 0, run.stdout
    [oom] = run.of("oom")
    assert oom.keys() == OOM_KEYS
    assert (oom["rank"], oom["phase"], oom["step"], oom["micro_step"]) == (1, "forward", 2, 1)
    assert oom["requested_bytes"] == 2 * GIB
    assert oom["message"].startswith("CUDA out of memory")
    assert sorted(m["rank"] for m in run.of("metrics")) == [0, 1]  # step 1 on both ranks
    assert run.of("done") == []


# -- resuming sharded checkpoints -----------------------------------------------------------------


@pytest.mark.slow
def test_resume_continues_exactly_and_skips_incomplete_checkpoints(
    runs: dict[str, Run], followups: dict[str, Run], tmp_path: Path
) -> None:
    """From step 3, steps 4 to 8 have the uninterrupted run's losses on both ranks, and the run
    ends with its weights. The newer checkpoint missing a shard is skipped with a warning, the
    step directory without launch.pt silently; both are pruned once a checkpoint is written. The
    resumed run does not recompute activations: the checkpoint's keys do not depend on it.

    The planted checkpoints ran nothing: the one whose .metadata names a function is refused
    with one line, the one whose launch.pt does is skipped as not loading (weights_only). Both
    are newer than step 3, so they are among the 3 kept at the end, in step 3's place."""
    run, reference = followups["resume"].check(), runs["fsdp"]
    assert "skipping checkpoint" in run.stderr and "__1_0.distcp" in run.stderr
    base = run.job_dir.parent
    assert not (base / "metadata_ran").exists() and not (base / "launch_pt_ran").exists()
    refused = [line for line in run.stderr.splitlines() if "refusing checkpoint" in line]
    assert len(refused) == 1 and "step_00000005: its .metadata names pathlib.Path.touch" in \
        refused[0], run.stderr
    assert re.search(r"skipping checkpoint \S*step_00000004 that does not load: Weights only",
                     run.stderr), run.stderr
    resumed = [(r["rank"], r["step"], Path(r["path"]).name) for r in run.of("resume")]
    assert sorted(resumed) == [(0, 3, "step_00000003"), (1, 3, "step_00000003")]
    for rank in (0, 1):
        expected = {s: v for s, v in reference.losses(rank).items() if s > 3}
        assert_same_losses(run.losses(rank), expected, tol=1e-6)
    assert_same_weights(load_sharded(run, 8, tmp_path)["model"],
                        load_sharded(reference, 8, tmp_path)["model"], tol=1e-6)
    assert sorted(p.name for p in run.checkpoint_dir.iterdir()) == [
        "step_00000005", "step_00000006", "step_00000008"]


@pytest.mark.slow
def test_resume_on_a_different_world_size(
    runs: dict[str, Run], followups: dict[str, Run], tmp_path: Path
) -> None:
    """The two-process checkpoint resumes in one process: DCP reads both ranks' shards into it,
    and with micro-batch 4 it sees the samples both ranks saw, so its loss is their mean."""
    run, reference = followups["resume_on_one"].check(), runs["fsdp"]
    assert [r["step"] for r in run.of("resume")] == [3]
    assert "world size changed" in run.stderr
    expected = {s: v for s, v in mean_losses(reference).items() if s > 3}
    assert_same_losses(run.losses(), expected, tol=TOLERANCE)
    assert_same_weights(load_sharded(run, 8, tmp_path)["model"],
                        load_sharded(reference, 8, tmp_path)["model"], tol=TOLERANCE)
    assert torch.load(run.checkpoint_dir / "step_00000008" / "launch.pt",
                      weights_only=True)["world_size"] == 1


# -- the rendered script's functions, in this process ---------------------------------------------


@pytest.fixture(scope="module", params=["fsdp", "hybrid_shard"])
def script(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModuleType]:
    module = import_script(request.param, tmp_path_factory.mktemp(request.param))
    yield module
    del sys.modules[module.__name__]


class Layer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.proj = torch.nn.Linear(4, width)


def test_blocks_are_the_recipes_or_else_the_largest_repeated_class(
    script: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    """A transformer's layers, not the experts repeated inside them (more of those, but
    smaller); the recipe's wrap_modules() when it has one; none when nothing repeats."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), Layer(64), Layer(64), torch.nn.ReLU())
    assert script.launch.block_types(model, SimpleNamespace()) == (Layer,)
    assert "sharding each of the 2 Layer blocks" in capsys.readouterr().err
    recipe = SimpleNamespace(wrap_modules=lambda: (torch.nn.Linear,))
    assert script.launch.block_types(model, recipe) == (torch.nn.Linear,)
    assert script.launch.block_types(torch.nn.Linear(2, 2), SimpleNamespace()) == ()
    assert "one FSDP unit" in capsys.readouterr().err


def test_only_complete_step_directories_are_checkpoints(
    script: ModuleType, tmp_path: Path
) -> None:
    for step in (12, 3, 7):
        (tmp_path / f"step_{step:08d}").mkdir()
        (tmp_path / f"step_{step:08d}" / "launch.pt").write_bytes(b"")
    (tmp_path / "step_00000020").mkdir()  # no launch.pt: still being written, or never finished
    (tmp_path / "step_00000001.pt").write_bytes(b"")  # the replicated format's file
    (tmp_path / "notes").mkdir()
    assert [p.name for p in script.CHECKPOINTS.list_checkpoints(tmp_path)] == [
        "step_00000003", "step_00000007", "step_00000012"]
    script.CHECKPOINTS.prune(tmp_path, keep=["step_00000007", "step_00000012"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes", "step_00000001.pt", "step_00000007", "step_00000012"]
    assert script.CHECKPOINTS.list_checkpoints(tmp_path / "missing") == []
    assert script.launch.missing_shards(tmp_path / "step_00000007") == [".metadata"]


def save_dcp(state: dict[str, Any], path: Path) -> Path:
    """``state`` as a DCP checkpoint in this one process (no process group)."""
    state_dict_saver.save(state, checkpoint_id=path, no_dist=True)
    return path


#: DCP in one process without a process group says so each time.
NO_DIST = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@NO_DIST
def test_checkpoint_metadata_is_unpickled_with_dcp_s_names_only(
    script: ModuleType, tmp_path: Path
) -> None:
    """The reader of a checkpoint another job could have written resolves only what DCP's
    metadata is made of: a real checkpoint's .metadata reads back as pickle.load reads it; one
    whose .metadata calls a function is refused before anything runs, where DCP's own reader
    runs it; so is one naming a shard file outside its folder."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    path = save_dcp(script.launch.sharded_state(model, optimizer), tmp_path / "step_00000001")
    metadata = script.launch.checked_reader(path).read_metadata()
    assert metadata.state_dict_metadata == pickle.loads((path / ".metadata").read_bytes()) \
        .state_dict_metadata
    assert script.launch.missing_shards(path) == []

    sentinel = tmp_path / "ran"
    (path / ".metadata").write_bytes(pickle.dumps(Planted(sentinel)))
    with pytest.raises(script.launch.UntrustedCheckpoint, match="names pathlib.Path.touch"):
        script.launch.checked_reader(path).read_metadata()
    with pytest.raises(script.launch.UntrustedCheckpoint):
        script.launch.missing_shards(path)
    assert not sentinel.exists()
    with contextlib.suppress(Exception):  # what it guards against: DCP's reader runs it
        FileSystemReader(path).read_metadata()
    assert sentinel.exists()

    metadata.storage_data = {index: dataclasses.replace(item, relative_path="../elsewhere")
                             for index, item in metadata.storage_data.items()}
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    untrusted = script.launch.UntrustedCheckpoint
    with pytest.raises(untrusted, match="names a shard file '../elsewhere'"):
        script.launch.checked_reader(path).read_metadata()


@NO_DIST
def test_non_tensor_values_of_a_checkpoint_load_as_plain_data_only(
    script: ModuleType, tmp_path: Path
) -> None:
    """DCP stores a state's non-tensor values (the optimizer's lr, betas...) as torch.save'd
    bytes and loads them with weights_only=False; through CheckedReader they load as plain data,
    and a planted object is refused instead of run (DCP's default reader runs it)."""
    sentinel = tmp_path / "ran"
    path = save_dcp({"w": torch.ones(2), "lr": 0.5, "betas": (0.9, 0.99)}, tmp_path / "plain")
    state = {"w": torch.zeros(2), "lr": 0.0, "betas": ()}
    state_dict_loader.load(state, checkpoint_id=path,
                           storage_reader=script.launch.checked_reader(path), no_dist=True)
    assert torch.equal(state["w"], torch.ones(2)) and state["lr"] == 0.5
    assert state["betas"] == (0.9, 0.99)

    path = save_dcp({"w": torch.ones(2), "lr": Planted(sentinel)}, tmp_path / "planted")
    with pytest.raises(CheckpointException, match="Weights only load failed"):
        state_dict_loader.load({"w": torch.zeros(2), "lr": 0.0}, checkpoint_id=path,
                               storage_reader=script.launch.checked_reader(path), no_dist=True)
    assert not sentinel.exists()
    assert torch.load is torch.serialization.load  # restricted for the read only
    with contextlib.suppress(CheckpointException):
        state_dict_loader.load({"w": torch.zeros(2), "lr": 0.0}, checkpoint_id=path,
                               no_dist=True)
    assert sentinel.exists()


def test_a_shard_group_that_does_not_divide_the_processes_is_refused(tmp_path: Path) -> None:
    script = import_script("hybrid_shard", tmp_path)
    try:
        runtime = script.Runtime(rank=0, local_rank=0, world_size=6, device=torch.device("cpu"))
        with pytest.raises(SystemExit, match=re.escape("shard group size (4)")):
            script.device_mesh({"gpus_per_node": 4}, runtime)
    finally:
        del sys.modules[script.__name__]
