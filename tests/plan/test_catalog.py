"""The machine catalogs: data sanity, known anchors, and the loader's behaviour."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from importlib import resources

import pytest

from launcher import providers
from launcher.plan import catalog as cat
from launcher.plan.catalog import UnknownGpu, UnknownMachine, gpu, gpus, load_catalog

GiB = 1024**3
PROVIDERS = ("vertex", "sagemaker")

# Vertex AI v1 AcceleratorType enum (google.cloud.aiplatform.v1.AcceleratorType), as listed in
# https://cloud.google.com/vertex-ai/docs/reference/rest/v1/MachineSpec#acceleratortype and
# https://docs.cloud.google.com/ruby/docs/reference/google-cloud-ai_platform-v1/latest/Google-Cloud-AIPlatform-V1-AcceleratorType
# (client v1.40.0). Used only when google-cloud-aiplatform is not installed.
VERTEX_ACCELERATOR_TYPES_FOUND = {
    "ACCELERATOR_TYPE_UNSPECIFIED",
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_L4",
    "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB",
    "NVIDIA_B200",
    "NVIDIA_GB200",
    "NVIDIA_RTX_PRO_6000",
    "TPU_V2",
    "TPU_V3",
    "TPU_V4_POD",
    "TPU_V5_LITEPOD",
}


def vertex_accelerator_types() -> set[str]:
    try:
        from google.cloud.aiplatform_v1.types import AcceleratorType  # type: ignore[import-not-found]
    except ImportError:
        return VERTEX_ACCELERATOR_TYPES_FOUND
    return {member.name for member in AcceleratorType}


def raw(provider_or_file: str) -> dict:
    """A provider's catalog as its package holds it, or a file of ``plan/catalogs/``."""
    if not provider_or_file.endswith(".json"):
        return providers.catalog_data(provider_or_file)
    folder = resources.files("launcher.plan").joinpath("catalogs")
    return json.loads(folder.joinpath(provider_or_file).read_text(encoding="utf-8"))


def is_date(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------------- data sanity


@pytest.mark.parametrize("provider", PROVIDERS)
def test_catalog_header(provider):
    data = raw(provider)
    assert data["provider"] == provider
    assert data["currency"] == "USD"
    assert data["region"] == {"vertex": "us-central1", "sagemaker": "us-east-1"}[provider]
    assert is_date(data["as_of"])
    assert data["sources"], "a catalog must list its sources"
    names = [m["name"] for m in data["machines"]]
    assert len(names) == len(set(names)), "machine names must be unique"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_machine_is_well_formed(provider):
    data = raw(provider)
    known_gpus = raw("gpus.json")["gpus"]
    source_keys = set(data["sources"])
    for m in data["machines"]:
        where = f"{provider}:{m['name']}"
        assert m["gpu"] in known_gpus, f"{where}: GPU {m['gpu']!r} has no facts in gpus.json"
        assert isinstance(m["gpu_count"], int) and m["gpu_count"] >= 1, where
        assert m["vcpus"] >= 1 and m["ram_gib"] > 0, where
        assert set(m["hardware_sources"]) <= source_keys, where
        net = m["interconnect"]
        assert net["intra_node"], where
        for key in ("intra_node_gbytes_per_s", "inter_node_gbps"):
            assert net[key] is None or net[key] > 0, where
        if m["gpu_count"] == 1:
            assert net["intra_node"] == "single GPU", where

        price = m["price"]
        assert price["source"], f"{where}: price without a source"
        assert is_date(price["as_of"]), f"{where}: price without an as_of date"
        on_demand, spot = price["on_demand_per_hour"], price["spot_per_hour"]
        if on_demand is None:
            assert price.get("null_reason"), f"{where}: null price without a reason"
        else:
            assert isinstance(on_demand, (int, float)) and on_demand > 0, where
            assert price["basis"], f"{where}: a price must say whether it is listed or derived"
        assert spot is None or spot > 0, where
        if spot is None:
            assert data["spot"]["reason"] or price.get("spot_reason"), (
                f"{where}: null spot price without a reason"
            )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_spot_is_cheaper_than_on_demand(provider):
    for m in raw(provider)["machines"]:
        p = m["price"]
        pairs = [(p["spot_per_hour"], p["on_demand_per_hour"])]
        pairs.append(
            (p.get("compute_engine_spot_per_hour"), p.get("compute_engine_on_demand_per_hour"))
        )
        for spot, on_demand in pairs:
            if spot is not None and on_demand is not None:
                assert spot < on_demand, m["name"]


def test_derived_vertex_prices_follow_their_rule():
    data = raw("vertex")
    assert "1.15" in data["derivations"]["vertex_markup"]
    derived = [m for m in data["machines"] if m["price"]["basis"] == "derived"]
    assert derived
    for m in derived:
        p = m["price"]
        assert p["derivation"] in data["derivations"]
        assert p["on_demand_per_hour"] == pytest.approx(
            1.15 * p["compute_engine_on_demand_per_hour"], abs=1e-6
        )
    # Evidence for the factor: Vertex n1-standard-4 $0.21849885, Compute Engine $0.189999.
    assert pytest.approx(0.21849885, abs=1e-9) == 1.15 * 0.189999
    # H100 Vertex SKU $11.2660332 = 1.15 x Compute Engine $9.79655057.
    assert pytest.approx(11.2660332, abs=1e-6) == 1.15 * 9.79655057


def test_a3_high_price_is_the_sum_of_its_vertex_skus():
    m = load_catalog("vertex").get("a3-highgpu-8g")
    assert m.price_per_hour == pytest.approx(
        8 * 11.2660332 + 208 * 0.0293227 + 1872 * 0.0025534, abs=1e-6
    )
    assert m.price_basis.startswith("listed")


def test_gpu_facts_are_consistent():
    table = raw("gpus.json")["gpus"]
    assert table
    for name, g in table.items():
        assert g["memory_bytes"] == int(g["memory_gb_nominal"] * GiB), name
        assert g["source"], name
        assert g["generation"] in {
            "pascal",
            "volta",
            "turing",
            "ampere",
            "ada",
            "hopper",
            "blackwell",
        }, name
        usable = g["cuda_total_memory_bytes"]
        if usable is not None:
            assert 0.85 * g["memory_bytes"] < usable <= g["memory_bytes"], name
            assert g["cuda_total_memory_source"], name
        for key in ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops"):
            assert g[key] is None or g[key] > 0, (name, key)
        if g["bf16_tflops"] and g["fp32_tflops"]:
            assert g["bf16_tflops"] > g["fp32_tflops"], name
        if g["tf32_tflops"] and g["bf16_tflops"]:
            assert g["tf32_tflops"] < g["bf16_tflops"], name


def test_gpu_anchors():
    a100 = gpu("A100-80GB")
    assert a100.memory_bytes == 81920 * 1024**2
    assert (a100.bf16_tflops, a100.tf32_tflops, a100.fp32_tflops) == (312, 156, 19.5)
    assert gpu("A100-40GB").memory_bytes == 40 * GiB
    h100 = gpu("H100-80GB")
    assert h100.bf16_tflops == 989.5 and h100.nvlink_gbytes_per_s == 900
    assert h100.usable_memory_bytes < h100.memory_bytes
    assert gpu("L4").memory_bytes == 24 * GiB
    assert gpu("T4").memory_bytes == 16 * GiB and not gpu("T4").supports_bf16
    assert gpu("V100-16GB").bf16_tflops is None and gpu("V100-32GB").memory_bytes == 32 * GiB
    assert gpu("A10G").memory_bytes == 24 * GiB
    assert gpu("H200-141GB").memory_bytes == 141 * GiB
    assert gpu("L40S").memory_bytes == 48 * GiB
    assert {"B200", "P100", "P4"} <= set(gpus())


# ----------------------------------------------------------------------------------------- anchors


@pytest.mark.parametrize(
    ("provider", "name", "gpu_name", "count", "gib"),
    [
        ("sagemaker", "ml.p4de.24xlarge", "A100-80GB", 8, 80),
        ("sagemaker", "ml.p4d.24xlarge", "A100-40GB", 8, 40),
        ("sagemaker", "ml.p5.48xlarge", "H100-80GB", 8, 80),
        ("sagemaker", "ml.p5en.48xlarge", "H200-141GB", 8, 141),
        ("sagemaker", "ml.g5.xlarge", "A10G", 1, 24),
        ("sagemaker", "ml.g5.48xlarge", "A10G", 8, 24),
        ("sagemaker", "ml.g6e.12xlarge", "L40S", 4, 48),
        ("sagemaker", "ml.g4dn.12xlarge", "T4", 4, 16),
        ("sagemaker", "ml.p3.16xlarge", "V100-16GB", 8, 16),
        ("sagemaker", "ml.p3dn.24xlarge", "V100-32GB", 8, 32),
        ("vertex", "a2-ultragpu-8g", "A100-80GB", 8, 80),
        ("vertex", "a2-highgpu-1g", "A100-40GB", 1, 40),
        ("vertex", "a2-megagpu-16g", "A100-40GB", 16, 40),
        ("vertex", "a3-highgpu-8g", "H100-80GB", 8, 80),
        ("vertex", "a3-ultragpu-8g", "H200-141GB", 8, 141),
        ("vertex", "g2-standard-96", "L4", 8, 24),
        ("vertex", "n1-standard-8+t4x1", "T4", 1, 16),
    ],
)
def test_known_machines(provider, name, gpu_name, count, gib):
    m = load_catalog(provider).get(name)
    assert (m.gpu, m.gpu_count, m.gpu_memory_bytes) == (gpu_name, count, gib * GiB)
    assert m.total_gpu_memory_bytes == count * gib * GiB


def test_vertex_accelerator_types_match_machine_families():
    expected = {
        "a2-highgpu-": "NVIDIA_TESLA_A100",
        "a2-megagpu-": "NVIDIA_TESLA_A100",
        "a2-ultragpu-": "NVIDIA_A100_80GB",
        "a3-highgpu-": "NVIDIA_H100_80GB",
        "a3-megagpu-": "NVIDIA_H100_MEGA_80GB",
        "a3-ultragpu-": "NVIDIA_H200_141GB",
        "a4-highgpu-": "NVIDIA_B200",
        "g2-standard-": "NVIDIA_L4",
    }
    for m in load_catalog("vertex"):
        for prefix, accel in expected.items():
            if m.machine_type.startswith(prefix):
                assert m.accelerator_type == accel, m.name
                # Fixed shapes carry the GPU count in the name (a2-highgpu-4g -> 4); not G2.
                if not prefix.startswith("g2"):
                    assert m.machine_type.endswith(f"-{m.gpu_count}g"), m.name


def test_g2_machines_are_all_l4():
    g2 = [m for m in load_catalog("vertex") if m.machine_type.startswith("g2-standard-")]
    assert len(g2) == 8
    counts = {m.name: m.gpu_count for m in g2}
    assert (
        counts["g2-standard-24"] == 2
        and counts["g2-standard-48"] == 4
        and counts["g2-standard-96"] == 8
    )
    for m in g2:
        assert (
            m.gpu == "L4" and m.gpu_memory_bytes == 24 * GiB and m.accelerator_type == "NVIDIA_L4"
        )


def test_vertex_accelerator_types_are_real_enum_names():
    valid = vertex_accelerator_types() - {"ACCELERATOR_TYPE_UNSPECIFIED"}
    for m in raw("vertex")["machines"]:
        assert m["accelerator_type"] in valid, m["name"]


def test_vertex_n1_combinations_respect_compute_engine_limits():
    # Max vCPUs per (accelerator, count) on N1: https://cloud.google.com/compute/docs/gpus (N1).
    limits = {
        "NVIDIA_TESLA_T4": {1: 48, 2: 48, 4: 96},
        "NVIDIA_TESLA_P4": {1: 24, 2: 48, 4: 96},
        "NVIDIA_TESLA_V100": {1: 12, 2: 24, 4: 48, 8: 96},
        "NVIDIA_TESLA_P100": {1: 16, 2: 32, 4: 96},
    }
    n1 = [m for m in load_catalog("vertex") if m.machine_type.startswith("n1-")]
    assert n1
    for m in n1:
        assert m.accelerator_type in limits, m.name
        assert m.gpu_count in limits[m.accelerator_type], m.name
        assert m.vcpus <= limits[m.accelerator_type][m.gpu_count], m.name
        assert m.name == f"{m.machine_type}+{m.gpu.split('-')[0].lower()}x{m.gpu_count}"
    names = {m.name for m in n1}
    assert "n1-standard-16+v100x1" not in names  # V100 x1 allows at most 12 vCPUs
    assert {"n1-standard-8+t4x1", "n1-standard-96+v100x8", "n1-standard-4+p4x1"} <= names


# ------------------------------------------------------------------------------------------ loader


def test_unknown_machine_suggests_closest_names():
    sagemaker = load_catalog("sagemaker")
    with pytest.raises(UnknownMachine) as info:
        sagemaker.get("ml.p4.24xlarge")
    assert isinstance(info.value, KeyError)
    assert (
        str(info.value) == "unknown SageMaker machine 'ml.p4.24xlarge';"
        " did you mean ml.p4d.24xlarge, ml.p4de.24xlarge?"
    )
    assert info.value.suggestions == ("ml.p4d.24xlarge", "ml.p4de.24xlarge")

    with pytest.raises(KeyError, match=r"did you mean ml\.p5\.48xlarge"):
        sagemaker.get("p5.48xlarge")
    with pytest.raises(UnknownMachine, match=r"did you mean a2-ultragpu-8g"):
        load_catalog("vertex").get("a2-ultragpu-9g")
    with pytest.raises(
        UnknownMachine, match=r"n1-standard-8\+t4x1.*more start with 'n1-standard-8'"
    ):
        load_catalog("vertex").get("n1-standard-8")
    with pytest.raises(UnknownMachine, match="run `launch machines`"):
        sagemaker.get("qqqqqqqq")


def test_lookup_is_case_insensitive():
    assert load_catalog("sagemaker").get("ML.P5.48XLARGE").name == "ml.p5.48xlarge"
    assert "ml.p5.48xlarge" in load_catalog("sagemaker")
    assert gpu("a100-80gb").name == "A100-80GB"


def test_unknown_gpu():
    with pytest.raises(UnknownGpu, match="did you mean A100-40GB, A100-80GB"):
        gpu("A100")


def test_unknown_provider():
    with pytest.raises(ValueError, match="known: vertex, sagemaker"):
        load_catalog("azure")


def test_machines_are_sorted_by_price_unpriced_last():
    for provider in PROVIDERS:
        machines = load_catalog(provider).machines
        prices = [m.price_per_hour for m in machines]
        priced = [p for p in prices if p is not None]
        assert priced == sorted(priced)
        assert prices[: len(priced)] == priced, "unpriced machines must come last"


def test_machine_fields_are_filled_from_the_json():
    m = load_catalog("sagemaker").get("ml.p5.48xlarge")
    assert m.provider == "sagemaker" and m.region == "us-east-1" and m.currency == "USD"
    assert m.vcpus == 192 and m.ram_bytes == 2048 * GiB
    assert (
        m.inter_node_gbps == 3200
        and m.intra_node_gbytes_per_s == 900
        and "EFA" in m.inter_node_fabric
    )
    assert m.price_per_hour > 0 and m.spot_price_per_hour is None
    assert m.price_per_gpu_hour == pytest.approx(m.price_per_hour / 8)
    assert m.source and is_date(m.as_of)
    assert m.accelerator_type is None and m.machine_type == "ml.p5.48xlarge"
    assert m.gpu_type.name == "H100-80GB"

    v = load_catalog("vertex").get("a3-highgpu-8g")
    assert v.accelerator_type == "NVIDIA_H100_80GB" and v.machine_type == "a3-highgpu-8g"
    assert v.inter_node_gbps == 1000 and "TCPX" in v.inter_node_fabric

    unpriced = load_catalog("vertex").get("n1-standard-8+t4x1")
    assert (
        unpriced.price_per_hour is None
        and unpriced.price_note
        and unpriced.price_per_gpu_hour is None
    )


def test_loading_is_cached_and_fast():
    assert load_catalog("vertex") is load_catalog("vertex")
    assert load_catalog("vertex-ai") is load_catalog("vertex")
    cat.load_catalog.cache_clear()
    cat._gpus.cache_clear()
    start = time.perf_counter()
    for provider in PROVIDERS:
        load_catalog(provider)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.1, f"loading both catalogs took {elapsed * 1000:.0f} ms"  # ~10 ms measured


def test_no_torch_import():
    import subprocess
    import sys

    code = (
        "import sys, launcher.plan.catalog as c;"
        " c.load_catalog('vertex'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_total_prices_are_finite_numbers():
    for provider in PROVIDERS:
        for m in load_catalog(provider):
            if m.price_per_hour is not None:
                assert math.isfinite(m.price_per_hour)
