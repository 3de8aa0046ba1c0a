"""The failure-log classifier (`launch explain`, the supervisor's watch) on real and written logs.

Real logs: ``../shared/oom-logs`` next to the repository (CI has it; a missing directory fails
these tests, it does not skip them). ``EXPECTED`` below is this file's own reading of every case,
written from the log and its ``cases.csv`` label, not from what the code returns: the failure kind
the label maps to, the cause the log's own evidence supports (``unknown`` where a thread settled
the cause by something the log does not show), and the 1-based line of the root-cause message.

Written logs: ``tests/fixtures/logs/``, realistic formats the shared sample lacks.
"""

from __future__ import annotations

import csv
import io
import json
import random
import sys
import tracemalloc
from pathlib import Path

import pytest

from launcher.failures import (
    Diagnosis,
    LogWatcher,
    explain_file,
    explain_lines,
    explain_stream,
    parse_size,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO / ".." / "shared" / "oom-logs").resolve()
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "logs"
GiB, MiB = 1024**3, 1024**2

# label -> the failure kinds it allows ("oom_unknown_cause": GPU or host, as the log shows).
LABEL_FAILURES = {
    "oom_activations": {"gpu_oom"},
    "oom_model_states": {"gpu_oom"},
    "oom_fragmentation": {"gpu_oom"},
    "oom_unknown_cause": {"gpu_oom", "host_oom"},
    "host_oom": {"host_oom"},
    "not_oom": {"other"},
}
LABEL_CAUSE = {"oom_activations": "activations", "oom_model_states": "model_states",
               "oom_fragmentation": "fragmentation"}

# id: (label, failure, cause, root-cause line, why)
EXPECTED: dict[str, tuple[str, str, str | None, int, str]] = {
    "002": ("oom_model_states", "gpu_oom", "unknown", 1,
            "figures only: no phase, reserved == allocated, nothing outside"),
    "004": ("host_oom", "host_oom", "unknown", 1, "CPU allocator"),
    "007": ("host_oom", "host_oom", "unknown", 1, "CPU allocator, Windows wording"),
    "010": ("host_oom", "host_oom", "unknown", 1, "AI Platform: replica ran out-of-memory"),
    "013": ("oom_unknown_cause", "gpu_oom", "unknown", 4,
            "CUDA_ERROR_OUT_OF_MEMORY beats the cuBLAS init errors before it"),
    "015": ("not_oom", "other", None, 1, "'more than 1EB' is an impossible request"),
    "019": ("oom_unknown_cause", "gpu_oom", "unknown", 1, "XLA RESOURCE_EXHAUSTED"),
    "022": ("oom_unknown_cause", "gpu_oom", "unknown", 7,
            "TF OOM when allocating (not the ResourceExhaustedError summary line)"),
    "026": ("oom_fragmentation", "gpu_oom", "fragmentation", 3,
            "8.65 GiB reserved-unallocated >= 8.06 GiB request"),
    "029": ("oom_fragmentation", "gpu_oom", "fragmentation", 1,
            "5.94 GiB reserved-unallocated >= 426 MiB request"),
    "032": ("oom_fragmentation", "gpu_oom", "fragmentation", 1,
            "2.35 GiB free yet 20 MiB refused"),
    "033": ("oom_unknown_cause", "gpu_oom", "unknown", 3, "softmax only: no phase"),
    "035": ("oom_model_states", "gpu_oom", "model_states", 2, "exp_avg_sq: optimizer step"),
    "038": ("oom_model_states", "gpu_oom", "unknown", 1, "figures only"),
    "041": ("oom_model_states", "gpu_oom", "model_states", 11,
            "Parameter(torch.empty(...)) in a model's __init__"),
    "044": ("oom_unknown_cause", "gpu_oom", "other_process", 1,
            "10.5 of 23.65 GiB held outside this allocator"),
    "045": ("oom_activations", "gpu_oom", "unknown", 1,
            "figures only; 0.31 GiB idle reserve is ordinary slack"),
    "049": ("not_oom", "other", None, 1, "NCCL watchdog timeout"),
    "052": ("not_oom", "other", None, 1, "CUDA error (illegal access) from the NCCL watchdog"),
    "055": ("not_oom", "other", None, 7, "Errno 28 writing a checkpoint"),
    "060": ("host_oom", "host_oom", "unknown", 5, "'Killed' glued to a tqdm bar"),
    "063": ("host_oom", "host_oom", "unknown", 4, "the shell's 'Killed'"),
    "066": ("oom_unknown_cause", "gpu_oom", "other_process", 1,
            "Process 1940794 has 71.97 GiB"),
    "068": ("oom_activations", "gpu_oom", "unknown", 1, "message cut after 'is free.'"),
    "070": ("not_oom", "other", None, 12, "CUDNN_STATUS_INTERNAL_ERROR"),
    "074": ("oom_model_states", "gpu_oom", "model_states", 3,
            "interleaved ranks; OOM inside DistributedDataParallel.__init__"),
    "076": ("not_oom", "other", None, 4, "replica exited with status 1"),
    "077": ("oom_unknown_cause", "host_oom", "unknown", 7,
            "exit status -9 reported by Cloud ML Engine's runner: SIGKILL on a managed platform"),
    "080": ("oom_activations", "gpu_oom", "activations", 1,
            "phase eval, from the traceback chained after the error"),
    "084": ("oom_unknown_cause", "gpu_oom", "unknown", 1,
            "allocated > capacity (Windows spill): no telling figure"),
}
FIGURE_COLUMNS = {
    "requested_bytes": "requested_bytes",
    "total_capacity": "capacity_bytes",
    "allocated": "allocated_bytes",
    "reserved": "reserved_bytes",
    "free": "free_bytes",
}


def shared_dir() -> Path:
    if not (SHARED / "cases.csv").is_file():
        pytest.fail(f"the real logs are missing: expected {SHARED}/cases.csv and NNN.log files "
                    "(a checkout of the shared test data next to the repository)")
    return SHARED


def cases() -> dict[str, dict[str, str]]:
    with open(shared_dir() / "cases.csv", newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def test_expected_table_covers_every_shared_case() -> None:
    rows = cases()
    assert set(rows) == set(EXPECTED), "cases.csv and EXPECTED name different cases"
    for case_id, row in rows.items():
        label, failure, cause, _, _ = EXPECTED[case_id]
        assert row["label"] == label, case_id
        assert failure in LABEL_FAILURES[label], case_id
        if label in LABEL_CAUSE:  # a cause is the label's or honestly unknown, never another
            assert cause in (LABEL_CAUSE[label], "unknown"), case_id


@pytest.mark.parametrize("case_id", sorted(EXPECTED))
def test_shared_case(case_id: str) -> None:
    label, failure, cause, line, why = EXPECTED[case_id]
    d = explain_file(str(shared_dir() / f"{case_id}.log"))
    assert (d.failure, d.cause, d.line) == (failure, cause, line), f"{case_id}: {why}; got {d}"
    assert d.advice and d.excerpt


@pytest.mark.parametrize("case_id", sorted(EXPECTED))
def test_shared_case_figures(case_id: str) -> None:
    row = cases()[case_id]
    d = explain_file(str(shared_dir() / f"{case_id}.log"))
    for column, attr in FIGURE_COLUMNS.items():
        got = getattr(d, attr)
        if not row[column]:
            continue
        want = int(row[column])
        assert got is not None, f"{case_id}: {attr} missing, cases.csv says {want}"
        # cases.csv: "sizes printed with two decimals, so about 0.5% rounding".
        assert abs(got - want) <= 0.005 * want + 1, f"{case_id}: {attr} {got} vs {want}"
        # And read exactly: the printed number times its power of 1024, rounded to the byte
        # (the 2.1+ reserved figure is the sum of its two rounded parts).
        assert got == want, f"{case_id}: {attr} {got} vs {want}"


def test_no_shared_negative_called_oom() -> None:
    for case_id, row in cases().items():
        if row["label"] == "not_oom":
            d = explain_file(str(shared_dir() / f"{case_id}.log"))
            assert not d.is_oom, f"{case_id} ({row['evidence_for_label']}) called {d.failure}"


def test_every_shared_label_kind_is_right() -> None:
    for case_id, row in cases().items():
        d = explain_file(str(shared_dir() / f"{case_id}.log"))
        assert d.failure in LABEL_FAILURES[row["label"]], (case_id, row["label"], d.failure)


# -- written fixtures ------------------------------------------------------------------------

# name: (failure, cause, signature, rank, line, figures)
FIXTURE_EXPECTED: dict[str, tuple[str, str | None, str, int | None, int, dict[str, float]]] = {
    "rocm_hip_oom.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", None, 13, {
        "requested_bytes": 2 * GiB, "capacity_bytes": 63.98 * GiB,
        "allocated_bytes": 60.12 * GiB, "reserved_bytes": (60.12 + 1.57) * GiB,
        "free_bytes": 1.02 * GiB}),
    "torch2_oom_no_figures.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", None, 13,
                                  {}),
    "torch2_oom_wrapped.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", 3, 9, {
        "requested_bytes": 1.95 * GiB, "capacity_bytes": 39.38 * GiB,
        "allocated_bytes": 35.91 * GiB, "reserved_bytes": (35.91 + 1.63) * GiB,
        "free_bytes": 1.12 * GiB}),
    "cublas_alloc_failed.log": ("gpu_oom", "activations", "CUBLAS_STATUS_ALLOC_FAILED", None,
                                11, {}),
    "cudnn_alloc_failed.log": ("gpu_oom", "activations", "CUDNN_STATUS_ALLOC_FAILED", None, 11,
                               {}),
    "cudnn_v8_alloc_failed.log": ("gpu_oom", "unknown", "CUDNN_STATUS_ALLOC_FAILED", None, 6, {}),
    "nccl_cuda_oom.log": ("gpu_oom", "model_states", "nccl_cuda_out_of_memory", 11, 4, {}),
    "xla_resource_exhausted.log": ("gpu_oom", "unknown", "xla_resource_exhausted", None, 3,
                                   {"requested_bytes": 17179869184}),
    "tf_oom_allocating.log": ("gpu_oom", "unknown", "tensorflow_oom", None, 1,
                              {"requested_bytes": 67108864}),
    "dmesg_oom_killer.log": ("host_oom", "unknown", "kernel_oom_killer", None, 1, {}),
    "dataloader_killed.log": ("host_oom", "unknown", "dataloader_killed", None, 9, {}),
    "dataloader_shm_bus_error.log": ("host_oom", "shared_memory", "dataloader_bus_error", 0, 2,
                                     {}),
    "shm_unable_to_write.log": ("host_oom", "shared_memory", "shm_exhausted", None, 6, {}),
    "shm_errno28_context.log": ("host_oom", "shared_memory", "shm_exhausted", None, 9, {}),
    "sagemaker_exit_137.log": ("host_oom", "unknown", "sigkill", None, 1, {}),
    "sagemaker_oom_failure_reason.log": ("host_oom", "unknown", "platform_out_of_memory", None,
                                         3, {}),
    "sagemaker_cloudwatch_mpirank.log": ("gpu_oom", "model_states", "torch.OutOfMemoryError", 5,
                                         7, {"requested_bytes": 4 * GiB,
                                             "capacity_bytes": 79.15 * GiB,
                                             "allocated_bytes": 74.21 * GiB,
                                             "reserved_bytes": 75.02 * GiB,
                                             "free_bytes": 2.91 * GiB}),
    "vertex_workerpool_oom.log": ("host_oom", "unknown", "platform_out_of_memory", None, 1, {}),
    "vertex_cloud_logging.jsonl": ("gpu_oom", "activations", "torch.OutOfMemoryError", None, 2, {
        "requested_bytes": 3.5 * GiB, "capacity_bytes": 22.05 * GiB,
        "allocated_bytes": 18.31 * GiB, "reserved_bytes": (18.31 + 2.02) * GiB,
        "free_bytes": 1.27 * GiB}),
    "docker_json_file.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", None, 7, {
        "requested_bytes": 20 * MiB, "capacity_bytes": 7.79 * GiB,
        "allocated_bytes": 6.58 * GiB, "reserved_bytes": 6.75 * GiB,
        "free_bytes": 11.62 * MiB}),
    "torchrun_16rank_oom_rank11.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", 11,
                                       380, {"requested_bytes": 3.91 * GiB,
                                             "capacity_bytes": 79.10 * GiB,
                                             "allocated_bytes": 71.86 * GiB,
                                             "reserved_bytes": (71.86 + 3.26) * GiB,
                                             "free_bytes": 2.47 * GiB}),
    "launcher_oom_event.log": ("gpu_oom", "model_states", "launch_oom_event", 2, 14, {
        "requested_bytes": 1073741824, "capacity_bytes": 84974239744,
        "allocated_bytes": 82463372288, "reserved_bytes": 82685063168,
        "free_bytes": 642252800}),
    "launcher_oom_event_cpu.log": ("host_oom", "activations", "launch_oom_event", 0, 6,
                                   {"requested_bytes": 12884901888}),
    "ansi_colored.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", None, 6, {
        "requested_bytes": 512 * MiB, "capacity_bytes": 23.69 * GiB,
        "allocated_bytes": 21.48 * GiB, "reserved_bytes": 22.01 * GiB,
        "free_bytes": 301.06 * MiB}),
    "mps_oom.log": ("gpu_oom", "unknown", "torch.OutOfMemoryError", None, 4, {
        "requested_bytes": 256 * MiB, "allocated_bytes": 17.18 * GiB,
        "capacity_bytes": 18.13 * GiB}),
    "torch10_cached.log": ("gpu_oom", "activations", "torch.OutOfMemoryError", None, 8, {
        "requested_bytes": 1.53 * GiB, "capacity_bytes": 10.92 * GiB,
        "allocated_bytes": 8.21 * GiB, "reserved_bytes": 8.76 * GiB, "free_bytes": 1.04 * GiB}),
    "torch03_thc.log": ("gpu_oom", "activations", "generic_out_of_memory", None, 1, {}),
    "numpy_memoryerror.log": ("host_oom", "unknown", "MemoryError", None, 5,
                              {"requested_bytes": 7.45 * GiB}),
    # PyTorch 1.0's CPU allocator: "posix_memalign(...) == 0. 12 vs 0", errno 12 = ENOMEM.
    "cpu_posix_memalign.log": ("host_oom", "unknown", "DefaultCPUAllocator", None, 10, {}),
    "k8s_oomkilled.log": ("host_oom", "unknown", "OOMKilled", None, 10, {}),
    # A bare SIGKILL off a managed platform: probable host memory (test_bare_sigkill_...).
    "local_sigkill_bare.log": ("host_oom", "unknown", "sigkill", None, 2, {}),
    "accelerate_sigkill_shards.log": ("host_oom", "unknown", "sigkill", None, 16, {}),
    "deepspeed_exit_minus_9.log": ("host_oom", "unknown", "sigkill", None, 10, {}),
    "shell_killed_de.log": ("host_oom", "unknown", "shell_killed", None, 4, {}),
    # oneDNN: probable with nothing else (cpu), host memory under `ulimit -v` (ulimit).
    "onednn_primitive_cpu.log": ("host_oom", "unknown", "onednn_primitive", None, 18, {}),
    "onednn_primitive_ulimit.log": ("host_oom", "unknown", "onednn_primitive", None, 13, {}),
    # --- not memory ---
    "device_side_assert.log": ("other", None, "device_side_assert", None, 1, {}),
    "illegal_memory_access.log": ("other", None, "illegal_memory_access", 0, 4, {}),
    "preemption.log": ("other", None, "preemption", None, 3, {}),
    "nccl_timeout_then_1eb.log": ("other", None, "nccl_timeout", 4, 1, {}),
    "clean_run.log": ("none", None, "", None, 0, {}),
}


def test_fixture_table_covers_the_directory() -> None:
    on_disk = {p.name for p in FIXTURES.iterdir() if p.is_file()}
    assert on_disk == set(FIXTURE_EXPECTED)
    assert len(on_disk) >= 15


@pytest.mark.parametrize("name", sorted(FIXTURE_EXPECTED))
def test_fixture(name: str) -> None:
    failure, cause, signature, rank, line, figures = FIXTURE_EXPECTED[name]
    d = explain_file(str(FIXTURES / name))
    got = (d.failure, d.cause, d.signature, d.rank, d.line or 0)
    assert got == (failure, cause, signature, rank, line), d
    for attr, want in figures.items():
        value = getattr(d, attr)
        assert value is not None and abs(value - want) <= 0.005 * want + 1, (attr, value, want)
    for attr in set(FIGURE_COLUMNS.values()) - set(figures):
        assert getattr(d, attr) is None, (attr, "the log does not say it")


@pytest.mark.parametrize("path", sorted(FIXTURES.iterdir()) + (
    sorted(SHARED.glob("*.log")) if SHARED.is_dir() else []), ids=lambda p: p.name)
def test_file_scan_agrees_with_line_by_line(path: Path) -> None:
    """explain_file only decodes the lines that hold a needle (and those that continue them); it
    must find what reading every line finds."""
    with open(path, encoding="utf-8", errors="replace") as f:
        assert explain_file(str(path)) == explain_lines(f)


# -- root cause, cascade, streaming -------------------------------------------------------------

def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def test_oom_beats_the_cascade_printed_before_it() -> None:
    """Two nodes' logs concatenated: node 1's watchdog timeouts come first in the file."""
    lines = _lines("torchrun_16rank_oom_rank11.log")
    timeouts = [x for x in lines if "Watchdog caught" in x]
    rest = [x for x in lines if "Watchdog caught" not in x]
    d = explain_lines(timeouts + rest)
    assert (d.failure, d.rank, d.phase) == ("gpu_oom", 11, "backward")
    assert not any("Watchdog" in x for x in lines[:380])
    assert d.line == len(timeouts) + 380


def test_watcher_returns_on_the_first_oom_line_and_only_once() -> None:
    watcher = LogWatcher()
    returned = []
    for n, line in enumerate(_lines("torchrun_16rank_oom_rank11.log"), 1):
        d = watcher.feed(line)
        if d is not None:
            returned.append((n, d))
    assert [n for n, _ in returned] == [380]
    first = returned[0][1]
    assert (first.failure, first.rank, first.phase, first.cause) == (
        "gpu_oom", 11, "backward", "activations")
    assert first.requested_bytes == round(3.91 * GiB)
    final = watcher.result()
    assert (final.failure, final.line, final.rank) == ("gpu_oom", 380, 11)


def test_watcher_does_not_stop_a_job_for_a_timeout_or_a_clean_log() -> None:
    for name in ("nccl_timeout_then_1eb.log", "clean_run.log", "device_side_assert.log"):
        watcher = LogWatcher()
        assert all(watcher.feed(line) is None for line in _lines(name)), name
    assert watcher.result().failure == "other"


def test_launcher_oom_line_settles_the_phase() -> None:
    """The traceback says backward; the template's own line says eval: the line wins."""
    lines = [
        "[default1]:Traceback (most recent call last):",
        '[default1]:  File "/job/train.py", line 80, in train',
        "[default1]:    loss.backward()",
        "[default1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 "
        "has a total capacity of 23.57 GiB of which 1.10 GiB is free.",
        '[default1]:{"launch": "oom", "rank": 1, "phase": "eval", "step": 7, "micro_step": 0, '
        '"micro_batch_size": 32, "grad_accum_steps": 1, "device": "cuda", "message": "CUDA out '
        'of memory.", "requested_bytes": null, "allocated_bytes": 21474836480, '
        '"reserved_bytes": 21743271936, "max_allocated_bytes": null, "capacity_bytes": null, '
        '"free_bytes": null}',
    ]
    d = explain_lines(lines)
    assert (d.failure, d.phase, d.cause, d.rank, d.line) == ("gpu_oom", "eval", "activations",
                                                            1, 5)
    # The event's own figures first, the PyTorch message's where the event has none.
    assert d.allocated_bytes == 21474836480
    assert d.requested_bytes == 2 * GiB
    assert d.capacity_bytes == round(23.57 * GiB)
    assert "evaluation" in d.advice


def test_micro_batch_one_advises_checkpointing_not_halving() -> None:
    event = {"launch": "oom", "rank": 0, "phase": "forward", "step": 1, "micro_step": 1,
             "micro_batch_size": 1, "grad_accum_steps": 64, "device": "cuda",
             "message": "CUDA out of memory.", "requested_bytes": 1 << 30}
    d = explain_lines([json.dumps(event)])
    assert d.cause == "activations"
    assert "activation checkpointing" in d.advice and "halve" not in d.advice


# What a probable host OOM's advice must name: what would confirm it.
CONFIRMING = ('dmesg | grep -i "killed process"', "OOMKilled", "memory graph")


@pytest.mark.parametrize("platform", [None, "local"])
def test_bare_sigkill_is_a_probable_host_oom_off_the_clouds(platform: str | None) -> None:
    """torchelastic's "failed (exitcode: -9)" and "Signal 9 (SIGKILL) received by PID" on a local
    (or unknown) run: the kernel's OOM killer is their usual sender, not the only one. Host
    memory, said to be probable, with what would confirm it; no micro-batch change."""
    d = explain_lines(_lines("local_sigkill_bare.log"), platform=platform)
    assert (d.failure, d.cause, d.signature, d.line, d.phase) == (
        "host_oom", "unknown", "sigkill", 2, None)
    assert d.note.startswith("probable host OOM") and "kill -9" in d.note
    assert d.advice.startswith("probably host RAM ran out")
    assert all(evidence in d.advice for evidence in CONFIRMING), d.advice
    assert "micro-batch" not in d.advice and "halve" not in d.advice


@pytest.mark.parametrize("platform", ["sagemaker", "vertex"])
def test_platform_argument_makes_a_bare_sigkill_host_memory(platform: str) -> None:
    d = explain_lines(_lines("local_sigkill_bare.log"), platform=platform)
    assert (d.failure, d.cause) == ("host_oom", "unknown")
    assert "SIGKILL" in d.note and "managed platform" in d.note
    assert "probabl" not in d.note + d.advice


def test_a_probable_kill_leads_to_no_micro_batch_change() -> None:
    """The replanner reads a diagnosis as activations (and halves the micro-batch) when its cause
    is unknown and its phase one where activations grow. A kill leaves no traceback: no phase, so
    the host_oom path's replan makes no change (``remedies.replan`` returns None: no expandable
    segments, no smaller micro-batch, no checkpointing), whatever lines came before the kill."""
    from launcher.plan.plan import Plan
    from launcher.remedies import Failure, replan

    plan = Plan(strategy="single", machine="m", nodes=1, gpus_per_node=1, micro_batch_size=8,
                grad_accum_steps=1, global_batch_size=8, precision="fp32", optimizer="adamw",
                activation_checkpointing=False, steps=10, lr=1e-3)
    before = ["Traceback (most recent call last):", '  File "train.py", line 80, in train',
              "    loss.backward()", "RuntimeWarning: ignored", "step 12 loss 2.2"]
    for kill in ("Killed", "Getötet", "trainer exited with code 137",
                 "Signal 9 (SIGKILL) received by PID 4242"):
        d = explain_lines([*before, kill])
        assert (d.failure, d.cause, d.phase) == ("host_oom", "unknown", None), (kill, d)
        assert not Failure.of(d.to_dict()).activations, kill
        assert replan(plan, d.to_dict()) is None, kill
    # oneDNN's failure has a traceback: in backward, the replanner tries a smaller micro-batch,
    # as its advice says (its scratchpad grows with the batch).
    onednn = explain_lines([*before[:3], "RuntimeError: could not create a primitive"])
    assert onednn.phase == "backward"
    fixed = replan(plan, onednn.to_dict())
    assert fixed is not None and fixed[0].micro_batch_size == 4


def test_a_kill_with_the_kernels_word_is_certain() -> None:
    """The shell's "Killed", then the kernel's log (dmesg pasted after it): host memory, no
    longer only probable."""
    d = explain_lines(["epoch 3 step 1200", "Killed",
                       "[871234.5] Out of memory: Killed process 4242 (python3) "
                       "total-vm:98765432kB, anon-rss:61234567kB"])
    assert (d.failure, d.signature, d.line) == ("host_oom", "shell_killed", 2)
    assert "line 3 reports host memory" in d.note and "probabl" not in d.note + d.advice


def test_wrapped_message_split_mid_word_is_joined() -> None:
    lines = [
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capa",
        "city; 825.14 MiB already allocated; 2.35 GiB free; 850.00 MiB reserved in total by PyTo",
        "rch)",
    ]
    d = explain_lines(lines)
    assert d.capacity_bytes == 4 * GiB
    assert d.allocated_bytes == round(825.14 * MiB)
    assert d.reserved_bytes == 850 * MiB
    assert d.free_bytes == round(2.35 * GiB)


def test_wrapped_message_skips_another_ranks_interleaved_line() -> None:
    lines = [
        "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 2 "
        "has a total capacity of",
        '[rank5]: {"step": 40, "loss": 2.2}',
        "[rank2]: 79.10 GiB of which 512.00 MiB is free. Of the allocated memory 50.00 GiB is "
        "allocated by PyTorch, and 26.00 GiB is reserved by PyTorch but unallocated.",
    ]
    d = explain_lines(lines)
    assert d.rank == 2
    assert d.capacity_bytes == round(79.10 * GiB)
    assert d.reserved_bytes == 76 * GiB
    assert d.cause == "fragmentation"
    assert "expandable_segments:True" in d.advice


def test_cause_advice_names_the_lever() -> None:
    by_name = {name: explain_file(str(FIXTURES / name)) for name in (
        "launcher_oom_event.log", "rocm_hip_oom.log", "dataloader_shm_bus_error.log")}
    assert "FSDP" in by_name["launcher_oom_event.log"].advice
    assert "will not help" in by_name["launcher_oom_event.log"].advice
    assert "halve the micro-batch" in by_name["rocm_hip_oom.log"].advice
    assert "gradient accumulation" in by_name["rocm_hip_oom.log"].advice
    assert "--shm-size" in by_name["dataloader_shm_bus_error.log"].advice
    other = explain_file(str(shared_dir() / "044.log"))
    assert other.cause == "other_process" and "another process" in other.advice


# -- bad input -------------------------------------------------------------------------------

def test_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    d = explain_file(str(path))
    assert (d.failure, d.cause, d.line) == ("none", None, None)
    assert "empty" in d.note and "\n" not in d.summary()


def test_binary_file(tmp_path: Path) -> None:
    rng = random.Random(1234)
    path = tmp_path / "core.bin"
    path.write_bytes(rng.randbytes(1 << 20) + b"\x00" * 4096)
    d = explain_file(str(path))
    assert d.failure == "none", d
    assert "binary" in d.note


def test_oom_between_nul_padding_is_found(tmp_path: Path) -> None:
    """A crashed writer leaves NUL runs; the message after them still counts."""
    path = tmp_path / "nul.log"
    path.write_bytes(b"step 1\n" + b"\x00" * 70000 + b"\n" + (FIXTURES / "rocm_hip_oom.log")
                     .read_bytes())
    d = explain_file(str(path))
    assert (d.failure, d.line) == ("gpu_oom", 15)


def test_non_utf8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "latin1.log"
    path.write_bytes("Entra\u00eenement \u00e9poque 3 \u2014 perte 2.1\n".encode("latin-1",
                                                                             "replace")
                     + b"\xff\xfe\x80 garbage\n"
                     + b"RuntimeError: CUDA out of memory. Tried to allocate 60.00 MiB (GPU 0; "
                       b"6.00 GiB total capacity; 4.11 GiB already allocated; 34.82 MiB free; "
                       b"4.42 GiB reserved in total by PyTorch) \xe9\xe8\n")
    d = explain_file(str(path))
    assert (d.failure, d.line, d.requested_bytes) == ("gpu_oom", 3, 60 * MiB)


def test_200_mb_single_line(tmp_path: Path) -> None:
    """One line of 200 MB (a flattened log) with an OOM in the middle: found, in bounded memory."""
    path = tmp_path / "one_line.log"
    filler = b"loss=2.1 lr=3e-4 tokens=81234 step_time=0.41 | " * 1000  # 48 KB, no needles
    oom = (b" torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has "
           b"a total capacity of 79.10 GiB of which 12.00 MiB is free. Of the allocated memory "
           b"77.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but "
           b"unallocated. ")
    with open(path, "wb") as f:
        for i in range(4300):  # ~100 MB, the message, ~100 MB
            f.write(filler)
            if i == 2150:
                f.write(oom)
    assert path.stat().st_size > 200_000_000
    tracemalloc.start()
    d = explain_file(str(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (d.failure, d.line, d.requested_bytes) == ("gpu_oom", 1, GiB)
    assert len(d.excerpt) <= 610
    assert peak < 64 * MiB, peak  # speed: bench/bench_explain.py, not a timed test
    assert "windows" in d.note


def test_huge_line_through_the_watcher() -> None:
    line = "x" * 3_000_000 + " RuntimeError: CUDA error: out of memory " + "y" * 3_000_000
    d = explain_lines(["step 1", line])
    assert (d.failure, d.line, d.signature) == ("gpu_oom", 2, "cuda_runtime_out_of_memory")


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    data = (FIXTURES / "dmesg_oom_killer.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert explain_file("-").failure == "host_oom"


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        explain_file(str(tmp_path / "nope.log"))


# -- the contract ------------------------------------------------------------------------------

def test_to_dict_is_the_explain_json_contract() -> None:
    d = explain_file(str(FIXTURES / "torchrun_16rank_oom_rank11.log"))
    out = d.to_dict()
    contract = ["failure", "cause", "requested_bytes", "capacity_bytes", "allocated_bytes",
                "reserved_bytes", "free_bytes", "rank", "line", "excerpt", "advice"]
    assert list(out)[:len(contract)] == contract
    assert "phase" in out
    assert json.loads(json.dumps(out)) == out
    assert out["failure"] in ("gpu_oom", "host_oom", "other", "none")
    assert isinstance(d, Diagnosis)
    assert d.summary().startswith("gpu_oom (activations) at line 380, rank 11")


def test_excerpt_is_clean_and_short() -> None:
    d = explain_file(str(FIXTURES / "ansi_colored.log"))
    assert "\x1b" not in d.excerpt and "[1;36m" not in d.excerpt
    assert d.excerpt.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00")
    for path in FIXTURES.iterdir():
        assert len(explain_file(str(path)).excerpt) <= 600


@pytest.mark.parametrize("text,expected", [
    ("0 bytes", 0), ("20.00 MiB", 20 * MiB), ("8.06 GiB", round(8.06 * GiB)),
    ("32.00M", 32 * MiB), ("4.44GiB", round(4.44 * GiB)), ("17.18 GB", round(17.18 * GiB)),
    ("48.5KiB", round(48.5 * 1024)), ("1,024 MB", GiB), ("278528000 bytes", 278528000),
    ("1.00 TiB", 1024**4),
])
def test_sizes_are_binary_whatever_the_unit(text: str, expected: int) -> None:
    assert parse_size(text) == expected


# -- formats no fixture file shows: one or a few lines each -----------------------------------

MORE_FORMATS = [
    # (name, lines, failure, signature)
    ("torch.compile wraps the OOM",
     ["torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
      "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
     "gpu_oom", "torch.OutOfMemoryError"),
    ("journald kernel line",
     ["May 01 10:31:56 gpu-node-3 kernel: Out of memory: Killed process 1234 (python3) "
      "total-vm:123456789kB, anon-rss:120000000kB"], "host_oom", "kernel_oom_killer"),
    ("Slurm cgroup", ["slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1234.0. Some of "
                      "your processes may have been killed by the cgroup out-of-memory handler."],
     "host_oom", "kernel_oom_killer"),
    ("srun", ["srun: error: node12: task 0: Out Of Memory"], "host_oom", "kernel_oom_killer"),
    ("bash job killed", ["/var/spool/slurmd/job123/slurm_script: line 12:  4021 Killed"
                         "                  python train.py --bs 64"], "host_oom", "shell_killed"),
    ("XLA on TPU", ["RuntimeError: Resource exhausted: Attempting to reserve 12.35G at the bottom "
                    "of memory. That was not possible. There are 10.13G free, 0B reserved, and "
                    "10.13G reservable."], "gpu_oom", "xla_resource_exhausted"),
    ("JAX request", ["jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate"
                     " request for 1.23GiB (1320702464B) on device ordinal 0"],
     "gpu_oom", "xla_resource_exhausted"),
    ("Keras", ["tensorflow.python.framework.errors_impl.ResourceExhaustedError: failed to "
               "allocate memory [Op:Mul]"], "gpu_oom", "tensorflow_oom"),
    ("fork ENOMEM", ["OSError: [Errno 12] Cannot allocate memory"], "host_oom", "MemoryError"),
    ("bad_alloc", ["terminate called after throwing an instance of 'std::bad_alloc'",
                   "  what():  std::bad_alloc", "Aborted (core dumped)"], "host_oom",
     "MemoryError"),
    ("Ray", ["ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on "
             "memory."], "host_oom", "platform_out_of_memory"),
    ("XPU", ["torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1.00 GiB"], "gpu_oom",
     "torch.OutOfMemoryError"),
    ("CUDA runtime", ["RuntimeError: CUDA error: out of memory",
                      "CUDA kernel errors might be asynchronously reported at some other API "
                      "call, so the stacktrace below might be incorrect."],
     "gpu_oom", "cuda_runtime_out_of_memory"),
    # not memory
    ("gRPC RESOURCE_EXHAUSTED", ['grpc._channel._InactiveRpcError: status = StatusCode.'
                                 'RESOURCE_EXHAUSTED details = "Received message larger than max'
                                 ' (4194305 vs. 4194304)"'],
     "other", "exception:_InactiveRpcError"),
    ("absurd request size", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                             "16777216.00 TiB (GPU 0; 79.10 GiB total capacity; 1.00 GiB already "
                             "allocated; 70.00 GiB free; 2.00 GiB reserved in total by PyTorch)"],
     "other", "impossible_allocation_size"),
    # a bare SIGKILL: probable host memory (test_bare_sigkill_is_a_probable_host_oom_...)
    ("mp spawn SIGKILL", ["Exception: Process 1 terminated with signal SIGKILL"], "host_oom",
     "sigkill"),
    ("docker 137", ["trainer exited with code 137"], "host_oom", "sigkill"),
    ("advice is not a failure", ["UserWarning: to avoid out of memory errors, set "
                                 "max_split_size_mb"], "none", ""),
    ("handled OOM", ["Caught OOM at batch 64, retrying with 32", "epoch 1 done"], "none", ""),
    ("shutdown noise after done",
     ['{"launch": "done", "rank": 0, "step": 10, "loss": 1.0, "checkpoint": null}',
      "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3>",
      "Traceback (most recent call last):", "AssertionError: can only test a child process"],
     "none", ""),
    ("OOMKilled false", ['"State": {"Status": "exited", "OOMKilled": false, "ExitCode": 1}'],
     "other", "exit_status"),
    ("too many open files", ["RuntimeError: unable to open shared memory object </torch_1_2> in "
                             "read-write mode: Too many open files (24)"], "other",
     "too_many_open_files"),
]


@pytest.mark.parametrize("name,lines,failure,signature", MORE_FORMATS,
                         ids=[m[0] for m in MORE_FORMATS])
def test_more_formats(name: str, lines: list[str], failure: str, signature: str) -> None:
    d = explain_lines(lines)
    assert (d.failure, d.signature) == (failure, signature), d


@pytest.mark.parametrize("chunk", [64, 1000, 4096])
def test_chunk_boundaries_do_not_change_the_answer(chunk: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunks put every message, traceback and context window across a chunk boundary."""
    from launcher.failures import _scan

    monkeypatch.setattr(_scan, "CHUNK", chunk)
    for path in sorted(FIXTURES.iterdir()):
        with open(path, "rb") as stream:
            got = _scan.explain_stream(stream)
        with open(path, encoding="utf-8", errors="replace") as f:
            assert got == explain_lines(f), path.name


def test_long_line_windows_across_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than MAX_LINE read in small pieces: the message straddles two reads."""
    from launcher.failures import _scan

    monkeypatch.setattr(_scan, "CHUNK", 4096)
    monkeypatch.setattr(_scan, "MAX_LINE", 8192)
    message = b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 8.00 GiB " \
              b"total capacity; 5.00 GiB already allocated; 100.00 MiB free; 5.50 GiB reserved " \
              b"in total by PyTorch)"
    for offset in range(0, 4096, 331):
        data = b"step 1\n" + b"a" * (20000 + offset) + b" " + message + b" " + b"b" * 30000 \
            + b"\nstep 2\n"
        d = _scan.explain_stream(io.BytesIO(data))
        assert (d.failure, d.line, d.requested_bytes, d.reserved_bytes) == (
            "gpu_oom", 2, 2 * GiB, round(5.5 * GiB)), offset


def test_stream_with_only_read() -> None:
    """A provider's log stream may offer read() and nothing else."""
    from launcher.failures import explain_stream

    class ReadOnly:
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)

        def read(self, n: int = -1) -> bytes:
            return self._inner.read(n)

    data = (FIXTURES / "torchrun_16rank_oom_rank11.log").read_bytes()
    d = explain_stream(ReadOnly(data))  # type: ignore[arg-type]
    assert (d.failure, d.rank, d.line) == ("gpu_oom", 11, 380)


# -- a bare SIGKILL, the shell's "Killed" in other languages, oneDNN (issue 28) -----------------

# Bare SIGKILLs as real launchers report them (read as "other" before): probable host memory.
SIGKILL_FORMS = [
    # torchelastic's agent and its ChildFailedError summary
    ["E0303 12:00:01.555000 4211 torch/distributed/elastic/multiprocessing/api.py:869] failed "
     "(exitcode: -9) local_rank: 0 (pid: 1234) of binary: /usr/bin/python3"],
    ["  traceback : Signal 9 (SIGKILL) received by PID 1234"],
    # accelerate launch while loading checkpoint shards
    ["Loading checkpoint shards:  33%|###3      | 1/3 [00:21<00:43, 21.52s/it]Traceback (most "
     "recent call last):",
     "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' died with "
     "<Signals.SIGKILL: 9>."],
    ["torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal "
     "SIGKILL"],
    ["ERROR: worker 3 was killed by signal: SIGKILL"],
    # DeepSpeed's launcher
    ["[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', "
     "'-u', 'main.py', '--local_rank=0'] exits with return code = -9"],
    ["Error: container exited with code 137"],
]


@pytest.mark.parametrize("lines", SIGKILL_FORMS, ids=lambda lines: lines[-1][:40])
def test_bare_sigkill_forms_are_probable_host_oom(lines: list[str]) -> None:
    d = explain_lines(lines)
    assert (d.failure, d.cause, d.signature, d.line) == (
        "host_oom", "unknown", "sigkill", len(lines)), d
    assert d.note.startswith("probable host OOM") and all(e in d.advice for e in CONFIRMING)
    assert explain_lines(lines, platform="sagemaker").note.startswith("killed by SIGKILL on a")
    data = ("\n".join(lines) + "\n").encode()
    assert explain_stream(io.BytesIO(data)) == d


# The shell's "Killed" in the languages of glibc's (libc.mo) and bash's (bash.mo) catalogs, as a
# shell prints it: a line of its own, glued to a progress bar, a job's status, a script's line.
LOCALIZED_KILLED = [
    "Processus arrêté",  # fr, libc
    "run.sh : ligne 12 :  4021 Tué                     python train.py",  # fr, bash
    "Getötet",  # de, libc
    "./train.sh: Zeile 7:  4021 Getötet                 python train.py",  # de
    "[1]+  Abgebrochen (Killed)    python train.py",  # de, bash
    "已杀死",  # zh_CN
    "Loading checkpoint shards:  50%|#####     | 4/8 [02:10<02:22, 35.73s/it]已杀死",
    "train.sh: 第 12 行：12345 已杀死               python train.py",  # zh_CN, bash
    "Matado",  # es, bash
    "[2]-  Terminado (killed)      torchrun --nproc_per_node 8 train.py",  # es, libc
    "強制終了",  # ja
    "  4021 強制結束                python train.py",  # zh_TW
]


@pytest.mark.parametrize("line", LOCALIZED_KILLED)
def test_localized_shell_killed_is_probable_host_oom(line: str) -> None:
    from launcher.failures._anchors import ALL_NEEDLES

    lines = ["step 1200 loss 0.81", line]
    d = explain_lines(lines)
    assert (d.failure, d.cause, d.signature, d.line, d.phase) == (
        "host_oom", "unknown", "shell_killed", 2, None), d
    assert d.note.startswith("probable host OOM") and all(e in d.advice for e in CONFIRMING)
    assert ALL_NEEDLES.search_line(line)  # a candidate line, for the file scanner too
    assert explain_stream(io.BytesIO(("\n".join(lines) + "\n").encode())) == d
    # the supervisor stops the job on it, as on the English word
    watcher = LogWatcher(platform="local")
    assert watcher.feed(lines[0]) is None and watcher.feed(line) is not None


@pytest.mark.parametrize("line", [
    "Killed 3 stale workers before the restart",
    "Killed two birds at step 12",
    "Processus arrêté par l'utilisateur à 12:03",
    "Getötet: 3 Prozesse beendet",
    "僵尸进程已杀死",  # "the zombie process was killed", inside a sentence
    "已杀死 3 个僵尸进程",
    "Terminado (killed) el proceso 4021 por el usuario",
    "Abgebrochen",  # SIGABRT's "Aborted" in German, not a kill
    "Matado el proceso zombi",
])
def test_killed_in_a_sentence_is_no_failure(line: str) -> None:
    d = explain_lines(["step 1", line, "step 2"])
    assert d.failure == "none", d


# oneDNN's messages as PyTorch (and MXNet) raise them.
ONEDNN_FORMS = [
    "RuntimeError: could not create a primitive descriptor for a convolution forward "
    "propagation primitive",
    "RuntimeError: could not create a primitive descriptor for a deconvolution forward "
    "propagation primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get "
    "additional diagnostic information.",
    "RuntimeError: could not create a primitive",
    "RuntimeError: could not create a primitive descriptor for a matmul primitive",
    "mxnet.base.MXNetError: MXNetError: could not create a primitive",
]


@pytest.mark.parametrize("line", ONEDNN_FORMS,
                         ids=["conv", "deconv_verbose", "primitive", "matmul", "mxnet"])
def test_onednn_primitive_is_probable_host_oom_alone(line: str) -> None:
    """Nothing says memory was short and no cap is known: probable host memory, with what would
    confirm it (ONEDNN_VERBOSE) and what it is otherwise (an unsupported op)."""
    d = explain_lines(["epoch 1 step 40 loss 2.21", line])
    assert (d.failure, d.cause, d.signature, d.line) == (
        "host_oom", "unknown", "onednn_primitive", 2), d
    assert d.note.startswith("probable host OOM")
    assert "ONEDNN_VERBOSE=all" in d.advice and d.advice.startswith("probably host RAM ran out")
    assert "torch.backends.mkldnn.enabled = False" in d.advice


def test_onednn_primitive_is_host_oom_under_a_cap_or_with_memory_evidence() -> None:
    lines = _lines("onednn_primitive_cpu.log")
    capped = explain_lines(lines, platform="local", capped=True)
    assert (capped.failure, capped.signature, capped.phase) == (
        "host_oom", "onednn_primitive", "forward")
    assert "memory cap" in capped.note and "probabl" not in capped.note + capped.advice
    assert "halve the micro-batch" in capped.advice
    assert explain_file(str(FIXTURES / "onednn_primitive_cpu.log"), capped=True) == capped
    # `ulimit -v` before the run: the log itself shows the cap
    ulimit = explain_file(str(FIXTURES / "onednn_primitive_ulimit.log"))
    assert "'ulimit -v'" in ulimit.note and "probabl" not in ulimit.advice
    assert ulimit.phase == "backward"
    # the kernel's OOM killer after it bears it out
    dmesg = explain_lines([*lines, "[ 9123.4] Out of memory: Killed process 77 (python)"])
    assert (dmesg.line, dmesg.signature) == (18, "onednn_primitive")
    assert "line 19 reports host memory (kernel_oom_killer)" in dmesg.note
    # alone: probable
    alone = explain_lines(lines)
    assert alone.note.startswith("probable") and alone.phase == "forward"


@pytest.mark.parametrize("line", [
    "INFO: could not create a primitives cache, using defaults",
    "building primitive descriptors for 12 layers",
    "the primitive could not be created for conv1; falling back to the reference kernel",
    "warning: primitive cache capacity 1024 reached",
])
def test_primitive_in_other_text_is_no_failure(line: str) -> None:
    assert explain_lines(["step 1", line, "step 2"]).failure == "none"


def test_launch_explain_reads_a_localized_kill_as_probable_host_oom(cli) -> None:
    path = str(FIXTURES / "shell_killed_de.log")
    result = cli("explain", path, "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    assert (data["failure"], data["cause"], data["signature"], data["line"]) == (
        "host_oom", "unknown", "shell_killed", 4)
    assert data["note"].startswith("probable host OOM")
    assert all(evidence in data["advice"] for evidence in CONFIRMING)
    text = cli("explain", path).stdout
    assert "failure: host_oom (line 4); cause: unknown" in text
    assert "advice: probably host RAM ran out" in text
    managed = cli("explain", path, "--platform", "vertex", "--json").json()
    assert managed["failure"] == "host_oom" and "probabl" not in managed["advice"]


# -- issue 28 item 7: an evaluation loop's out-of-memory is its own phase -------------------------

_SITE = "/opt/conda/lib/python3.10/site-packages"
# transformers 4.4x: evaluation inside train() (eval_strategy="steps"), the model's forward
# reached from prediction_step.
HF_TRAINER_EVAL_OOM = [
    "Traceback (most recent call last):",
    '  File "/job/finetune.py", line 61, in <module>',
    "    trainer.train()",
    f'  File "{_SITE}/transformers/trainer.py", line 1885, in train',
    "    return inner_training_loop(",
    f'  File "{_SITE}/transformers/trainer.py", line 2291, in _inner_training_loop',
    "    self._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, "
    "ignore_keys_for_eval)",
    f'  File "{_SITE}/transformers/trainer.py", line 2721, in _maybe_log_save_evaluate',
    "    metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)",
    f'  File "{_SITE}/transformers/trainer.py", line 3572, in evaluate',
    "    output = eval_loop(",
    f'  File "{_SITE}/transformers/trainer.py", line 3757, in evaluation_loop',
    "    losses, logits, labels = self.prediction_step(model, inputs, prediction_loss_only, "
    "ignore_keys=ignore_keys)",
    f'  File "{_SITE}/transformers/trainer.py", line 3971, in prediction_step',
    "    loss, outputs = self.compute_loss(model, inputs, return_outputs=True)",
    f'  File "{_SITE}/transformers/trainer.py", line 3264, in compute_loss',
    "    outputs = model(**inputs)",
    f'  File "{_SITE}/torch/nn/modules/module.py", line 1532, in _wrapped_call_impl',
    "    return self._call_impl(*args, **kwargs)",
    f'  File "{_SITE}/torch/nn/modules/module.py", line 1541, in _call_impl',
    "    return forward_call(*args, **kwargs)",
    f'  File "{_SITE}/transformers/models/gpt2/modeling_gpt2.py", line 1305, in forward',
    "    lm_logits = self.lm_head(hidden_states)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.14 GiB. GPU 0 has a total "
    "capacity of 23.65 GiB of which 3.02 GiB is free. Including non-PyTorch memory, this process "
    "has 20.62 GiB memory in use. Of the allocated memory 19.80 GiB is allocated by PyTorch, and "
    "381.20 MiB is reserved by PyTorch but unallocated.",
]
# Lightning 2.x: validation at the end of a training epoch; the module's validation_step.
LIGHTNING_VALIDATION_OOM = [
    "Traceback (most recent call last):",
    '  File "/job/train_lit.py", line 88, in <module>',
    "    trainer.fit(model, train_loader, val_loader)",
    f'  File "{_SITE}/lightning/pytorch/trainer/trainer.py", line 543, in fit',
    "    call._call_and_handle_interrupt(",
    f'  File "{_SITE}/lightning/pytorch/trainer/call.py", line 44, in _call_and_handle_interrupt',
    "    return trainer_fn(*args, **kwargs)",
    f'  File "{_SITE}/lightning/pytorch/trainer/trainer.py", line 579, in _fit_impl',
    "    self._run(model, ckpt_path=ckpt_path)",
    f'  File "{_SITE}/lightning/pytorch/trainer/trainer.py", line 986, in _run',
    "    results = self._run_stage()",
    f'  File "{_SITE}/lightning/pytorch/trainer/trainer.py", line 1032, in _run_stage',
    "    self.fit_loop.run()",
    f'  File "{_SITE}/lightning/pytorch/loops/fit_loop.py", line 205, in run',
    "    self.advance()",
    f'  File "{_SITE}/lightning/pytorch/loops/fit_loop.py", line 363, in advance',
    "    self.epoch_loop.run(self._data_fetcher)",
    f'  File "{_SITE}/lightning/pytorch/loops/training_epoch_loop.py", line 141, in run',
    "    self.on_advance_end(data_fetcher)",
    f'  File "{_SITE}/lightning/pytorch/loops/training_epoch_loop.py", line 295, in '
    "on_advance_end",
    "    self.val_loop.run()",
    f'  File "{_SITE}/lightning/pytorch/loops/utilities.py", line 182, in _decorator',
    "    return loop_run(self, *args, **kwargs)",
    f'  File "{_SITE}/lightning/pytorch/loops/evaluation_loop.py", line 135, in run',
    "    self._evaluation_step(batch, batch_idx, dataloader_idx, dataloader_iter)",
    f'  File "{_SITE}/lightning/pytorch/loops/evaluation_loop.py", line 396, in _evaluation_step',
    "    output = call._call_strategy_hook(trainer, hook_name, *step_args)",
    f'  File "{_SITE}/lightning/pytorch/trainer/call.py", line 311, in _call_strategy_hook',
    "    output = fn(*args, **kwargs)",
    f'  File "{_SITE}/lightning/pytorch/strategies/strategy.py", line 411, in validation_step',
    "    return self.lightning_module.validation_step(*args, **kwargs)",
    '  File "/job/train_lit.py", line 41, in validation_step',
    "    logits = self(x)",
    f'  File "{_SITE}/torch/nn/modules/module.py", line 1532, in _wrapped_call_impl',
    "    return self._call_impl(*args, **kwargs)",
    f'  File "{_SITE}/torch/nn/modules/module.py", line 1541, in _call_impl',
    "    return forward_call(*args, **kwargs)",
    '  File "/job/train_lit.py", line 30, in forward',
    "    return self.head(self.body(x))",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
    "capacity of 23.65 GiB of which 2.10 GiB is free.",
]
# A plain script's own evaluation under torch.no_grad (the decorator's frame in between).
PLAIN_NO_GRAD_EVAL_OOM = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 70, in <module>',
    "    val_loss = eval_epoch(model, val_loader)",
    f'  File "{_SITE}/torch/utils/_contextlib.py", line 115, in decorate_context',
    "    return func(*args, **kwargs)",
    '  File "/job/train.py", line 52, in eval_epoch',
    "    out = model(x.to(device))",
    f'  File "{_SITE}/torch/nn/modules/module.py", line 1541, in _call_impl',
    "    return forward_call(*args, **kwargs)",
    '  File "/job/train.py", line 20, in forward',
    "    return self.net(x)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 23.65 GiB of which 1.10 GiB is free.",
]


@pytest.mark.parametrize("lines", [HF_TRAINER_EVAL_OOM, LIGHTNING_VALIDATION_OOM,
                                   PLAIN_NO_GRAD_EVAL_OOM], ids=["trainer", "lightning", "plain"])
def test_an_oom_in_an_evaluation_loop_is_read_as_evaluation(lines: list[str]) -> None:
    """The forward that ran out was the evaluation loop's, at its own batch size: the phase is
    evaluation (not forward), and the advice is the evaluation batch, not the micro-batch."""
    d = explain_lines(lines)
    assert (d.failure, d.phase, d.cause) == ("gpu_oom", "evaluation", "activations"), d
    assert "evaluation batch" in d.advice and "per_device_eval_batch_size" in d.advice
    assert "halve the micro-batch" not in d.advice


def test_a_training_step_s_oom_is_not_read_as_evaluation() -> None:
    """The Trainer's training step passes through _inner_training_loop, whose arguments name
    ignore_keys_for_eval: still the forward."""
    lines = HF_TRAINER_EVAL_OOM[:5] + [
        f'  File "{_SITE}/transformers/trainer.py", line 2216, in _inner_training_loop',
        "    tr_loss_step = self.training_step(model, inputs)",
        f'  File "{_SITE}/transformers/trainer.py", line 3238, in training_step',
        "    loss = self.compute_loss(model, inputs)",
    ] + HF_TRAINER_EVAL_OOM[-10:]
    assert explain_lines(lines).phase == "forward"


def test_a_fragmented_evaluation_oom_falls_back_to_the_evaluation_batch() -> None:
    """Expandable segments first (the allocator's), then the evaluation batch, never the
    training micro-batch."""
    lines = PLAIN_NO_GRAD_EVAL_OOM[:-1] + [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 23.65 GiB of which 1.10 GiB is free. Of the allocated memory 12.00 GiB "
        "is allocated by PyTorch, and 8.00 GiB is reserved by PyTorch but unallocated."]
    d = explain_lines(lines)
    assert (d.phase, d.cause) == ("evaluation", "fragmentation"), d
    assert "expandable_segments" in d.advice and "evaluation batch" in d.advice
    assert "halve the micro-batch" not in d.advice
