"""What the SageMaker SDK knows, asked of it: the training images AWS publishes (by region, PyTorch
version, Python and instance type) and the GPUs of each instance type, from ``sagemaker-core``.

Why the SDK and not a table of our own: AWS adds regions, versions and registry accounts, and the
SDK's data (``sagemaker/core/image_uri_config/*.json``) is where it says so. The table this module
replaced had gone stale without a sign: it lacked ``me-west-1``, which sagemaker-core 2.27.0
publishes PyTorch 2.8.0 for. Every answer here comes from the SDK's own functions
(``image_uris.get_training_image_uri``, ``list_py_versions``, ``config_for_framework``;
``instance_types_gpu_info.retrieve``), none of which calls AWS or opens a connection (a test
holds that).

Why only here, and only when called: ``from sagemaker.core import image_uris`` takes 1.4 to 2 s
(it imports the whole package: typed shapes, resources, pandas) and the package with its
dependencies (scipy, pandas) is about 400 MB (docs/benchmarks.md), so it is the ``sagemaker``
extra, imported by the SageMaker dry run alone. ``launch --help``, ``launch machines``, a plan for
another provider or with an ``image`` of one's own, and ``status``/``logs``/``cancel`` never
import it (tests/test_cli.py, tests/providers/test_sagemaker_sdk.py and
bench/bench_cli_startup.py check). Without the extra, the one line :data:`MISSING` says what to
install.

What stays this project's own knowledge (``launcher/providers/images.py``): which torch each
rendered training script ran under, hence which PyTorch version (2.8.0; 2.5.1 in the SMP v2
image) the request asks the SDK for. A combination the SDK publishes no image for is one line
(:class:`~launcher.status.BadValue`, exit 2) naming the nearest one it does publish.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from launcher import strategies
from launcher.status import BadValue, UsageError

if TYPE_CHECKING:
    from launcher.plan.plan import Plan

DISTRIBUTION = "sagemaker-core"
EXTRA = "sagemaker"
INSTALL_HINT = "pip install 'launch-fit[sagemaker]'"
#: The one line a SageMaker request says when the extra is not installed.
MISSING = (f"the SageMaker provider needs the {EXTRA} extra ({DISTRIBUTION}: the training image "
           "URIs AWS publishes)")
SCOPE = "training"
#: ``get_training_image_uri``'s ``distribution`` that selects the SMP v2 image; the SDK then
#: picks the image's CUDA tag itself (``cu124`` for PyTorch 2.5), as its estimators do.
SMP_DISTRIBUTION: dict[str, Any] = {"torch_distributed": {"enabled": True},
                                    "smdistributed": {"modelparallel": {"enabled": True}}}
_FULL_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class TrainingImage:
    """An image URI the SDK gave, and what it was asked: enough for the dry run to say where the
    URI came from, and for a reader to ask the SDK again."""

    uri: str
    framework: str  # the SDK's name: "pytorch" or "pytorch-smp"
    torch: str
    py_version: str
    region: str
    instance_type: str
    sdk: str  # "sagemaker-core 2.27.0"

    @property
    def source(self) -> str:
        smp = ", distribution=SMP v2" if self.framework == "pytorch-smp" else ""
        return (f"{self.sdk} image_uris.get_training_image_uri(region={self.region!r}, "
                f"framework='pytorch', framework_version={self.torch!r}, "
                f"py_version={self.py_version!r}, instance_type={self.instance_type!r}{smp})")

    def to_dict(self) -> dict[str, str]:
        return {"uri": self.uri, "from": self.source}


def image_uris() -> ModuleType:
    """``sagemaker.core.image_uris``, or the one line that says which extra to install."""
    try:
        from sagemaker.core import image_uris as module
    except ImportError:
        raise UsageError(MISSING, INSTALL_HINT) from None
    return module


@functools.cache
def sdk_version() -> str:
    """``sagemaker-core X.Y.Z``, as the dry run names its source."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{DISTRIBUTION} {version(DISTRIBUTION)}"
    except PackageNotFoundError:  # imported from a source tree
        return DISTRIBUTION


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def nearest_version(wanted: str, published: list[str]) -> str:
    """The published version closest to ``wanted``: the same major.minor first, then the
    smallest step in the numbers, the newer of two as near."""
    want = _version_key(wanted) + (0, 0, 0)

    def distance(version: str) -> tuple[int, int, int]:
        have = _version_key(version) + (0, 0, 0)
        steps = [abs(a - b) for a, b in zip(want[:3], have[:3], strict=True)]
        return (steps[0] * 1000 + steps[1]) * 1000 + steps[2], -have[1], -have[2]

    return min(published, key=distance)


def nearest_region(wanted: str, published: list[str]) -> str:
    """The published region most like ``wanted``: most leading name parts in common (``ap-``,
    ``us-gov-``), then the closest spelling."""
    parts = wanted.split("-")

    def score(region: str) -> tuple[int, float]:
        other = region.split("-")
        common = 0
        while common < min(len(parts), len(other)) and parts[common] == other[common]:
            common += 1
        return common, difflib.SequenceMatcher(None, wanted, region).ratio()

    return max(sorted(published), key=score)


def _framework(strategy: str) -> str:
    # SMP v2's scripts need SageMaker's SMP container (``Strategy.image``), the SDK's
    # "pytorch-smp" framework; every other strategy runs in its stock PyTorch training image.
    return "pytorch-smp" if strategies.get(strategy).image == "smp" else "pytorch"


def _label(framework: str) -> str:
    return "SMP v2" if framework == "pytorch-smp" else "AWS PyTorch training"


def torch_versions(framework: str) -> tuple[list[str], dict[str, str]]:
    """(the PyTorch versions the SDK has ``framework`` training images for, each as x.y.z;
    what it also accepts -> the config key it resolves to). For ``pytorch`` the config's keys
    are PyTorch versions (``2.8`` is an alias of ``2.8.0``); for ``pytorch-smp`` they are SMP
    library versions and the PyTorch versions are the aliases (``2.5.1`` -> SMP ``2.8.0``)."""
    config = _config(framework)
    aliases: dict[str, str] = dict(config.get("version_aliases", {}))
    if framework == "pytorch":
        full = [v for v in config["versions"] if _FULL_VERSION.match(v)]
        keys = {v: v for v in full} | {a: k for a, k in aliases.items() if k in full}
    else:
        full = [a for a in aliases if _FULL_VERSION.match(a)]
        keys = {a: aliases[a] for a in full}
    return sorted(full, key=_version_key), keys


@functools.cache
def _config(framework: str) -> dict[str, Any]:
    """The SDK's training image data of ``framework`` (its JSON, read once: a lookup reads it
    several times otherwise). Not to be changed by the caller."""
    config: dict[str, Any] = image_uris().config_for_framework(framework)[SCOPE]
    return config


def _version_config(framework: str, key: str, py_version: str | None) -> dict[str, Any]:
    config = _config(framework)["versions"][key]
    return (config.get(py_version) or config) if py_version else config


def published_regions(framework: str, torch: str, py_version: str | None = None) -> list[str]:
    """The regions the SDK has a ``framework`` training image of PyTorch ``torch`` in."""
    _, keys = torch_versions(framework)
    return sorted(_version_config(framework, keys[torch], py_version)["registries"])


def registries(framework: str, torch: str) -> dict[str, str]:
    """Region -> the ECR account that serves the image there (what an execution role must be
    allowed to pull from: infra/aws is held to it)."""
    _, keys = torch_versions(framework)
    return dict(_version_config(framework, keys[torch], None)["registries"])


def training_image(region: str, strategy: str, instance_type: str, torch: str,
                   py_version: str | None = None) -> TrainingImage:
    """The image a ``strategy`` job of PyTorch ``torch`` runs in on ``instance_type`` in
    ``region``: the SMP v2 image for ``smp_v2``, else AWS's PyTorch training container; Python
    the newest the SDK has for that version unless ``py_version`` is given. A combination the
    SDK has no image for is a :class:`BadValue` naming the nearest it has."""
    framework = _framework(strategy)
    label = _label(framework)
    sdk = sdk_version()
    versions, keys = torch_versions(framework)
    if torch not in keys:
        near = nearest_version(torch, versions)
        raise BadValue(f"{sdk} publishes no {label} image of torch {torch}; the nearest it "
                       f"publishes is {near}",
                       f"set torch_version = \"{near}\", or pass --image")
    torch = keys[torch] if framework == "pytorch" else torch  # "2.8" -> "2.8.0"
    py_versions = image_uris().list_py_versions(framework, torch, SCOPE)
    if py_version is None:
        py_version = max(py_versions, key=_version_key)
    elif py_version not in py_versions:
        near = nearest_version(py_version, py_versions)
        raise BadValue(f"{sdk} publishes no {label} image of torch {torch} for Python "
                       f"{py_version}; the nearest it publishes is {near}",
                       f"set py_version = \"{near}\", or pass --image")
    regions = published_regions(framework, torch, py_version)
    if region not in regions:
        near = nearest_region(region, regions)
        raise BadValue(f"{sdk} publishes no {label} image of torch {torch} in {region}; the "
                       f"nearest region it publishes one in is {near}",
                       f"pass --region {near}, or --image with an image in {region}")
    try:
        uri = image_uris().get_training_image_uri(
            region, "pytorch", framework_version=torch, py_version=py_version,
            instance_type=instance_type,
            distribution=SMP_DISTRIBUTION if framework == "pytorch-smp" else None)
    except ValueError as exc:  # the instance type: a processor the image is not built for
        reason = str(exc).split(". ")[0].rstrip(".")
        raise BadValue(f"{sdk} publishes no {label} image of torch {torch} for "
                       f"{instance_type} ({reason[:200]})",
                       "run `launch machines --provider sagemaker` for the GPU instance types"
                       ) from None
    return TrainingImage(uri=uri, framework=framework, torch=torch, py_version=py_version,
                         region=region, instance_type=instance_type, sdk=sdk)


def request_image(image: str | None, torch: str | None, py_version: str | None, region: str,
                  plan: Plan, instance_type: str) -> dict[str, str]:
    """``{"uri", "from"}`` for the request: the ``image`` setting as given (no SDK needed),
    else the image the SDK names for the plan's strategy, region and instance type, of the
    torch its script ran under (images.py) unless ``torch`` (``torch_version``) says another."""
    from launcher.providers.images import default_image

    if image:
        return {"uri": image, "from": "the image setting"}
    default = default_image("sagemaker", plan.strategy, plan.optimizer)
    if default is None:
        raise UsageError(f"no SageMaker image is known to run the {plan.strategy} script",
                         "pass --image")
    return training_image(region, plan.strategy, instance_type, torch or default.torch,
                          py_version).to_dict()


def gpu_facts(region: str) -> dict[str, tuple[int, int]]:
    """Instance type -> (GPUs, total GPU memory in MiB) as the SDK's data has them for
    ``region`` (``instance_gpu_info.json``); the SageMaker catalog is held to it in a test."""
    try:
        from sagemaker.core import instance_types_gpu_info
    except ImportError:
        raise UsageError(MISSING, INSTALL_HINT) from None
    return {name: (int(info["Count"]), int(info["TotalGpuMemoryInMiB"]))
            for name, info in instance_types_gpu_info.retrieve(region).items()}
