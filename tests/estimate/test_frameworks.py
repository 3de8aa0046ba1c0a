"""Framework scripts (Hugging Face Trainer, accelerate, Lightning) planned as the user wrote them.

``launch plan SCRIPT --json`` on such a script runs it up to where training starts (a child
process with a time limit, launcher/capture/child/), traces the model, optimizer and batch it
built (launcher/capture/recipe_template.py) and plans on that: ``model.source`` is ``traced``
without ``--params``. The traced peak at the plan's micro-batch is checked against the framework's
own training step, run for real on the CPU (``frameworks.measure_step``: the CPU allocator's record
of two optimizer steps of the real Trainer, accelerate loop or Lightning fit), within 2%.

Nine scripts are known here: the examples (examples/hf_trainer, examples/accelerate,
examples/lightning) and two more per framework written as its documentation writes them
(tests/fixtures/frameworks). The tests plan and measure four of them (``TESTED``), in a pool of
processes started once for the module: each plan and measurement imports torch and the framework
in a child (seconds of CPU that overlap). ``bench/bench_frameworks.py`` reruns the check over all
nine and reports each script's traced and real peaks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from launcher.capture.frameworks import Detected, detect, measure_step
from launcher.recipe import classify
from tests.fakes.in_process import launch as _launch
from tests.fakes.record import record

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "frameworks"

#: script, framework, (micro-batch, global batch) as the script itself trains.
SCRIPTS: dict[str, tuple[Path, str, tuple[int, int]]] = {
    "hf_example": (REPO / "examples" / "hf_trainer" / "train.py", "hf_trainer", (4, 8)),
    "hf_classifier": (FIXTURES / "hf_classifier" / "train.py", "hf_trainer", (8, 8)),
    "accelerate_example": (REPO / "examples" / "accelerate" / "train.py", "accelerate", (8, 8)),
    "accelerate_nlp": (FIXTURES / "accelerate_nlp.py", "accelerate", (4, 4)),
    "lightning_example": (REPO / "examples" / "lightning" / "train.py", "lightning", (8, 8)),
    "lightning_autoencoder": (FIXTURES / "lightning_autoencoder.py", "lightning", (32, 32)),
    "hf_run_clm": (FIXTURES / "hf_run_clm.py", "hf_trainer", (8, 8)),
    "accelerate_cv": (FIXTURES / "accelerate_cv.py", "accelerate", (8, 8)),
    "lightning_classifier": (FIXTURES / "lightning_classifier.py", "lightning", (32, 32)),
}
#: The scripts the tests plan and measure: the examples' Trainer script (the settings test reads
#: it), one more Trainer script, and one script from each of accelerate's and Lightning's docs.
#: The sweep of all nine is a benchmark (``bench/bench_frameworks.py``, docs/benchmarks.md), which
#: sets ``LAUNCH_TEST_ALL_FRAMEWORK_SCRIPTS=1``: each script is a real framework step and a trace
#: in child processes, minutes on two cores for the nine.
TESTED = tuple(SCRIPTS) if os.environ.get("LAUNCH_TEST_ALL_FRAMEWORK_SCRIPTS") == "1" else (
    "hf_example", "hf_classifier", "accelerate_nlp", "lightning_classifier")
_PACKAGES = {"hf_trainer": "transformers", "accelerate": "accelerate", "lightning": "lightning"}
#: A note each plan must carry (what was assumed about the script).
NOTES = {"hf_classifier": "no local weights for"}




class Runs:
    """Every plan and measurement of the module, started at once in a small pool."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.pool = ThreadPoolExecutor(3)
        self.futures: dict[str, Future] = {}

    def start(self, name: str) -> None:
        script, kind, (micro, global_batch) = SCRIPTS[name]
        if _missing(kind):
            return
        folder = self.dir / name
        folder.mkdir()
        self.futures[name] = self.pool.submit(
            _launch, ["plan", str(script), "--json", "--precision", "fp32",
                      "--micro-batch-size", str(micro), "--global-batch-size",
                      str(global_batch)], folder)
        self.futures[f"{name}_real"] = self.pool.submit(
            measure_step, script, detect(script), timeout_s=300)

    def get(self, key: str) -> Any:
        if key.removesuffix("_real") not in self.futures:
            pytest.skip(f"{_PACKAGES[SCRIPTS[key.removesuffix('_real')][1]]} is not installed")
        return self.futures[key].result()


def _missing(kind: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(_PACKAGES[kind]) is None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("frameworks"))
    for name in TESTED:
        r.start(name)
    if not _missing("accelerate"):
        folder = r.dir / "no_backward"
        folder.mkdir()
        r.futures["no_backward"] = r.pool.submit(
            _launch, ["plan", str(FIXTURES / "accelerate_no_backward.py"), "--json",
                      "--precision", "fp32"], folder)
    yield r
    r.pool.shutdown(wait=True, cancel_futures=True)


# --- recognition ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_is_recognised_as_its_framework(name: str) -> None:
    script, kind, _ = SCRIPTS[name]
    assert classify(script)[0] == "script"
    found = detect(script)
    assert found is not None and found.kind == kind


def test_lightning_is_recognised_under_each_of_its_import_names(tmp_path: Path) -> None:
    cases = {
        "import lightning as L\nL.Trainer().fit(m)\n": ("lightning",),
        "import pytorch_lightning as pl\npl.Trainer(max_epochs=1).fit(m, dl)\n":
            ("pytorch_lightning",),
        "from lightning.pytorch import Trainer\nTrainer().fit(m)\n": ("lightning.pytorch",),
        "import lightning.pytorch as pl\npl.Trainer().fit(m)\n": ("lightning.pytorch",),
    }
    for source, modules in cases.items():
        assert detect(tmp_path / "x.py", source) == Detected("lightning", modules), source


@pytest.mark.parametrize("source", [
    # a Trainer that is built but never trained (evaluation only)
    "from transformers import Trainer\nt = Trainer(model=m)\nt.evaluate()\n",
    # an Accelerator used without its training calls
    "from accelerate import Accelerator\nAccelerator().print('hi')\n",
    # prepare without backward: inference
    "from accelerate import Accelerator\na = Accelerator()\nm = a.prepare(m)\nm(x)\n",
    # a class called Trainer of the script's own, with fit
    "class Trainer:\n    def fit(self, m):\n        pass\nTrainer().fit(1)\n",
    # torch only
    "import torch\nloss.backward()\nopt.step()\n",
])
def test_other_scripts_are_not_framework_scripts(tmp_path: Path, source: str) -> None:
    assert detect(tmp_path / "x.py", source) is None


def test_hf_trainer_is_recognised_through_module_attributes_and_subclasses(
        tmp_path: Path) -> None:
    attribute = "import transformers\ntransformers.Trainer(model=m).train()\n"
    subclass = ("from transformers import Trainer\nclass MyTrainer(Trainer):\n    pass\n"
                "MyTrainer(model=m).train()\n")
    trl = "from trl import SFTTrainer\nSFTTrainer(model=m).train()\n"
    for source in (attribute, subclass, trl):
        found = detect(tmp_path / "x.py", source)
        assert found is not None and found.kind == "hf_trainer", source


def test_recognising_a_script_imports_no_torch() -> None:
    code = ("import sys; from pathlib import Path; from launcher.capture.frameworks import detect; "
            f"assert detect(Path({str(SCRIPTS['hf_example'][0])!r})).kind == 'hf_trainer'; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_examples_recognised_by_their_recipes_stay_recipes() -> None:
    # a recipe importing a framework is still a recipe: classify decides first
    assert classify(REPO / "examples" / "tinygpt" / "train.py")[0] == "recipe"


# --- traced plans against the framework's own step -------------------------------------------


#: Known gaps of the estimator itself (the launch loop's own real step differs the same way).
ESTIMATOR_GAPS: dict[str, str] = {}


def test_the_cpu_probe_counts_the_unreduced_loss_of_mse_loss() -> None:
    """The CPU ``mse_loss`` kernel computes the unreduced ``[b, n]`` loss inside itself before
    its mean: invisible to the dispatcher, 12% of the Lightning autoencoder's step until probed."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from launcher.estimate.child._tracker import ScratchProbe

    probe = ScratchProbe(torch.device("cpu"))
    assert "mse_loss" in probe.ops
    with FakeTensorMode():
        x, y = torch.empty(32, 784), torch.empty(32, 784)
    measured = probe.measure(torch.ops.aten.mse_loss.default, (x, y, 1), {})
    assert measured is not None and measured.scratch >= 32 * 784 * 4


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=ESTIMATOR_GAPS[n], strict=True))
    if n in ESTIMATOR_GAPS else n for n in sorted(TESTED)])
def test_plan_is_traced_and_matches_the_frameworks_own_step(runs: Runs, name: str) -> None:
    status, stdout, stderr = runs.get(name)
    assert status == 0, stderr
    import json

    result = json.loads(stdout)
    _script, _kind, (micro, global_batch) = SCRIPTS[name]
    assert result["model"]["source"] == "traced"
    assert result["model"]["parameters"] and result["model"]["parameters"] > 1000
    chosen = result["chosen"]
    assert chosen["micro_batch_size"] == micro
    assert chosen["grad_accum_steps"] == global_batch // micro
    real = runs.get(f"{name}_real")
    traced = chosen["memory"]["peak_allocated"]
    record("framework_script", script=name, framework=_kind, traced_peak=traced,
           real_peak=real["peak_allocated"], micro_batch_size=micro)
    # the framework's own real step: the Trainer, the accelerate loop, Lightning's fit
    assert abs(traced - real["peak_allocated"]) <= 0.02 * real["peak_allocated"], (
        f"{name}: traced {traced} B, the framework's real step {real['peak_allocated']} B")
    # and the model is not just its weights: activations and optimizer state were traced
    assert chosen["memory"]["optimizer"] > 0 and chosen["memory"]["activations"] > 0
    if name in NOTES:
        assert any(NOTES[name] in n for n in result["notes"]), result["notes"]


#: The script's own length each tested script trains for when no --steps pins it, and how the
#: plan says it was found (the Trainer's max_steps, epochs of the loader's batches, the loops).
OWN_STEPS = {
    "hf_example": (20, "the script's own: max_steps=20"),
    "hf_classifier": (4, "the script's own: 1 epoch of 4 batches"),  # 32 reviews, 8 a batch
    "accelerate_nlp": (16, "the script's own: 1 epoch of 16 batches"),  # range(1) x 64 rows / 4
    "lightning_classifier": (32, "the script's own: 2 epochs of 16 batches"),  # 512 / 32, twice
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TESTED))
def test_the_plan_keeps_the_scripts_own_length_and_says_where_each_value_came_from(
        runs: Runs, name: str) -> None:
    """Not launch's default 100 steps: the Trainer's max_steps or epochs, Lightning's
    max_epochs over its loader, an accelerate loop bounded by its loops; the plan's ``origins``
    say which (the flags pin the micro-batch and the global batch here)."""
    import json

    status, stdout, stderr = runs.get(name)
    assert status == 0, stderr
    result = json.loads(stdout)
    steps, origin = OWN_STEPS[name]
    assert result["chosen"]["steps"] == steps
    assert result["origins"]["steps"] == origin
    assert result["origins"]["global_batch_size"] == "--global-batch-size"
    assert result["origins"]["lr"].startswith("the script's own")
    assert result["origins"]["optimizer"].startswith("the script's own: torch.optim.Adam")


@pytest.mark.slow
def test_an_accelerate_loop_stopped_before_backward_is_traced_with_the_models_loss(
        runs: Runs) -> None:
    import json

    status, stdout, stderr = runs.get("no_backward")
    assert status == 0, stderr
    result = json.loads(stdout)
    assert result["model"]["source"] == "traced"
    assert any("loop's loss was not seen" in n for n in result["notes"]), result["notes"]
    # SGD with momentum, as prepare was given: one state tensor per weight, not AdamW's two;
    # and the plan names it (it named launch's default, adamw, over SGD's bytes)
    memory = result["chosen"]["memory"]
    assert memory["optimizer"] == memory["parameters"]
    assert result["chosen"]["optimizer"] == "sgd"
    assert result["origins"]["optimizer"] == "the script's own: torch.optim.SGD"
    # its loop never got to count a batch: its length is unknown, and so is its cost
    assert result["chosen"]["steps"] is None
    assert result["origins"]["steps"].startswith("the script's own, not known before it runs")


@pytest.mark.slow
def test_the_frameworks_settings_become_the_plans_defaults(runs: Runs) -> None:
    import json

    status, stdout, stderr = runs.get("hf_example")
    assert status == 0, stderr
    # no pins but the micro-batch: the Trainer's per-device batch x accumulation is the global
    state = runs.dir / "hf_defaults"
    state.mkdir()
    status, stdout, stderr = _launch(["plan", str(SCRIPTS["hf_example"][0]), "--json",
                                      "--precision", "fp32", "--micro-batch-size", "2"], state)
    assert status == 0, stderr
    chosen = json.loads(stdout)["chosen"]
    assert chosen["global_batch_size"] == 8 and chosen["grad_accum_steps"] == 4


# --- scripts that never reach training --------------------------------------------------------


@pytest.mark.slow
def test_a_script_that_exits_before_training_is_planned_from_its_models_config(
        tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import json

    status, stdout, stderr = _launch(
        ["plan", str(FIXTURES / "exits_early.py"), "--json", "--precision", "fp32"], tmp_path)
    assert status == 0, stderr
    result = json.loads(stdout)
    assert result["model"]["source"] == "config"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):  # the script's model, counted by transformers itself
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    assert result["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert any("exited (status 3) before reaching Trainer.train()" in n
               for n in result["notes"]), result["notes"]


@pytest.mark.slow
def test_a_script_that_hangs_is_stopped_at_the_time_limit_with_a_note(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    started = time.monotonic()
    status, _stdout, stderr = _launch(["plan", str(FIXTURES / "hangs.py"), "--json"], tmp_path,
                                      {"LAUNCH_CAPTURE_TIMEOUT": "5"})
    elapsed = time.monotonic() - started
    assert status == 2  # nothing to plan on: a usage error that says why
    assert "did not reach Trainer.fit() within 5 s" in stderr
    assert "--model-config" in stderr
    assert elapsed < 25, elapsed


# --- the generated recipe, in-process -----------------------------------------------------------


def _recipe_from(folder: Path, model: Any, batch: Any, capture: dict[str, Any]) -> Any:
    """The recipe launch writes for a capture of ``model`` and ``batch``, imported here."""
    import importlib.util
    import json
    import shutil

    import torch

    from launcher.capture.child.capture import MetaPickler

    folder.mkdir()
    with open(folder / "model.pkl", "wb") as handle:
        MetaPickler(handle).dump(model)
    torch.save(batch, folder / "batch.pt")
    (folder / "capture.json").write_text(json.dumps({
        "script": str(folder / "train.py"), "script_dir": str(folder), **capture}))
    shutil.copyfile(REPO / "launcher" / "capture/recipe_template.py", folder / "recipe.py")
    spec = importlib.util.spec_from_file_location(f"recipe_{folder.name}", folder / "recipe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_rebuilds_the_captured_model_with_its_ties_and_buffers(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as a language model's head often is
    model.register_buffer("scale", torch.arange(3.0))
    recipe = _recipe_from(tmp_path / "tied", model, {"x": torch.zeros(3, 2, dtype=torch.long)},
                          {"batch_size": 3, "step": {"kind": "hf_loss"}, "wrap_modules": [],
                           "optimizer": {"class": "torch.optim.sgd.SGD",
                                         "defaults": {"lr": 0.1, "momentum": 0.9,
                                                      "not_an_sgd_setting": 1}}})
    built = recipe.build_model()
    assert built[1].weight is built[0].weight and built[0].weight.device.type == "cpu"
    assert built[0].weight.shape == (10, 4) and built[0].weight.requires_grad
    assert built.scale.tolist() == [0.0, 1.0, 2.0]  # a small buffer keeps its values
    with torch.device("meta"):  # sized without memory, as launcher.recipe probes recipes
        assert recipe.build_model()[0].weight.device.type == "meta"
    optimizer = recipe.build_optimizer(built.parameters())
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.9
    assert not hasattr(recipe, "wrap_modules")  # no repeated blocks: none to checkpoint


def test_the_recipes_batches_are_the_captured_rows_at_any_size(tmp_path: Path) -> None:
    import torch

    rows = torch.arange(12).reshape(3, 4)
    batch = ({"input_ids": rows, "vocab": torch.ones(7), "name": "train"}, rows.float())
    recipe = _recipe_from(tmp_path / "rows", torch.nn.Linear(4, 4), batch,
                          {"batch_size": 3, "step": {"kind": "model_output"},
                           "optimizer": {"class": None}})
    small, ids = recipe.example_batch(2)
    assert small["input_ids"].tolist() == rows[:2].tolist() and ids.shape == (2, 4)
    large, _ = recipe.example_batch(5)  # repeated: the script's own token ids, not random ones
    assert large["input_ids"].tolist() == rows[[0, 1, 2, 0, 1]].tolist()
    assert large["vocab"].shape == (7,) and large["name"] == "train"  # not the batch's rows
    assert not hasattr(recipe, "build_optimizer")  # the plan's optimizer then


# --- the script's own length ------------------------------------------------------------------


def test_the_scripts_own_length_is_counted_as_its_framework_counts_it() -> None:
    from launcher.capture.frameworks import own_steps

    # the Trainer's epochs: ceil(epochs x ceil(batches / accumulation)), as run_clm.py's 1 epoch
    assert own_steps({"epochs": 1, "batches": 2, "accumulation": 1, "batch_size": 8}, 8) == (
        2, "1 epoch of 2 batches")
    assert own_steps({"epochs": 3, "batches": 5, "accumulation": 2, "batch_size": 4}, 8) == (
        9, "3 epochs of 5 batches, 2 a step")
    # Lightning's max_steps and max_epochs: the first limit reached
    assert own_steps({"max_steps": 100, "epochs": 20, "batches": 40, "batch_size": 8}, 8) == (
        100, "max_steps=100, before 20 epochs of 40 batches")
    assert own_steps({"max_steps": 1000, "epochs": 20, "batches": 40, "batch_size": 8}, 8)[0] == (
        800)
    # at a global batch the user pinned: an epoch is the samples over it
    assert own_steps({"epochs": 2, "batches": 8, "batch_size": 8, "samples": 64}, 16) == (
        8, "2 epochs of 64 samples at a global batch of 16")
    # an accelerate loop that stops itself: not launch's 100, unknown
    steps, how = own_steps({"unknown": "its loop stops itself (a break or return)"}, 8)
    assert steps is None and how.endswith("its loop stops itself (a break or return)")


def test_an_accelerate_loops_bounds_are_read_from_the_loops_around_backward(
        tmp_path: Path) -> None:
    """The capture reads the loops around the first ``accelerator.backward`` in the frame that
    called it: ``range`` of a value the frame holds, then the DataLoader; a break makes the
    length the loop's own, unknown."""
    import importlib.util
    import sys as _sys

    from launcher.capture.child.accelerate import _loop_counts

    script = tmp_path / "loops.py"
    script.write_text(
        "def train(loader, backward, config):\n"
        "    for _epoch in range(config['epochs']):\n"
        "        for batch in enumerate(loader):\n"
        "            backward(batch)\n"
        "\n"
        "def stops(loader, backward):\n"
        "    for step, batch in enumerate(loader):\n"
        "        backward(batch)\n"
        "        if step == 3:\n"
        "            break\n")
    spec = importlib.util.spec_from_file_location("loops_fixture", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(torch.arange(40), batch_size=8)
    frames: list = []

    def backward(_batch: Any) -> None:
        frames.append(_sys._getframe(1))
        raise StopIteration

    with pytest.raises(StopIteration):
        module.train(loader, backward, {"epochs": 3})
    assert _loop_counts(frames[-1]) == (3, 5, loader)
    with pytest.raises(StopIteration):
        module.stops(loader, backward)
    assert _loop_counts(frames[-1]) == "its loop stops itself (a break or return)"
