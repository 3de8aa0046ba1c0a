"""Vertex AI machine specs: a catalog name or ``MACHINE_TYPE+GPUxCOUNT`` -> the machineSpec of the
request, refused here when Vertex AI would refuse it minutes later."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from launcher.status import UsageError

#: Short GPU names accepted in ``MACHINE+GPUxCOUNT`` -> Vertex AI's AcceleratorType.
ACCELERATORS = {
    "t4": "NVIDIA_TESLA_T4", "v100": "NVIDIA_TESLA_V100", "p100": "NVIDIA_TESLA_P100",
    "p4": "NVIDIA_TESLA_P4", "k80": "NVIDIA_TESLA_K80", "l4": "NVIDIA_L4",
    "a100": "NVIDIA_TESLA_A100", "a100-40gb": "NVIDIA_TESLA_A100",
    "a100-80gb": "NVIDIA_A100_80GB", "h100": "NVIDIA_H100_80GB",
    "h100-80gb": "NVIDIA_H100_80GB", "h100-mega": "NVIDIA_H100_MEGA_80GB",
    "h200": "NVIDIA_H200_141GB", "b200": "NVIDIA_B200",
}
#: GPUs that attach to N1 machine types (the other GPU families come built into theirs).
N1_ACCELERATORS = ("NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100",
                   "NVIDIA_TESLA_P4", "NVIDIA_TESLA_K80")
N1_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class MachineSpec:
    machine_type: str
    accelerator_type: str | None
    accelerator_count: int

    def to_dict(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"machineType": self.machine_type}
        if self.accelerator_type:
            spec["acceleratorType"] = self.accelerator_type
            spec["acceleratorCount"] = self.accelerator_count
        return spec


def machine_spec(machine: str, gpus_per_node: int) -> MachineSpec:
    """The machineSpec of a plan's machine: a catalog name (``a2-ultragpu-8g``,
    ``n1-standard-8+t4x1``), or ``MACHINE_TYPE+GPUxCOUNT`` for a combination the catalog does not
    list, checked against what the machine type can take."""
    from launcher.plan.catalog import load_catalog

    catalog = load_catalog("vertex")
    if machine in catalog:
        row = catalog.get(machine)
        spec = MachineSpec(row.machine_type or row.name, row.accelerator_type, row.gpu_count)
    else:
        spec = _parse_machine(machine)
        _check_accelerator(spec, catalog)
    if spec.accelerator_type and gpus_per_node > spec.accelerator_count:
        raise UsageError(f"{machine} has {spec.accelerator_count} GPU(s), the plan runs "
                         f"{gpus_per_node} processes per node",
                         "pass --gpus-per-node at most the machine's GPU count")
    return spec


def _parse_machine(machine: str) -> MachineSpec:
    machine_type, plus, gpus = machine.strip().partition("+")
    if not plus:
        return MachineSpec(machine_type, None, 0)
    match = re.fullmatch(r"(.+?)x(\d+)", gpus)
    if match is None:
        raise UsageError(f"cannot read the GPUs of machine {machine!r}",
                         "write MACHINE_TYPE+GPUxCOUNT, e.g. n1-standard-8+t4x1")
    name, count = match.group(1), int(match.group(2))
    accelerator = ACCELERATORS.get(name.lower(), name.upper())
    return MachineSpec(machine_type, accelerator, count)


def _check_accelerator(spec: MachineSpec, catalog: Any) -> None:
    """Refuse what Vertex AI would refuse anyway, minutes later and in less plain words."""
    from google.cloud.aiplatform_v1.types import AcceleratorType

    fixed = {(m.accelerator_type, m.gpu_count) for m in catalog
             if (m.machine_type or m.name) == spec.machine_type}
    family = spec.machine_type.split("-")[0]
    if spec.accelerator_type is None:
        if fixed and all(acc for acc, _ in fixed):
            acc, count = sorted(fixed, key=str)[0]
            raise UsageError(f"machine type {spec.machine_type} comes with {count} x {acc}",
                             f"use the catalog name {spec.machine_type}")
        return
    if spec.accelerator_type not in AcceleratorType.__members__:
        raise UsageError(f"unknown accelerator type {spec.accelerator_type!r}",
                         f"use one of {', '.join(sorted(set(ACCELERATORS)))}, or a Vertex AI "
                         "AcceleratorType name")
    if family == "n1":
        if spec.accelerator_type not in N1_ACCELERATORS:
            raise UsageError(
                f"machine type {spec.machine_type} cannot take {spec.accelerator_type}",
                f"N1 machines take {', '.join(N1_ACCELERATORS)}; "
                "`launch machines --provider vertex` lists the combinations")
        if spec.accelerator_count not in N1_COUNTS:
            raise UsageError(f"{spec.accelerator_count} GPUs cannot attach to an N1 machine",
                             f"attach {', '.join(map(str, N1_COUNTS))} GPUs")
        return
    if fixed:
        if (spec.accelerator_type, spec.accelerator_count) not in fixed:
            acc, count = sorted(fixed, key=str)[0]
            raise UsageError(
                f"machine type {spec.machine_type} cannot take {spec.accelerator_count} x "
                f"{spec.accelerator_type}; it comes with {count} x {acc}",
                f"use the catalog name {spec.machine_type}")
        return
    raise UsageError(
        f"machine type {spec.machine_type} cannot take {spec.accelerator_type}",
        "GPUs attach to N1 machine types, or come built into A2, A3, A4 and G2 ones; "
        "`launch machines --provider vertex` lists them")
