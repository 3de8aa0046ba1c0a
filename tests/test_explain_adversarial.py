"""`launch explain` on text that is not a training log, or is one built to mislead (issue 16).

Throughput is measured by bench/bench_explain.py, not here: these tests check what the fast paths
must not change. The file scanner reads exactly the lines the line-by-line watcher classifies, on
any text; every rule's needles are in every message it reports; random words are not a failure;
PyTorch 1.0's CPU allocator message is host memory; pathological lines neither crash nor change
the answer.
"""

from __future__ import annotations

import bisect
import io
import random
import string

import pytest

from launcher.failures import LogWatcher, _anchors, _rules, _scan, explain_lines, explain_stream
from launcher.failures._anchors import ALL_NEEDLES, NeedleSet, needles_for

GiB = 1024**3

_WORD_LIST = (
    "the of and to in is it that was for on are with as his they be at one have this from or had "
    "by word but what some we can out other were all there when use your how said each which do "
    "their time if will way about many then them write would like so these her long make thing see "
    "process free full shared device total limit running worker pipe reset peer timeout memory "
    "error signal exit code status killed kill python allocate failed abort fatal room zoom"
)
_WORDS = _WORD_LIST.split()


def _random_words(seed: int, lines: int) -> bytes:
    rng = random.Random(seed)
    vocab = list(_WORDS) + ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 9)))
                            for _ in range(500)]
    out = []
    for _ in range(lines):
        words = [w.capitalize() if rng.random() < 0.1 else w
                 for w in rng.choices(vocab, k=rng.randint(3, 20))]
        out.append(" ".join(words))
    out.append("and the test Killed")  # a sentence that ends in the word, as random text does
    out.append("and Killed python the test")
    return ("\n".join(out) + "\n").encode()


def _dense(seed: int, lines: int) -> bytes:
    """Lines dense with failure words: exceptions, tracebacks, OOM fragments, exit codes."""
    rng = random.Random(seed)
    pieces = ["RuntimeError:", "Exception", "Traceback (most recent call last):", "out of memory",
              "OOM", "Killed", "exit code 1", "exit code 137", "signal", "CUDA", "MemoryError",
              "NCCL", "Tried to allocate 2.00 GiB", "killed", "error", "[rank3]:", "[default1]:",
              "No space left on device", "Watchdog caught collective operation timeout", "room",
              '{"launch": "done"}', "AssertionError", "SIGTERM", "torch.OutOfMemoryError:"]
    out = []
    for _ in range(lines):
        out.append(" ".join(rng.choice(pieces) if rng.random() < 0.4 else rng.choice(_WORDS)
                            for _ in range(rng.randint(1, 12))))
    return ("\n".join(out) + "\n").encode()


def _near_misses(seed: int, lines: int) -> bytes:
    rng = random.Random(seed)
    templates = ["the loader ran out of memory budget at {n}", "Killed two birds at step {n}",
                 "No Error here, {n} checks passed", "to avoid out of memory errors set {n}",
                 "NCCL INFO Channel {n}/24", "worker {n} exited normally", "peak memory {n} MiB"]
    return ("\n".join(rng.choice(templates).format(n=rng.randint(0, 10**6))
                      for _ in range(lines)) + "\n").encode()


def _rank_lines(seed: int, lines: int) -> bytes:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        rank = rng.randint(0, 1023)
        words = " ".join(rng.choices(_WORDS, k=rng.randint(1, 10)))
        out.append(rng.choice([f"[default{rank % 8}]:[rank{rank}]: {words}",
                               f"[1,{rank}]<stderr>: {words}",
                               f"node-{rank // 8}:{rank}:{rank} [{rank % 8}] NCCL INFO {words}"]))
    return ("\n".join(out) + "\n").encode()


_PIECES = (
    "\n", "\n", "\n", "\n", "", " ", "'", "`", "1", "137", "-9", "OOM", "oom", "memory", "model",
    "Killed", "killed", "exit code 137", "SIGKILL", "signal 9", "Error", "RuntimeError:",
    "CUDA out of memory", "Tried to allocate", " total capacity", " already allocated", " free",
    "(GPU 0;", "GiB", "[rank3]:", "[1,3]<stderr>:", "\r", "\\n", "\x1b[31m", "\x00", "/dev/shm",
    "</torch_1>", "No space left on device", '{"launch": "done"}', "posix_memalign(&data, "
    "gAlignment, nbytes) == 0. 12 vs 0", "Traceback (most recent call last):",
    'During handling of the above exception, another exception occurred:',
    '  File "x.py", line 3, in evaluate', '  File "m.py", line 9, in __init__',
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 4.00 GiB total capa",
    "city; 1.00 GiB already allocated)", "The replica workerpool0-0 exited with a non-zero status "
    "of 137", "ml.googleapis.com", "NCCL", "Watchdog caught collective operation timeout")


def _mixed(seed: int, pieces: int) -> bytes:
    """Failure fragments glued at random: messages cut over lines, empty lines inside a join,
    chained tracebacks, findings one after another. (Seed 143 with 200 pieces is the fuzzing
    case where the scanner read the lines of a join back as context: they had been fed.)"""
    rng = random.Random(seed)
    return "".join(rng.choice(_PIECES) for _ in range(pieces)).encode()


def _binary(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _lines_of(data: bytes) -> list[str]:
    lines = [line.decode("utf-8", "replace") for line in data.split(b"\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


ADVERSARIAL = {
    "random_words": lambda: _random_words(1, 6000),
    "dense": lambda: _dense(2, 6000),
    "near_misses": lambda: _near_misses(3, 6000),
    "rank_prefixes": lambda: _rank_lines(4, 6000),
    "binary": lambda: _binary(5, 300_000),
    "dense_then_oom": lambda: _dense(6, 3000) + b"torch.OutOfMemoryError: CUDA out of memory. "
                              b"Tried to allocate 2.00 GiB\n" + _random_words(7, 3000),
    **{f"mixed_{seed}_{n}": (lambda seed=seed, n=n: _mixed(seed, n))
       for seed, n in ((143, 200), (1, 200), (2, 400), (3, 3000))},
}


# -- the file scanner reads what the watcher would --------------------------------------------

@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_file_scan_agrees_with_line_by_line_on_any_text(name: str, chunk: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates are defined by the same needles in both, so they agree on any text, not only on
    the logs the tests hold; small chunks put lines, tracebacks and joins across chunk ends."""
    data = ADVERSARIAL[name]()
    monkeypatch.setattr(_scan, "CHUNK", chunk)
    got = explain_stream(io.BytesIO(data))
    want = explain_lines(_lines_of(data))
    if "binary" in got.note:  # the scanner says the file has NUL bytes; lines cannot know
        got = type(got)(**{**got.to_dict(), "note": want.note})
    assert got == want


def test_random_words_are_not_a_failure() -> None:
    """Issue 16: 200 MB of random words read as host_oom (a line ending in the word "Killed").
    The shell prints "Killed" on a line of its own, glued to a progress bar, or after a job's
    line number and pid, never as the last word of a sentence. (A line that is the one word
    "Killed" is the shell's report: random text of one-word lines would be read so.)"""
    data = _random_words(16, 20000)
    d = explain_stream(io.BytesIO(data))
    assert not d.is_oom, d
    assert d.failure == "none", d
    assert explain_lines(_lines_of(data)).failure == "none"


@pytest.mark.parametrize("line,failure", [
    ("Killed", "host_oom"),
    ("  8/8 [02:10<02:22, 35.73s/it]Killed", "host_oom"),
    ("/job/run.sh: line 12:  4021 Killed                  python train.py", "host_oom"),
    ("[1]+  Killed                  python train.py", "host_oom"),
    ("zsh: killed     python train.py", "host_oom"),
    ("Killed python train.py --epochs 3", "host_oom"),
    ("and the test Killed", "none"),
    ("Killed two birds with one stone", "none"),
    ("the test Killed python again", "none"),
    ("worker Killed by the scheduler", "none"),
])
def test_shell_killed(line: str, failure: str) -> None:
    assert explain_lines(["step 1", line]).failure == failure


# -- PyTorch 1.0's CPU allocator ------------------------------------------------------------------

@pytest.mark.parametrize("line,requested", [
    ("RuntimeError: [enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, gAlignment, "
     "nbytes) == 0. 12 vs 0", None),
    ("Train error: [enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, gAlignment, "
     "nbytes) == 0. 12 vs 0", None),
    ("RuntimeError: [enforce fail at ../c10/core/CPUAllocator.cpp:64] posix_memalign(&data, "
     "gAlignment, nbytes) == 0 12 vs 0", None),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:73] . DefaultCPUAllocator: posix_memalign "
     "failed: you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)",
     34359738368),
])
def test_cpu_allocator_posix_memalign_is_host_memory(line: str, requested: int | None) -> None:
    d = explain_lines(["epoch 1", line])
    assert (d.failure, d.signature, d.line) == ("host_oom", "DefaultCPUAllocator", 2), d
    assert d.requested_bytes == requested
    assert "host RAM" in d.advice


def test_posix_memalign_with_another_errno_is_not_memory() -> None:
    """errno 22 (EINVAL) is a bad alignment, not a shortage."""
    d = explain_lines(["RuntimeError: [enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, "
                       "gAlignment, nbytes) == 0. 22 vs 0"])
    assert d.failure == "other" and not d.is_oom


# -- needles ------------------------------------------------------------------------------------

# One message per alternative of each rule's pattern (and of the generic readings).
RULE_EXAMPLES: dict[str, list[str]] = {
    "impossible_allocation_size": ["Tried to allocate more than 1EB memory."],
    "illegal_memory_access": ["an illegal memory access was encountered",
                              "CUDA error: misaligned address"],
    "torch.OutOfMemoryError": ["CUDA out of memory.", "HIP out of memory.", "XPU out of memory",
                               "MTIA out of memory", "NPU out of memory", "MUSA out of memory",
                               "MPS backend out of memory (MPS allocated: 1 GB)",
                               "torch.OutOfMemoryError: boom", "torch.cuda.OutOfMemoryError",
                               "RuntimeError: cuda runtime error (2) : out of memory at x.cu:58"],
    "DefaultCPUAllocator": [
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes.",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes.",
        "posix_memalign(&data, gAlignment, nbytes) == 0. 12 vs 0",
        "posix_memalign failed: ENOMEM", "posix_memalign: Cannot allocate memory",
        "posix_memalign returned errno 12"],
    "dataloader_bus_error": [
        "DataLoader worker (pid 12) is killed by signal: Bus error.",
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
        "shared memory (shm).", "insufficient shared memory"],
    "shm_exhausted": [
        "RuntimeError: unable to write to file </torch_12_345>: No space left on device (28)",
        "No space left on device: '/dev/shm/torch_1'",
        "OSError: [Errno 28] No space left on device: /dev/shm",
        "/dev/shm is full", "shared memory exhausted", "share_memory_: out of memory",
        "storage_share_filename_: Cannot allocate memory"],
    "too_many_open_files": ["OSError: [Errno 24] Too many open files", "accept: EMFILE"],
    "dataloader_killed": ["DataLoader worker (pid 4242) is killed by signal: Killed."],
    "kernel_oom_killer": [
        "Out of memory: Killed process 4242 (python)", "Memory cgroup out of memory: Kill",
        "python invoked oom-killer: gfp_mask=0x100cca", "oom-kill:constraint=CONSTRAINT_NONE",
        "oom_kill_process.cold+0xb/0x10", "oom_reaper: reaped process 4242 (python)",
        "Killed process 4242 (python) total-vm:12kB",
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1.0",
        "Detected 2 oom_kill events", "Detected 1 oom kill event",
        "killed by the cgroup out-of-memory handler", "srun: error: node1: task 0: Out Of Memory",
        "JobState=FAILED Reason=State=OUT_OF_MEMORY", "status OUT_OF_MEMORY"],
    "OOMKilled": ["Reason: OOMKilled", "reason: OOMKilled", '"OOMKilled": true'],
    "platform_out_of_memory": [
        "The replica workerpool0-0 ran out-of-memory and exited with a non-zero status of 9",
        "The replica workerpool0-0 ran out-of-memory",
        "Please use an instance type with more memory",
        "OutOfMemoryError: Please use an instance type with more memory",
        "CUDA failed: out of memory (OOM)", "OutOfMemory: Please reduce the batch",
        "Container exceeded its memory limit", "memory limit exceeded",
        "Container killed on request: memory", "Task was killed due to the node running low on "
        "memory", "java.lang.OutOfMemoryError: Java heap space"],
    "CUBLAS_STATUS_ALLOC_FAILED": ["CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"],
    "CUDNN_STATUS_ALLOC_FAILED": ["CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_ENOUGH_MEMORY",
                                  "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION"],
    "nccl_cuda_out_of_memory": ["NCCL WARN Cuda failure 'out of memory'",
                                "Cuda failure out of memory",
                                "NCCL error in: x.cpp:1, unhandled cuda error, out of memory",
                                "ncclUnhandledCudaError: Call to CUDA function failed: "
                                "out of memory"],
    "cuda_runtime_out_of_memory": [
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cudaErrorMemoryAllocation",
        "hipErrorOutOfMemory", "RuntimeError: CUDA error: out of memory",
        "CUDA driver error: out of memory", "failed: CUDA error 2", "failed with CUresult 2"],
    "xla_resource_exhausted": [
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12 bytes",
        "XlaRuntimeError: INTERNAL: out of memory", "jaxlib.xla_extension: out of memory",
        "BufferAssignment OOM Debugging.",
        "Attempting to reserve 12.35G at the bottom of memory. That was not possible.",
        "Attempting to allocate 1.00G. That was not possible."],
    "tensorflow_oom": [
        "OOM when allocating tensor with shape[8,512] and type float",
        "Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.17GiB",
        "Resource exhausted: OOM when allocating", "ResourceExhaustedError: failed to allocate",
        "failed to allocate 32.00M (33554432 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY"],
    "gpu_out_of_memory_exception": ["ray.exceptions.OutOfMemoryError: on GPU 0"],
    "out_of_memory_exception": ["java.lang.OutOfMemoryException"],
    "onednn_primitive": ["RuntimeError: could not create a primitive",
                         "could not create a primitive descriptor for a convolution forward "
                         "propagation primitive"],
    "MemoryError": ["MemoryError", "numpy.core._exceptions._ArrayMemoryError: Unable",
                    "terminate called after throwing an instance of 'std::bad_alloc'",
                    "what(): bad_alloc", "OSError: [Errno 12] Cannot allocate memory",
                    "mmap failed: ENOMEM",
                    "Unable to allocate 7.45 GiB for an array with shape (1000,) and data type"],
    "shell_killed": ["Killed", "  8/8 [02:10<02:22, 35.73s/it]Killed",
                     "run.sh: line 12:  4021 Killed                  python train.py",
                     "[1]+  Killed                  python train.py",
                     "Killed python train.py", "zsh: killed     python train.py",
                     "Getötet", "[1]+  Abgebrochen (Killed)    python train.py",
                     "  4021 Matado                  python train.py",
                     "run.sh: 第 12 行：4021 已杀死   python train.py",
                     "  8/8 [02:10<02:22]強制終了"],
    "generic_out_of_memory": ["RuntimeError: OOM", "Error: out of memory", "FATAL: OOM",
                              "GPU OOM", "device out of memory", "OOM error at step 3",
                              "Exception (OOM) in step", "error:oom"],
    "sigkill": ["Received SIGKILL", "killed by signal 9", "signal: killed",
                "exited with exit code 137", "exit status 137", "exit_code=-9",
                "exitcode: -9", "returned non-zero exit status -9",
                "non-zero status of 137", "status of 9 (SIGKILL)", "ExitCode 137",
                "exit code: 137", "exits with return code = -9"],
    "device_side_assert": ["device-side assert triggered",
                           "Assertion `t >= 0 && t < n_classes` failed.",
                           "Assertion 'idx < size' failed"],
    "preemption": ["the VM was preempted", "has been preempted", "preemption notice received",
                   "Preempted", "PREEMPTED", "spot instance interruption",
                   "instance was reclaimed", "capacity was reclaimed", "preemptible VM stopped"],
    "disk_full": ["No space left on device", "OSError: [Errno 28]", "write: ENOSPC",
                  "Disk quota exceeded"],
    "cuda_error": ["CUDA error: an illegal instruction", "CUDA kernel errors might be "
                   "asynchronously reported", "unspecified launch failure",
                   "CUBLAS_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_BAD_PARAM",
                   "cuDNN error: CUDNN_STATUS_MAPPING_ERROR", "CuDNN error: x",
                   "cudaErrorLaunchFailure", "NVML_SUCCESS == r INTERNAL ASSERT FAILED"],
    "segfault": ["Segmentation fault (core dumped)", "SIGSEGV", "SIGBUS", "Bus error",
                 "Fatal Python error: Aborted"],
    "nccl_timeout": ["Watchdog caught collective operation timeout: WorkNCCL(...)",
                     "collective operation timeout", "Timeout(ms)=1800000) ran for 1800087",
                     "NCCL communicator timed out", "NCCL watchdog timing out",
                     "Some NCCL operations have failed or timed out.",
                     "torch.distributed.DistStoreError: x", "Socket Timeout",
                     "timed out after 1800 seconds"],
    "nccl_error": ["NCCL error in: ProcessGroupNCCL.cpp:1", "ncclSystemError: x",
                   "ncclInternalError", "ProcessGroupNCCL aborting",
                   "NCCL communicator was aborted",
                   "torch.distributed.DistBackendError: x", "Connection reset by peer",
                   "BrokenPipeError: [Errno 32] Broken pipe", "remote process exited",
                   "peer closed the connection"],
    "child_failed": ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                     "SignalException: Process 12 got signal: 15", "worker group failed",
                     "AlgorithmError: x", "ExecuteUserScriptError:"],
    "sigterm": ["Sending process 2208 closing signal SIGTERM", "got signal 15",
                "exit code 143", "exit_status=-15", "non-zero exit status 143"],
    "dataloader_exited": ["DataLoader worker (pid(s) 12, 13) exited unexpectedly"],
}
GENERIC_EXAMPLES = ["RuntimeError: boom", "  ValueError: x", "KeyboardInterrupt",
                    "SystemExit: 1", "torch.x.YError:", "MyError", "exit code 3",
                    "exited with code 1", "non-zero exit status 2",
                    "Traceback (most recent call last):", "AssertionError"]


def test_rule_examples_cover_every_rule() -> None:
    assert set(RULE_EXAMPLES) == {rule.signature for rule in _rules.RULES}


@pytest.mark.parametrize("rule", _rules.RULES, ids=lambda r: r.signature)
def test_every_message_of_a_rule_holds_its_needles(rule: _rules.Rule) -> None:
    """A rule is only tried on a text with one of its needles, and only such lines are read at
    all: an alternative of a pattern whose messages hold none would never fire."""
    for text in RULE_EXAMPLES[rule.signature]:
        assert rule.pattern.search(text), (rule.signature, text)  # the example is one
        low = text.lower()
        gated = [k for k in rule.keys if k in low and (
            k not in rule.also or any(all(p in low for p in parts) for parts in rule.also[k]))]
        assert gated, (rule.signature, text, "holds none of the rule's needles")
        if rule.exact:
            assert any(n in text for n in rule.exact), (rule.signature, text)
        assert ALL_NEEDLES.search_line(text), (rule.signature, text, "not a candidate line")
        assert _rules.classify(text)[0] is not None, (rule.signature, text)


def test_escaped_message_is_found_through_its_escaped_needle() -> None:
    """Docker's JSON log escapes "<" as \\u003c: the raw line holds "\\u003c/torch_", which is a
    needle of its own, and the watcher reads the unescaped message."""
    line = ('{"log":"RuntimeError: unable to write to file \\u003c/torch_1_2\\u003e: No space left '
            'on device (28)\\n","stream":"stderr"}')
    assert "<" not in line
    d = explain_lines(["step 1", line])
    assert (d.failure, d.signature, d.cause) == ("host_oom", "shm_exhausted", "shared_memory")
    assert explain_stream(io.BytesIO(("step 1\n" + line + "\n").encode())) == d


@pytest.mark.parametrize("text", GENERIC_EXAMPLES)
def test_generic_failures_are_candidates(text: str) -> None:
    assert _rules.generic(text) is not None or _rules.classify(text)[0] is not None, text
    assert ALL_NEEDLES.search_line(text), text


def test_needle_categories_follow_the_rules() -> None:
    for rule in _rules.RULES:
        for key in rule.keys:
            assert rule.categories() <= _rules.NEEDLE_CATEGORIES[key], (rule.signature, key)


def _brute(data: bytes, needles: tuple[str, ...]) -> set[int]:
    """Line numbers that hold a needle, in any case."""
    return {i for i, line in enumerate(data.lower().split(b"\n"))
            if any(n.encode() in line for n in needles)}


def _lines_hit(data: bytes, hits: list[int]) -> set[int]:
    starts = [i for i, c in enumerate(data) if c == 10]
    return {bisect.bisect_left(starts, h) for h in hits}


@pytest.mark.parametrize("seed", range(6))
def test_needle_search_finds_every_line_that_holds_a_needle(seed: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """NeedleSet.hits against a brute-force search, on texts that make different keys cheap or
    dear (capitals, letters, bytes), with memchr and with the regular expressions."""
    rng = random.Random(seed)
    alphabet = [string.ascii_lowercase + " \n", string.ascii_uppercase + " \n_-",
                string.printable, "".join(map(chr, range(256)))][seed % 4]
    # (ASCII needles: the text is bytes read back as latin-1, in which "getötet" is not UTF-8)
    needles = tuple(rng.sample(sorted(n for n in _rules.NEEDLE_CATEGORIES if n.isascii()), 40))
    parts = []
    for _ in range(3000):
        parts.append("".join(rng.choices(alphabet, k=rng.randint(0, 40))))
        if rng.random() < 0.2:
            needle = rng.choice(needles)
            parts.append(needle.upper() if rng.random() < 0.3 else needle)
    data = "".join(parts).encode("latin-1", "replace")
    if seed % 2:
        monkeypatch.setattr(_anchors, "_FIND_MAX", 0)  # every key through a regex
    needle_set = NeedleSet(needles)
    want = _brute(data, needles)
    assert _lines_hit(data, needle_set.hits(data)) == want
    for i, line in enumerate(data.split(b"\n")):
        assert needle_set.search_line(line.decode("latin-1")) == (i in want)


def test_needle_search_limit_spreads_the_windows() -> None:
    data = b"x" * 100 + (b"error " + b"y" * 50) * 200
    hits = NeedleSet(("error",)).hits(data, limit=5, skip=1000)
    assert len(hits) == 5 and all(b - a >= 1000 for a, b in zip(hits, hits[1:], strict=False))


# -- what is still looked for -------------------------------------------------------------------

def test_needles_narrow_as_findings_come_in() -> None:
    """Once the root cause is settled, only what could change it is looked for; the sets only
    shrink, and the file scanner searches for fewer needles from there on."""
    w = LogWatcher()
    full = w.needed()
    assert {"oom", "event", "t1", "t2", "t3", "t4", "weak"} <= full
    w.feed("RuntimeError: something broke")  # tier 2
    after_exception = w.needed()
    assert after_exception < full and "t1" in after_exception
    assert not {"t2", "t3", "t4", "weak"} & after_exception
    w.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert w.needed() == frozenset({"oom", "event"})
    for _ in range(70):
        w.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert w.needed() == frozenset({"event"})
    assert needles_for(w.needed()).needles == ('"oom',)  # the launcher's own oom line
    d = w.result()
    assert (d.failure, d.line) == ("gpu_oom", 2)


def test_launcher_line_after_many_ooms_still_settles_the_phase() -> None:
    lines = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"] * 100
    lines.append('{"launch": "oom", "rank": 0, "phase": "optimizer", "device": "cuda", '
                 '"message": "CUDA out of memory.", "requested_bytes": 1073741824}')
    d = explain_stream(io.BytesIO(("\n".join(lines) + "\n").encode()))
    assert (d.failure, d.phase, d.cause, d.line) == ("gpu_oom", "optimizer", "model_states", 101)


def test_platform_words_next_to_a_bare_sigkill() -> None:
    """A managed platform reports its kills next to the exit status: the words are read in the
    lines around a SIGKILL, not searched for through the whole log."""
    before = ["ml.googleapis.com/job_id: x", "step 1", "step 2"]
    after = ["step 3", "  pathname:  \"/runcloudml.py\""]
    kill = "returned non-zero exit status -9"
    assert explain_lines([*before, kill]).failure == "host_oom"
    assert explain_lines([kill, *after]).failure == "host_oom"
    alone = explain_lines(["step"] * 5 + [kill] + ["step"] * 5)  # probable, not certain
    assert alone.failure == "host_oom" and alone.note.startswith("probable")
    far = ["cloudml"] + ["step"] * 100 + [kill]
    assert explain_lines(far).note.startswith("probable")
    assert "managed platform" in explain_lines([*before, kill]).note
    data = ("\n".join([kill, *after]) + "\n").encode()
    assert explain_stream(io.BytesIO(data)).failure == "host_oom"


# -- pathological lines ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,failure", [
    ("RuntimeError: CUDA out of memory. Tried to allocate " + "9" * 5000 + " GiB", "other"),
    ("CUDA out of memory. " + "1 " * 4000, "gpu_oom"),
    ("[rank" + "7" * 5000 + "]: RuntimeError: CUDA out of memory.", "gpu_oom"),
    ("OOM when allocating tensor with shape[" + "9" * 5000 + "] and type float", "other"),
    ("failed to allocate 1G (" + "9" * 5000 + " bytes) from device", "other"),
    ("Assertion '" * 2000, "none"),
    ("RuntimeError: " + "a." * 4000, "other"),
    ("Tried to allocate 1" + " " * 8000 + "x", "none"),
    ("model " * 3000 + "\n" + "RuntimeError: CUDA out of memory.", "gpu_oom"),
    ("\r".join(["  3%|#   | 3/100 loss 2.1"] * 3000) + "\rKilled", "host_oom"),
])
def test_pathological_lines_do_not_crash(text: str, failure: str) -> None:
    """Digit runs too long for a number, thousands of look-alike starts, a progress bar of
    thousands of updates: read in bounded work (no quadratic pattern: a rule sees at most a few
    KiB around its needles), and read the same by both paths."""
    d = explain_lines(text.split("\n"))
    assert d.failure == failure, d
    assert explain_stream(io.BytesIO(text.encode())) == d


def test_impossible_figures_are_not_a_shortage() -> None:
    d = explain_lines(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                       + "9" * 50 + " GiB"])
    assert (d.failure, d.signature) == ("other", "impossible_allocation_size")
    assert d.requested_bytes is not None and d.requested_bytes >= 1024**5
