"""launcher/providers/images.py: the torch of the images a request names, and the refusal of an
image whose torch is older than the one the strategy's script was run under."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.providers import images, vertex
from launcher.providers.images import MIN_TORCH, check_image, torch_version
from launcher.render import available_strategies
from launcher.status import ExitStatus, UsageError
from launcher.strategies import STRATEGIES

VERTEX_24 = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"


@pytest.mark.parametrize(("image", "torch"), [
    (VERTEX_24, (2, 4)),
    ("europe-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest", (2, 1)),
    ("us-docker.pkg.dev/vertex-ai/training/pytorch-xla.2-4.py310:latest", (2, 4)),
    ("us-docker.pkg.dev/deeplearning-platform-release/gcr.io/pytorch-cu124.2-4.py310", (2, 4)),
    ("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312", (2, 8)),
    ("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-gpu-py311", (2, 3)),
    ("658645717510.dkr.ecr.eu-west-1.amazonaws.com/smdistributed-modelparallel:"
     "2.5.1-gpu-py311-cu124", (2, 5)),
    ("763104351884.dkr.ecr.us-west-2.amazonaws.com/huggingface-pytorch-training:"
     "2.1.0-transformers4.36.0-gpu-py310-cu121-ubuntu20.04", (2, 1)),
    ("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime", (2, 8)),
    ("localhost:5000/pytorch:2.3.0", (2, 3)),
    # Nothing to tell from: let through rather than guessed.
    ("pytorch/pytorch:latest", None),
    ("pytorch/pytorch@sha256:0123abcd", None),
    ("nvcr.io/nvidia/pytorch:24.05-py3", None),  # NGC tags are release dates, not torch
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:2.1", None),
    ("us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-14.py310:latest", None),
])
def test_the_torch_of_an_image_comes_from_the_table_or_its_name(image, torch):
    assert torch_version(image) == torch


def test_an_image_older_than_the_strategy_ran_under_is_refused_in_one_line():
    with pytest.raises(UsageError) as raised:
        check_image("1.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-gpu-py311",
                    "fsdp", "adamw", "sagemaker")
    error = raised.value
    assert error.status == ExitStatus.USAGE
    assert "\n" not in str(error)
    assert "has torch 2.3" in error.message and "torch 2.7 or newer" in error.message
    # the provider's own default, which the SDK names (sagemaker-core's image_uris)
    assert "unset for pytorch-training with torch 2.8.0" in error.hint


def test_new_enough_and_unknown_images_pass():
    check_image("1.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312",
                "hybrid_shard", "adafactor", "sagemaker")
    check_image("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "fsdp")
    check_image("registry.example.com/team/trainer:3", "fsdp")  # torch unknown: the user's call
    check_image(VERTEX_24, "ddp", "adamw", "vertex")
    check_image(VERTEX_24, "single", "sgd", "vertex")


def test_an_optimizer_can_need_a_newer_torch_than_its_strategy():
    """torch.optim.Adafactor is new in 2.5: under 2.4.1 the script dies with AttributeError."""
    with pytest.raises(UsageError, match="ddp training script with optimizer adafactor"):
        check_image(VERTEX_24, "ddp", "adafactor", "vertex")


def test_the_vertex_default_image_is_refused_for_fsdp_with_an_image_to_use_instead():
    """Vertex AI's prebuilt PyTorch images stop at 2.4, older than FSDP2's CPU-tested floor."""
    for strategy in ("fsdp", "hybrid_shard"):
        with pytest.raises(UsageError) as raised:
            check_image(VERTEX_24, strategy, "adamw", "vertex")
        assert images.OFFICIAL_EXAMPLE in raised.value.hint
        assert torch_version(images.OFFICIAL_EXAMPLE) >= MIN_TORCH[strategy]


def test_every_strategy_has_a_floor_and_every_default_image_is_in_the_table():
    assert set(MIN_TORCH) == set(available_strategies())
    assert set(STRATEGIES) == set(MIN_TORCH)
    uri = vertex.DEFAULT_IMAGE.format(geo="us")
    table = {f"{i.repository}:{i.tag}": i for i in images.IMAGES if i.tag is not None}
    (entry,) = [i for key, i in table.items() if uri.endswith(key)]
    assert torch_version(uri) == entry.torch_version


def test_the_sdk_names_sagemaker_s_defaults_with_the_torch_the_table_keeps():
    """SageMaker's default images are the SDK's URIs (sagemaker-core's image_uris) of the torch
    images.py keeps; the torch read back from each URI is that torch, and each default serves
    every strategy it is picked for."""
    pytest.importorskip("sagemaker.core.image_uris")
    from launcher.providers.sagemaker import sdk

    for strategy in ("single", "ddp", "fsdp", "hybrid_shard", "smp_v2"):
        entry = images.default_image("sagemaker", strategy, "adamw")
        assert entry is not None and entry.tag is None  # no tag of ours: the SDK's
        image = sdk.training_image("us-east-1", strategy, "ml.p4d.24xlarge", entry.torch)
        assert image.torch == entry.torch
        assert f"/{entry.repository}:{entry.torch}-gpu-" in image.uri
        assert torch_version(image.uri) == entry.torch_version
        check_image(image.uri, strategy, "adamw", "sagemaker")


def test_the_vertex_default_follows_the_strategy_and_an_old_image_is_refused(tmp_path: Path):
    pytest.importorskip("google.cloud.aiplatform_v1")
    from tests.providers.test_vertex import make_job, make_plan

    def image_of(request):
        return request.custom_job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["imageUri"]

    provider = vertex.VertexProvider(project="p", region="us-central1", bucket="b",
                                     environ={})
    ddp = provider.dryrun(make_job(tmp_path))  # the prebuilt image's torch 2.4 runs ddp
    assert "vertex-ai/training/pytorch-gpu.2-4" in image_of(ddp)
    fsdp = provider.dryrun(make_job(tmp_path, make_plan(strategy="fsdp")))
    assert image_of(fsdp) == f"docker.io/{images.OFFICIAL_EXAMPLE}"  # FSDP2 needs torch >= 2.7
    old = vertex.VertexProvider(project="p", region="us-central1", bucket="b", environ={},
                                image="us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest")
    with pytest.raises(UsageError, match="fsdp training script"):
        old.dryrun(make_job(tmp_path, make_plan(strategy="fsdp")))


def test_the_sagemaker_dry_run_refuses_an_image_too_old(tmp_path: Path):
    pytest.importorskip("boto3")
    from tests.providers.test_sagemaker import make_job, make_plan, provider

    old = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-gpu-py311"
    with pytest.raises(UsageError, match="has torch 2.3"):
        provider({}, image=old).dryrun(make_job(tmp_path, make_plan(strategy="fsdp")))
    with pytest.raises(UsageError, match="ddp training script"):  # ddp's floor is 2.4
        provider({}, image=old).dryrun(make_job(tmp_path))
    provider({}).dryrun(make_job(tmp_path, make_plan(strategy="fsdp")))  # the default: 2.8.0
