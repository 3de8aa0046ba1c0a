"""The training images a request can name, the torch each carries, and the oldest torch each
rendered training script has run under. One home for both, so a job is never sent to an image
whose torch its script was not run with.

Why a floor per strategy and not one number: the scripts differ in what they ask of torch.

- ``single`` and ``ddp`` use only APIs that are the same from torch 2.4 to 2.13; their scripts ran
  (2 CPU processes, checkpoints, a resume) under 2.4.1, 2.5.1, 2.6.0, 2.7.1, 2.8.0 and 2.13.0.
- ``fsdp`` and ``hybrid_shard`` use FSDP2 (``fully_shard``). Its CPU path did not exist before
  torch 2.7 (2.4 and 2.5 create CUDA streams unconditionally, 2.6's CPU stream lacks
  ``record_event``) and before 2.8 gloo refused the all-reduce across replicas that hybrid
  sharding does (``ReduceOp.AVG``), so those are the oldest torches these scripts were run under.
- ``smp_v2`` runs only in the SMP v2 image; its torch (2.5.1) is the one its script was run under
  (with a stand-in for ``torch.sagemaker``, which exists only in that image).
- optimizer ``adafactor`` is ``torch.optim.Adafactor``, new in torch 2.5.

A newer torch than the floor is accepted: 2.13 is the one the test suite runs under.

No torch here: this runs in the CLI process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.status import UsageError
from launcher.strategies import STRATEGIES

Version = tuple[int, int]

#: The oldest torch (major, minor) each strategy's rendered script ran under; see the docstring.
#: Each strategy says its own (``Strategy.oldest_torch``).
MIN_TORCH: dict[str, Version] = {s.name: s.oldest_torch for s in STRATEGIES.values()}
#: Optimizers that need a newer torch than the strategy does.
MIN_TORCH_OPTIMIZER: dict[str, Version] = {"adafactor": (2, 5)}


@dataclass(frozen=True)
class Image:
    """A training image the launcher picks by default. ``repository`` and ``tag`` are what
    follows the registry host; ``torch`` is the version inside.

    ``tag`` None: the SageMaker SDK names the image (``launcher/providers/sagemaker/sdk.py`` asks
    it for the URI of ``torch`` in the job's region, for its instance type); what this table
    keeps is the torch the scripts ran under, not a copy of AWS's registries and tags."""

    provider: str
    repository: str
    tag: str | None
    torch: str
    source: str
    #: The runtime it has beyond stock PyTorch (``Strategy.image``: "smp", SageMaker's SMP
    #: container); None: a stock PyTorch image.
    kind: str | None = None

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategies whose scripts it runs: those that need its kind of image, and whose
        oldest torch it has."""
        return tuple(s.name for s in STRATEGIES.values()
                     if s.image == self.kind and self.torch_version >= s.oldest_torch)

    @property
    def shown(self) -> str:
        """The image as a hint names it."""
        if self.tag is None:
            return f"{self.repository} with torch {self.torch}"
        return f"{self.repository}:{self.tag}"

    @property
    def torch_version(self) -> Version:
        major, minor = self.torch.split(".")[:2]
        return int(major), int(minor)


def _catalogued_images() -> tuple[Image, ...]:
    """Each provider's training images, from its machine catalog's ``images`` (in the registry's
    order, each catalog's in its own: a provider's first fitting one is its default)."""
    from launcher.plan.catalog import catalog_data, catalogued

    return tuple(Image(provider=name, **row) for name in catalogued()
                 for row in catalog_data(name).get("images", ()))


#: The images the requests name when no image is given, as each provider's catalog lists them
#: (``images``). launcher/providers/vertex/provider.py (DEFAULT_IMAGE) builds Vertex's URIs;
#: SageMaker's come from the SDK (sagemaker-core's image_uris, asked by
#: launcher/providers/sagemaker/sdk.py for the torch its row gives).
IMAGES: tuple[Image, ...] = _catalogued_images()

#: Named in hints when the provider's own default is too old (Vertex AI's prebuilt PyTorch
#: training images stop at 2.4): the official image, torch 2.8.0 like SageMaker's default.
OFFICIAL_EXAMPLE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"

# Repositories whose tags start with the torch version ("2.8.0-gpu-py312", "2.5.1-gpu-..."):
# AWS's PyTorch and SMP containers, the official pytorch/pytorch image, Hugging Face's DLCs.
_TORCH_TAGGED = re.compile(r"(^|[-_/])pytorch([-_]training|[-_]inference)?$|"
                           r"^smdistributed-modelparallel$")
_TAG_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?(?:$|[-+_])")
# Google's names carry it in the image name: pytorch-gpu.2-4.py310, pytorch-cu124.2-4.py310.
_GOOGLE_NAME = re.compile(r"^pytorch-[a-z0-9]+\.(\d+)-(\d+)(?:\.py\d+)?$")


def _split(image: str) -> tuple[str, str, str]:
    """(repository path without the registry host, last path component, tag)."""
    name = image.split("@", 1)[0]  # a digest says nothing about the version
    last = name.rsplit("/", 1)[-1]
    tag = ""
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # registry host (us-docker.pkg.dev, 1234.dkr.ecr..., nvcr.io)
    return "/".join(parts), parts[-1], tag


def torch_version(image: str) -> Version | None:
    """The torch (major, minor) in ``image``: from the table, else from its name or tag; None
    when neither tells (a custom image, ``latest``, NVIDIA's NGC tags that are release dates)."""
    repository, last, tag = _split(image)
    for known in IMAGES:
        if known.tag is not None and repository.endswith(known.repository) and tag == known.tag:
            return known.torch_version
    match = _GOOGLE_NAME.match(last)
    if match:
        return int(match.group(1)), int(match.group(2))
    if _TORCH_TAGGED.search(repository.lower()) and not repository.startswith("nvidia/"):
        match = _TAG_VERSION.match(tag)
        if match and int(match.group(1)) < 10:  # "24.05" is NGC's release, not torch 24.5
            return int(match.group(1)), int(match.group(2))
    return None


def required_torch(strategy: str, optimizer: str | None = None) -> Version:
    """The oldest torch the rendered script of ``strategy`` (with ``optimizer``) ran under."""
    return max(MIN_TORCH.get(strategy, (0, 0)), MIN_TORCH_OPTIMIZER.get(optimizer or "", (0, 0)))


def suggestion(provider: str | None, strategy: str, optimizer: str | None = None) -> str:
    """An image new enough for ``strategy``: ``provider``'s default if it is, else the official
    PyTorch image with the torch of SageMaker's default (2.8.0, which every script ran under)."""
    image = default_image(provider or "", strategy, optimizer)
    return image.shown if image is not None else OFFICIAL_EXAMPLE


def default_image(provider: str, strategy: str, optimizer: str | None = None) -> Image | None:
    """The first of ``provider``'s images (in ``IMAGES`` order: its own platform's first) whose
    torch runs ``strategy``'s script; None when it has none."""
    need = required_torch(strategy, optimizer)
    for image in IMAGES:
        if (image.provider == provider and strategy in image.strategies
                and image.torch_version >= need):
            return image
    return None


def check_image(image: str, strategy: str, optimizer: str | None = None,
                provider: str | None = None) -> None:
    """Refuse ``image`` when its torch is known and older than the oldest one ``strategy``'s
    script (with ``optimizer``) ran under. An image whose torch cannot be told is let through:
    the user chose it, and the job's own error will say what is missing."""
    have = torch_version(image)
    need = required_torch(strategy, optimizer)
    if have is None or have >= need:
        return
    script = f"the {strategy} training script"
    if MIN_TORCH_OPTIMIZER.get(optimizer or "", (0, 0)) > MIN_TORCH.get(strategy, (0, 0)):
        script += f" with optimizer {optimizer}"
    default = default_image(provider or "", strategy, optimizer)
    hint = f"pass --image with a newer torch, e.g. {suggestion(provider, strategy, optimizer)}"
    if default is not None and default.tag is None:  # the SDK names it: no URI to give here
        hint = (f"leave --image and torch_version unset for {default.shown}, or pass --image "
                "with a newer torch")
    raise UsageError(
        f"image {image} has torch {have[0]}.{have[1]}, older than {script} supports "
        f"(torch {need[0]}.{need[1]} or newer, the oldest it was run under)", hint)
