"""A model's single-device memory per micro-batch: what the planner scales to every strategy.

One ``Footprint`` is one choice of precision, optimizer and activation checkpointing; its
``memory_at(b, accum)`` gives the single-device ``Memory`` at micro-batch ``b`` with ``accum``
micro-batches per optimizer step (accumulation keeps a gradient alive through the micro-steps
after the first), without re-tracing (the
traced estimate fits lines through a few traced sizes; the analytic one is linear by
construction). The planner applies the strategy (sharding divides the model states) and the
GPU-side overheads on top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.estimate.analytic import ModelShape
from launcher.estimate.states import model_states
from launcher.plan.plan import Memory


@dataclass(frozen=True)
class Footprint:
    kind: str                          # traced | config | declared (| upper_bound)
    precision: str
    optimizer: str
    activation_checkpointing: bool
    parameters: int                    # count
    memory_at: Callable[[int, int], Memory]  # single device, at (micro-batch, accumulation)
    unit_parameters: int | None = None  # the largest wrap_modules() block: FSDP's gathered unit
    flops_per_sample: float | None = None
    note: str = ""
    #: Traced footprints: the ``Memory`` at each phase's own peak (build, forward, backward,
    #: optimizer, zero_grad), so that sharding is applied to each moment before the maximum.
    phases_at: Callable[[int, int], dict[str, Memory]] | None = None
    #: Traced footprints: one rank's ``Memory`` under a sharded strategy, traced at its world
    #: size: ``(strategy, nodes, gpus per node, micro-batch, accumulation)``; None when it
    #: cannot be traced (the planner then keeps the sharded single-device estimate).
    rank_memory_at: Callable[[str, int, int, int, int], Memory | None] | None = None
    #: Analytic footprints: the activation bytes per sample that exist only because the
    #: weights are fp32 under autocast (the fp32 stream of a RMSNorm model,
    #: ``ModelShape.fp32_stream``): a sharded rank, whose FSDP gathers bf16 weights, has none.
    fp32_weight_bytes_per_sample: int = 0
    #: Traced footprints of a step that built the script's own optimizer (not launch's): its
    #: class (``Adadelta``), for the plan to name (``Plan.optimizer_class``).
    optimizer_class: str | None = None


#: How an optimizer's step runs over the parameters: ``foreach`` (multi-tensor kernels over a
#: whole group: PyTorch's default on CUDA) or ``for-loop`` (one parameter at a time: PyTorch's
#: ``foreach=False``, PyTorch before 2.0, transformers' own ``AdamW``, Trainer's ``adamw_hf``).
OPTIMIZER_IMPLEMENTATIONS = ("foreach", "for-loop")


def foreach_temporary(trainable: int, optimizer: str, precision: str,
                      implementation: str = "foreach", largest: int | None = None) -> int:
    """Bytes an optimizer step allocates on top of its state.

    PyTorch's foreach AdamW (the default on CUDA) computes ``_foreach_sqrt(exp_avg_sq)`` out of
    place: a full copy of the second moments, 4 bytes per trained parameter in fp32 (2 in bf16).
    A for-loop AdamW makes its temporaries one parameter at a time: PyTorch's single-tensor step
    holds ``exp_avg_sq.sqrt()`` and its quotient by the bias correction at once (two copies of
    one parameter), transformers' ``AdamW`` only ``exp_avg_sq.sqrt()`` (one); two copies of the
    ``largest`` parameter are counted (the foreach figure where the largest is unknown).
    SGD's step updates in place either way.
    """
    if optimizer != "adamw":
        return 0
    element = 2 if precision == "bf16" else 4
    if implementation == "for-loop" and largest is not None:
        return min(trainable, 2 * largest) * element
    return trainable * element


def from_shape(shape: ModelShape, *, precision: str, optimizer: str, checkpointing: bool | str,
               flash: bool | None = None, kind: str = "config",
               optimizer_implementation: str = "foreach") -> Footprint:
    """The analytic footprint: exact model states, formula activations (None if unknown).
    ``optimizer_implementation``: foreach | for-loop (``OPTIMIZER_IMPLEMENTATIONS``)."""
    if optimizer_implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ValueError(f"unknown optimizer implementation {optimizer_implementation!r}")
    states = model_states(shape.parameters, precision, optimizer)
    element = 4 if precision == "fp32" else 2
    autocast = precision == "bf16_mixed"  # the templates' bf16_mixed: autocast, fp32 weights
    per_sample = shape.activation_bytes_per_sample(element_bytes=element, flash=flash,
                                                   checkpointing=checkpointing, autocast=autocast)
    # what a sharded rank's bf16 gathers would not have: an RMSNorm model's fp32 stream
    bf16_weights = shape.activation_bytes_per_sample(
        element_bytes=element, flash=flash, checkpointing=checkpointing, autocast=autocast,
        fp32_weights=False)
    fp32_only = 0 if per_sample is None or bf16_weights is None else per_sample - bf16_weights
    # autocast's 16-bit weight copies: once per step, whatever the micro-batch (the planner
    # takes them out of sharded plans, whose FSDP gathers bf16 weights autocast does not cast)
    copies = (shape.autocast_copy_bytes() or 0) if autocast else 0
    temporary = foreach_temporary(shape.parameters, optimizer, precision,
                                  optimizer_implementation, shape.largest_parameter)

    def memory_at(micro_batch: int, accum: int = 1) -> Memory:
        # ``accum`` does not change this model: it counts the gradients with the activations'
        # peak in every plan (an upper bound without accumulation, whose forward pass holds no
        # gradient; the traced estimate tells the two apart).
        activations = None if per_sample is None else per_sample * micro_batch + copies
        peak = None
        if activations is not None and states.optimizer is not None:
            # Activations are gone by the optimizer step, where its temporaries appear.
            peak = states.parameters + states.gradients + states.optimizer + max(
                activations, temporary)
        return Memory(parameters=states.parameters, gradients=states.gradients,
                      optimizer=states.optimizer, activations=activations, temporary=temporary,
                      peak_allocated=peak)

    note = "" if per_sample is not None else (
        "activations unknown: give the shape (--model-config, or --layers --hidden-size "
        "--heads --vocab-size --seq-len)")
    return Footprint(kind=kind, precision=precision, optimizer=optimizer,
                     activation_checkpointing=checkpointing, parameters=shape.parameters,
                     memory_at=memory_at, unit_parameters=shape.layer_parameters,
                     flops_per_sample=shape.flops_per_sample(), note=note,
                     fp32_weight_bytes_per_sample=fp32_only)
