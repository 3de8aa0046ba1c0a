"""The SMP v2 template, checked without SMP: the SageMaker model parallelism library exists only in
its training image, and the FSDP it configures needs a GPU. So this checks what can be checked
here: the script renders, compiles and passes the linter; torch.sagemaker is used only inside the
marked SMP section and only through names AWS documents; the SMP configuration is built from the
plan as documented; and ``wrap_model`` calls SMP before FSDP, with a stand-in for both.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from launcher.render import SCRIPT_NAME, render_script
from tests.trainer_templates.harness import REPO, import_script

# The torch.sagemaker names AWS documents, from "The SageMaker model parallel library v2
# reference" (docs.aws.amazon.com/sagemaker/latest/dg/distributed-model-parallel-v2-reference.html).
DOCUMENTED_API = {
    "init", "is_initialized", "transform",
    "state.hybrid_shard_degree", "state.rank", "state.rep_rank_process_group",
    "state.tensor_parallel_degree", "state.tp_size", "state.tp_rank", "state.tp_process_group",
    "state.world_size",
    "delayed_param.DelayedParamIniter",
    "distributed.checkpoint.state_dict_saver.save",
    "distributed.checkpoint.state_dict_saver.async_save",
    "distributed.checkpoint.state_dict_saver.maybe_finalize_async_calls",
    "distributed.checkpoint.state_dict_loader.load",
}
# The keys of "SMP v2 core feature configuration parameters" in the same reference.
DOCUMENTED_CONFIG = {
    "hybrid_shard_degree", "sm_activation_offloading", "activation_loading_horizon",
    "fsdp_cache_flush_warnings", "allow_empty_shards", "tensor_parallel_degree",
    "context_parallel_degree", "expert_parallel_degree", "random_seed",
}
SMP_SECTION = "# SageMaker model parallelism (SMP v2)"
PLAN = {"gpus_per_node": 8, "nodes": 2, "seed": 0, "precision": "bf16_mixed",
        "activation_checkpointing": True}


@pytest.fixture(scope="module")
def source() -> str:
    return render_script("smp_v2")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    module = import_script("smp_v2", tmp_path_factory.mktemp("smp_v2"))
    yield module
    del sys.modules[module.__name__]


def test_it_renders_compiles_and_passes_the_linter(source: str, tmp_path: Path) -> None:
    compile(source, SCRIPT_NAME, "exec")
    path = tmp_path / SCRIPT_NAME
    path.write_text(source)
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
         str(REPO / "pyproject.toml"), str(path)],
        capture_output=True, text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def smp_uses(tree: ast.Module) -> tuple[list[ast.AST], set[str]]:
    """Every import of torch.sagemaker, and every name used through it (``tsm.state.rank`` ->
    ``state.rank``; ``from torch.sagemaker.x import y`` -> ``x.y``)."""
    imports: list[ast.AST] = []
    aliases: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch.sagemaker" or alias.name.startswith("torch.sagemaker."):
                    imports.append(node)
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.sagemaker"):
            imports.append(node)
            prefix = node.module.removeprefix("torch.sagemaker").lstrip(".")
            names.update(".".join(filter(None, (prefix, a.name))) for a in node.names)
    chained = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):  # whole chains only: tsm.state.rank, not also tsm.state
        if isinstance(node, ast.Attribute) and id(node) not in chained:
            dotted = ast.unparse(node)
            names.update(dotted.removeprefix(a + ".") for a in aliases
                         if dotted.startswith(a + "."))
    return imports, names


def test_smp_is_used_only_in_its_section_and_only_through_documented_names(source: str) -> None:
    tree = ast.parse(source)
    imports, names = smp_uses(tree)
    assert imports, "the script does not use torch.sagemaker at all"
    assert names and names <= DOCUMENTED_API, names - DOCUMENTED_API

    lines = source.splitlines()  # the section: from its heading to the next "# =====" rule
    start = next(i for i, line in enumerate(lines) if line.startswith(SMP_SECTION)) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("# =====")) + 1
    used_at = [n.lineno for n in imports] + [
        n.lineno for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id == "tsm"
    ]
    assert all(start < line < end for line in used_at), (start, end, used_at)
    # Imported inside functions, so the rest of the script imports (and is tested) without SMP.
    top_level = {id(n) for n in tree.body}
    assert not any(id(n) in top_level for n in imports)


def test_the_smp_configuration_comes_from_the_plan(script: ModuleType) -> None:
    config = script.smp_config(PLAN)
    assert config.keys() <= DOCUMENTED_CONFIG
    # By default a shard group is a node: gathers stay on NVLink, nodes are replicas.
    assert config == {"hybrid_shard_degree": 8, "tensor_parallel_degree": 1,
                      "sm_activation_offloading": False, "random_seed": 0}
    chosen = script.smp_config({**PLAN, "hybrid_shard_degree": 16, "activation_offloading": True})
    assert (chosen["hybrid_shard_degree"], chosen["sm_activation_offloading"]) == (16, True)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"activation_offloading": True, "activation_checkpointing": False},
         "turn activation checkpointing on"),
        ({"tensor_parallel_degree": 4}, "tensor_parallel_degree 4"),
    ],
)
def test_plans_smp_cannot_run_as_asked_are_refused(
    script: ModuleType, keys: dict[str, Any], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        script.smp_config({**PLAN, **keys})


class FakeFSDP(torch.nn.Module):
    """Records how it was built instead of sharding (FSDP needs a GPU)."""

    def __init__(self, module: torch.nn.Module, **kwargs: Any) -> None:
        super().__init__()
        self.module, self.kwargs = module, kwargs
        calls.append(("FSDP", kwargs))


calls: list[tuple[str, Any]] = []


@pytest.mark.parametrize("offload", [False, True])
def test_wrap_model_initializes_smp_before_fsdp(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, offload: bool
) -> None:
    calls.clear()
    tsm = ModuleType("torch.sagemaker")
    tsm.init = lambda config: calls.append(("init", config))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.sagemaker", tsm)
    monkeypatch.setattr(script, "FullyShardedDataParallel", FakeFSDP)

    block = torch.nn.Linear(2, 2)
    recipe = SimpleNamespace(wrap_modules=lambda: (torch.nn.Linear,))
    plan = {**PLAN, "activation_offloading": offload}
    runtime = script.Runtime(rank=0, local_rank=0, world_size=16, device=torch.device("cpu"))
    wrapped = script.wrap_model(torch.nn.Sequential(block), recipe, plan, runtime)

    assert [name for name, _ in calls] == ["init", "FSDP"]
    assert calls[0][1] == script.smp_config(plan)
    kwargs = calls[1][1]
    assert "sharding_strategy" not in kwargs  # SMP sets hybrid sharding from its degree
    assert kwargs["mixed_precision"].param_dtype == torch.bfloat16
    assert isinstance(kwargs["auto_wrap_policy"], ModuleWrapPolicy)  # one unit per block
    assert kwargs["use_orig_params"] is True
    fsdp = script.unwrap(wrapped)
    assert isinstance(fsdp, FakeFSDP)
    assert (wrapped is not fsdp) == offload  # offloading wraps the root
