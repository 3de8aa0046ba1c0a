"""The precision a plan trains in when nobody pinned one: the one home of that decision.

A plan on a GPU that computes in bf16 (compute capability 8.0 and up: A100, H100, H200, L4,
L40S, A10G, B200; ``catalog.GpuType.supports_bf16``) trains in ``bf16_mixed``: bf16 autocast
over fp32 master weights, gradients and optimizer state, the common recipe for training large
models (torchtitan's and llama-recipes' default, ZeRO's "mixed precision" with 16 bytes of
states per parameter). A GPU without bf16 (V100, T4, P100) and the CPU train in fp32, and so does
a GPU whose bf16 support is not known (this machine's GPU under the local provider when its
name is none of the catalog's families: ``catalog.family_of``).

A default is not a user's choice, and nothing the user did not pin is changed behind their back:
launch picks the precision only where the precision is launch's to set, that is, where the job
runs launch's own training code or asks launch for it:

- a recipe: the rendered template applies the plan's precision (``LAUNCH["precision"]`` in the
  recipe is a pin and stays);
- no script at all (``launch plan --params 30B``): a plan for the template the model will get;
- a plain script described by ``--params`` / ``--model-config`` that reads the plan's
  precision (``LAUNCH_PRECISION`` or ``LAUNCH_PLAN``): it asked launch.

Never a framework script (a Trainer's ``bf16``, Lightning's ``precision`` are its own) nor a
captured plain script (its precision is its code's: autocast seen in its loop is recorded as its
own ``bf16_mixed``, no autocast is fp32), nor a plain script that does not read the plan's
precision: those keep what they run, and the plan says the GPU has bf16 where it does.
"""

from __future__ import annotations

from launcher.plan.memory import Target
from launcher.script_info import plain_reads
from launcher.spec import Spec

#: Unpinned, on a GPU with bf16.
WITH_BF16 = "bf16_mixed"
#: Unpinned, on a GPU without it (or not known to have it), on the CPU, and a script's own
#: precision when it shows none.
WITHOUT_BF16 = "fp32"
#: The variables through which a plain script reads the plan's precision.
_READ_BY = frozenset({"LAUNCH_PRECISION", "LAUNCH_PLAN"})


def launch_chooses(spec: Spec) -> bool:
    """Whether the plan's precision is launch's to choose (this module's docstring)."""
    if spec.precision is not None or spec.framework is not None or spec.captured:
        return False
    if spec.mode == "recipe":
        return True
    reads = plain_reads(spec)
    return reads is None or bool(reads & _READ_BY)


def precision_for(spec: Spec, target: Target) -> str:
    """The precision a plan on ``target`` trains in."""
    if spec.precision is not None:
        return spec.precision
    if launch_chooses(spec) and target.bf16 and not target.cpu:
        return WITH_BF16
    return WITHOUT_BF16


def origin(spec: Spec, target: Target) -> str | None:
    """Where a plan's precision came from, in words, when launch chose it (None when it was
    pinned: the spec's origins already say how)."""
    if spec.precision is not None:
        return None
    gpu = target.gpu_name or target.name
    if not launch_chooses(spec):
        return f"{spec.script.name}'s own: launch does not change a script's precision"
    if target.cpu:
        return "launch's default on the CPU"
    if target.bf16:
        return (f"launch's default on {gpu}, which computes in bf16; "
                "--precision fp32 to keep fp32")
    if target.bf16 is None:
        return f"launch's default: {gpu}'s bf16 support is not known"
    return f"launch's default on {gpu}, which has no bf16"


def note(spec: Spec, target: Target, precision: str) -> str | None:
    """The GPU has bf16 and a script's own precision is fp32: said, not changed."""
    if launch_chooses(spec) or spec.precision is not None or precision != WITHOUT_BF16:
        return None
    if not target.bf16 or target.cpu:
        return None
    return (f"{target.gpu_name or target.name} computes in bf16, but {spec.script.name}'s "
            "precision is its own code's (planned as fp32); if it trains under bf16 autocast, "
            "--precision bf16_mixed sizes it so")
