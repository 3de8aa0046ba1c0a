"""What a plan costs: step time from FLOPs and communication, times the machine's price.

step time = compute + communication, with
  compute = global batch x training FLOPs per sample x (4/3 with full activation
            checkpointing: one more forward; 7/6 with selective: about half of each block's
            matmuls again, ``RECOMPUTE``) / (GPUs x peak rate x MFU);
  communication, per optimizer step and GPU: DDP all-reduces the gradients once (2 (n-1)/n of
  their bytes on the wire), FSDP all-gathers the parameters for forward and backward and
  reduce-scatters the gradients (3 (n-1)/n of their bytes; ZeRO-2, which keeps the gathered
  parameters from forward to backward, gathers once: 2 (n-1)/n), over NVLink within a node and the
  network between nodes; a plan that reduce-scatters on every micro-step
  (``Plan.reduce_every_micro_step``) does that last part once per micro-step. It is added
  without overlap: a cost model should not flatter a plan.
The MFU is an assumption (``ASSUMED_MFU``), stated with every cost; a calibrated one replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher import strategies
from launcher.plan.plan import checkpointing_mode

#: Model FLOPs utilisation assumed for dense transformer training with PyTorch (torchtitan reports
#: roughly 35-50% for Llama 3 8B on H100 with FSDP2; 40% is the middle).
ASSUMED_MFU = 0.40
#: A step's compute relative to no checkpointing. Full: each block's forward runs again (the
#: forward is a third of forward + backward). Selective (the templates' op-level policy) recomputes
#: the matmuls whose outputs it does not keep, every other one, and the element-wise ops, whose
#: FLOPs are negligible: at most half the forward's matmul FLOPs, +1/6 (39% of them for a Llama
#: block, 42% for GPT-2's, by their shapes; attention is kept, not recomputed).
RECOMPUTE = {"none": 1.0, "selective": 7 / 6, "full": 4 / 3}


@dataclass(frozen=True)
class Hardware:
    peak_tflops: float | None        # for the plan's precision
    intra_node_gbytes_per_s: float | None
    inter_node_gbps: float | None
    price_per_hour: float | None


@dataclass(frozen=True)
class Cost:
    step_time_s: float | None
    cost_per_hour_usd: float | None
    total_cost_usd: float | None


def step_cost(*, flops_per_sample: float | None, global_batch: int, world: int, nodes: int,
              strategy: str, checkpointing: bool | str, gradient_bytes: int | None,
              parameter_bytes_compute: int | None, steps: int | None, hw: Hardware,
              reduce_scatters: int = 1, gathers: int = 2) -> Cost:
    price = None if hw.price_per_hour is None else hw.price_per_hour * nodes
    if flops_per_sample is None or not hw.peak_tflops:
        return Cost(None, price, None)
    flops = global_batch * flops_per_sample * RECOMPUTE[checkpointing_mode(checkpointing)]
    compute = flops / (world * hw.peak_tflops * 1e12 * ASSUMED_MFU)
    comm = 0.0
    if world > 1:
        if nodes > 1 and hw.inter_node_gbps:
            bandwidth = hw.inter_node_gbps / 8 * 1e9 / (world // nodes)  # per GPU share
        else:
            bandwidth = (hw.intra_node_gbytes_per_s or 16.0) * 1e9  # PCIe Gen3 x16 otherwise
        factor = (world - 1) / world
        sharded = strategies.get(strategy).sharded
        if not sharded and gradient_bytes:  # DDP: an all-reduce of the gradients
            comm = 2 * factor * gradient_bytes / bandwidth
        elif sharded and parameter_bytes_compute:
            # all-gathers (forward, and backward unless ZeRO-2 kept the parameters) and the
            # reduce-scatter(s) of the gradients
            comm = (gathers + reduce_scatters) * factor * parameter_bytes_compute / bandwidth
    step = compute + comm
    # steps None: a framework script's own length, not known before it runs (nor its cost)
    total = None if price is None or steps is None else steps * step * price / 3600
    return Cost(step, price, total)
