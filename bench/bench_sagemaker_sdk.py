"""What the SageMaker SDK costs and what it would offer, measured (issue 27).

    .venv/bin/python bench/bench_sagemaker_sdk.py [--runs 7]

1. **Install size** of the ``sagemaker`` extra: the files (RECORD) of every distribution that
   ``sagemaker-core`` brings and launch-fit's base install and boto3 do not, from the installed
   metadata; the same for ``sagemaker-train`` where it is installed.
2. **Import time**, each in a fresh interpreter (median of ``--runs``): ``sagemaker.core.
   image_uris`` (what a SageMaker dry run imports), ``sagemaker.core.resources.TrainingJob``,
   ``sagemaker.train.ModelTrainer`` (if installed), and ``botocore`` for scale.
3. **Resolving an image** once imported: the first ``sdk.training_image`` call, then each next.
4. **The dry run**: ``launch plan --provider sagemaker --json`` end to end, with the SDK naming the
   image and with ``--image`` (no SDK), median of ``--runs``.
5. **Validating the request**: the provider's real CreateTrainingJob dict, and broken copies of
   it, through botocore's service model (what the tests use) and through sagemaker-core's typed
   shapes (what ``TrainingJob.create`` builds); whether each catches each break, whether the
   shapes give back the very dict (the dry run's exactness), and the time per validation.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import typing
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPE = """
import torch
LAUNCH = {"global_batch_size": 8, "steps": 2, "lr": 0.01}
def build_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
def example_batch(batch_size):
    x = torch.randn(batch_size, 16)
    return {"x": x, "y": x.sum(dim=1, keepdim=True)}
def training_step(model, batch):
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
"""
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"


# -- 1. install size ----------------------------------------------------------------------------


def _name(requirement: str) -> tuple[str, bool]:
    """(normalised distribution name, whether it applies without extras)."""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    applies = req.marker is None or req.marker.evaluate({"extra": ""})
    return req.name.lower().replace("_", "-"), applies


def closure(roots: list[str]) -> set[str]:
    """The installed distributions ``roots`` need, themselves included (no extras)."""
    seen: set[str] = set()
    todo = [r.lower() for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for requirement in dist.requires or []:
            dep, applies = _name(requirement)
            if applies and dep not in seen:
                todo.append(dep)
    return seen


def size_mb(names: set[str]) -> float:
    total = 0
    for name in names:
        for file in metadata.distribution(name).files or []:
            path = Path(file.locate())
            if path.is_file():
                total += path.stat().st_size
    return total / 1e6


def install_sizes() -> dict[str, Any]:
    base = closure(["click", "rich", "jinja2", "torch", "numpy", "pathspec", "boto3"])
    core = closure(["sagemaker-core"]) - base
    out: dict[str, Any] = {"sagemaker-core adds": {"distributions": len(core),
                                                   "MB": round(size_mb(core), 1)},
                           "biggest": sorted(((round(size_mb({n}), 1), n) for n in core),
                                             reverse=True)[:6]}
    try:
        metadata.distribution("sagemaker-train")
    except metadata.PackageNotFoundError:
        out["sagemaker-train adds"] = "not installed here"
    else:
        train = closure(["sagemaker-train"]) - base - core
        out["sagemaker-train adds (beyond sagemaker-core)"] = {
            "distributions": len(train), "MB": round(size_mb(train), 1)}
    return out


# -- 2. import time -----------------------------------------------------------------------------


def fresh_seconds(statement: str) -> float:
    code = (f"import time\nt = time.perf_counter()\n{statement}\n"
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return float(out.stdout.strip().splitlines()[-1])


def import_times(runs: int) -> dict[str, Any]:
    statements = {
        "botocore.session (for scale)": "import botocore.session",
        "sagemaker.core.image_uris": "from sagemaker.core import image_uris",
        "sagemaker.core.resources.TrainingJob": "from sagemaker.core.resources import TrainingJob",
        "sagemaker.train.ModelTrainer": "from sagemaker.train import ModelTrainer",
    }
    out: dict[str, Any] = {}
    for label, statement in statements.items():
        try:
            times = [fresh_seconds(statement) for _ in range(runs)]
        except subprocess.CalledProcessError:
            out[label] = "not installed here"
            continue
        out[label] = {"median_s": round(statistics.median(times), 3),
                      "min_s": round(min(times), 3), "max_s": round(max(times), 3)}
    return out


# -- 3. resolving --------------------------------------------------------------------------------


def resolve_times() -> dict[str, Any]:
    code = textwrap.dedent("""
        import json, time
        from launcher.providers.sagemaker import sdk
        sdk.image_uris()
        t = time.perf_counter()
        sdk.training_image("us-east-1", "ddp", "ml.p4d.24xlarge", "2.8.0")
        first = time.perf_counter() - t
        cases = [("eu-west-1", "ddp"), ("ap-east-1", "fsdp"), ("us-west-2", "smp_v2"),
                 ("cn-north-1", "ddp"), ("me-west-1", "ddp")] * 4
        t = time.perf_counter()
        for region, strategy in cases:
            sdk.training_image(region, strategy, "ml.p5.48xlarge",
                               "2.5.1" if strategy == "smp_v2" else "2.8.0")
        each = (time.perf_counter() - t) / len(cases)
        print(json.dumps({"first_call_ms": round(first * 1000, 1),
                          "next_calls_ms": round(each * 1000, 2)}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- 4. the dry run ------------------------------------------------------------------------------


def dry_run_times(runs: int, folder: Path) -> dict[str, Any]:
    script = folder / "train.py"
    script.write_text(RECIPE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAUNCH_NO_TRACE": "1",
           "LAUNCH_STATE_DIR": str(folder / "state"), "LAUNCH_HOME": str(folder / "home"),
           "AWS_EC2_METADATA_DISABLED": "true"}
    base = [sys.executable, "-m", "launcher.cli", "plan", str(script), "--provider", "sagemaker",
            "--region", "us-east-1", "--machine", "ml.g5.2xlarge", "--bucket", "b-launch",
            "--role", ROLE, "--json"]
    out: dict[str, Any] = {}
    for label, extra in (("image from the SDK", []),
                         ("--image given (no SDK)", ["--image", "1.dkr.ecr.x/mine:1"])):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([*base, *extra], capture_output=True, check=True, env=env,
                           cwd=folder)
            times.append(time.perf_counter() - start)
        out[label] = {"median_s": round(statistics.median(times), 2),
                      "min_s": round(min(times), 2)}
    return out


# -- 5. validating the request -------------------------------------------------------------------


def real_request(folder: Path) -> dict[str, Any]:
    """The CreateTrainingJob kwargs of a real dry run (``launch plan --json``)."""
    script = folder / "train.py"
    script.write_text(RECIPE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAUNCH_NO_TRACE": "1",
           "LAUNCH_STATE_DIR": str(folder / "state"), "LAUNCH_HOME": str(folder / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "plan", str(script), "--provider", "sagemaker",
         "--region", "us-east-1", "--machine", "ml.g5.2xlarge", "--bucket", "b-launch",
         "--role", ROLE, "--json"], capture_output=True, text=True, check=True, env=env,
        cwd=folder)
    kwargs: dict[str, Any] = json.loads(out.stdout)["request"]["create_training_job"]
    return kwargs


def _shape_of(annotation: Any) -> Any:
    """The pydantic model inside Optional[...] / List[...] / Union[...], else None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _shape_of(arg)
        if found is not None:
            return found
    return None


def _typed(shape: Any, value: Any) -> Any:
    """``value`` (PascalCase, as boto3 takes it) built into sagemaker-core's typed ``shape``."""
    from sagemaker.core.utils.utils import pascal_to_snake

    if isinstance(value, list):
        return [_typed(shape, item) for item in value]
    if not isinstance(value, dict):
        return value
    fields = {}
    for key, item in value.items():
        name = pascal_to_snake(key)
        info = shape.model_fields.get(name)
        inner = _shape_of(info.annotation) if info is not None else None
        fields[name] = _typed(inner, item) if inner is not None else item
    return shape(**fields)


def typed_validate(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What ``TrainingJob.create`` does before it sends: each argument built as its typed shape
    (pydantic checks the types and required fields), then ``serialize`` back to the dict boto3
    is given. Returns that dict; raises what pydantic raises."""
    from sagemaker.core.resources import TrainingJob
    from sagemaker.core.utils.utils import pascal_to_snake, serialize

    hints = typing.get_type_hints(TrainingJob.create)
    arguments: dict[str, Any] = {}
    for key, value in kwargs.items():
        name = pascal_to_snake(key)
        if name not in hints:
            raise TypeError(f"TrainingJob.create() got an unexpected keyword argument {name!r}")
        shape = _shape_of(hints[name])
        arguments[key] = _typed(shape, value) if shape is not None else value
    missing = [n for n in ("training_job_name", "role_arn", "output_data_config")
               if snake_missing(n, kwargs)]
    if missing:
        raise TypeError(f"TrainingJob.create() missing required arguments: {missing}")
    result: dict[str, Any] = serialize(arguments)
    return result


def snake_missing(name: str, kwargs: dict[str, Any]) -> bool:
    from sagemaker.core.utils.utils import snake_to_pascal

    return snake_to_pascal(name) not in kwargs


@functools.cache
def _create_shape() -> Any:
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateTrainingJob").input_shape


def botocore_validate(kwargs: dict[str, Any]) -> None:
    """What boto3 itself does before it sends (and tests/providers/test_sagemaker.py calls)."""
    import botocore.validate

    botocore.validate.validate_parameters(kwargs, _create_shape())


def breaks() -> dict[str, Callable[[dict[str, Any]], None]]:
    """Broken copies of the request, each a mistake a request builder could make."""

    def arg_too_long(k: dict[str, Any]) -> None:  # the API allows 256 characters an element
        k["AlgorithmSpecification"]["ContainerArguments"].append("x" * 300)

    def bad_name(k: dict[str, Any]) -> None:  # [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}
        k["TrainingJobName"] = "launch_run_1"

    def zero_instances(k: dict[str, Any]) -> None:  # InstanceCount >= 1
        k["ResourceConfig"]["InstanceCount"] = 0

    def no_output(k: dict[str, Any]) -> None:  # required
        del k["OutputDataConfig"]

    def runtime_as_text(k: dict[str, Any]) -> None:  # an integer
        k["StoppingCondition"]["MaxRuntimeInSeconds"] = "3600"

    def unknown_key(k: dict[str, Any]) -> None:
        k["ResourceConfig"]["InstanceKind"] = "ml.g5.2xlarge"

    def number_as_env(k: dict[str, Any]) -> None:  # environment values are strings
        k["Environment"]["LAUNCH_ATTEMPT"] = 1

    return {"container argument of 300 characters": arg_too_long,
            "job name with underscores": bad_name, "InstanceCount 0": zero_instances,
            "OutputDataConfig missing": no_output, "MaxRuntimeInSeconds '3600'": runtime_as_text,
            "unknown key in ResourceConfig": unknown_key,
            "an environment value 1 (not '1')": number_as_env}


def _verdict(check: Callable[[dict[str, Any]], Any], kwargs: dict[str, Any]) -> str:
    try:
        check(kwargs)
    except Exception as exc:
        return "caught: " + (str(exc).splitlines() or [type(exc).__name__])[0][:90]
    return "not caught"


def validation(folder: Path) -> dict[str, Any]:
    kwargs = real_request(folder)
    out: dict[str, Any] = {}
    for label, check in (("botocore service model", botocore_validate),
                         ("sagemaker-core typed shapes", typed_validate)):
        verdicts = {}
        for name, mutate in breaks().items():
            broken = copy.deepcopy(kwargs)
            mutate(broken)
            verdicts[name] = _verdict(check, broken)
        check(kwargs)  # warm
        start = time.perf_counter()
        for _ in range(200):
            check(kwargs)
        out[label] = {"per_request_ms": round((time.perf_counter() - start) / 200 * 1000, 2),
                      "breaks": verdicts}
    back = typed_validate(copy.deepcopy(kwargs))
    out["typed shapes give back the very request"] = back == kwargs
    if back != kwargs:
        out["what differs"] = sorted(k for k in set(back) | set(kwargs)
                                     if back.get(k) != kwargs.get(k))
    falsy = copy.deepcopy(kwargs)
    falsy["ResourceConfig"]["KeepAlivePeriodInSeconds"] = 0  # a nested 0 is a value
    out["a nested 0 survives the typed shapes"] = (
        typed_validate(copy.deepcopy(falsy)).get("ResourceConfig", {}).get(
            "KeepAlivePeriodInSeconds") == 0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    results: dict[str, Any] = {"sagemaker-core": metadata.version("sagemaker-core"),
                               "python": sys.version.split()[0]}
    results["install"] = install_sizes()
    results["import"] = import_times(args.runs)
    results["resolve"] = resolve_times()
    with tempfile.TemporaryDirectory() as folder:
        results["dry run"] = dry_run_times(args.runs, Path(folder))
        results["validation"] = validation(Path(folder))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
