"""The precision of a plan nobody pinned one for: bf16_mixed on a GPU with bf16, fp32 on one
without; never a script's own precision, never a pin (issue 25 item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.plan.catalog import gpu
from launcher.plan.memory import Target
from launcher.plan.precision import launch_chooses, precision_for
from launcher.spec import Spec

A100 = Target(name="ml.p4de.24xlarge", gpus=8, memory_bytes=80 * 2**30, gpu_name="A100-80GB",
              bf16=True)
V100 = Target(name="ml.p3.16xlarge", gpus=8, memory_bytes=16 * 2**30, gpu_name="V100-16GB",
              bf16=False)


@pytest.mark.parametrize(("name", "bf16"), [
    ("A100-80GB", True), ("H100-80GB", True), ("H200-141GB", True), ("L4", True),
    ("A10G", True),  # Ampere: bf16 although the catalog has no bf16 TFLOPS for it
    ("B200", True), ("V100-16GB", False), ("T4", False), ("P100", False),
])
def test_the_catalog_says_which_gpus_compute_in_bf16(name, bf16):
    assert gpu(name).supports_bf16 is bf16


def test_a_recipe_unpinned_takes_the_gpus_precision():
    recipe = Spec(script=Path("recipe.py"), mode="recipe")
    assert precision_for(recipe, A100) == "bf16_mixed"
    assert precision_for(recipe, V100) == "fp32"
    pinned = Spec(script=Path("recipe.py"), mode="recipe", precision="fp32")
    assert precision_for(pinned, A100) == "fp32"


def test_a_captured_or_framework_script_keeps_its_own_precision(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\nprint(os.environ['LAUNCH_PRECISION'])\n")
    captured = Spec(script=script, mode="script", captured=True)
    framework = Spec(script=script, mode="script", framework="hf_trainer")
    own_autocast = Spec(script=script, mode="script", captured=True, precision="bf16_mixed")
    assert not launch_chooses(captured) and precision_for(captured, A100) == "fp32"
    assert not launch_chooses(framework) and precision_for(framework, A100) == "fp32"
    assert precision_for(own_autocast, V100) == "bf16_mixed"  # its own, even without bf16


def test_cloud_plan_from_params_is_bf16_mixed_on_a100_and_says_why(cli):
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes",
               "2", "--params", "30B", "--json").json()
    assert all(p["precision"] == "bf16_mixed" for p in data["plans"])
    assert "A100-80GB, which computes in bf16" in data["origins"]["precision"]
    # 16 bytes a parameter of states (fp32 master weights), sharded 16 ways
    chosen = data["chosen"]["memory"]
    assert chosen["parameters"] + chosen["gradients"] + chosen["optimizer"] == pytest.approx(
        16 * 30e9 / 16, rel=1e-6)


def test_cloud_plan_on_a_gpu_without_bf16_is_fp32(cli):
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p3.16xlarge",
               "--params", "1B", "--json").json()
    assert {p["precision"] for p in data["plans"]} == {"fp32"}
    assert "V100-16GB, which has no bf16" in data["origins"]["precision"]


def test_a_pin_stays_and_is_named(cli):
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge",
               "--params", "1B", "--precision", "fp32", "--json").json()
    assert {p["precision"] for p in data["plans"]} == {"fp32"}
    assert data["origins"]["precision"] == "--precision"


def test_a_plain_script_keeps_fp32_unless_it_reads_the_plans_precision(cli, write_script):
    plain = write_script("print('training')\n")
    data = cli("plan", str(plain), "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge",
               "--params", "1B", "--json").json()
    assert {p["precision"] for p in data["plans"]} == {"fp32"}
    assert "train.py's own" in data["origins"]["precision"]
    assert any("A100-80GB computes in bf16, but train.py" in n for n in data["notes"])
    reads = write_script("import os\nprecision = os.environ['LAUNCH_PRECISION']\n",
                         name="reads.py")
    data = cli("plan", str(reads), "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge",
               "--params", "1B", "--json").json()
    assert {p["precision"] for p in data["plans"]} == {"bf16_mixed"}


@pytest.mark.parametrize(("device", "bf16"), [
    ("NVIDIA H200", True), ("NVIDIA A100-SXM4-80GB", True), ("NVIDIA L40S", True),
    ("Tesla T4", False), ("Tesla V100-SXM2-16GB", False), ("NVIDIA GeForce RTX 4090", None),
])
def test_this_machines_gpu_is_known_by_its_family(device, bf16):
    from launcher.plan.targets import local_target
    from launcher.script_info import Hardware

    recipe = Spec(script=Path("recipe.py"), mode="recipe")
    target = local_target(recipe, Hardware(cuda_devices=1, cuda_name=device,
                                           cuda_memory_bytes=80 * 2**30))
    assert target.bf16 is bf16
    assert precision_for(recipe, target) == ("bf16_mixed" if bf16 else "fp32")
