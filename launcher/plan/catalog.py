"""GPU machine catalogs: what each provider can run, what it costs, and what its GPUs can do.

The facts live in JSON: each provider's machines in its own package (``catalog.json``, where its
registry entry says: ``launcher/providers/vertex/catalog.json``), the GPUs' in
``catalogs/gpus.json`` next to this module (``catalogs/README.md`` gives the schema and every
source). This module only loads them into plain dataclasses. It must stay cheap to import: no
torch, no cloud SDKs, no provider class.

    >>> cat = load_catalog("sagemaker")
    >>> m = cat.get("ml.p4de.24xlarge")
    >>> m.gpu, m.gpu_count, m.gpu_memory_bytes // 2**30
    ('A100-80GB', 8, 80)
    >>> gpu("A100-80GB").bf16_tflops
    312

Prices are USD per machine per hour in the catalog's region, ``None`` when no source gave one
(never guessed). ``Catalog.machines`` is sorted by price, unpriced machines last.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from launcher import providers
from launcher.providers import catalogued

GiB = 1024**3
#: The first CUDA compute capability with bf16 arithmetic (Ampere).
BF16_COMPUTE_CAPABILITY = 8.0

class UnknownMachine(KeyError):
    """A machine name that is not in the catalog. The message suggests the closest names."""

    def __init__(self, message: str, name: str = "", suggestions: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.name = name
        self.suggestions = suggestions

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return self.message


class UnknownGpu(KeyError):
    """A GPU type name that is not in ``gpus.json``."""

    def __init__(self, message: str, name: str = "", suggestions: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.name = name
        self.suggestions = suggestions

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class GpuType:
    """Per-GPU facts. TFLOPS are peak dense (no sparsity); ``None`` = unsupported or unknown."""

    name: str
    full_name: str
    generation: str
    memory_bytes: int
    cuda_total_memory_bytes: int | None = None
    cuda_context_bytes_estimate: int | None = None
    memory_bandwidth_gbytes_per_s: float | None = None
    nvlink_gbytes_per_s: float | None = None
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    tf32_tflops: float | None = None
    fp32_tflops: float | None = None
    #: CUDA compute capability ("8.0"): bf16 arithmetic from 8.0 (Ampere) on
    #: (``supports_bf16``); from NVIDIA's table, https://developer.nvidia.com/cuda-gpus.
    compute_capability: str | None = None
    source: str = ""
    notes: tuple[str, ...] = ()

    @property
    def usable_memory_bytes(self) -> int:
        """What CUDA reports as total memory when observed, else the nominal size."""
        return self.cuda_total_memory_bytes or self.memory_bytes

    @property
    def supports_bf16(self) -> bool:
        """Whether the GPU computes in bf16: compute capability 8.0 or more, the test
        ``torch.cuda.is_bf16_supported()`` makes (an A10G has bf16 although no primary source
        gave its bf16 TFLOPS; a T4 or a V100 has none). The default precision of a plan on it
        (``launcher/plan/precision.py``)."""
        if self.compute_capability is not None:
            return float(self.compute_capability) >= BF16_COMPUTE_CAPABILITY
        return self.bf16_tflops is not None


@dataclass(frozen=True)
class Machine:
    """One submittable machine: a SageMaker instance type, or Vertex machine type + accelerators."""

    name: str
    provider: str
    gpu: str
    gpu_count: int
    gpu_memory_bytes: (
        int  # per GPU, nominal (see GpuType.usable_memory_bytes for what CUDA reports)
    )
    vcpus: int
    ram_bytes: int
    price_per_hour: float | None
    spot_price_per_hour: float | None
    accelerator_type: str | None = None  # Vertex machineSpec.acceleratorType; None on SageMaker
    machine_type: str | None = None  # Vertex machineSpec.machineType; equals name on SageMaker
    intra_node: str = ""  # e.g. "NVLink 4 (NVSwitch)", "PCIe (no NVLink)", "single GPU"
    intra_node_gbytes_per_s: float | None = None  # per GPU, GB/s, NVLink only
    inter_node_gbps: float | None = None  # network, Gbit/s
    inter_node_fabric: str = ""  # e.g. "EFA (32 x 100 Gbps)", "GPUDirect-TCPX"
    region: str = ""
    currency: str = "USD"
    source: str = ""  # where the price came from
    as_of: str = ""  # date of that price
    price_basis: str | None = None  # "listed", "derived", ... (see catalogs/README.md)
    price_note: str | None = None  # why the price is None, when it is
    notes: tuple[str, ...] = field(default=())

    @property
    def total_gpu_memory_bytes(self) -> int:
        return self.gpu_memory_bytes * self.gpu_count

    @property
    def ram_gib(self) -> float:
        return self.ram_bytes / GiB

    @property
    def price_per_gpu_hour(self) -> float | None:
        return None if self.price_per_hour is None else self.price_per_hour / self.gpu_count

    @property
    def gpu_type(self) -> GpuType:
        return gpu(self.gpu)


class Catalog:
    """The machines of one provider in one region."""

    def __init__(
        self,
        provider: str,
        region: str,
        currency: str,
        as_of: str,
        machines: list[Machine],
        display_name: str = "",
        raw: dict[str, Any] | None = None,
    ):
        self.provider = provider
        self.region = region
        self.currency = currency
        self.as_of = as_of
        self.display_name = display_name or provider
        self.raw = raw or {}
        self._by_name = {m.name: m for m in machines}
        self._by_lower = {m.name.lower(): m for m in machines}
        self.machines: tuple[Machine, ...] = tuple(sorted(machines, key=_price_key))

    def get(self, name: str) -> Machine:
        machine = self._by_name.get(name) or self._by_lower.get(name.strip().lower())
        if machine is not None:
            return machine
        query = name.strip().lower()
        extending = sorted(
            (m for m in self._by_name.values() if m.name.lower().startswith(query)),
            key=lambda m: (m.gpu_count, m.name),
        )
        if extending:
            suggestions = tuple(m.name for m in extending[:3])
        else:
            suggestions = tuple(self._by_lower[s].name for s in _closest(query, self._by_lower))
        message = f"unknown {self.display_name} machine {name!r}"
        if suggestions:
            message += f"; did you mean {', '.join(suggestions)}?"
            if len(extending) > len(suggestions):
                message += (
                    f" ({len(extending) - len(suggestions)} more start with {name.strip()!r})"
                )
        else:
            message += f" ({len(self._by_name)} known; run `launch machines` to list them)"
        raise UnknownMachine(message, name=name, suggestions=suggestions)

    def names(self) -> list[str]:
        return [m.name for m in self.machines]

    def with_gpu(self, gpu_name: str) -> list[Machine]:
        return [m for m in self.machines if m.gpu == gpu_name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            name in self._by_name or name.strip().lower() in self._by_lower
        )

    def __iter__(self) -> Iterator[Machine]:
        return iter(self.machines)

    def __len__(self) -> int:
        return len(self.machines)

    def __repr__(self) -> str:
        return (
            f"Catalog({self.provider!r}, region={self.region!r}, {len(self)} machines,"
            f" as_of={self.as_of!r})"
        )


def _closest(query: str, names: Iterator[str] | dict[str, Any], limit: int = 3) -> list[str]:
    """The names nearest to ``query`` in spelling.

    Only names about as close as the best one are kept, so "ml.p4.24xlarge" suggests ml.p4d.24xlarge
    and ml.p4de.24xlarge but not ml.p3.2xlarge.
    """
    names = list(names)
    close = difflib.get_close_matches(query, names, n=limit + 2, cutoff=0.6)
    if not close:
        return []
    score = {n: difflib.SequenceMatcher(None, query, n).ratio() for n in close}
    best = max(score.values())
    return [n for n in close if score[n] >= best - 0.04][:limit]


def _price_key(m: Machine) -> tuple[bool, float, str]:
    return (m.price_per_hour is None, m.price_per_hour or 0.0, m.name)


def _read_json(filename: str) -> dict[str, Any]:
    text = (
        resources.files("launcher.plan").joinpath("catalogs", filename).read_text(encoding="utf-8")
    )
    return json.loads(text)


def catalog_data(provider: str) -> dict[str, Any]:
    """The parsed catalog file of ``provider`` (a name with a catalog; the registry reads it)."""
    data = providers.catalog_data(provider)
    if data is None:
        raise ValueError(f"provider {provider!r} has no machine catalog")
    return data


def _aliases() -> dict[str, str]:
    """Every spelling of a provider with a catalog (its name, its catalog's ``aliases``)."""
    return {alias: name for name in catalogued()
            for alias in (name, *catalog_data(name).get("aliases", ()))}


def data_parallel_library(provider: str) -> str | None:
    """The provider's own library that speeds up DDP's gradient all-reduce (SageMaker's SMDDP),
    as its catalog names it; None where it has none (or no catalog)."""
    if provider not in catalogued():
        return None
    found = load_catalog(provider).raw.get("data_parallel_library")  # read once, cached
    return found if isinstance(found, str) else None


def normalize_provider(provider: str) -> str:
    key = _aliases().get(provider.strip().lower())
    if key is None:
        raise ValueError(
            f"no machine catalog for provider {provider!r}; known: {', '.join(catalogued())}"
        )
    return key


@functools.cache
def _gpus() -> dict[str, GpuType]:
    data = _read_json("gpus.json")["gpus"]
    out = {}
    for name, g in data.items():
        out[name] = GpuType(
            name=name,
            full_name=g.get("full_name", name),
            generation=g.get("generation", ""),
            memory_bytes=int(g["memory_bytes"]),
            cuda_total_memory_bytes=g.get("cuda_total_memory_bytes"),
            cuda_context_bytes_estimate=g.get("cuda_context_bytes_estimate"),
            memory_bandwidth_gbytes_per_s=g.get("memory_bandwidth_gbytes_per_s"),
            nvlink_gbytes_per_s=g.get("nvlink_gbytes_per_s"),
            bf16_tflops=g.get("bf16_tflops"),
            fp16_tflops=g.get("fp16_tflops"),
            tf32_tflops=g.get("tf32_tflops"),
            fp32_tflops=g.get("fp32_tflops"),
            compute_capability=g.get("compute_capability"),
            source=g.get("source", ""),
            notes=tuple(g.get("notes", ())),
        )
    return out


def gpus() -> dict[str, GpuType]:
    """All GPU types, by catalog name ("A100-80GB", "H100-80GB", "L4", ...)."""
    return dict(_gpus())


def family_of(device_name: str | None) -> GpuType | None:
    """The catalog's GPU type of a device name as CUDA or nvidia-smi gives it ("NVIDIA
    A100-SXM4-80GB", "Tesla T4", "NVIDIA H200"): the type whose family (its name before the
    size: A100, T4, L40S) is one of the device name's words; None when none is, or when two
    types of the family differ in what a plan asks of them (bf16). Used for this machine's GPU,
    whose bf16 support decides the local default precision."""
    if not device_name:
        return None
    import re

    words = {w.upper() for w in re.split(r"[^A-Za-z0-9]+", device_name) if w}
    found = [g for name, g in _gpus().items() if name.split("-")[0].upper() in words]
    if not found or len({g.supports_bf16 for g in found}) > 1:
        return None
    return found[0]


def gpu(name: str) -> GpuType:
    table = _gpus()
    if name in table:
        return table[name]
    lower = {k.lower(): k for k in table}
    if name.strip().lower() in lower:
        return table[lower[name.strip().lower()]]
    query = name.strip().lower()
    extending = sorted(n for n in lower if n.startswith(query))  # "a100" -> A100-40GB, A100-80GB
    suggestions = tuple(lower[s] for s in (extending[:3] or _closest(query, lower)))
    message = f"unknown GPU type {name!r}"
    message += (
        f"; did you mean {', '.join(suggestions)}?"
        if suggestions
        else f"; known: {', '.join(sorted(table))}"
    )
    raise UnknownGpu(message, name=name, suggestions=suggestions)


@functools.cache
def load_catalog(provider: str) -> Catalog:
    """The catalog of ``provider`` ("vertex" or "sagemaker"), read once and cached."""
    key = normalize_provider(provider)
    if key != provider:
        return load_catalog(key)
    data = catalog_data(key)
    table = _gpus()
    machines = [_machine(row, data, table) for row in data["machines"]]
    return Catalog(
        provider=key,
        region=data["region"],
        currency=data.get("currency", "USD"),
        as_of=data.get("as_of", ""),
        machines=machines,
        display_name=data.get("display_name", ""),
        raw=data,
    )


def _machine(row: dict[str, Any], data: dict[str, Any], table: dict[str, GpuType]) -> Machine:
    price = row.get("price") or {}
    net = row.get("interconnect") or {}
    gpu_name = row["gpu"]
    if gpu_name not in table:
        raise ValueError(
            f"{data['provider']} machine {row['name']!r} uses GPU {gpu_name!r},"
            " which gpus.json does not list"
        )
    return Machine(
        name=row["name"],
        provider=data["provider"],
        gpu=gpu_name,
        gpu_count=int(row["gpu_count"]),
        gpu_memory_bytes=table[gpu_name].memory_bytes,
        vcpus=int(row["vcpus"]),
        ram_bytes=int(round(float(row["ram_gib"]) * GiB)),
        price_per_hour=price.get("on_demand_per_hour"),
        spot_price_per_hour=price.get("spot_per_hour"),
        accelerator_type=row.get("accelerator_type"),
        machine_type=row.get("machine_type", row["name"]),
        intra_node=net.get("intra_node", ""),
        intra_node_gbytes_per_s=net.get("intra_node_gbytes_per_s"),
        inter_node_gbps=net.get("inter_node_gbps"),
        inter_node_fabric=net.get("inter_node_fabric", ""),
        region=data["region"],
        currency=data.get("currency", "USD"),
        source=price.get("source", ""),
        as_of=price.get("as_of", ""),
        price_basis=price.get("basis"),
        price_note=price.get("null_reason"),
        notes=tuple(row.get("notes", ())),
    )
