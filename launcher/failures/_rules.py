"""Which failure a cleaned message reports: the rule table.

Each rule is a regular expression over one message (after :mod:`._clean`), the failure kind it
means, how strongly, and where its figures come from. Rules are tried in order and the first match
wins, so a specific message (PyTorch's CUDA out-of-memory) is never mistaken for a generic one (a
``RuntimeError``). The order encodes what the design brief asks for:

- every allocator's out-of-memory message is a *memory* failure, whatever exception wraps it;
- a request no machine could serve ("Tried to allocate more than 1EB") is *not* one: the size is
  garbage handed over after a collective failed (NCCL issue 1284, case 015);
- a process killed by SIGKILL / exit 137 / -9 is a host out-of-memory kill only with corroboration
  (the kernel's "Killed process", Kubernetes' OOMKilled, a platform's "ran out-of-memory", the
  shell's "Killed"); on its own it is *weak* evidence that :mod:`._watch` weighs at the end;
- NCCL timeouts, illegal memory accesses, device-side asserts, cuDNN errors, a full disk and
  preemption are failures of another kind, ranked so that a root cause outranks the cascade that
  follows it (``tier``: 1 specific root causes, 2 exceptions, 3 distributed cascades, 4 process
  exits and signals).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.failures._sizes import Figures, other_figures, torch_figures

GPU_OOM, HOST_OOM, SIGKILL, OTHER = "gpu_oom", "host_oom", "sigkill", "other"

# Where a PyTorch allocator message split over lines is visibly cut: it ends in a number, a unit,
# a "(GPU 0;" list still open, or a connecting word.
_CUT = re.compile(
    r"(?:\b(?:allocate|of|has|which|and|is|memory|by|total|capacity|already|in|PyTorch|bytes|"
    r"[KMGT]i?B)|;|,|\(GPU|\d|\d\.)\s*$", re.IGNORECASE
)


@dataclass
class Finding:
    """One message that reports a failure, where it is, and what it says."""

    kind: str  # gpu_oom | host_oom | sigkill (weak host OOM evidence) | other
    tier: int  # 0 for memory failures; 1..4 for the others (lower is more likely a root cause)
    signature: str
    text: str
    line: int
    rank: int | None = None
    host: str | None = None
    start: int = 0  # where in ``text`` the match starts (for the excerpt)
    figures: Figures = field(default_factory=Figures)
    cause: str | None = None  # a cause the message itself settles (shared memory)
    phase: str | None = None
    event: dict[str, Any] | None = None
    note: str = ""
    complete: bool = True  # False: an allocator message whose figures continue on the next line

    @property
    def is_oom(self) -> bool:
        return self.kind in (GPU_OOM, HOST_OOM)


@dataclass(frozen=True)
class Rule:
    signature: str
    pattern: re.Pattern[str]
    kind: str
    tier: int = 0
    figures: Callable[[str], Figures] | None = None
    cause: str | None = None
    unless: re.Pattern[str] | None = None  # the message matches but is not this failure


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


_I = re.IGNORECASE
_SHM_CONTEXT = r"(?:/dev/shm|</?torch_\d|\bshm\b|shared memory|share_memory|storage_share)"

RULES: tuple[Rule, ...] = (
    # --- not memory, although the words say so -------------------------------------------
    Rule("impossible_allocation_size",
         _rx(r"Tried to allocate more than \d+(?:\.\d+)?\s*[PE]i?B", _I), OTHER, 4),
    Rule("illegal_memory_access", _rx(r"illegal memory access|misaligned address", _I), OTHER, 1),
    # --- PyTorch allocators: CUDA, ROCm (HIP), XPU, MTIA, MPS -----------------------------
    Rule("torch.OutOfMemoryError",
         _rx(r"(?:CUDA|HIP|XPU|MTIA|NPU|MUSA) out of memory|MPS backend out of memory|"
             r"\btorch\.(?:cuda\.)?OutOfMemoryError\b|\bcuda runtime error \(2\)\s*:\s*out of mem",
             _I),
         GPU_OOM, figures=torch_figures),
    # --- the CPU allocator and host memory ------------------------------------------------
    Rule("DefaultCPUAllocator",
         _rx(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)", _I), HOST_OOM,
         figures=other_figures),
    Rule("dataloader_bus_error",
         _rx(r"(?:DataLoader worker \(pid[^)]*\) is killed by signal: Bus error|"
             r"Unexpected bus error encountered in worker|insufficient shared memory)", _I),
         HOST_OOM, cause="shared_memory"),
    Rule("shm_exhausted",
         _rx(r"(?:unable to (?:write to|mmap|allocate|open|resize)[^\n]{0,40}</?torch_\d"
             r"[^\n]{0,120}(?:No space left|Cannot allocate memory|errno[ =:]*(?:28|12)|"
             r"out of memory)|No space left on device[^\n]{0,80}" + _SHM_CONTEXT + r"|"
             + _SHM_CONTEXT + r"[^\n]{0,160}(?:No space left on device|Errno 28|"
             r"Cannot allocate memory|out of memory|exhausted|is full))", _I),
         HOST_OOM, cause="shared_memory"),
    Rule("too_many_open_files", _rx(r"Too many open files|EMFILE", _I), OTHER, 1),
    Rule("dataloader_killed",
         _rx(r"DataLoader worker \(pid[^)]*\) is killed by signal: Killed", _I), HOST_OOM),
    Rule("kernel_oom_killer",
         _rx(r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory|invoked oom-killer|"
             r"\boom-kill:|oom_kill_process|oom_reaper: reaped|\bKilled process \d+|"
             r"Detected \d+ oom[-_ ]kill event|cgroup out-of-memory handler|"
             r"task \d+: Out Of Memory|State=OUT_OF_MEMORY|\bOUT_OF_MEMORY\b(?!:)", _I),
         HOST_OOM),
    Rule("OOMKilled", _rx(r"\bOOMKilled\b|reason:\s*OOMKilled|OOMKilled\"?\s*[:=]\s*true"),
         HOST_OOM, unless=_rx(r"OOMKilled\"?\s*[:=]\s*false", _I)),
    Rule("platform_out_of_memory",
         _rx(r"\bran out[- ]of[- ]memory and exited|\breplica \S+ ran out[- ]of[- ]memory|"
             r"instance type with more memory|OutOfMemoryError: Please use|"
             r"out of memory \(OOM\)|\bOutOfMemory: Please|exceeded (?:its |the )?memory limit|"
             r"memory limit exceeded|Container killed .{0,60}(?:memory|OOM)|"
             r"running low on memory|java\.lang\.OutOfMemoryError", _I),
         HOST_OOM),
    # --- other GPU libraries ----------------------------------------------------------------
    Rule("CUBLAS_STATUS_ALLOC_FAILED", _rx(r"CUBLAS_STATUS_ALLOC_FAILED"), GPU_OOM),
    Rule("CUDNN_STATUS_ALLOC_FAILED",
         _rx(r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_MEMORY|INTERNAL_ERROR_HOST_ALLOCATION)"),
         GPU_OOM),
    Rule("nccl_cuda_out_of_memory",
         _rx(r"Cuda failure '?out of memory|NCCL[^\n]{0,200}\bout of memory|"
             r"ncclUnhandledCudaError[^\n]{0,200}out of memory", _I),
         GPU_OOM),
    Rule("cuda_runtime_out_of_memory",
         _rx(r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|hipErrorOutOfMemory|"
             r"CUDA (?:driver )?error: out of memory|\bCUDA error 2\b|CUresult 2\b", _I),
         GPU_OOM, figures=other_figures),
    # --- TensorFlow, XLA, JAX -------------------------------------------------------------
    Rule("xla_resource_exhausted",
         _rx(r"RESOURCE_EXHAUSTED:?[^\n]{0,80}(?:memory|allocat|OOM)|"
             r"(?:XlaRuntimeError|jaxlib)[^\n]{0,80}out of memory|BufferAssignment OOM|"
             r"Attempting to (?:reserve|allocate) \S+ (?:at the bottom of memory\. )?"
             r"That was not possible", _I),
         GPU_OOM, figures=other_figures),
    Rule("tensorflow_oom",
         _rx(r"OOM when allocating tensor|Allocator \([^)]*\) ran out of memory|"
             r"Resource ?exhausted:?[^\n]{0,40}\b(?:OOM|out of memory)|"
             r"ResourceExhaustedError:?[^\n]{0,60}(?:allocat|memory)|"
             r"failed to allocate \S+ \(\d+ bytes\) from device", _I),
         GPU_OOM, figures=other_figures),
    # Some other framework's OutOfMemoryError (Ray's, a Java driver's): GPU or host as it says.
    Rule("gpu_out_of_memory_exception",
         _rx(r"\b\w*OutOfMemory(?:Error|Exception)\b(?=[^\n]{0,200}\b(?:GPU|CUDA|HIP|device|"
             r"VRAM|HBM)\b)"), GPU_OOM, figures=torch_figures),
    Rule("out_of_memory_exception", _rx(r"\b\w*OutOfMemory(?:Error|Exception)\b"), HOST_OOM),
    # --- host memory, generic -------------------------------------------------------------
    Rule("MemoryError",
         _rx(r"(?<![A-Za-z])(?:_Array)?MemoryError\b|std::bad_alloc|\bbad_alloc\b|"
             r"Cannot allocate memory|\bENOMEM\b|Unable to allocate \S+ \S+ for an array"),
         HOST_OOM, figures=other_figures),
    Rule("shell_killed",
         _rx(r"(?<![A-Za-z_])Killed\s*$|^\s*Killed(?::\s*9)?\s*$|\b\d+\s+Killed\s+\S|"
             r"(?:^|\s)Killed\s+(?:python|torchrun|accelerate|deepspeed)"),
         HOST_OOM, unless=_rx(r"Killed by|Killed(?: the)? (?:job|worker|process group)", _I)),
    Rule("generic_out_of_memory",
         _rx(r"(?:Error|Exception|FATAL|Fatal|fatal|error)\b[^\n]{0,60}\b(?:out of memory|"
             r"OOM\b)|^\s*(?:GPU|CUDA|device) (?:OOM|out of memory)\b|\bOOM error\b", _I),
         GPU_OOM, figures=torch_figures,
         unless=_rx(r"avoid (?:an? )?(?:out of memory|OOM)|to prevent (?:an? )?OOM", _I)),
    # --- a process killed by a signal: weak evidence of the kernel OOM killer -------------
    Rule("sigkill",
         _rx(r"\bSIGKILL\b|\b[Ss]ignal 9\b|\bsignal: killed\b|"
             r"\bexit(?:[ _]?code|[ _]status|ed with (?:a )?(?:non-zero )?(?:exit )?"
             r"(?:status|code))(?: of)?\"?\s*[:=]?\s*\(?(?:137|-9)\b|"
             r"non-zero (?:exit )?status(?: of)? (?:137|-9)\b|status of 9\s*\(SIGKILL|"
             r"ExitCode[:\s]+137\b|exit code:? 137\b", _I),
         SIGKILL, 3),
    # --- failures of another kind ---------------------------------------------------------
    Rule("device_side_assert", _rx(r"device-side assert|Assertion [`'].*[`'] failed", _I),
         OTHER, 1),
    Rule("preemption",
         _rx(r"\b(?:was|been|being|got|is being) preempted\b|\bpreemption (?:notice|signal|event|"
             r"detected|warning)|\bPreempted\b|\bPREEMPTED\b|spot (?:instance )?interruption|"
             r"instance (?:was |has been )?reclaimed|capacity.{0,20}reclaimed|preemptible VM",
             _I),
         OTHER, 1),
    Rule("disk_full",
         _rx(r"No space left on device|\[Errno 28\]|\bENOSPC\b|Disk quota exceeded", _I),
         OTHER, 1),
    Rule("cuda_error",
         _rx(r"CUDA error:|CUDA kernel errors might be asynchronously reported|"
             r"unspecified launch failure|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|cuDNN error|"
             r"CuDNN error|\bcudaError\w+|NVML_SUCCESS == r INTERNAL ASSERT", _I),
         OTHER, 1),
    Rule("segfault", _rx(r"Segmentation fault|\bSIGSEGV\b|\bSIGBUS\b|Bus error|"
                         r"Fatal Python error", _I), OTHER, 1),
    Rule("nccl_timeout",
         _rx(r"Watchdog caught collective operation timeout|collective operation timeout|"
             r"Timeout\(ms\)=\d+\) ran for|NCCL[^\n]{0,80}tim(?:ed|ing) ?out|"
             r"Some NCCL operations have failed or timed out|DistStoreError|"
             r"Socket Timeout|timed out after \d+", _I),
         OTHER, 3),
    Rule("nccl_error",
         _rx(r"\bNCCL error\b|\bnccl\w*Error\b|ProcessGroupNCCL[^\n]{0,80}(?:abort|error)|"
             r"NCCL communicator (?:was )?aborted|DistBackendError|Connection reset by peer|"
             r"Broken pipe|remote process exited|peer closed", _I),
         OTHER, 3),
    # Wrappers that report a worker's exit, not a failure of their own: torchrun's summary,
    # SageMaker's "AlgorithmError: ExecuteUserScriptError: ... exit code: N".
    Rule("child_failed",
         _rx(r"ChildFailedError|SignalException|worker group failed|AlgorithmError|"
             r"ExecuteUserScriptError", _I),
         OTHER, 4),
    Rule("sigterm",
         _rx(r"\bSIGTERM\b|\b[Ss]ignal 15\b|\bexit(?:[ _]?code|[ _]status)\s*[:=]?\s*"
             r"(?:-15|143)\b|non-zero (?:exit )?status(?: of)? (?:143|-15)\b", _I),
         OTHER, 4),
    Rule("dataloader_exited",
         _rx(r"DataLoader worker \(pid\(?s?\)?[^)]*\) exited unexpectedly", _I), OTHER, 3),
)

# A Python exception line, the last line of a traceback: "RuntimeError: ...", "torch.x.YError".
_EXCEPTION = re.compile(
    r"(?:^|[\s:>\]|'\"])((?:[A-Za-z_]\w*\.)*(?:_?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)|"
    r"KeyboardInterrupt))(?::\s|:?\s*$)"
)
_CASCADE_WORDS = re.compile(
    r"NCCL|nccl|timed out|timeout|[Aa]bort|communicator|Connection reset|Broken pipe|SIGTERM|"
    r"signal 15|process group|ProcessGroup|collective|barrier|store|rendezvous"
)
_EXIT_STATUS = re.compile(
    r"\b(?:exit(?:[ _]?code|[ _]status)|exited with (?:a )?(?:non-zero )?(?:exit )?"
    r"(?:status|code)|non-zero (?:exit )?status|returned non-zero exit status)(?: of)?\"?\s*[:=]?"
    r"\s*\(?(-?\d+)", re.IGNORECASE
)
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")


def classify(text: str) -> tuple[Rule | None, re.Match[str] | None, str]:
    """The first rule that matches ``text``; for a text no rule matches, a generic exception or a
    non-zero exit status is still a failure (signature ``exception:<Name>`` / ``exit_status``)."""
    for rule in RULES:
        match = rule.pattern.search(text)
        if match is None:
            continue
        if rule.unless is not None and rule.unless.search(text):
            continue
        return rule, match, rule.signature
    return None, None, ""


def generic(text: str) -> tuple[str, int, int] | None:
    """(signature, tier, start) of a failure no rule names: an uncaught exception, a non-zero exit
    status, or a traceback header. None when the text reports no failure."""
    match = _EXCEPTION.search(text)
    if match:
        name = match.group(1).rsplit(".", 1)[-1]
        if name in ("Warning", "DeprecationWarning", "UserWarning"):
            return None
        tier = 3 if _CASCADE_WORDS.search(text) else 2
        if name == "SystemExit" and re.search(r"SystemExit:\s*0\b", text):
            return None
        return f"exception:{name}", tier, match.start(1)
    match = _EXIT_STATUS.search(text)
    if match and match.group(1) not in ("0", "-0"):
        return "exit_status", 4, match.start()
    match = _TRACEBACK.search(text)
    if match:
        return "traceback", 4, match.start()
    return None


def torch_message_complete(text: str) -> bool:
    """Whether a PyTorch allocator message carries all its figures (or visibly ended), so that a
    message split over several lines (a terminal's wrap, a logger's line limit) can be joined
    until it does."""
    if "ried to allocate" not in text:
        return True
    gpu = text.find("(GPU")
    if gpu >= 0:  # <= 2.0: the figures are a parenthesised list
        return ")" in text[gpu:]
    if re.search(r"but unallocated|See documentation", text, re.IGNORECASE):
        return True
    # >= 2.1 without its last sentence: complete only if it stops at a full stop (a message
    # quoted up to "... is free." is all there is), not mid-sentence.
    return text.rstrip().endswith(".") and not _CUT.search(text)
