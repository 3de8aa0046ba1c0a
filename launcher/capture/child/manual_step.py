"""A plain loop that updates its weights by hand: its step ends where the next one starts.

Most plain loops step a ``torch.optim`` optimizer, and its step pre-hook is where the capture
stops the script (``plain.patch_plain``). Some never make one: pytorch/examples'
word_language_model clips and then updates every parameter itself
(``for p in model.parameters(): p.data.add_(p.grad, alpha=-lr)``), and the script ran to its end
with no plan ("no optimizer step"). Such a loop's step is over when the next one starts, so:

- after each backward (while no optimizer was ever made: one that is made keeps the usual stop),
  the weights the backward gave gradients are fingerprinted (their sum, and their values where
  their gradients are largest and smallest: exact floats, cheap, and nothing weight-sized is
  allocated, which the measurement would count);
- at the loop's next top-level forward with gradients or ``zero_grad``, the weights are compared:
  changed, that was a step by hand; unchanged, the loop is accumulating gradients (the next
  backward fingerprints again). A forward or ``zero_grad`` alone is no step boundary: an
  accumulating loop makes several backwards before it updates.

At the first such boundary the capture takes the step as it does at an optimizer's (the module
whose weights changed, its last call's inputs: word_language_model's ``model(data, hidden)``
with the hidden state carried in from the last step), with a stand-in optimizer that holds what
the script's update holds: ``torch.optim.SGD`` without momentum or weight decay, which keeps no
state and adds ``-lr * grad`` in place, as the script's loop does. The plan says the script
updates its weights itself, so that no optimizer setting reaches it (``--optimizer``,
``--weight-decay``; a pinned ``--lr`` only where the script has an lr flag, which its own update
reads: word_language_model's ``--lr``).

With ``--measure`` the same boundaries count the script's steps: the profile stops at the third,
as it stops at an optimizer's third step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE, Stop, note, write_answer
from launcher.capture.child.capture import own
from launcher.capture.child.measure import stop_profile

#: What the capture writes for the update by hand: an optimizer of no state, updating in place.
BY_HAND = {"class": "torch.optim.sgd.SGD", "name": "sgd", "by_hand": True,
           "defaults": {"lr": 1.0, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
                        "nesterov": False, "foreach": False}}


def watch_plain(capture_step: Callable[[torch.nn.Module, tuple, dict, Any], None]) -> None:
    """The capture's (and ``--measure``'s) hooks: at the first step by hand the capture is
    written by ``capture_step(model, args, kwargs, out)``; measuring, the third ends the
    profile."""
    watch_manual_steps(_watched, lambda changed, where: _step_ended(changed, where,
                                                                    capture_step))


def watch_manual_steps(weights: Callable[[], list[torch.nn.Parameter]],
                       on_step: Callable[[list[torch.nn.Parameter], str], None]) -> None:
    """Hooks (outermost, over ``plain``'s own) that find a loop's updates by hand:
    ``on_step(changed weights, "forward" | "zero_grad")`` at each boundary where the weights
    that ``weights()`` gives changed since the last backward (bench_plain's hook-free run counts
    its steps with it too)."""
    made = [0]  # optimizers made so far: one that is made stops the script itself
    init = torch.optim.Optimizer.__init__

    def counting_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        made[0] += 1
        init(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = counting_init  # type: ignore[method-assign]
    #: after a backward: (the weights with gradients, their fingerprints)
    pending: list[tuple[list[torch.nn.Parameter], list[tuple[float, ...]]]] = []
    backward = torch.Tensor.backward
    inside = [False]

    def fingerprinting_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        outer, inside[0] = inside[0], True
        try:
            done = backward(self, *args, **kwargs)
        finally:
            inside[0] = outer
        if not outer and not made[0] and not STATE.get("capturing"):
            graded = [p for p in weights() if p.grad is not None]
            pending[:] = [(graded, [_fingerprint(p) for p in graded])] if graded else []
        return done

    torch.Tensor.backward = fingerprinting_backward  # type: ignore[method-assign]

    def boundary(where: str) -> None:
        """At a top-level forward with gradients or a ``zero_grad``: a step by hand ended if the
        weights changed since the last backward."""
        if not pending or made[0]:
            pending.clear()
            return
        graded, prints = pending.pop()
        changed = [p for p, before in zip(graded, prints, strict=True)
                   if _fingerprint(p) != before]
        if changed:
            on_step(changed, where)

    call = torch.nn.Module.__call__
    depth = [0]

    def watching_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not depth[0] and pending and torch.is_grad_enabled():
            boundary("forward")
        depth[0] += 1
        try:
            return call(self, *args, **kwargs)
        finally:
            depth[0] -= 1

    torch.nn.Module.__call__ = watching_call  # type: ignore[method-assign]
    zero_grad = torch.nn.Module.zero_grad

    def watching_zero_grad(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if pending:
            boundary("zero_grad")
        return zero_grad(self, *args, **kwargs)

    torch.nn.Module.zero_grad = watching_zero_grad  # type: ignore[method-assign]


def _watched() -> list[torch.nn.Parameter]:
    """The weights that may be updated by hand: those of the modules the loop called at the
    top level with gradients (the measured model, when measuring)."""
    if STATE.get("measure"):
        model = STATE.get("measured_model")
        modules = [model] if model is not None else []
    else:
        modules = [entry[0] for entry in (STATE.get("plain_calls") or {}).values()]
    found = {id(p): p for m in modules for p in m.parameters() if p.requires_grad}
    return list(found.values())


def _fingerprint(weight: torch.Tensor) -> tuple[float, ...]:
    """The weight's sum and its values where its gradient is largest and smallest (an update
    along the gradient changes those most; exact floats, nothing weight-sized allocated)."""
    with torch.no_grad():
        flat, grad = weight.detach().reshape(-1), weight.grad
        prints = [float(flat.sum())]
        if grad is not None and grad.numel() == flat.numel():
            grad = grad.reshape(-1)
            prints += [float(flat[int(grad.argmax())]), float(flat[int(grad.argmin())])]
        return tuple(prints)


def _step_ended(changed: list[torch.Tensor], where: str,
                capture_step: Callable[[torch.nn.Module, tuple, dict, Any], None]) -> None:
    if STATE.get("measure"):
        STATE["steps"] = STATE.get("steps", 0) + 1
        if STATE["steps"] >= 3 and "profile" in STATE:
            stop_profile()
            raise Stop
        return
    if ANSWER["reached"]:
        raise Stop
    STATE["capturing"] = True
    mine = {id(p) for p in changed}
    owners = sorted(((sum(1 for p in module.parameters() if id(p) in mine), module, args, kwargs,
                      out) for module, args, kwargs, out in
                     (STATE.get("plain_calls") or {}).values()), key=lambda o: -o[0])
    if not owners or not owners[0][0]:
        note("the loop changed its weights without an optimizer, but not those of a module it "
             "called: launch cannot trace the script")
        write_answer()
        raise Stop
    if sum(1 for o in owners if o[0]) > 1:
        note(f"{sum(1 for o in owners if o[0])} modules' weights were updated by hand: the "
             f"largest ({type(owners[0][1]).__name__}) is traced")
    _, model, args, kwargs, out = owners[0]
    script = getattr(STATE.get("script"), "name", "the script")
    ANSWER["optimizer"] = dict(BY_HAND)
    own("optimizer", "sgd", f"none: {script} updates its weights itself (no torch.optim "
        "optimizer), traced as SGD without momentum: no optimizer state")
    note(f"{script} updates its weights itself, without a torch.optim optimizer (its step ended "
         f"at the loop's next {where} after a backward, the weights changed): traced with no "
         "optimizer state, as an update by hand holds none; no optimizer setting reaches it "
         "(--optimizer, --weight-decay; a pinned --lr only through a flag of its own)")
    with contextlib.suppress(KeyError):
        del ANSWER["launch"]["lr"]  # not an optimizer's lr: the script's own update
    capture_step(model, args, kwargs, out)
    raise Stop
