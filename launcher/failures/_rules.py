"""Which failure a cleaned message reports: the rule table.

Each rule is a regular expression over one message (after :mod:`._clean`), the failure kind it
means, how strongly, and where its figures come from. Rules are tried in order and the first match
wins, so a specific message (PyTorch's CUDA out-of-memory) is never mistaken for a generic one (a
``RuntimeError``). The order encodes what the design brief asks for:

- every allocator's out-of-memory message is a *memory* failure, whatever exception wraps it;
- a request no machine could serve ("Tried to allocate more than 1EB") is *not* one: the size is
  garbage handed over after a collective failed (NCCL issue 1284, case 015);
- a process killed by SIGKILL / exit 137 / -9 is a host out-of-memory kill for certain only with
  corroboration (the kernel's "Killed process", Kubernetes' OOMKilled, a platform's "ran
  out-of-memory"); on its own it is *weak* evidence that :mod:`._watch` weighs at the end: host
  memory on a managed platform, *probable* host memory elsewhere (the kernel's OOM killer sends
  most of them, but not all). The shell's "Killed" (in any language its catalogs hold) is the
  same kill as the shell reports it: a memory failure the job stops on, probable as well;
- oneDNN's "could not create a primitive" is host memory (creating a primitive allocates its
  scratchpad), with the confidence the log supports (:mod:`._watch`);
- NCCL timeouts, illegal memory accesses, device-side asserts, cuDNN errors, a full disk and
  preemption are failures of another kind, ranked so that a root cause outranks the cascade that
  follows it (``tier``: 1 specific root causes, 2 exceptions, 3 distributed cascades, 4 process
  exits and signals).

Every rule names its **needles**: literal strings, one of which every message the rule reports
contains, matched without regard to case (:func:`_n`). A rule is only tried on a text that holds
one of them, which keeps :func:`classify` to a few `in` tests for most lines; and the file scanner
(:mod:`._anchors`, :mod:`._scan`) searches whole blocks of bytes for the same needles, so a line
reaches the rules only if some rule could read it. An alternative of a pattern that holds none of
its rule's needles would never fire: the tests check every rule's needles against examples of
each alternative.

Over 600 lines on purpose: the rule table is one unit, read top to bottom in the order the rules
are tried, and splitting it would separate a rule from the ones it must outrank.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
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
    # What in the log shows memory was short where the message itself does not say it (oneDNN's
    # "could not create a primitive" after a line naming RLIMIT_AS): "" when nothing does.
    evidence: str = ""

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
    # Strings one of which every match contains, as real messages spell them. A tuple ("a", "b"):
    # a match that holds "a" also holds "b" ("a" is searched for, "b" checked before the pattern
    # runs); several tuples may start with the same string.
    needles: tuple[str | tuple[str, ...], ...] = ()
    keys: tuple[str, ...] = field(init=False)  # the searched-for parts, in lower case
    # key -> the sets of other parts one of which must come with it (absent: none needed)
    also: dict[str, tuple[tuple[str, ...], ...]] = field(init=False)
    exact: tuple[str, ...] = field(init=False)  # a case-sensitive pattern's keys as written

    def __post_init__(self) -> None:
        if not self.needles:
            raise ValueError(f"rule {self.signature} names no needles")
        keys: dict[str, list[tuple[str, ...]]] = {}
        firsts = []
        for needle in self.needles:
            first, *rest = (needle,) if isinstance(needle, str) else needle
            keys.setdefault(first.lower(), []).append(tuple(part.lower() for part in rest))
            firsts.append(first)
        object.__setattr__(self, "keys", tuple(keys))
        object.__setattr__(self, "also", {k: tuple(v) for k, v in keys.items() if all(v)})
        exact = () if self.pattern.flags & re.IGNORECASE else tuple(dict.fromkeys(firsts))
        object.__setattr__(self, "exact", exact)

    def categories(self) -> frozenset[str]:
        """What a finding of this rule can change in the result (see :data:`CATEGORIES`)."""
        cats = {category(self.kind, self.tier)}
        if self.figures is not None:
            cats.add("t4")  # figures of an impossible size make it "other", tier 4
        if self.signature == "disk_full":
            cats.add("oom")  # a full /dev/shm after a DataLoader traceback is host memory
        return frozenset(cats)


# What a finding can decide, which is what the scanner still looks for: "oom" (any out-of-memory
# message), "event" / "done" (the launcher's own oom / done lines), "t1".."t4" (other failures by
# tier), "weak" (a bare SIGKILL).
CATEGORIES = ("oom", "event", "done", "t1", "t2", "t3", "t4", "weak")


def category(kind: str, tier: int) -> str:
    if kind in (GPU_OOM, HOST_OOM):
        return "oom"
    if kind == SIGKILL:
        return "weak"
    return f"t{tier}"


def _n(*phrases: str | tuple[str, ...]) -> tuple[str | tuple[str, ...], ...]:
    """Needles, as written. A line is searched for them in lower case ("Killed", "killed" and
    "KILLED" are one needle), as most rules match; a case-sensitive rule also checks them as
    written before its pattern runs."""
    return tuple(dict.fromkeys(phrases))


def _lower(*phrases: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(phrase.lower() for phrase in phrases))


# How an exit status is reported: "exit code", "exit_status", "ExitCode", "exited with", "non-zero
# (exit) status".
_EXIT_WORDS = _lower("exit code", "exit_code", "exitcode", "exit status", "exit_status",
                     "exited with", "non-zero")


# "OOM" as a word (\bOOM\b), not inside "room" or "zoom": each character that can come before it.
# (At the start of a line it can only be "OOM error", a needle of its own.)
_WORD_OOM = tuple(c + "oom" for c in " \t!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~")


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


_I = re.IGNORECASE

# The shell's "Killed" (a SIGKILL's description) in other languages, as the gettext catalogs of
# glibc (libc.mo: strsignal, which dash and most bash builds print) and of bash (bash.mo: a bash
# built with its own signal list) translate it: msgstr of msgid "Killed" in Debian's catalogs.
# Only words whose letters have no case outside ASCII: needles are matched lower-cased byte by
# byte (as ._anchors lowers a block), so "Убито" (ru) could never be found; a word a sentence
# could end in is not enough on its own ("Abgebrochen" is SIGABRT's "Aborted" in German). Each
# word is a needle the file scanner searches every block for, so not every catalog's: pt's
# "Morto" and it's "Ucciso" cost a tenth more on English prose, ko's "죽었음" a search pass more
# on binary text (bench/bench_explain.py).
KILLED_WORDS = (
    "Processus arrêté", "Tué",  # fr: libc; bash, coreutils
    "Getötet", "Abgebrochen (Killed)",  # de: libc; bash
    "Terminado (killed)", "Matado",  # es: libc; bash
    "已杀死",  # zh_CN
    "強制結束",  # zh_TW
    "強制終了",  # ja: libc (bash's ja catalog keeps "Killed")
)
_KW = "(?:" + "|".join(re.escape(w) for w in sorted(KILLED_WORDS, key=len, reverse=True)) + ")"
_SHM_CONTEXT = r"(?:/dev/shm|</?torch_\d|\bshm\b|shared memory|share_memory|storage_share)"

RULES: tuple[Rule, ...] = (
    # --- not memory, although the words say so -------------------------------------------
    Rule("impossible_allocation_size",
         _rx(r"Tried to allocate more than \d+(?:\.\d+)?\s*[PE]i?B", _I), OTHER, 4,
         needles=_n("to allocate")),
    Rule("illegal_memory_access", _rx(r"illegal memory access|misaligned address", _I), OTHER, 1,
         needles=_n("illegal memory access", "misaligned address")),
    # --- PyTorch allocators: CUDA, ROCm (HIP), XPU, MTIA, MPS -----------------------------
    Rule("torch.OutOfMemoryError",
         _rx(r"(?:CUDA|HIP|XPU|MTIA|NPU|MUSA) out of memory|MPS backend out of memory|"
             r"\btorch\.(?:cuda\.)?OutOfMemoryError\b|\bcuda runtime error \(2\)\s*:\s*out of mem",
             _I),
         GPU_OOM, figures=torch_figures,
         needles=_n("CUDA out of mem", "HIP out of mem", "XPU out of mem", "MTIA out of mem",
                    "NPU out of mem", "MUSA out of mem", "MPS backend out of mem",
                    "OutOfMemoryError", "runtime error (2)")),
    # --- the CPU allocator and host memory ------------------------------------------------
    # Since 1.x: "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error
    # code 12 (Cannot allocate memory)"; Windows: "... not enough memory: you tried to allocate N
    # bytes."; before that (Caffe2's enforce, PyTorch 1.0): "[enforce fail at CPUAllocator.cpp:56]
    # posix_memalign(&data, gAlignment, nbytes) == 0. 12 vs 0", errno 12 being ENOMEM (22,
    # EINVAL, is a bad alignment, not memory).
    Rule("DefaultCPUAllocator",
         _rx(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|"
             r"posix_memalign\s*\([^)\n]{0,120}\)\s*==\s*0\W{0,4}12 vs 0\b|"
             r"posix_memalign[^\n]{0,200}?(?:\bENOMEM\b|Cannot allocate memory|"
             r"\b(?:error code|errno|err)\s*[=:]?\s*12\b)", _I), HOST_OOM,
         figures=other_figures, needles=_n("DefaultCPUAllocator", "posix_memalign")),
    # oneDNN (mkldnn / ideep, under PyTorch's CPU convolutions and matmuls; MXNet, Paddle): "could
    # not create a primitive" when creating a primitive fails, which is where its scratchpad is
    # allocated (oneDNN >= 1.7 returns out_of_memory there instead of crashing: oneDNN issue 848,
    # MXNet issue 19265), and "could not create a primitive descriptor for a convolution forward
    # propagation primitive" (".. Run workload with environment variable ONEDNN_VERBOSE=all ...")
    # when no implementation takes the problem. Neither says which: under a memory cap (RLIMIT_AS,
    # a cgroup) it is the allocation; it is also what oneDNN says for shapes, dtypes or CPUs it has
    # no implementation for. Host memory, as certain as the log makes it (._watch).
    Rule("onednn_primitive", _rx(r"\bcould not create a primitive\b", _I), HOST_OOM,
         needles=_n("could not create a primitive")),
    Rule("dataloader_bus_error",
         _rx(r"(?:DataLoader worker \(pid[^)]*\) is killed by signal: Bus error|"
             r"Unexpected bus error encountered in worker|insufficient shared memory)", _I),
         HOST_OOM, cause="shared_memory",
         needles=_n("bus error", "insufficient shared memory")),
    Rule("shm_exhausted",
         _rx(r"(?:unable to (?:write to|mmap|allocate|open|resize)[^\n]{0,40}</?torch_\d"
             r"[^\n]{0,120}(?:No space left|Cannot allocate memory|errno[ =:]*(?:28|12)|"
             r"out of memory)|No space left on device[^\n]{0,80}" + _SHM_CONTEXT + r"|"
             + _SHM_CONTEXT + r"[^\n]{0,160}(?:No space left on device|Errno 28|"
             r"Cannot allocate memory|out of memory|exhausted|is full))", _I),
         HOST_OOM, cause="shared_memory",
         needles=_n("<torch_", "</torch_", "003ctorch_", "003c/torch_", "no space left", "shm",
                    "shared memory", "share_memory", "storage_share")),
    Rule("too_many_open_files", _rx(r"Too many open files|EMFILE", _I), OTHER, 1,
         needles=_n("Too many open files", "EMFILE")),
    Rule("dataloader_killed",
         _rx(r"DataLoader worker \(pid[^)]*\) is killed by signal: Killed", _I), HOST_OOM,
         needles=_n("killed by signal")),
    Rule("kernel_oom_killer",
         _rx(r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory|invoked oom-killer|"
             r"\boom-kill:|oom_kill_process|oom_reaper: reaped|\bKilled process \d+|"
             r"Detected \d+ oom[-_ ]kill event|cgroup out-of-memory handler|"
             r"task \d+: Out Of Memory|State=OUT_OF_MEMORY|\bOUT_OF_MEMORY\b(?!:)", _I),
         HOST_OOM,
         needles=_n("out of memory: kill", "memory cgroup", "oom-kill", "oom_kill", "oom kill",
                    "oom_reaper", "killed process", "out-of-memory handler", ": out of memory",
                    "out_of_memory")),
    Rule("OOMKilled", _rx(r"\bOOMKilled\b|reason:\s*OOMKilled|OOMKilled\"?\s*[:=]\s*true"),
         HOST_OOM, unless=_rx(r"OOMKilled\"?\s*[:=]\s*false", _I), needles=_n("OOMKilled")),
    Rule("platform_out_of_memory",
         _rx(r"\bran out[- ]of[- ]memory and exited|\breplica \S+ ran out[- ]of[- ]memory|"
             r"instance type with more memory|OutOfMemoryError: Please use|"
             r"out of memory \(OOM\)|\bOutOfMemory: Please|exceeded (?:its |the )?memory limit|"
             r"memory limit exceeded|Container killed .{0,60}(?:memory|OOM)|"
             r"running low on memory|java\.lang\.OutOfMemoryError", _I),
         HOST_OOM,
         needles=_n("memory and exited", ("ran out", "memory"), "more memory", "OutOfMemory",
                    "out of memory (OOM)", "memory limit", "container killed", "low on memory")),
    # --- other GPU libraries ----------------------------------------------------------------
    Rule("CUBLAS_STATUS_ALLOC_FAILED", _rx(r"CUBLAS_STATUS_ALLOC_FAILED"), GPU_OOM,
         needles=_n("CUBLAS_STATUS_ALLOC_FAILED")),
    Rule("CUDNN_STATUS_ALLOC_FAILED",
         _rx(r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_MEMORY|INTERNAL_ERROR_HOST_ALLOCATION)"),
         GPU_OOM, needles=_n("CUDNN_STATUS_")),
    Rule("nccl_cuda_out_of_memory",
         _rx(r"Cuda failure '?out of memory|NCCL[^\n]{0,200}\bout of memory|"
             r"ncclUnhandledCudaError[^\n]{0,200}out of memory", _I),
         GPU_OOM, needles=_n(("out of memory", "Cuda failure"), ("out of memory", "NCCL"))),
    Rule("cuda_runtime_out_of_memory",
         _rx(r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|hipErrorOutOfMemory|"
             r"CUDA (?:driver )?error: out of memory|\bCUDA error 2\b|CUresult 2\b", _I),
         GPU_OOM, figures=other_figures,
         needles=_n("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation",
                    "hipErrorOutOfMemory", "CUDA error", "CUDA driver error", "CUresult 2")),
    # --- TensorFlow, XLA, JAX -------------------------------------------------------------
    Rule("xla_resource_exhausted",
         _rx(r"RESOURCE_EXHAUSTED:?[^\n]{0,80}(?:memory|allocat|OOM)|"
             r"(?:XlaRuntimeError|jaxlib)[^\n]{0,80}out of memory|BufferAssignment OOM|"
             r"Attempting to (?:reserve|allocate) \S+ (?:at the bottom of memory\. )?"
             r"That was not possible", _I),
         GPU_OOM, figures=other_figures,
         needles=_n("RESOURCE_EXHAUSTED", "XlaRuntimeError", "jaxlib", "BufferAssignment OOM",
                    "That was not possible")),
    Rule("tensorflow_oom",
         _rx(r"OOM when allocating tensor|Allocator \([^)]*\) ran out of memory|"
             r"Resource ?exhausted:?[^\n]{0,40}\b(?:OOM|out of memory)|"
             r"ResourceExhaustedError:?[^\n]{0,60}(?:allocat|memory)|"
             r"failed to allocate \S+ \(\d+ bytes\) from device", _I),
         GPU_OOM, figures=other_figures,
         needles=_n("OOM when allocating", "Allocator (", "Resource exhausted", "ResourceExhausted",
                    "failed to allocate")),
    # Some other framework's OutOfMemoryError (Ray's, a Java driver's): GPU or host as it says.
    Rule("gpu_out_of_memory_exception",
         _rx(r"\b\w*OutOfMemory(?:Error|Exception)\b(?=[^\n]{0,200}\b(?:GPU|CUDA|HIP|device|"
             r"VRAM|HBM)\b)"), GPU_OOM, figures=torch_figures, needles=_n("OutOfMemory")),
    Rule("out_of_memory_exception", _rx(r"\b\w*OutOfMemory(?:Error|Exception)\b"), HOST_OOM,
         needles=_n("OutOfMemory")),
    # --- host memory, generic -------------------------------------------------------------
    Rule("MemoryError",
         _rx(r"(?<![A-Za-z])(?:_Array)?MemoryError\b|std::bad_alloc|\bbad_alloc\b|"
             r"Cannot allocate memory|\bENOMEM\b|Unable to allocate \S+ \S+ for an array"),
         HOST_OOM, figures=other_figures,
         needles=_n("MemoryError", "bad_alloc", "Cannot allocate memory", "ENOMEM",
                    "Unable to allocate")),
    # The shell's "Killed": a line of its own (dash, a tqdm bar's line ended by the kill), bash's
    # "line 12:  4021 Killed   python train.py", an interactive "[1]+ Killed ...", zsh's
    # "zsh: killed  python train.py". Not a word that merely ends or starts a sentence ("... the
    # test Killed"): that read random text as host memory (issue 16). A line that is only the word
    # is the shell's report, whatever surrounds it. The same in the catalogs' other languages
    # (KILLED_WORDS: "Getötet", "已杀死"): a line of its own, "[1]+  Getötet   python ...",
    # bash's "run.sh: Zeile 12:  4021 Getötet   python ..." ("第 12 行：4021 已杀死 ..."), glued to
    # a progress bar's last bracket.
    Rule("shell_killed",
         # (The forms that start a line share one "^\s*": fewer alternatives to try at each
         # position of a line that holds the word but is no kill.)
         _rx(r"^\s*(?:Killed(?::\s*9)?\s*$|(?:\[\d+\][+-]?\s+)?\d*\s*Killed\s{2,}\S|"
             r"Killed\s+(?:python\S*|torchrun|accelerate|deepspeed)\b|"
             + _KW + r"\s*$|\[\d+\][+-]?\s+(?:\d+\s+)?" + _KW + r"(?:\s*$|\s+\S)|"
             r"\d+\s+" + _KW + r"(?:\s*$|\s{2,}\S))|"
             r"(?<=[^\sA-Za-z0-9_])(?:Killed|(?<=[!-/:-@\[-`{-~])" + _KW + r")\s*$|"
             r"\b[Ll]ine \d+:\s+\d+\s+Killed\b|\bzsh: killed\s+\S|"
             r"[:\uff1a]\s*\d+\s+" + _KW + r"(?:\s*$|\s+\S)"),
         HOST_OOM, unless=_rx(r"Killed by|Killed(?: the)? (?:job|worker|process group)", _I),
         needles=_n("Killed", "zsh: killed", *KILLED_WORDS)),
    Rule("generic_out_of_memory",
         _rx(r"(?:Error|Exception|FATAL|Fatal|fatal|error)\b[^\n]{0,60}\b(?:out of memory|"
             r"OOM\b)|^\s*(?:GPU|CUDA|device) (?:OOM|out of memory)\b|\bOOM error\b", _I),
         GPU_OOM, figures=torch_figures,
         unless=_rx(r"avoid (?:an? )?(?:out of memory|OOM)|to prevent (?:an? )?OOM", _I),
         needles=_n("OOM error", *((word, also) for word in ("out of memory", *_WORD_OOM)
                                   for also in ("error", "exception", "fatal", "GPU", "CUDA",
                                                "device")))),
    # --- a process killed by a signal: weak evidence of the kernel OOM killer -------------
    # (DeepSpeed's launcher: "[launch.py:434:sigkill_handler] [...] exits with return code = -9")
    Rule("sigkill",
         _rx(r"\bSIGKILL\b|\b[Ss]ignal 9\b|\bsignal: killed\b|"
             r"\bexit(?:[ _]?code|[ _]status|ed with (?:a )?(?:non-zero )?(?:exit )?"
             r"(?:status|code))(?: of)?\"?\s*[:=]?\s*\(?(?:137|-9)\b|"
             r"non-zero (?:exit )?status(?: of)? (?:137|-9)\b|status of 9\s*\(SIGKILL|"
             r"ExitCode[:\s]+137\b|exit code:? 137\b|"
             r"\breturn ?code\s*[:=]?\s*(?:137|-9)\b", _I),
         SIGKILL, 3, needles=_n("SIGKILL", "signal 9", "signal: killed", *_EXIT_WORDS,
                                "return code", "returncode")),
    # --- failures of another kind ---------------------------------------------------------
    Rule("device_side_assert",
         _rx(r"device-side assert|Assertion [`'][^\n]{0,400}?[`'] failed", _I), OTHER, 1,
         needles=_n("device-side assert", "Assertion `", "Assertion '")),
    Rule("preemption",
         _rx(r"\b(?:was|been|being|got|is being) preempted\b|\bpreemption (?:notice|signal|event|"
             r"detected|warning)|\bPreempted\b|\bPREEMPTED\b|spot (?:instance )?interruption|"
             r"instance (?:was |has been )?reclaimed|capacity.{0,20}reclaimed|preemptible VM",
             _I),
         OTHER, 1, needles=_n("preempt", "interruption", "reclaimed")),
    Rule("disk_full",
         _rx(r"No space left on device|\[Errno 28\]|\bENOSPC\b|Disk quota exceeded", _I),
         OTHER, 1, needles=_n("No space left", "Errno 28", "ENOSPC", "Disk quota")),
    Rule("cuda_error",
         _rx(r"CUDA error:|CUDA kernel errors might be asynchronously reported|"
             r"unspecified launch failure|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|cuDNN error|"
             r"CuDNN error|\bcudaError\w+|NVML_SUCCESS == r INTERNAL ASSERT", _I),
         OTHER, 1,
         needles=_n("CUDA error", "CUDA kernel errors", "unspecified launch failure",
                    "CUBLAS_STATUS_", "CUDNN_STATUS_", "cuDNN error", "cudaError",
                    "NVML_SUCCESS")),
    Rule("segfault", _rx(r"Segmentation fault|\bSIGSEGV\b|\bSIGBUS\b|Bus error|"
                         r"Fatal Python error", _I), OTHER, 1,
         needles=_n("Segmentation fault", "SIGSEGV", "SIGBUS", "Bus error",
                    "Fatal Python error")),
    Rule("nccl_timeout",
         _rx(r"Watchdog caught collective operation timeout|collective operation timeout|"
             r"Timeout\(ms\)=\d+\) ran for|NCCL[^\n]{0,80}tim(?:ed|ing) ?out|"
             r"Some NCCL operations have failed or timed out|DistStoreError|"
             r"Socket Timeout|timed out after \d+", _I),
         OTHER, 3,
         needles=_n("collective operation timeout", "Timeout(ms)", "timed out", "timedout",
                    "timing out", "timingout", "DistStoreError", "Socket Timeout")),
    Rule("nccl_error",
         _rx(r"\bNCCL error\b|\bnccl\w*Error\b|ProcessGroupNCCL[^\n]{0,80}(?:abort|error)|"
             r"NCCL communicator (?:was )?aborted|DistBackendError|Connection reset by peer|"
             r"Broken pipe|remote process exited|peer closed", _I),
         OTHER, 3,
         needles=_n("NCCL error", ("error", "nccl"), "ProcessGroupNCCL", "NCCL communicator",
                    "DistBackendError", "Connection reset", "Broken pipe", "remote process exited",
                    "peer closed")),
    # Wrappers that report a worker's exit, not a failure of their own: torchrun's summary,
    # SageMaker's "AlgorithmError: ExecuteUserScriptError: ... exit code: N".
    Rule("child_failed",
         _rx(r"ChildFailedError|SignalException|worker group failed|AlgorithmError|"
             r"ExecuteUserScriptError", _I),
         OTHER, 4,
         needles=_n("ChildFailedError", "SignalException", "worker group failed",
                    "AlgorithmError", "ExecuteUserScriptError")),
    Rule("sigterm",
         _rx(r"\bSIGTERM\b|\b[Ss]ignal 15\b|\bexit(?:[ _]?code|[ _]status)\s*[:=]?\s*"
             r"(?:-15|143)\b|non-zero (?:exit )?status(?: of)? (?:143|-15)\b", _I),
         OTHER, 4, needles=_n("SIGTERM", "signal 15", *_EXIT_WORDS)),
    Rule("dataloader_exited",
         _rx(r"DataLoader worker \(pid\(?s?\)?[^)]*\) exited unexpectedly", _I), OTHER, 3,
         needles=_n("exited unexpectedly")),
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
# The generic readings' needles: _EXCEPTION's names end in one of these words, _EXIT_STATUS says
# exit or non-zero, _TRACEBACK is its header.
# (Names ending in "Exit" are SystemExit and GeneratorExit, or any followed by a colon.)
_EXCEPTION_NEEDLES = _lower("Error", "Exception", "Interrupt", "Exit:", "SystemExit",
                            "GeneratorExit")
_EXIT_NEEDLES = _EXIT_WORDS
_TRACEBACK_NEEDLES = _lower("Traceback (most recent call last)")

# Words that name a managed platform (Vertex AI, AI Platform / Cloud ML Engine, SageMaker): where
# nothing but the kernel's OOM killer sends an unannounced SIGKILL. Looked for in the lines that
# are classified and around a SIGKILL (the platform's own report of the exit is next to it), not
# searched for through the whole log. Each provider says its own (``Provider.platform_pattern``,
# ``platform_needles``): a log from anywhere is read for all of them.


@functools.cache
def _platforms() -> tuple[NeedleIndex, re.Pattern[str], frozenset[str]]:
    """Every provider's platform words (needles, then the expression) and the names a log of a
    managed platform may be explained under; from the provider registry, once."""
    from launcher import providers

    classes = [providers.provider_class(name) for name in providers.names()]
    managed = [c for c in classes if c.platform_pattern]
    return (NeedleIndex(tuple(n for c in managed for n in c.platform_needles)),
            re.compile("|".join(c.platform_pattern for c in managed)),
            frozenset(n for c in managed for n in (c.name, *c.platform_aliases)))


def names_platform(text: str) -> bool:
    """Whether ``text`` names a managed platform, checked for a few words first: the expression
    itself would try each position of a line that may be a megabyte long."""
    needles, pattern, _ = _platforms()
    return needles.any(text.lower()) and pattern.search(text) is not None


def managed_platform(name: str | None) -> bool:
    """Whether a log explained as coming from ``name`` (a provider, or an older name of its
    platform) ran on a managed platform."""
    return name is not None and name.lower() in _platforms()[2]


# The launcher's own lines that matter: {"launch": "oom", ...} and {"launch": "done", ...} (also
# JSON-escaped inside a Cloud Logging entry: \"oom\").
_EVENT_NEEDLES = ('"oom', '"done')


def _needle_categories() -> dict[str, frozenset[str]]:
    table: dict[str, set[str]] = {}

    def add(needles: tuple[str, ...], cats: frozenset[str] | set[str]) -> None:
        for needle in needles:
            table.setdefault(needle, set()).update(cats)

    for rule in RULES:
        add(rule.keys, rule.categories())
    add(_EXCEPTION_NEEDLES, {"t2", "t3"})
    add(_EXIT_NEEDLES, {"t4"})
    add(_TRACEBACK_NEEDLES, {"t4"})
    add(_EVENT_NEEDLES[:1], {"event"})
    add(_EVENT_NEEDLES[1:], {"done"})
    return {needle: frozenset(cats) for needle, cats in table.items()}


# Every needle and what a line holding it may decide: the scanner searches for the needles of the
# categories still open (``._watch.LogWatcher`` says which).
NEEDLE_CATEGORIES: dict[str, frozenset[str]] = _needle_categories()


def _has(text: str, needles: tuple[str, ...]) -> bool:
    for needle in needles:  # noqa: SIM110 (a loop: any() over a generator costs twice as much)
        if needle in text:
            return True
    return False


# A rough order of character frequency in logs and prose, most frequent first.
_COMMON = " etaonisrhldcumpfgywb.,:/-_\"'0123456789vkxjqz()[]<>="


def _rarity(char: str) -> int:
    i = _COMMON.find(char)
    return len(_COMMON) - i if i >= 0 else 0  # lower is rarer; characters not listed are rarest


class NeedleIndex:
    """Which of many lower-case needles a lower-cased text holds, in a few ``in`` tests: the
    needles are grouped under keys, three-character substrings that many of them share ("mem",
    "oom", "exi"), so a text is tested for a few dozen keys and only the groups of those it holds
    are tested needle by needle."""

    def __init__(self, needles: Iterable[str]) -> None:
        left = list(dict.fromkeys(needles))
        groups: dict[str, tuple[str, ...]] = {}
        while left:  # greedy cover: the key shared by most needles first
            counts: dict[str, int] = {}
            for needle in left:
                for sub in {needle[i:i + 3] for i in range(max(1, len(needle) - 2))}:
                    counts[sub] = counts.get(sub, 0) + 1
            key = max(counts, key=lambda k: (counts[k], -sum(map(_rarity, k)), k))
            groups[key] = tuple(n for n in left if key in n)
            left = [n for n in left if key not in n]
        self._groups = tuple(groups.items())

    def present(self, low: str) -> list[str]:
        return [needle for key, group in self._groups if key in low
                for needle in group if needle in low]

    def any(self, low: str) -> bool:
        for key, group in self._groups:  # noqa: SIM110 (faster than any())
            if key in low and _has(low, group):
                return True
        return False


# needle -> the rules that name it, with the parts each needs with it
_RULES_OF: dict[str, tuple[tuple[int, tuple[tuple[str, ...], ...]], ...]] = {}
for _i, _rule in enumerate(RULES):
    for _key in _rule.keys:
        _RULES_OF[_key] = (*_RULES_OF.get(_key, ()), (_i, _rule.also.get(_key, ())))
_RULE_NEEDLES = NeedleIndex(_RULES_OF)


def classify(text: str) -> tuple[Rule | None, re.Match[str] | None, str]:
    """The first rule that matches ``text``; for a text no rule matches, a generic exception or a
    non-zero exit status is still a failure (signature ``exception:<Name>`` / ``exit_status``).

    A rule is tried only if one of its needles is in the text (in lower case)."""
    low = text.lower()
    present = _RULE_NEEDLES.present(low)
    if not present:
        return None, None, ""
    tried = {i for needle in present for i, also in _RULES_OF[needle]
             if not also or any(all(part in low for part in parts) for parts in also)}
    for i in sorted(tried):
        rule = RULES[i]
        if rule.exact and not _has(text, rule.exact):
            continue
        match = rule.pattern.search(text)
        if match is None:
            continue
        if rule.unless is not None and rule.unless.search(text):
            continue
        return rule, match, rule.signature
    return None, None, ""


_TAIL_WORDS = ("Error", "Exception", "Exit", "Interrupt")


def _exception_tail(text: str) -> bool:
    """Whether ``text`` could hold what _EXCEPTION matches, checked without it (a regular
    expression that starts with an alternation tries every position): a name's last word glued
    to a word character before it ("RuntimeError", not "an Error") and followed by a colon and a
    space, or ending the text."""
    for word in _TAIL_WORDS:
        i = text.find(word, 1)
        while i > 0:
            j = i + len(word)
            if text[i - 1].isalnum() or text[i - 1] == "_":
                rest = text[j:]
                if not rest.strip() or rest[0] == ":" and (
                        len(rest) == 1 or rest[1].isspace() or not rest[1:].strip()):
                    return True
            i = text.find(word, j)
    return False


def generic(text: str) -> tuple[str, int, int] | None:
    """(signature, tier, start) of a failure no rule names: an uncaught exception, a non-zero exit
    status, or a traceback header. None when the text reports no failure."""
    low = text.lower()
    match = _EXCEPTION.search(text) if (
        _has(low, _EXCEPTION_NEEDLES) and _exception_tail(text)) else None
    if match:
        name = match.group(1).rsplit(".", 1)[-1]
        if name in ("Warning", "DeprecationWarning", "UserWarning"):
            return None
        tier = 3 if _CASCADE_WORDS.search(text) else 2
        if name == "SystemExit" and re.search(r"SystemExit:\s*0\b", text):
            return None
        return f"exception:{name}", tier, match.start(1)
    match = _EXIT_STATUS.search(text) if _has(low, _EXIT_NEEDLES) else None
    if match and match.group(1) not in ("0", "-0"):
        return "exit_status", 4, match.start()
    match = _TRACEBACK.search(text) if _TRACEBACK_NEEDLES[0] in low else None
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
