"""launch_runtime.py's functions (the rendered scripts' ``launch.`` names), imported in this
process (no subprocess, no torchrun).

The runtime is a plain module of definitions, so importing it trains nothing; these tests cover
the cases a whole run does not reach cheaply.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from launcher.render import RUNTIME_NAME, runtime_source


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """launch_runtime.py as a job imports it (``launch`` in the rendered scripts)."""
    path = tmp_path_factory.mktemp("job") / RUNTIME_NAME
    path.write_text(runtime_source())
    spec = importlib.util.spec_from_file_location("launch_runtime_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def cpu_runtime(launch: ModuleType, rank: int = 0, world_size: int = 1) -> object:
    return launch.Runtime(rank=rank, local_rank=rank, world_size=world_size,
                          device=torch.device("cpu"))


Pair = namedtuple("Pair", "tokens weights")


def test_batches_move_recursively_and_pure_bf16_casts_only_floats(launch: ModuleType) -> None:
    batch = {
        "ids": torch.arange(4),
        "nested": [torch.ones(2), (torch.zeros(1), "label")],
        "pair": Pair(torch.arange(2), torch.ones(2)),
        "count": 3,
    }
    moved = launch.move_to_device(batch, torch.device("cpu"), torch.bfloat16)
    assert moved["ids"].dtype == torch.int64  # token ids are never cast
    assert isinstance(moved["nested"], list) and isinstance(moved["nested"][1], tuple)
    assert moved["nested"][0].dtype == moved["nested"][1][0].dtype == torch.bfloat16
    assert moved["nested"][1][1] == "label" and moved["count"] == 3
    assert isinstance(moved["pair"], Pair) and moved["pair"].weights.dtype == torch.bfloat16
    kept = launch.move_to_device(batch, torch.device("cpu"), None)
    assert kept["nested"][0].dtype == torch.float32


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)",
         20 * 2**20),
        ("Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.15 GiB", 3 * 2**29),
        ("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: you "
         "tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)", 2**32),
        ("something else entirely", None),
    ],
)
def test_requested_bytes_are_read_from_the_allocators_message(
    launch: ModuleType, message: str, expected: int | None
) -> None:
    assert launch.requested_bytes(message) == expected


def test_out_of_memory_errors_are_recognized_also_when_wrapped(launch: ModuleType) -> None:
    assert launch.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert launch.is_out_of_memory(MemoryError())
    assert launch.is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes"))
    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise ValueError("a recipe's own error") from inner
    except ValueError as outer:
        assert launch.is_out_of_memory(outer)
    assert not launch.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not launch.is_out_of_memory(KeyError("idx"))


def test_the_default_stream_is_a_function_of_its_index(launch: ModuleType) -> None:
    """Micro-batch i is the same whether the stream starts at 0 or resumes at i, differs per
    rank, and drawing it leaves the training random state alone."""
    recipe = SimpleNamespace(example_batch=lambda n: torch.randn(n, 3))
    runtime = cpu_runtime(launch)
    state = torch.get_rng_state()
    from_start = list(itertools.islice(launch.synthetic_stream(recipe, 2, 0, runtime, 0), 5))
    resumed = list(itertools.islice(launch.synthetic_stream(recipe, 2, 0, runtime, 3), 2))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(from_start[3:], resumed, strict=True))
    assert not torch.equal(from_start[0], from_start[1])
    other_rank = next(launch.synthetic_stream(recipe, 2, 0, cpu_runtime(launch, 1, 2), 0))
    assert not torch.equal(from_start[0], other_rank)


def test_a_one_shot_generator_is_refused_at_its_second_epoch(launch: ModuleType) -> None:
    loader = (torch.ones(1) for _ in range(2))
    stream = launch.loader_stream(loader, 0, cpu_runtime(launch))
    assert len([next(stream), next(stream)]) == 2
    with pytest.raises(SystemExit, match="yielded no batch in epoch 1"):
        next(stream)


@pytest.mark.parametrize(
    ("saved", "micro", "world", "skip", "warns"),
    [
        (None, 4, 1, 0, False),
        ({"samples_per_rank": 48, "world_size": 1}, 4, 1, 12, False),  # same plan
        ({"samples_per_rank": 48, "world_size": 1}, 8, 1, 6, False),  # larger micro-batch
        ({"samples_per_rank": 24, "world_size": 2}, 2, 2, 12, False),  # 2 ranks
        ({"samples_per_rank": 48, "world_size": 1}, 5, 1, 9, True),  # 48 is not 9 x 5
    ],
)
def test_resume_position_is_kept_in_samples(
    launch: ModuleType, capsys: pytest.CaptureFixture, saved: dict | None, micro: int,
    world: int, skip: int, warns: bool,
) -> None:
    checkpoint = None if saved is None else {
        "data": {"samples_per_rank": saved["samples_per_rank"]}, "world_size": saved["world_size"]}
    runtime = cpu_runtime(launch, 0, world)
    assert launch.micro_batches_to_skip(checkpoint, {"micro_batch_size": micro}, runtime) == skip
    assert ("resumes near" in capsys.readouterr().err) == warns


def test_activation_checkpointing_without_wrap_modules_says_what_to_add(
    launch: ModuleType,
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(SystemExit, match=r"defines no wrap_modules\(\)"):
        launch.apply_checkpointing(model, SimpleNamespace())
    with pytest.raises(SystemExit, match="no module of wrap_modules"):
        launch.apply_checkpointing(model, SimpleNamespace(wrap_modules=lambda: (torch.nn.ReLU,)))


def test_checkpoints_are_listed_by_step_and_pruned_to_the_newest(
    launch: ModuleType, tmp_path: Path
) -> None:
    for step in (2, 10, 4):
        launch.write_atomically({"step": step}, tmp_path / f"step_{step:08d}.pt")
    (tmp_path / ".step_00000012.pt.abc.tmp").write_bytes(b"half")  # a killed writer's leftover
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    checkpoints = launch.WholeCheckpoints(unwrap=lambda model: model)
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path)] == [
        "step_00000002.pt", "step_00000004.pt", "step_00000010.pt"]
    checkpoints.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt", "step_00000004.pt", "step_00000010.pt"]
    assert checkpoints.list_checkpoints(tmp_path / "missing") == []


# -- selective activation checkpointing ----------------------------------------------------------


class _AttentionBlock(torch.nn.Module):
    """Four matmuls (query-key-value, output, MLP in and out) around attention, as a transformer
    block runs them: what the selective policy chooses among."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim, bias=False)  # mm, where the others are addmm
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2)
                   for y in self.qkv(self.norm(x)).split(d, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def _checkpointed(launch: ModuleType, mode: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_AttentionBlock(), _AttentionBlock())
    if mode != "none":
        launch.apply_checkpointing(model, SimpleNamespace(wrap_modules=lambda: (_AttentionBlock,)),
                                   mode)
    return model


def _step(model: torch.nn.Module) -> tuple[int, dict[str, int], list[torch.Tensor]]:
    """(bytes the forward leaves allocated for the backward, by the CPU allocator's own events;
    the ops the backward ran; the gradients)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            self.counts[name] = self.counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as forward:
        loss = model(x).square().mean()
    kept = sum(e.self_cpu_memory_usage for e in forward.events())
    with Ops() as ops:
        loss.backward()
    return kept, ops.counts, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_checkpointing_recomputes_what_its_policy_drops_with_the_same_gradients(
    launch: ModuleType, mode: str
) -> None:
    """Selective keeps the 1st and 3rd of each block's four matmuls (query-key-value, MLP in)
    and the attention output; full keeps none. The backward recomputes up to the last tensor it
    needs (the last matmul's output is not one: torch stops the recomputation early), so per
    block selective runs one matmul again (the output projection) and never attention, full
    three and attention. Either way the gradients are the uncheckpointed ones."""
    plain_bytes, plain_ops, plain_grads = _step(_checkpointed(launch, "none"))
    kept_bytes, ops, grads = _step(_checkpointed(launch, mode))
    for a, b in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b)

    def matmuls(counts: dict[str, int]) -> int:
        return counts.get("mm", 0) + counts.get("addmm", 0)

    recomputed = matmuls(ops) - matmuls(plain_ops)
    attention = [n for n in ops if n.startswith("_scaled_dot_product") and "backward" not in n]
    if mode == "selective":
        assert recomputed == 2 * 1  # two blocks
        assert attention == []  # kept, not run again
    else:
        assert recomputed == 2 * 3
        assert attention and ops[attention[0]] == 2
    assert kept_bytes < plain_bytes


def test_selective_keeps_more_than_full_and_less_than_nothing(launch: ModuleType) -> None:
    kept = {mode: _step(_checkpointed(launch, mode))[0] for mode in ("none", "selective", "full")}
    assert kept["full"] < kept["selective"] < kept["none"]


def test_checkpointing_mode_reads_old_and_new_plans(launch: ModuleType) -> None:
    assert launch.checkpointing_mode({"activation_checkpointing": True}) == "full"
    assert launch.checkpointing_mode({"activation_checkpointing": False}) == "none"
    assert launch.checkpointing_mode(
        {"activation_checkpointing": True, "checkpointing": "selective"}) == "selective"
    with pytest.raises(SystemExit, match="unknown checkpointing"):
        launch.checkpointing_mode({"activation_checkpointing": True, "checkpointing": "some"})


def test_the_failure_file_is_written_only_where_the_provider_names_one(
    launch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SageMaker shows /opt/ml/output/failure as the job's FailureReason: its provider sets
    LAUNCH_FAILURE_FILE. Without it (the local provider, Vertex) no such file is written, even
    where the folder exists; with it, the first rank to fail wins."""
    target = tmp_path / "output" / "failure"
    target.parent.mkdir()
    monkeypatch.setattr(launch, "FAILURE_FILE", None)
    launch.write_failure_file({"launch": "oom", "rank": 1})
    assert not target.exists()
    monkeypatch.setattr(launch, "FAILURE_FILE", str(target))
    launch.write_failure_file({"launch": "oom", "rank": 1})
    launch.write_failure_file({"launch": "oom", "rank": 0})
    assert json.loads(target.read_text()) == {"launch": "oom", "rank": 1}

