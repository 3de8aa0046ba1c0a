"""bench/gpu_validate.py end to end in its CPU smoke mode: plan, render, run, JSON.

The GPU sweep itself needs a GPU; here the same code path runs on the CPU (``--device cpu``):
``launch plan`` for the row's exact plan, the rendered ``launch_train.py`` run for one step, and
the CPU allocator's peak of the same script's functions (``measure_recipe``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_validate.py"

sys.path.insert(0, str(ROOT / "bench"))
import gpu_validate  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu_validate")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--rows", "2", "--steps", "1",
         "--only", "mlp", "--jobs", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((out / gpu_validate.OUTPUT_NAME).read_text())
    document["_out"] = out
    document["_stdout"] = done.stdout
    return document


def test_smoke_writes_every_row_with_the_environment(smoke):
    env = smoke["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["cuda_available"] is False
    assert smoke["steps"] == 1
    assert [r["status"] for r in smoke["rows"]] == ["done", "done"]
    assert smoke["summary"]["done"] == 2 and smoke["summary"]["rows"] == 2
    # The printed summary names the same file.
    assert json.loads(smoke["_stdout"])["output"].endswith(gpu_validate.OUTPUT_NAME)


def test_smoke_rows_compare_positive_measurements_with_the_plan(smoke):
    for row in smoke["rows"]:
        assert row["model"] == "mlp" and row["zoo"] == "arch"
        measured, predicted = row["measured"], row["predicted"]
        assert measured["device"] == "cpu" and measured["steps"] == 1
        assert measured["peak_rss"] > 0 and measured["cpu_allocator_peak"] > 0
        assert predicted["peak_allocated"] > 0
        # A CPU plan has no reserve: null, not a guess.
        assert predicted["peak_reserved"] is None and measured["peak_reserved"] is None
        error = row["error"]["peak_allocated"]
        assert error == pytest.approx(
            (predicted["peak_allocated"] - measured["peak_allocated"])
            / measured["peak_allocated"])
        # The traced estimate of this MLP is exact on the CPU (docs/benchmarks.md).
        assert abs(error) < 0.01
        assert row["estimate_source"] == "traced" and row["plan_machine"] == "local-cpu"
        # The rendered script ran: its files and its log are in the row's folder.
        job = smoke["_out"] / "rows" / gpu_validate.Row(
            row["zoo"], row["model"], row["micro_batch"], row["accum"], row["precision"],
            row["checkpointing"], row["strategy"]).slug / "job"
        assert (job / "launch_train.py").is_file() and (job / "plan.json").is_file()
        assert '"launch": "metrics"' in (job / "run.log").read_text()


def test_rows_are_ordered_and_cover_both_zoos():
    rows = gpu_validate.all_rows(3)
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    zoo = len(gpu_validate.HF_MODELS) + len(gpu_validate.ARCH_MODELS)
    # Every model once in bf16_mixed first, then once in fp32.
    assert {r.precision for r in rows[:zoo]} == {"bf16_mixed"}
    assert {r.precision for r in rows[zoo:2 * zoo]} == {"fp32"}
    assert {(r.zoo, r.model) for r in rows[:zoo]} == (
        {("hf", m) for m in gpu_validate.HF_MODELS}
        | {("arch", m) for m in gpu_validate.ARCH_MODELS})
    assert any(r.checkpointing for r in rows) and any(r.accum > 1 for r in rows)
    assert any(r.strategy == "fsdp" for r in rows)


def test_a_row_that_cannot_start_in_the_budget_is_skipped_with_its_reason(tmp_path):
    code = gpu_validate.main(["--device", "cpu", "--rows", "2", "--budget-s", "0",
                              "--out", str(tmp_path)])
    document = json.loads((tmp_path / gpu_validate.OUTPUT_NAME).read_text())
    assert code == 1  # nothing was done
    assert [r["status"] for r in document["rows"]] == ["skipped", "skipped"]
    assert all(r["reason"].startswith("budget:") for r in document["rows"])


def test_cuda_without_a_gpu_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: --device cuda would run the whole sweep")
    code = gpu_validate.main(["--device", "cuda", "--out", str(tmp_path)])
    document = json.loads((tmp_path / gpu_validate.OUTPUT_NAME).read_text())
    assert code == 2 and "no GPU" in document["error"] and document["rows"] == []


def test_summary_reports_the_worst_under_estimate():
    a = gpu_validate.Row("arch", "mlp", 8, 1, "fp32", False, status="done")
    b = gpu_validate.Row("arch", "gpt", 8, 1, "fp32", False, status="done")
    a.error = {"peak_allocated": -0.10, "peak_reserved": 0.02}
    b.error = {"peak_allocated": 0.04, "peak_reserved": None}
    out = gpu_validate.summary([a, b])
    assert out["peak_allocated"]["median_abs_error"] == pytest.approx(0.07)
    assert out["peak_allocated"]["worst_under"] == {"row": a.name, "error": -0.10}
    assert out["peak_allocated"]["within_5%"] == 1
    assert out["peak_reserved"]["compared"] == 1 and out["peak_reserved"]["worst_under"] is None
