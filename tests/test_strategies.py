"""A strategy is one object in one registry (``launcher/strategies.py``).

Two things are checked: no module outside the registry branches on a strategy's name (the
planner, memory, cost, reasons, the renderer, the estimator and the providers ask the
``Strategy``), and every strategy, a toy one registered here included, keeps the same contract:
a template that renders to Python, an image on every cloud it runs on, a shard degree and a
replica count that agree with what it says it shards, a plan the planner makes when it is
pinned, and a plan that survives its JSON."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher import strategies
from launcher.estimate.footprint import from_shape
from launcher.estimate.model_config import shape_from_config
from launcher.plan.plan import Plan
from launcher.plan.planner import plan
from launcher.plan.targets import cloud_targets
from launcher.providers import images
from launcher.render import render_script
from launcher.spec import Spec
from launcher.strategies import STRATEGIES, Strategy

PACKAGE = Path(__file__).resolve().parents[1] / "launcher"
REGISTRY = PACKAGE / "strategies.py"

#: A strategy added the way CONTRIBUTING.md says: one entry (its template borrowed from FSDP's:
#: adding a real one also adds ``trainer_templates/<name>.py.j2``). Its rung comes before the
#: others, so an unpinned search that shards must try it first.
TOY = Strategy("toy_zero3", "a toy ZeRO-3", "toy", "world", (2, 7), zero2=False,
               script_parallelism="fsdp", sharding_rung=-1, template_name="fsdp.py.j2")


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Strategy:
    monkeypatch.setitem(STRATEGIES, TOY.name, TOY)
    return TOY


def _names(node: ast.AST, names: set[str]) -> bool:
    """A strategy's name, or a collection of names, as a literal."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names(e, names) for e in node.elts)
    return False


def branches(source: str, names: set[str]) -> list[str]:
    """Where ``source`` decides something by a strategy's name: a comparison with one (``==``,
    ``in``), a collection of names (a tuple of "the sharded ones"), a dict keyed by them, a
    ``match`` case. Passing one name on as data (a default, an argument) is not deciding."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Compare):
            hit = any(_names(x, names) for x in [node.left, *node.comparators])
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            hit = sum(isinstance(e, ast.Constant) and e.value in names for e in node.elts) > 1
        elif isinstance(node, ast.Dict):
            hit = any(k is not None and _names(k, names) for k in node.keys)
        elif isinstance(node, ast.match_case):
            hit = isinstance(node.pattern, ast.MatchValue) and _names(node.pattern.value, names)
        if hit:
            where = getattr(node, "lineno", None) or node.pattern.lineno  # type: ignore[attr-defined]
            found.append(f"line {where}: {ast.unparse(node)[:80]}")
    return found


def test_the_detector_finds_each_way_of_branching_on_a_name():
    names = set(STRATEGIES)
    for source in ('if plan.strategy == "fsdp": pass', 'x = s in ("fsdp", "hybrid_shard")',
                   'SHARDED = ("fsdp", "smp_v2")', 'FLOOR = {"ddp": (2, 4)}',
                   'match s:\n    case "ddp": pass'):
        assert branches(source, names), source
    for source in ('get(request.get("name", "single"))', 'Rung(1, "x", "fsdp", 1)'):
        assert not branches(source, names), source


def test_no_module_outside_the_registry_branches_on_a_strategy_name():
    names = set(STRATEGIES)
    found = {str(p.relative_to(PACKAGE)): hits for p in sorted(PACKAGE.rglob("*.py"))
             if p != REGISTRY and (hits := branches(p.read_text(encoding="utf-8"), names))}
    assert len(found) == 0, found


ALL = [*STRATEGIES, TOY.name]
#: Llama-2-7B's config.json values (bench/bench_planner.py's model): the whole shape, so that
#: activations are known and "fits" is yes or no.
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 4096}


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_renders_a_script_and_has_an_image_where_it_runs(name, toy):
    s = strategies.get(name)
    compile(render_script(name), s.template, "exec")
    for provider in ("vertex", "sagemaker"):
        image = images.default_image(provider, name)
        assert (image is not None) == s.runs_on(provider), provider
        if image is not None:
            assert image.torch_version >= s.oldest_torch
            assert name in image.strategies


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_shards_as_it_says(name, toy):
    s = strategies.get(name)
    degree = s.shard_degree(2, 8)
    assert degree == {"nothing": 1, "world": 16, "node": 8}[s.shards]
    assert s.replicas(2) * (degree if s.shards == "node" else 1) in (1, 16)
    assert s.sharded == (degree > 1)
    assert not (s.zero2 or s.reduce_every_micro_step or s.sized_per_rank) or s.sharded
    assert s.rank_trace is None or name in strategies.rank_traceable()


@pytest.mark.parametrize("name", ALL)
def test_the_planner_plans_every_strategy_pinned_and_its_plan_survives_json(name, toy):
    s = strategies.get(name)
    provider = "sagemaker" if s.runs_on("sagemaker") else "vertex"
    shape = shape_from_config(LLAMA2_7B, seq_len=2048)
    gpus = 1 if s.one_process else 8
    spec = Spec(script=Path("train.py"), mode="script", provider=provider, global_batch_size=64,
                steps=100, params=shape.parameters, precision="bf16_mixed", strategy=name,
                gpus_per_node=gpus)

    def estimator(precision: str, optimizer: str, checkpointing: bool | str):
        return from_shape(shape, precision=precision, optimizer=optimizer,
                          checkpointing=checkpointing)

    targets = [t for t in cloud_targets(provider, spec) if t.gpus >= 8
               and (t.memory_bytes or 0) >= 80 * 10**9]
    result = plan(spec, estimator, targets, provider, parameters=shape.parameters,
                  source="declared", can_checkpoint=True)
    tried = [p for p in result.plans if p.strategy == name]
    assert tried and all(p.strategy == name for p in result.plans), [
        p.strategy for p in result.plans]
    one = tried[0]
    single = estimator(one.precision, one.optimizer, False).memory_at(1)
    degree = s.shard_degree(one.nodes, one.gpus_per_node)
    assert one.memory.optimizer == -(-single.optimizer // degree)
    assert Plan.from_dict(one.to_dict()) == one


def test_a_registered_strategy_is_a_rung_of_the_unpinned_search_in_its_place(toy):
    """The planner's sharding rungs come from the registry: the toy's rung sorts first, so an
    unpinned 7B search that must shard tries it before FSDP, and chooses it where it fits."""
    shape = shape_from_config(LLAMA2_7B, seq_len=2048)
    spec = Spec(script=Path("train.py"), mode="script", provider="sagemaker",
                global_batch_size=64, steps=100, params=shape.parameters,
                precision="bf16_mixed", machine="ml.p4d.24xlarge")

    def estimator(precision: str, optimizer: str, checkpointing: bool | str):
        return from_shape(shape, precision=precision, optimizer=optimizer,
                          checkpointing=checkpointing)

    targets = cloud_targets("sagemaker", spec)
    result = plan(spec, estimator, targets, "sagemaker", parameters=shape.parameters,
                  source="declared", can_checkpoint=True)
    order = [p.strategy for p in result.plans]
    assert TOY.name in order and "fsdp" not in order[:order.index(TOY.name)], order
    assert result.chosen is not None and result.chosen.strategy == TOY.name
    assert strategies.sharding_rungs(1)[0] is TOY


def test_a_vendor_strategy_runs_where_a_catalog_offers_it_and_nowhere_else() -> None:
    """SMP v2 is SageMaker's: its catalog's ``strategies`` says so, not a list in the strategy
    (a provider's place is its own, and a cloud's name is not written outside it)."""

    from launcher import providers

    offered = {name: data.get("strategies", []) for name in providers.names()
               if (data := providers.catalog_data(name)) is not None}
    assert set(offered) == {"vertex", "sagemaker"}
    assert any(offered.values())  # the rule is exercised
    for s in STRATEGIES.values():
        for provider, names in offered.items():
            assert s.runs_on(provider) == (not s.vendor or s.name in names), (s.name, provider)
        assert s.runs_on("local") == (not s.vendor)  # no catalog, no vendor strategy

