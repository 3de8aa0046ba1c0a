"""The footprints preflight hands the planner (launcher/footprints.py): one rank of a sharded plan
traced at its world size, the rank traces' shared budget, and the plan path that calls them
without coming back into preflight."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "estimate"))
from _recipes import GPT  # noqa: E402

from launcher.estimate.traced import trace_recipe  # noqa: E402
from launcher.footprints import rank_traces  # noqa: E402

OPTIONS = {"micro_batch_sizes": (1, 2, 4), "precision": "fp32", "optimizer": None,
           "activation_checkpointing": False, "device": "cpu", "timeout_s": 120.0}


def test_rank_memory_is_the_ranks_own_trace(tmp_path: Path) -> None:
    recipe = tmp_path / "gpt.py"
    recipe.write_text(textwrap.dedent(GPT))
    rank_memory_at = rank_traces(recipe, dict(OPTIONS))
    for accum in (1, 4):
        memory = rank_memory_at("fsdp", 1, 2, 2, accum)
        trace = trace_recipe(recipe, **{**OPTIONS, "grad_accum_steps": min(accum, 2)},
                             strategy={"name": "fsdp", "world_size": 2})
        assert memory == trace.memory_at(2, accum)
    # hybrid sharding: a shard group per node, the nodes replicas
    hybrid = rank_memory_at("hybrid_shard", 2, 2, 2, 1)
    assert hybrid == trace_recipe(recipe, **{**OPTIONS, "grad_accum_steps": 1}, strategy={
        "name": "hybrid_shard", "world_size": 4, "replicas": 2}).memory_at(2, 1)


def test_a_scaled_rank_whose_peak_moved_between_depths_is_traced_whole(tmp_path: Path) -> None:
    """A 12-block Llama, hybrid-sharded 2 x 2 with full checkpointing, at micro-batch 8: the
    backward's peak holds activations at 4 blocks and gradient shards at 6, so the two depths
    do not extrapolate (+18%); the rank is traced whole instead, and answers as that trace."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from models_zoo import write_recipe

    recipe = write_recipe("llama", tmp_path, layers=12)
    options = {**OPTIONS, "precision": "bf16_mixed", "optimizer": "adamw",
               "activation_checkpointing": True, "device": "cuda"}
    hybrid = {"name": "hybrid_shard", "world_size": 4, "replicas": 2}
    scaled = trace_recipe(recipe, **options, strategy=hybrid)
    # at 8 and at half of it, as the planner traces a rank (rank_traces)
    whole = trace_recipe(recipe, **{**options, "micro_batch_sizes": (4, 8)}, strategy=hybrid,
                         scale_depth=False)
    assert scaled.moment_moved(8, 1) and not scaled.moment_moved(2, 1)
    assert scaled.peak_at(8, 1) > 1.1 * whole.peak_at(8, 1)
    assert rank_traces(recipe, dict(options))("hybrid_shard", 2, 2, 8, 1) == \
        whole.memory_at(8, 1)


def test_a_recipe_that_cannot_be_traced_leaves_the_scaled_estimate(tmp_path: Path) -> None:
    recipe = tmp_path / "broken.py"
    recipe.write_text("def build_model(): raise ValueError('no')\n"
                      "def example_batch(b): ...\ndef training_step(m, b): ...\n")
    assert rank_traces(recipe, dict(OPTIONS))("fsdp", 1, 2, 2, 1) is None


def test_rank_traces_share_one_budget_and_say_what_they_skipped(tmp_path: Path) -> None:
    """A catalog search can ask for a dozen rank traces; together they get one budget, after
    which the scaled estimate stands and the plan says so (a 7B preflight once ran 15 minutes)."""
    from launcher.footprints import Budget

    recipe = tmp_path / "gpt.py"
    recipe.write_text(textwrap.dedent(GPT))
    spent = Budget(0.0)
    assert rank_traces(recipe, dict(OPTIONS), spent)("fsdp", 1, 2, 2, 1) is None
    assert spent.skipped == 1 and "LAUNCH_RANK_TRACE_BUDGET" in (spent.note() or "")
    budget = Budget(1000.0)
    rank_memory_at = rank_traces(recipe, dict(OPTIONS), budget)
    assert rank_memory_at("fsdp", 1, 2, 2, 1) is not None
    left = budget.left
    assert left < 1000.0 and budget.note() is None
    rank_memory_at("fsdp", 1, 2, 1, 1)  # traced with 2: half of it, the rung's next try
    assert budget.left == left
    rank_memory_at("fsdp", 1, 2, 4, 1)  # not traced yet: a trace of its own
    assert budget.left < left



def test_ranks_noted_ahead_are_traced_in_one_request_and_answer_as_if_asked(
        tmp_path: Path) -> None:
    """preflight runs the planner once on the sharded estimates, noting the ranks it asks for
    (answered None meanwhile), traces them together, and plans again: each footprint then
    answers from that trace exactly as a trace of its own would, and a size a noted trace
    covers is not noted twice."""
    from launcher.footprints import Ahead, Budget

    recipe = tmp_path / "gpt.py"
    recipe.write_text(textwrap.dedent(GPT))
    checkpointed = {**OPTIONS, "activation_checkpointing": True}
    budget, ahead = Budget(1000.0), Ahead()
    plain = rank_traces(recipe, dict(OPTIONS), budget, ahead)
    ckpt = rank_traces(recipe, dict(checkpointed), budget, ahead)
    ahead.collecting = True
    assert plain("fsdp", 1, 2, 2, 1) is None and ckpt("fsdp", 1, 2, 2, 4) is None
    assert plain("fsdp", 1, 2, 1, 1) is None  # in the (1, 2) noted for micro-batch 2
    assert plain("hybrid_shard", 2, 2, 1, 1) is None
    assert len(ahead.wishes) == 3 and budget.left == 1000.0
    ahead.collecting = False
    ahead.flush(budget)  # two requests: Ahead.CHUNK ranks each
    assert not ahead.wishes and len(ahead.done) == 3 and budget.left < 1000.0
    spent = budget.left
    assert plain("fsdp", 1, 2, 2, 1) == rank_traces(recipe, dict(OPTIONS))("fsdp", 1, 2, 2, 1)
    assert plain("fsdp", 1, 2, 1, 1) == rank_traces(recipe, dict(OPTIONS))("fsdp", 1, 2, 1, 1)
    assert ckpt("fsdp", 1, 2, 2, 4) == rank_traces(recipe, dict(checkpointed))(
        "fsdp", 1, 2, 2, 4)
    assert plain("hybrid_shard", 2, 2, 1, 1) == rank_traces(recipe, dict(OPTIONS))(
        "hybrid_shard", 2, 2, 1, 1)
    assert budget.left == spent and not ahead.done  # answered from the flush, taken in


def _noted_and_flushed(recipe: Path, seconds: float) -> tuple[Any, Any]:
    """One FSDP rank of ``recipe`` noted ahead (answered None meanwhile), then flushed with
    ``seconds`` of budget: the footprint's ``rank_memory_at`` and the budget."""
    from launcher.footprints import Ahead, Budget

    budget, ahead = Budget(seconds), Ahead()
    rank_memory_at = rank_traces(recipe, dict(OPTIONS), budget, ahead)
    ahead.collecting = True
    assert rank_memory_at("fsdp", 1, 2, 2, 1) is None
    ahead.collecting = False
    ahead.flush(budget)
    return rank_memory_at, budget


def test_ranks_noted_ahead_with_no_time_left_keep_the_scaled_estimate(tmp_path: Path) -> None:
    recipe = tmp_path / "gpt.py"
    recipe.write_text(textwrap.dedent(GPT))
    rank_memory_at, budget = _noted_and_flushed(recipe, 1.0)
    assert budget.skipped == 1 and "LAUNCH_RANK_TRACE_BUDGET" in (budget.note() or "")
    assert rank_memory_at("fsdp", 1, 2, 2, 1) is None  # tried: the scaled figure stands


def test_a_rank_noted_ahead_that_cannot_be_traced_leaves_the_scaled_estimate(
        tmp_path: Path) -> None:
    recipe = tmp_path / "broken.py"
    recipe.write_text("def build_model(): raise ValueError('no')\n"
                      "def example_batch(b): ...\ndef training_step(m, b): ...\n")
    rank_memory_at, budget = _noted_and_flushed(recipe, 1000.0)
    left = budget.left
    assert left < 1000.0 and budget.skipped == 0  # tried, in the flush
    assert rank_memory_at("fsdp", 1, 2, 2, 1) is None
    assert budget.left == left  # not tried again when asked

NO_WRAP = """
import torch

LAUNCH = {"global_batch_size": 4, "steps": 2, "lr": 0.01}


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))


def example_batch(batch_size):
    return torch.randn(batch_size, 8)


def training_step(model, batch):
    return model(batch).pow(2).mean()
"""


def test_a_sharded_plan_of_a_model_without_blocks_is_sized_by_its_ranks_trace(
        cli, write_script) -> None:
    """No wrap_modules(): no unit for the sharded estimate to gather, so its peak is unknown
    ("fits ?"); the chosen plan is sized by tracing its rank all the same (issue 25: a
    Trainer script's FSDP plan answered ">1008.2 KiB, fits ?")."""
    script = write_script(NO_WRAP)
    chosen = cli("plan", str(script), "--strategy", "fsdp", "--gpus-per-node", "2", "--json",
                 environ={"LAUNCH_NO_TRACE": "0"}).json()["chosen"]
    assert chosen["memory"]["rank_traced"] is True and chosen["fits"] is True
    assert chosen["memory"]["peak_allocated"] > 0 and chosen["memory"]["headroom"] > 0


def test_a_pinned_checkpointing_the_recipe_cannot_apply_is_refused_before_any_job(
        cli, write_script) -> None:
    """Without wrap_modules() there are no blocks to checkpoint: refused at the plan (exit 2,
    one line), not by the rendered script once a machine is paid for."""
    script = write_script(NO_WRAP)
    for pin in (("--checkpointing", "selective"), ("--checkpointing", "full"),
                ("--activation-checkpointing",)):
        result = cli("plan", str(script), *pin, "--json")
        assert result.status == 2, result.stdout
        assert "wrap_modules()" in result.stderr and "Traceback" not in result.stderr
    assert cli("plan", str(script), "--checkpointing", "none", "--json").status == 0


def test_a_described_recipe_without_wrap_modules_is_never_planned_with_checkpointing(
        cli, write_script, tmp_path) -> None:
    """--model-config sizes the model from its config, but the templates still checkpoint the
    recipe's wrap_modules() blocks and stop without them: refused when pinned, and never chosen
    as a remedy, even where only checkpointing would fit. A plain script, which checkpoints by
    the contract's LAUNCH_CHECKPOINTING itself, may still be planned with it."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 2048}))
    tight = ("--model-config", str(config), "--seq-len", "2048", "--provider", "vertex",
             "--region", "us-central1", "--machine", "a2-highgpu-1g", "--micro-batch-size",
             "8", "--global-batch-size", "64", "--precision", "fp32", "--json")
    recipe = write_script(NO_WRAP)
    pinned = cli("plan", str(recipe), *tight, "--checkpointing", "full")
    assert pinned.status == 2 and "wrap_modules()" in pinned.stderr, pinned.stdout
    chosen = cli("plan", str(recipe), *tight).json()["chosen"]
    assert chosen is None or not chosen["activation_checkpointing"], chosen
    plain = tmp_path / "plain.py"
    plain.write_text("print('trains by the LAUNCH_* variables')\n")
    chosen = cli("plan", str(plain), *tight).json()["chosen"]
    assert chosen is not None and chosen["activation_checkpointing"], chosen


#: A decoder the analytic sizer has no formula for (OPT: learned positions, ReLU MLP, biases),
#: which transformers builds: preflight traces it instead of refusing it.
TINY_OPT = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 64,
            "ffn_dim": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 512, "max_position_embeddings": 64, "word_embed_proj_dim": 64}


def _config_plan(cli, tmp_path: Path, config: dict, traced: bool):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    return cli("plan", str(script), "--model-config", str(path), "--gpus-per-node", "1",
               "--global-batch-size", "4", "--json",
               environ={"LAUNCH_NO_TRACE": "0" if traced else "1"})


def test_a_config_launch_cannot_size_is_traced_as_transformers_builds_it(cli, tmp_path: Path
                                                                          ) -> None:
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    result = _config_plan(cli, tmp_path, TINY_OPT, traced=True)
    assert result.status == 0, result.stderr
    out = json.loads(result.stdout)
    with torch.device("meta"):
        model = OPTForCausalLM(OPTConfig(**TINY_OPT))
    # the parameters transformers' own class has (tied output layer counted once)
    assert out["model"] == {"parameters": sum(p.numel() for p in model.parameters()),
                            "source": "config"}
    memory = out["chosen"]["memory"]
    assert memory["activations"] and memory["activations"] > 0  # traced, not states only
    assert any("'opt' has no analytic shape" in note for note in out["notes"])


def test_a_config_launch_cannot_size_is_refused_in_one_line_when_it_cannot_be_traced(
        cli, tmp_path: Path) -> None:
    untraced = _config_plan(cli, tmp_path, TINY_OPT, traced=False)
    assert untraced.status == 2 and untraced.stderr.count("\n") == 1, untraced.stderr
    assert 'model_type "opt" is not one launch can size' in untraced.stderr
    assert "unset LAUNCH_NO_TRACE" in untraced.stderr
    unknown = _config_plan(cli, tmp_path, {**TINY_OPT, "model_type": "not_a_model"},
                           traced=True)
    assert unknown.status == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "transformers could not build it either" in unknown.stderr
    assert "Traceback" not in unknown.stderr + untraced.stderr


def test_the_plan_path_enters_preflight_once(tmp_path: Path, monkeypatch) -> None:
    """From ``Runner.plan`` to the chosen plan, launch/preflight.py is called into once (the
    runner's call); the planner asks ``Footprints`` and the rank traces for what it needs,
    never preflight again (issue 26: it was entered 8 times). Counted with a profile hook
    over a real plan of a traced recipe, and of a ``--params`` cloud plan."""
    from launcher.context import Environment
    from launcher.runner import Runner

    package = Path(__import__("launcher").__file__).parent
    preflight_py = str(package / "preflight.py")
    recipe = tmp_path / "gpt.py"
    recipe.write_text(textwrap.dedent(GPT))
    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))

    def entries(options: dict) -> list[str]:
        calls: list[str] = []

        def hook(frame, event, arg) -> None:
            if (event != "call" or frame.f_code.co_filename != preflight_py
                    or frame.f_code.co_name == "<module>"):  # its import: not a call into it
                return
            caller = frame.f_back
            while caller is not None and not caller.f_code.co_filename.startswith(str(package)):
                caller = caller.f_back
            if caller is None or caller.f_code.co_filename != preflight_py:
                calls.append(frame.f_code.co_name)

        runner = Runner(Environment(cwd=tmp_path, environ={**os.environ}))
        sys.setprofile(hook)
        try:
            planned = runner.plan(options, dry_run=True)
        finally:
            sys.setprofile(None)
        assert planned.result.chosen is not None
        return calls

    assert entries({"script": recipe, "provider": "local"}) == ["preflight"]
    assert entries({"script": recipe, "provider": "vertex", "params": 7_000_000_000,
                    "region": "us-central1"}) == ["preflight"]



# -- the model states counted without a trace ---------------------------------------------------


def _variant(tmp_path: Path, name: str, tail: str) -> Path:
    path = tmp_path / name / "train.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(GPT) + textwrap.dedent(tail))
    return path


def test_the_floor_is_never_above_the_traced_step_and_is_its_states_where_it_counts_them(
        tmp_path: Path) -> None:
    """``footprints.floor`` rejects rungs without a trace, so it must never exceed what the
    trace finds: for the recipe as written (fp32 weights, the templates' AdamW) it is the
    traced model states; for a model built in bf16 (which bf16_mixed does not
    cast) with a frozen embedding and its own optimizer it counts less, never more.
    (AdamW's step counters, a scalar per weight, are left out.)"""
    from launcher.footprints import floor
    from launcher.recipe import inspect_script

    variants = {
        "plain": "",
        # built in bf16 (which bf16_mixed does not cast), its embedding frozen, its own SGD
        "own": ("\n_build = build_model\ndef build_model():\n"
                "    torch.set_default_dtype(torch.bfloat16)\n    try:\n        m = _build()\n"
                "    finally:\n        torch.set_default_dtype(torch.float32)\n"
                "    m.wte.weight.requires_grad_(False)\n    return m\n"
                "\ndef build_optimizer(params):\n"
                "    return torch.optim.SGD(params, lr=0.1, momentum=0.9)\n"),
    }
    precisions = {"plain": ("fp32", "bf16"), "own": ("bf16_mixed",)}
    for name, tail in variants.items():
        path = _variant(tmp_path, name, tail)
        info = inspect_script(path, count_flops=False)
        known = "build_optimizer" not in info.hooks
        for precision in precisions[name]:
            lower = floor(info, precision, "adamw" if known else None)
            assert lower is not None
            states = lower.memory_at(1, 1).model_states
            trace = trace_recipe(path, micro_batch_sizes=(1,), precision=precision,
                                 device="cpu", timeout_s=120.0)
            traced = trace.parameter_bytes + trace.gradient_bytes + trace.optimizer_state_bytes
            assert states <= traced <= trace.peak_at(1), (name, precision)
            if name == "plain" and precision != "bf16":  # all but AdamW's step counters
                assert traced - states < 1e-3 * traced, precision
            if name == "own":  # weights as built, no gradient for the frozen, no moments
                counted = lower.memory_at(1, 1)
                assert counted.parameters == 2 * info.parameters
                assert counted.gradients < counted.parameters and counted.optimizer == 0
    # a probe that could not count the bytes: no floor, the rung is traced as before
    assert floor(dataclasses.replace(info, trainable_bytes=None), "fp32", "adamw") is None
