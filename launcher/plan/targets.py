"""The machines a plan can use: this one (local provider) or a cloud catalog's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from launcher.estimate.calibration import lookup
from launcher.plan.catalog import UnknownMachine, family_of, load_catalog
from launcher.plan.memory import Target
from launcher.script_info import Hardware
from launcher.spec import Spec
from launcher.status import UsageError

#: Nodes the planner may add on a cloud when one machine is not enough.
MAX_CLOUD_NODES = 16


def calibrated(targets: list[Target], state_dir: Path | None, model: str | None
               ) -> list[Target]:
    """Each target with what earlier runs on its machine type measured (see calibration)."""
    if state_dir is None:
        return targets
    out = []
    for t in targets:
        if t.cpu:
            out.append(t)
            continue
        cal = lookup(state_dir, t.name, model)
        out.append(replace(t, reserve_ratio=cal.reserve_ratio,
                           allocated_scale=cal.allocated_scale))
    return out


def local_target(spec: Spec, hw: Hardware) -> Target:
    """This machine: its GPUs as torch sees them, else CPU processes with gloo."""
    if spec.nodes not in (None, 1):
        raise UsageError("the local provider runs on one node", "drop --nodes, or use a cloud")
    if spec.machine is not None:
        raise UsageError("--machine names a cloud machine type",
                         "drop it for the local provider, or pass --provider vertex|sagemaker")
    if hw.cuda_devices:
        known = family_of(hw.cuda_name)  # its bf16 support: the default precision
        return Target(name=f"local-{hw.cuda_name or 'cuda'}", gpus=hw.cuda_devices,
                      memory_bytes=hw.cuda_memory_bytes, gpu_name=hw.cuda_name,
                      bf16=None if known is None else known.supports_bf16, here=True)
    procs = spec.gpus_per_node or 1
    host = hw.host_memory_bytes
    capacity = spec.memory_limit or (host // procs if host else None)
    return Target(name="local-cpu", gpus=max(procs, 1), memory_bytes=capacity, cpu=True,
                  bf16=False, address_space_cap=spec.memory_limit is not None, here=True)


def cloud_targets(provider: str, spec: Spec) -> list[Target]:
    catalog = load_catalog(provider)
    if spec.machine is not None:
        try:
            machines = [catalog.get(spec.machine)]
        except UnknownMachine as exc:
            raise UsageError(str(exc)) from None
    else:
        machines = [m for m in catalog.machines if spec.gpus_per_node is None
                    or m.gpu_count >= spec.gpus_per_node]
    targets = []
    for m in machines:
        gpu = m.gpu_type
        targets.append(Target(
            name=m.name, gpus=m.gpu_count, memory_bytes=gpu.usable_memory_bytes,
            generation=gpu.generation, gpu_name=gpu.name,
            price_per_hour=(m.spot_price_per_hour if spec.spot and m.spot_price_per_hour
                            else m.price_per_hour),
            bf16_tflops=gpu.bf16_tflops, fp32_tflops=gpu.fp32_tflops, bf16=gpu.supports_bf16,
            price_note=m.price_note,
            intra_node_gbytes_per_s=m.intra_node_gbytes_per_s,
            inter_node_gbps=m.inter_node_gbps, max_nodes=MAX_CLOUD_NODES))
    return targets
