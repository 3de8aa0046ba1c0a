"""The training strategies, one object each: the one home of what a strategy is and does.

A strategy is how the processes of a job share the model: ``single`` (one process), ``ddp``
(every GPU a replica), ``fsdp`` (FSDP2: the model states sharded over every GPU), ``hybrid_shard``
(sharded within a node, replicated across nodes) and ``smp_v2`` (SageMaker's model-parallel
library: FSDP configured by SageMaker, in its own image). Each is one ``Strategy`` in
``STRATEGIES``, and everything else asks it, never its name:

- the planner (``plan/planner.py``): which strategies it tries as sharding rungs and in which
  order (``sharding_rung``, ``multi_node_only``), which it shows beside another's plan
  (``beside``), which it sizes from a rank traced at its world size (``sized_per_rank``), and
  whether a rung has a ZeRO-2 form (``zero2``) or can reduce-scatter on every micro-step;
- memory (``plan/memory.py``) and cost (``plan/cost.py``): how far the model states are
  sharded (``shard_degree``) and so what is communicated;
- the reasons (``plan/reasons.py``) and the plan table: its ``words`` and ``label``;
- the estimator: how one rank is traced (``rank_trace``: whole, or at two depths of the block
  stack and extrapolated) and how many replicas it has (``replicas``);
- the providers: where it runs (``vendor``: only where a provider's catalog offers it), the
  oldest torch its rendered script ran under (``oldest_torch``, ``providers/images.py``), the
  image it needs (``image``);
- the renderer: its template is ``trainer_templates/<name>.py.j2``.

Adding a strategy is one ``Strategy`` here, one template, and its line in CONTRIBUTING.md's
recipe; ``tests/test_strategies.py`` runs the same contract over every entry (a toy strategy
included) and counts the modules outside this one that branch on a strategy's name (none).

This module imports nothing of the launcher's and no torch: the CLI, the planner and the trace
child all import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: How far a strategy shards the model states: not at all (every process holds them whole),
#: over every process of the job, or over the processes of one node (replicated across nodes).
Shards = Literal["nothing", "world", "node"]


@dataclass(frozen=True)
class Strategy:
    """One way to run the processes of a job. The fields say what the rest of the launcher asks
    of a strategy; the docstring of this module says who asks what."""

    name: str
    #: The strategy in a sentence's words ("fully sharded data parallel (FSDP2)").
    words: str
    #: Its name where a table is narrow ("hybrid" for hybrid_shard's ZeRO-2 form).
    label: str
    shards: Shards
    #: The oldest torch (major, minor) its rendered script ran under (``providers/images.py``).
    oldest_torch: tuple[int, int]
    #: A provider's own library (SMP v2): it runs only on the providers whose catalog lists it
    #: (``strategies`` in its provider's ``catalog.json``); otherwise on every one (its
    #: template runs in any PyTorch image).
    vendor: bool = False
    #: The image it needs beyond a stock PyTorch one (SMP v2: SageMaker's SMP container), as
    #: a provider's image table names it; None: any PyTorch image of its ``oldest_torch``.
    image: str | None = None
    #: One process on one device: its trace is the single-device trace, nothing to reduce.
    one_process: bool = False
    #: Can keep each unit's gathered parameters from its forward to its backward (ZeRO-2,
    #: FSDP2's ``reshard_after_forward=False``).
    zero2: bool = False
    #: Its script can reduce-scatter the gradients on every micro-step of an accumulating step
    #: (FSDP2's ``set_requires_gradient_sync``), sharding them instead of holding them whole.
    reduce_every_micro_step: bool = False
    #: How one of its ranks is traced at its world size on fake tensors (a fake process group,
    #: the rendered script's own wrapping): "whole" (DDP: its gradient buckets are cut by size,
    #: not by block, so its memory is not linear in the depth), "depth_scaled" (two depths of
    #: the block stack, ``estimate/_blocks.SHARDED_DEPTHS``), or None (not traceable here).
    rank_trace: Literal["whole", "depth_scaled"] | None = None
    #: The planner sizes its plans from one rank traced at its world size (the chosen plan, and
    #: candidates near capacity): the scaled single-device figure is tens of percent off.
    sized_per_rank: bool = False
    #: The parallelism a plain script must run itself to be started as this strategy
    #: (``script_info.REPLICATES`` or ``script_info.SHARDS``); None: none, or the strategy's
    #: own library does it.
    script_parallelism: str | None = None
    #: Its place among the planner's sharding rungs (lower first); None: never a rung.
    sharding_rung: int | None = None
    #: Tried as a rung only on more than one node (on one node it is ``fsdp``).
    multi_node_only: bool = False
    #: The strategies whose chosen plan it is shown beside, with its numbers and why it was not
    #: chosen (SMP v2 beside FSDP on SageMaker).
    beside: tuple[str, ...] = ()
    #: Why a chosen plan of those strategies is kept when this one fits too (a clause).
    kept_over: str = ""
    #: Its training script's template under ``trainer_templates/``; None: ``<name>.py.j2``.
    template_name: str | None = None

    @property
    def sharded(self) -> bool:
        return self.shards != "nothing"

    @property
    def template(self) -> str:
        """Its training script's template under ``trainer_templates/``."""
        return self.template_name or f"{self.name}.py.j2"

    def shard_degree(self, nodes: int, gpus: int) -> int:
        """Over how many processes each model state is split."""
        if self.shards == "world":
            return nodes * gpus
        if self.shards == "node":
            return gpus  # shard within a node, replicate across nodes
        return 1

    def replicas(self, nodes: int) -> int:
        """How many copies of the sharded model states the job holds (a shard group per node
        for node sharding; one otherwise: DDP's replicas are not shard groups)."""
        return nodes if self.shards == "node" else 1

    def runs_on(self, provider: str) -> bool:
        return not self.vendor or self.name in _offered(provider)

    @property
    def providers(self) -> tuple[str, ...]:
        """The providers with a machine catalog it runs on (by name)."""
        from launcher.providers import catalogued

        return tuple(p for p in catalogued() if self.runs_on(p))


def _offered(provider: str) -> tuple[str, ...]:
    """The vendor strategies ``provider`` offers: its machine catalog's ``strategies`` (where a
    provider says what it has); none without one."""
    from launcher.providers import REGISTRY, catalog_data

    data = catalog_data(provider) if provider in REGISTRY else None
    return tuple(str(name) for name in (data or {}).get("strategies") or ())


#: Every strategy, in the order ``--strategy`` lists them.
STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("single", "one process on one GPU", "single", "nothing", (2, 4), one_process=True),
    Strategy("ddp", "DistributedDataParallel", "ddp", "nothing", (2, 4), rank_trace="whole",
             script_parallelism="ddp"),
    Strategy("fsdp", "fully sharded data parallel (FSDP2)", "fsdp", "world", (2, 7),
             zero2=True, reduce_every_micro_step=True, rank_trace="depth_scaled",
             sized_per_rank=True, script_parallelism="fsdp", sharding_rung=1),
    Strategy("hybrid_shard", "hybrid sharding (FSDP2 within a node, replicas across nodes)",
             "hybrid", "node", (2, 8), zero2=True, reduce_every_micro_step=True,
             rank_trace="depth_scaled", sized_per_rank=True, script_parallelism="fsdp",
             sharding_rung=0, multi_node_only=True),
    Strategy("smp_v2", "SageMaker's model-parallel library", "smp_v2", "node", (2, 5),
             vendor=True, image="smp", beside=("fsdp", "hybrid_shard"),
             kept_over="SMP v2 is PyTorch FSDP configured by SageMaker and runs only in its SMP "
             "image (PyTorch 2.5.1); its extras (tensor parallelism, activation offloading) are "
             "not needed here"),
)}

#: Every strategy's name, for ``--strategy``'s choices and the plan's JSON schema.
NAMES: tuple[str, ...] = tuple(STRATEGIES)
#: The one-process strategy's name: what a request that names no strategy runs.
SINGLE: str = next(s.name for s in STRATEGIES.values() if s.one_process)
#: The strategy of several processes that shards nothing (a replica on every GPU): the
#: planner's starting point on more than one GPU.
REPLICATED: str = next(s.name for s in STRATEGIES.values()
                       if not s.one_process and not s.sharded and not s.vendor)


def get(name: str) -> Strategy:
    """The registered strategy called ``name``; ``KeyError`` names the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


def elsewhere(name: str | None, provider: str | None) -> tuple[str, str] | None:
    """(the refusal, its hint) when the strategy ``name`` does not run on ``provider``; None
    when it does, or when no strategy is pinned."""
    pinned = STRATEGIES.get(name or "")
    if pinned is None or pinned.runs_on(provider or ""):
        return None
    alike = [s.name for s in STRATEGIES.values()
             if s.sharded == pinned.sharded and s.runs_on(provider or "")]
    where = pinned.providers
    hints = [f"--provider {where[0]}"] if where else []
    hints += [f"--strategy {' / '.join(alike)}"] if alike else []
    return (f"{pinned.name} is {pinned.words} and runs only on "
            f"{' and '.join(where) or 'no provider this launch knows'}",
            "use " + (", or ".join(hints) or "another --strategy"))


def sharding_rungs(nodes: int) -> list[Strategy]:
    """The strategies the planner tries as sharding rungs on ``nodes`` nodes, in order."""
    rungs = [s for s in STRATEGIES.values() if s.sharding_rung is not None
             and (nodes > 1 or not s.multi_node_only)]
    return sorted(rungs, key=lambda s: s.sharding_rung or 0)


def rank_traceable() -> tuple[str, ...]:
    """The names of the strategies one rank of which the estimator can trace."""
    return tuple(s.name for s in STRATEGIES.values() if s.rank_trace is not None)
