"""A plain script whose step runs several top-level modules: traced as its loop runs them.

PyTorch's seq2seq tutorial trains an ``EncoderRNN`` and a ``DecoderRNN`` with one ``Adam`` each:

    encoder_outputs, encoder_hidden = encoder(input_tensor)
    decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden, target_tensor)
    loss = criterion(decoder_outputs.view(-1, V), target_tensor.view(-1))
    loss.backward(); encoder_optimizer.step(); decoder_optimizer.step()

The single-module capture (``plain._capture``) stops at ``encoder_optimizer.step()`` and traces
the encoder alone, with the sum of its output for a loss: half the real step (-50.8%). Here the
step is rebuilt as the loop ran it instead:

- every top-level call with gradients is recorded (``record_call``), and each ``backward``
  closes the calls since the one before (``record_backward``): those are the last micro-step's;
- the modules of the step are those whose parameters the loss's autograd graph reaches (its
  ``AccumulateGrad`` nodes, still there after backward): a loss module, a frozen or detached
  one (a GAN's generator under the discriminator's loss) is not part of it;
- the loop's own tensor operations on what the step produced (``head(features.mean(1))``,
  ``decoder(h[:, -1])``) are recorded too, by a torch function mode (``_RecordOps``): those a
  module's input needs are replayed between the calls, a size equal to the batch's rows as the
  replayed batch's rows;
- the dataflow between them is read by tensor identity: an argument that is an earlier call's
  or operation's output (or an element of it) is that output in the replay; any other tensor
  is an input of the batch (the loader's tensors, resized with it), any other value is kept as
  it was. An argument computed with gradients some other way (a custom ``autograd.Function``,
  whose forward runs without gradients; a property such as ``.T``) cannot be replayed from
  what was recorded: the capture then says so and writes no recipe, so the plan never shows a
  traced number for a step it did not trace;
- the loss is matched as the single-module capture matches it, against the outputs of the
  step's calls from the last, with the loop's own tensors (the batch's too) as targets;
- every optimizer the script built (``Optimizer.__init__`` is recorded) that holds the step's
  parameters is rebuilt: one of the same class as all of them, with one parameter group each
  where their settings differ, or, of different classes, each for its own parameters (the
  recipe's ``Optimizers`` steps them together), so the trace holds the states of all of them.

The recipe (``recipe_template.PipelineStep``) replays the calls in one wrapper module, so DDP
and FSDP see one forward and the optimizer gets every stage's parameters.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE, Stop, note, write_answer

#: JSON values kept in a call's arguments as they are.
_PLAIN = (bool, int, float, str, type(None))


class NotReplayable(Exception):
    """The step's dataflow cannot be rebuilt from what was recorded (the message says why)."""


def patch_pipeline() -> None:
    """Record every optimizer the script builds and the tensor operations its loop makes
    between its modules' calls; nothing in a measurement (``--measure``), which keeps no step
    and whose loop the mode's per-operation cost would slow: a loader's workers then deliver
    more batches into the profiled window (cifar10_tutorial's real peak varied by 10%)."""
    if STATE.get("measure"):
        return
    _record_optimizers()
    _RecordOps().__enter__()  # for the rest of the script: the capture ends the process


def _record_optimizers() -> None:
    """Every optimizer the script builds, weakly: the capture stops at the first one's step,
    and the others it made (the decoder's) are only known from here."""
    init = torch.optim.Optimizer.__init__
    made: list[weakref.ref] = []
    STATE["optimizers"] = made

    def recording_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    torch.optim.Optimizer.__init__ = recording_init  # type: ignore[method-assign]


def _recording() -> bool:
    """Whether the loop's step is being recorded: after a top-level call with gradients, outside
    any module's forward, before the capture itself runs."""
    depth = STATE.get("plain_depth") or [0]
    return (bool(STATE.get("pipeline_pending")) and not depth[0] and torch.is_grad_enabled()
            and not ANSWER["reached"] and not STATE.get("capturing")
            and not STATE.get("measure"))


class _RecordOps(torch.overrides.TorchFunctionMode):
    """The loop's own tensor operations on what its modules returned (``features.mean(1)``,
    ``h[:, -1]``, ``torch.cat``), in order with the module calls: a module's input computed so
    is replayed by the same operation. Only operations on a tensor the step produced are kept
    (the loop's other work, the data's, passes through)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _recording():
            from launcher.capture.child.capture import leaves

            produced = STATE.setdefault("pipeline_produced", set())
            if any(id(t) in produced for t in leaves([list(args), kwargs])):
                STATE["pipeline_pending"].append(("op", func, args, kwargs, out))
                produced.update(id(t) for t in leaves(out))
        return out


def record_call(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
    """A top-level call with gradients, in order, until the next ``backward`` closes them."""
    from launcher.capture.child.capture import leaves

    STATE.setdefault("pipeline_pending", []).append(("call", module, args, kwargs, out))
    STATE.setdefault("pipeline_produced", set()).update(id(t) for t in leaves(out))


def record_backward() -> None:
    """The calls since the last backward are this backward's (an accumulating loop's last
    micro-step's, at the first optimizer step)."""
    STATE["pipeline_step"] = STATE.get("pipeline_pending") or []
    STATE["pipeline_pending"] = []
    STATE["pipeline_produced"] = set()


def _graph_parameters(loss: torch.Tensor) -> set[int]:
    """The ids of the leaf tensors (parameters) the loss's autograd graph accumulates into."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            found.add(id(variable))
        stack.extend(fn for fn, _ in node.next_functions)
    return found


#: One recorded entry of the step: ("call", module, args, kwargs, output) or ("op", torch
#: function, args, kwargs, output).
Entry = tuple[str, Any, tuple, dict, Any]


def _step_entries(loss: torch.Tensor) -> tuple[list[Entry], list[torch.nn.Module]]:
    """The step's calls of modules whose parameters the loss reaches, and the loop's operations
    their inputs need, in order; and those modules."""
    from launcher.capture.child.capture import leaves

    reached = _graph_parameters(loss)
    recorded: list[Entry] = list(STATE.get("pipeline_step") or ())
    kept = [e[0] == "call" and any(id(p) in reached for p in e[1].parameters())
            for e in recorded]
    needed = {id(t) for e, k in zip(recorded, kept, strict=True) if k
              for t in leaves([list(e[2]), e[3]])}
    for index in range(len(recorded) - 1, -1, -1):
        entry = recorded[index]
        if entry[0] == "op" and any(id(t) in needed for t in leaves(entry[4])):
            kept[index] = True
            needed.update(id(t) for t in leaves([list(entry[2]), entry[3]]))
    modules: dict[int, torch.nn.Module] = {}
    for entry, keep in zip(recorded, kept, strict=True):
        if keep and entry[0] == "call":
            modules.setdefault(id(entry[1]), entry[1])
    return [e for e, k in zip(recorded, kept, strict=True) if k], list(modules.values())


#: Operations whose int arguments are sizes: the captured batch's rows among them are the
#: replayed batch's (``x.view(x.size(0), -1)``).
_SHAPE_OPS = ("view", "reshape", "expand", "repeat", "unflatten", "new_zeros", "new_ones",
              "new_empty", "new_full")


def _op_name(func: Any) -> str:
    """A torch function as the recipe finds it again: ``Tensor.mean``, ``torch.cat``,
    ``F.relu``."""
    import torch.nn.functional as F

    name = getattr(func, "__name__", "")
    if name and func in (getattr(torch.Tensor, name, None),
                         getattr(torch._C.TensorBase, name, None)):
        return f"Tensor.{name}"
    if name and getattr(torch, name, None) is func:
        return f"torch.{name}"
    if name and getattr(F, name, None) is func:
        return f"F.{name}"
    raise NotReplayable(f"the loop computes a module's input with {name or func!r}, which "
                        "launch cannot call again")


def _outputs(value: Any, path: list[Any], into: dict[int, list[Any]]) -> None:
    """Each tensor of a call's output, by id, with its path in the output."""
    if isinstance(value, torch.Tensor):
        into.setdefault(id(value), list(path))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _outputs(item, [*path, key], into)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _outputs(item, [*path, index], into)


class _Flow:
    """The step's arguments as references: to the batch's inputs or to earlier outputs."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []
        self.index: dict[int, int] = {}
        self.produced: dict[int, tuple[int, list[Any]]] = {}
        self.sizes = False  # the arguments of a shape operation are being read

    def spec(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) in self.produced:
                call, path = self.produced[id(value)]
                return {"out": call, "path": path}
            if value.requires_grad:
                raise NotReplayable(
                    "a module of the step takes a tensor computed with gradients outside the "
                    "step's modules and the loop's operations on their outputs")
            if id(value) not in self.index:
                self.index[id(value)] = len(self.inputs)
                self.inputs.append(value)
            return {"in": self.index[id(value)]}
        if isinstance(value, int) and self.sizes and not isinstance(value, bool):
            return {"size": value}  # the captured rows here are the replayed batch's
        if isinstance(value, _PLAIN):
            return {"value": value}
        if isinstance(value, slice):
            return {"slice": [self.spec(value.start), self.spec(value.stop),
                              self.spec(value.step)]}
        if value is Ellipsis:
            return {"ellipsis": True}
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).removeprefix("torch.")}
        if isinstance(value, Mapping):
            return {"dict": {str(k): self.spec(v) for k, v in value.items()}}
        if isinstance(value, (list, tuple)):
            return {"list": [self.spec(v) for v in value], "tuple": isinstance(value, tuple)}
        raise NotReplayable(f"a module of the step takes a {type(value).__name__}")

    def produce(self, call: int, out: Any) -> None:
        found: dict[int, list[Any]] = {}
        _outputs(out, [], found)
        for key, path in found.items():
            self.produced.setdefault(key, (call, path))


#: ``plain._scaled_from``: whether the loop's loss is a value scaled by constants (``loss / n``),
#: handed in by ``plain._capture`` (this module is imported by plain.py, not the other way).
ScaledFrom = Callable[[torch.Tensor, torch.Tensor], bool]


def pipeline_step(optimizer: torch.optim.Optimizer, scaled_from: ScaledFrom
                  ) -> tuple[list[torch.nn.Module], dict[str, Any], dict[str, Any]] | None:
    """The step as a pipeline of its modules, if it runs more than one: the modules, the batch
    (``{"inputs", "extra"}``, at the largest the loader makes) and the recipe's step, with the
    optimizers' settings in the answer; ``plain._capture`` writes them. None leaves the script
    to the single-module capture (one module: the same results as before). A step that cannot
    be replayed ends the capture here with a note: no recipe, so no traced number."""
    loss = STATE.get("plain_loss")
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    entries, modules = _step_entries(loss)
    if len(modules) < 2:
        return None
    names = [type(m).__name__ for m in modules]
    try:
        batch, step = _replayed_step(entries, modules, scaled_from)
    except NotReplayable as why:
        note(f"the training step runs {len(names)} modules ({', '.join(names)}), and {why}: "
             "launch cannot replay that step, so it is not traced")
        write_answer()
        raise Stop from None
    _optimizers(optimizer, modules)
    return modules, batch, step


def _replayed_step(entries: list[Entry], modules: list[torch.nn.Module],
                   scaled_from: ScaledFrom) -> tuple[dict[str, Any], dict[str, Any]]:
    from launcher.capture.child.capture import leaves
    from launcher.capture.child.data_bound import bounded_inputs, bounded_shape

    flow = _Flow()
    position = {id(m): i for i, m in enumerate(modules)}
    steps = []
    for index, (kind, target, args, kwargs, out) in enumerate(entries):
        if kind == "call":
            steps.append({"module": position[id(target)], "args": flow.spec(list(args)),
                          "kwargs": flow.spec(dict(kwargs))})
        else:
            name = _op_name(target)
            flow.sizes = name.split(".")[-1] in _SHAPE_OPS
            try:
                steps.append({"op": name, "args": flow.spec(list(args)),
                              "kwargs": flow.spec(dict(kwargs))})
            finally:
                flow.sizes = False
        flow.produce(index, out)
    batch: dict[str, Any] = {"inputs": list(flow.inputs), "extra": {}}
    sizes = [t.shape[0] for t in leaves(batch) if t.dim() > 0]
    rows = max(set(sizes), key=sizes.count) if sizes else None
    step: dict[str, Any] = {"kind": "pipeline", "calls": steps}
    step.update(_loss(entries, flow, rows, batch, scaled_from))
    batch = bounded_inputs(batch)
    # where the loop binds each call's results to names, each stays alive until that call
    # returns again in the next step (the decoder's log-probabilities through the encoder's
    # forward): ``plain._capture`` keeps these shapes if it does
    step["held_output"] = [[[bounded_shape(list(t.shape)), str(t.dtype).removeprefix("torch.")]
                            for t in leaves(out)] if kind == "call" else []
                           for kind, *_, out in entries]
    return batch, step


def _loss(calls: list[Entry], flow: _Flow, rows: int | None, batch: dict[str, Any],
          scaled_from: ScaledFrom) -> dict[str, Any]:
    """How the loop's loss came from the step's outputs: the last call's whose output it is
    matched against first (``from``), as ``plain._loss`` matches a single model's; the target
    is a batch input (``target_input``) or a tensor of the loop's own (``batch["extra"]``)."""
    import torch.nn.functional as F

    from launcher.capture.child.accelerate import match_loss, output_loss, same_values

    loss = STATE["plain_loss"]
    frame = {name: value for name, value in (STATE.get("plain_frame") or {}).items()
             if isinstance(value, torch.Tensor) and not value.requires_grad and value.dim() > 0
             and value.shape[0] == rows}
    for index in range(len(calls) - 1, -1, -1):
        if calls[index][0] != "call":
            continue
        out = calls[index][4]
        if isinstance(out, torch.Tensor) and out.dim() == 0 and (
                out is loss or scaled_from(loss, out)):
            return {"from": index, "loss": "output"}  # a loss module with weights of its own
        own_loss = output_loss(out)
        if own_loss is not None and (own_loss is loss or same_values(own_loss, loss)
                                     or scaled_from(loss, own_loss)):
            return {"from": index, "loss": "model"}
        if isinstance(out, (list, tuple)):
            for position, value in enumerate(out):
                if isinstance(value, torch.Tensor) and (value is loss or (
                        value.dim() == 0 and (same_values(value, loss)
                                              or scaled_from(loss, value)))):
                    return {"from": index, "loss": "index", "index": position}
        match = _nll_first(out, frame, loss, F) or match_loss(out, frame, loss, F)
        if match is not None:
            target = frame[match["target"]]
            if id(target) in flow.index:
                match["target_input"] = flow.index[id(target)]
            else:
                batch["extra"][match["target"]] = target
            return {"from": index, **match}
    note("the loop's loss is not a module's own nor a cross-entropy, MSE, L1, NLL or BCE of the "
         "last module's output: the traced step sums that output (the loss's own activations "
         "are not counted)")
    return {"from": max(i for i, e in enumerate(calls) if e[0] == "call"), "loss": "sum"}


def _nll_first(out: Any, frame: dict[str, torch.Tensor], loss: torch.Tensor, F: Any
               ) -> dict[str, Any] | None:
    """An NLL loss of log-probabilities (the decoder's ``log_softmax``), read off the loss's
    graph: ``cross_entropy`` of them has the same values (log-softmax is idempotent), and
    ``match_loss`` tries it first, but it makes one more log-softmax of the whole output and
    its gradient (+3.5% on seq2seq). An ``NllLossBackward0`` whose input is not a
    ``LogSoftmaxBackward0`` made after the output was an ``nll_loss``."""
    from launcher.capture.child.accelerate import output_tensor, same_values

    output, which = output_tensor(out)
    node = loss.grad_fn
    if output is None or type(node).__name__ != "NllLossBackward0":
        return None
    inner = node.next_functions[0][0]
    if type(inner).__name__ == "LogSoftmaxBackward0" and inner is not output.grad_fn:
        return None  # cross_entropy's own log-softmax
    with torch.no_grad():
        for key, target in frame.items():
            for flatten in (False, True):
                try:
                    got = (F.nll_loss(output.reshape(-1, output.shape[-1]), target.reshape(-1))
                           if flatten else F.nll_loss(output, target))
                except Exception:  # noqa: BLE001, S112 - shapes that do not go together
                    continue
                if same_values(got, loss):
                    return {"loss": "function", "function": "nll_loss", "output": which,
                            "target": key, "flatten": flatten}
    return None


def _optimizers(first: torch.optim.Optimizer, modules: list[torch.nn.Module]) -> None:
    """The optimizers holding the step's parameters, rebuilt as one (``save_optimizer``): of
    their class, with one parameter group each (by the parameters' places in the stages'
    order) where their settings differ; of different classes (an Adam and an SGD), each for
    its own groups (``parts``), which the recipe steps together."""
    from launcher.capture.child.capture import save_optimizer

    params = list({id(p): p for m in modules for p in m.parameters()}.values())
    place = {id(p): i for i, p in enumerate(params)}
    made = [ref() for ref in STATE.get("optimizers") or ()]
    if first not in made:
        made.insert(0, first)
    held = [o for o in made if o is not None and any(
        id(p) in place for g in o.param_groups for p in g["params"])]
    held.sort(key=lambda o: o is not first)  # the one that stepped first, then as built
    save_optimizer(held[0])
    ANSWER["optimizers"] = [type(o).__name__ for o in held]
    outside = [p for o in held for g in o.param_groups for p in g["params"]
               if id(p) not in place]
    if outside:
        note("the optimizers hold parameters outside the step's modules: their states are not "
             "counted")
    parts = []
    for optimizer in held:
        groups = []
        for group in optimizer.param_groups:
            groups.append({"params": [place[id(p)] for p in group["params"] if id(p) in place],
                           "settings": _settings(group)})
        cls = type(optimizer)
        parts.append({"class": f"{cls.__module__}.{cls.__qualname__}",
                      "defaults": _settings(optimizer.defaults), "groups": groups})
    if len({p["class"] for p in parts}) > 1:
        ANSWER["optimizer"]["parts"] = parts
        note(f"the step's optimizers are {', '.join(ANSWER['optimizers'])}: each is rebuilt for "
             "its own parameters (under FSDP, whose parameters are flat, all are traced with "
             f"{ANSWER['optimizers'][0]}'s states)")
        return
    groups = [g for part in parts for g in part["groups"]]
    if len({repr(sorted(g["settings"].items())) for g in groups}) > 1:
        ANSWER["optimizer"]["groups"] = groups


def _settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """An optimizer's (or a group's) plain settings, as JSON holds them."""
    return {k: v for k, v in values.items() if k != "params" and (
        isinstance(v, _PLAIN) or isinstance(v, (tuple, list))
        and all(isinstance(x, (int, float)) for x in v))}


def other_optimizers(stepped: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """Refuse the step where the script built other optimizers, for parameters outside
    ``model`` (a GAN's generator, whose Adam steps after the discriminator's): the step that
    would be traced is the first optimizer's, of its model alone, and a plan of that (35K of a
    DCGAN's 375K parameters) would be presented as the script's."""
    mine = {id(p) for p in model.parameters()}
    outside: dict[int, torch.Tensor] = {}
    for ref in STATE.get("optimizers") or ():
        other = ref()
        if other is None or other is stepped:
            continue
        for group in other.param_groups:
            outside.update((id(p), p) for p in group["params"] if id(p) not in mine)
    if outside:
        count = sum(p.numel() for p in outside.values())
        note(f"the script builds another optimizer, for {count:,} parameters outside the "
             f"model its first optimizer step updates ({type(model).__name__}): launch traces "
             "one training step, and this script's steps update its models in turns (a GAN), "
             "so it is not traced")
        write_answer()
        raise Stop
