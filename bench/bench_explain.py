"""`launch explain` throughput on adversarial text next to real logs (issue 16).

    .venv/bin/python bench/bench_explain.py                      # 200 MB per adversarial input
    .venv/bin/python bench/bench_explain.py --size-mb 20 --real-mb 20     # quick
    .venv/bin/python bench/bench_explain.py --inputs random_words,real_logs --keep-dir /tmp/bx

Writes each input to a file, then classifies it with the real ``explain_stream`` (through
``explain_file``) in a fresh process and prints MB/s, CPU time and the diagnosis. Once, the
installed ``launch explain FILE --json`` runs end to end on the random-words input (start-up,
import and output included). The target is 100 MB/s or more on every input, not only on real logs;
nothing here is a test (the tests assert no timings).

Inputs (deterministic: each has a fixed seed):

- ``random_words``: English words and random letter strings, one in ten capitalised, 2 to 25 a
  line. The vocabulary holds words failures also use (error, memory, killed, signal, exit, code,
  status), so lines end in "Killed", say "Error", "Memory" and so on: the input that took 340 s and
  read as host_oom before. (A line that is the one word "Killed" is the shell's report of a kill,
  whatever surrounds it, so lines hold two words at least.)
- ``dense_errors``: every line an exception or a traceback line ("RuntimeError: ... Exception ...
  Traceback ..."), with varied names and words.
- ``oom_fragments``: every line a salad of out-of-memory fragments (out of memory, OOM, Killed,
  MemoryError, CUDA, allocate, exit code, signal) between random words.
- ``oom_lookalikes``: PyTorch's CUDA out-of-memory message and look-alikes (the allocator warnings
  that mention OOM, "Caught OOM, retrying", the message with its figures varied) over and over.
- ``near_miss``: lines that contain the classifier's own anchor words (out of memory, Killed,
  exit, Error, Traceback, NCCL, memory) in sentences no rule reads as a failure: the worst case
  for any prefilter, since every line is a candidate.
- ``long_lines``: lines of 0.3 to 3 MB without a newline (random words with failure words in
  them), both under and over the 1 MiB cut.
- ``binary``: random bytes (NULs, invalid UTF-8, newlines at random).
- ``rank_prefixes``: 1024 ranks' prefixes (torchrun ``[defaultN]:[rankM]:``, mpirun
  ``[1,N]<stderr>:``, SageMaker, NCCL's ``host:pid:tid [dev]``) before random words and metrics.
- ``real_logs``: every log of ../shared/oom-logs and tests/fixtures/logs concatenated, repeated to
  ``--real-mb``.
- ``training_log``: bench/bench_failures.py's synthetic 16-rank torchrun log (metrics lines, an
  out-of-memory error near the end) at ``--real-mb``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO / ".." / "shared" / "oom-logs").resolve()
FIXTURES = REPO / "tests" / "fixtures" / "logs"
TARGET_MB_S = 100.0
BLOCK = 4 << 20  # generators write in blocks of about this many bytes

_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air "
    "well also play small end put home read hand port large spell add even land here must big "
    "high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep eye "
    "never last let thought city tree cross farm hard start might story saw far sea draw left "
    "late run while press close night real life few north open seem together next white children "
    "begin got walk example ease paper group always music those both mark often letter until mile "
    "river car feet care second book carry took science eat room friend began idea fish mountain "
    "stop once base hear horse cut sure watch color face wood main enough plain girl usual young "
    "ready above ever red list though feel talk bird soon body dog family direct pose leave song "
    "measure door product black short class wind question happen complete ship area half rock "
    "order fire south problem piece told knew pass since top whole king space heard best hour "
    "better true during hundred five remember step early hold west ground interest reach fast "
    "process free full shared device total limit running worker pipe reset peer timeout watchdog "
    "memory error signal exit code status killed kill process python allocate failed abort fatal"
)
_ENGLISH = _WORDS.split()


def _vocabulary(rng: random.Random) -> list[str]:
    words = list(_ENGLISH)
    words += ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 10)))
              for _ in range(3000)]
    return words


def _word_lines(rng: random.Random, vocab: list[str], lo: int, hi: int) -> Iterator[str]:
    """Blocks of lines of ``lo`` to ``hi`` random words, one in ten capitalised and one in a
    hundred in capitals (fast: one choices() call a block)."""
    forms = vocab + [w.capitalize() for w in vocab] + [w.upper() for w in vocab]
    weights = [89] * len(vocab) + [10] * len(vocab) + [1] * len(vocab)
    cum = list(itertools.accumulate(weights))
    while True:
        words = rng.choices(forms, cum_weights=cum, k=200_000)
        lengths = rng.choices(range(lo, hi + 1), k=len(words) // lo)
        lines, i = [], 0
        for n in lengths:
            if i + n > len(words):
                break
            lines.append(" ".join(words[i:i + n]))
            i += n
        yield "\n".join(lines) + "\n"


def _write(path: Path, size: int, blocks: Iterator[str | bytes]) -> None:
    written = 0
    with open(path, "wb") as f:
        for block in blocks:
            data = block.encode("utf-8") if isinstance(block, str) else block
            f.write(data)
            written += len(data)
            if written >= size:
                break


def gen_random_words(path: Path, size: int) -> None:
    rng = random.Random(16)
    _write(path, size, _word_lines(rng, _vocabulary(rng), 2, 25))


_EXC_NAMES = ("RuntimeError", "ValueError", "KeyError", "TypeError", "OSError", "AssertionError",
              "IndexError", "ZeroDivisionError", "AttributeError", "Exception", "MyCustomError",
              "torch.distributed.DistBackendError", "ChildFailedError", "StopIteration")


def gen_dense_errors(path: Path, size: int) -> None:
    rng = random.Random(17)
    vocab = _vocabulary(rng)

    def blocks() -> Iterator[str]:
        while True:
            lines = []
            for _ in range(20_000):
                words = " ".join(rng.choices(vocab, k=rng.randint(2, 12)))
                kind = rng.random()
                if kind < 0.5:
                    lines.append(f"{rng.choice(_EXC_NAMES)}: {words} Exception {words[:20]} Error")
                elif kind < 0.7:
                    lines.append(f"Traceback (most recent call last): {words} Error Exception")
                elif kind < 0.85:
                    lines.append(f'  File "/job/{words[:12]}.py", line {rng.randint(1, 999)}, in '
                                 f"{rng.choice(vocab)} Error")
                else:
                    lines.append(f"ERROR {words} Exception raised: Error {rng.choice(vocab)}")
            yield "\n".join(lines) + "\n"

    _write(path, size, blocks())


_FRAGMENTS = ("out of memory", "OOM", "Killed", "MemoryError", "CUDA", "allocate", "exit code",
              "signal", "memory", "Error", "killed", "Out of memory", "OutOfMemory", "oom",
              "Cannot allocate", "SIGKILL", "exhausted", "Traceback", "Exception", "137")


def gen_oom_fragments(path: Path, size: int) -> None:
    rng = random.Random(18)
    vocab = _vocabulary(rng)

    def blocks() -> Iterator[str]:
        while True:
            lines = []
            for _ in range(20_000):
                parts = []
                for _ in range(rng.randint(3, 10)):
                    parts.append(rng.choice(_FRAGMENTS) if rng.random() < 0.4
                                 else rng.choice(vocab))
                lines.append(" ".join(parts))
            yield "\n".join(lines) + "\n"

    _write(path, size, blocks())


def gen_oom_lookalikes(path: Path, size: int) -> None:
    rng = random.Random(19)

    def message() -> str:
        r = rng.random()
        a, b, c = rng.uniform(0.1, 80), rng.uniform(0.1, 80), rng.uniform(0.1, 80)
        if r < 0.35:
            return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {a:.2f} GiB. "
                    f"GPU {rng.randint(0, 7)} has a total capacity of 79.10 GiB of which "
                    f"{b:.2f} MiB is free. Of the allocated memory {c:.2f} GiB is allocated by "
                    "PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")
        if r < 0.55:
            return ("UserWarning: to avoid out of memory errors, set PYTORCH_CUDA_ALLOC_CONF="
                    f"max_split_size_mb:{rng.randint(64, 512)} (step {rng.randint(1, 10**6)})")
        if r < 0.7:
            return f"Caught OOM at batch {rng.randint(1, 512)}, retrying with a smaller batch"
        if r < 0.85:
            return (f"[rank{rng.randint(0, 63)}]: RuntimeError: CUDA out of memory. Tried to "
                    f"allocate {a:.2f} MiB (GPU 0; 4.00 GiB total capacity; {b:.2f} MiB "
                    f"already allocated; {c:.2f} MiB free; 850.00 MiB reserved in total by "
                    "PyTorch)")
        return (f"step {rng.randint(1, 10**6)}: peak memory {a:.2f} GiB of 80 GiB, out of memory "
                "headroom fine, no OOM")

    def blocks() -> Iterator[str]:
        while True:
            yield "\n".join(message() for _ in range(20_000)) + "\n"

    _write(path, size, blocks())


_NEAR_MISS = (
    "the loader ran out of memory budget for prefetching and slowed down",
    "Killed two birds with one stone, said the comment in {n}.py",
    "the process will exit when done; exit when the queue is empty",
    "No Error here, all {n} checks passed",
    "Traceback printing is disabled for step {n}",
    "NCCL INFO Channel {n}/24 : 0 1 2 3 4 5 6 7",
    "memory stats: allocated {n} MiB reserved {n} MiB",
    "to avoid out of memory errors the batch was capped at {n}",
    "signal handler installed for SIGUSR{n}",
    "worker {n} exited normally",
)


def gen_near_miss(path: Path, size: int) -> None:
    rng = random.Random(20)

    def blocks() -> Iterator[str]:
        while True:
            yield "\n".join(rng.choice(_NEAR_MISS).format(n=rng.randint(0, 99999))
                            for _ in range(20_000)) + "\n"

    _write(path, size, blocks())


def gen_long_lines(path: Path, size: int) -> None:
    rng = random.Random(21)
    vocab = _vocabulary(rng) + ["Error", "Exception", "memory", "Killed", "OOM", "Traceback"] * 20
    words = _word_lines(rng, vocab, 200_000, 200_000)

    def blocks() -> Iterator[str]:
        while True:
            target = rng.randint(300_000, 3_000_000)
            parts, n = [], 0
            while n < target:
                block = next(words).replace("\n", " ")
                parts.append(block)
                n += len(block)
            yield "".join(parts)[:target] + "\n"

    _write(path, size, blocks())


def gen_binary(path: Path, size: int) -> None:
    rng = random.Random(22)

    def blocks() -> Iterator[bytes]:
        while True:
            yield rng.randbytes(BLOCK)

    _write(path, size, blocks())


def gen_rank_prefixes(path: Path, size: int) -> None:
    rng = random.Random(23)
    vocab = _vocabulary(rng)

    def line() -> str:
        rank = rng.randint(0, 1023)
        words = " ".join(rng.choices(vocab, k=rng.randint(1, 15)))
        r = rng.random()
        if r < 0.3:
            return f"[default{rank % 8}]:[rank{rank}]: {words}"
        if r < 0.5:
            return f"[1,{rank}]<stderr>: {words}"
        if r < 0.65:
            return f"[1,mpirank:{rank},algo-{rank // 8 + 1}]<stdout>: {words}"
        if r < 0.8:
            return (f"node-{rank // 8}:{40000 + rank}:{41000 + rank} [{rank % 8}] NCCL INFO "
                    f"{words}")
        return (f'[default{rank % 8}]:{{"launch": "metrics", "rank": {rank}, "step": '
                f'{rng.randint(1, 10**5)}, "loss": {rng.random():.4f}}}')

    def blocks() -> Iterator[str]:
        while True:
            yield "\n".join(line() for _ in range(20_000)) + "\n"

    _write(path, size, blocks())


def _real_corpus() -> bytes:
    parts = []
    for directory in (SHARED, FIXTURES):
        if directory.is_dir():
            for p in sorted(directory.iterdir()):
                if p.suffix in (".log", ".jsonl"):
                    data = p.read_bytes()
                    parts.append(data if data.endswith(b"\n") else data + b"\n")
    if not parts:
        raise SystemExit(f"no real logs: expected {SHARED} or {FIXTURES}")
    return b"".join(parts)


def gen_real_logs(path: Path, size: int) -> None:
    corpus = _real_corpus()

    def blocks() -> Iterator[bytes]:
        while True:
            yield corpus * max(1, BLOCK // len(corpus))

    _write(path, size, blocks())


def gen_training_log(path: Path, size: int) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from bench_failures import generate

    generate(path, size / 2**20)


ADVERSARIAL: dict[str, Callable[[Path, int], None]] = {
    "random_words": gen_random_words,
    "dense_errors": gen_dense_errors,
    "oom_fragments": gen_oom_fragments,
    "oom_lookalikes": gen_oom_lookalikes,
    "near_miss": gen_near_miss,
    "long_lines": gen_long_lines,
    "binary": gen_binary,
    "rank_prefixes": gen_rank_prefixes,
}
REAL: dict[str, Callable[[Path, int], None]] = {
    "real_logs": gen_real_logs,
    "training_log": gen_training_log,
}


def measure(path: str) -> None:
    """In a fresh process: classify ``path`` with explain_stream; print timing and diagnosis."""
    sys.path.insert(0, str(REPO))
    from launcher.failures import explain_file

    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    diagnosis = explain_file(path)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu0,
                      "rss_peak_kib": usage.ru_maxrss, "diagnosis": diagnosis.to_dict()}))


def _launch_command() -> list[str]:
    """The installed console script when it runs this checkout, else the same entry point."""
    launch = shutil.which("launch", path=str(Path(sys.executable).parent))
    if launch and _installed_here():
        return [launch]
    return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from launcher.cli import entry; entry()", str(REPO)]


def _installed_here() -> bool:
    out = subprocess.run([sys.executable, "-c", "import launcher, sys; print(launcher.__file__)"],
                         capture_output=True, text=True, cwd="/")
    return out.returncode == 0 and Path(out.stdout.strip()).resolve().is_relative_to(REPO)


def _short(d: dict) -> str:
    parts = [d["failure"]]
    if d.get("cause"):
        parts.append(d["cause"])
    if d.get("signature"):
        parts.append(d["signature"])
    if d.get("line"):
        parts.append(f"line {d['line']}")
    return " / ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=200.0,
                        help="size of each adversarial input in MB (10**6 bytes)")
    parser.add_argument("--real-mb", type=float, default=100.0,
                        help="size of the real-log inputs in MB")
    parser.add_argument("--inputs", default="",
                        help="comma-separated subset of: " + ", ".join([*ADVERSARIAL, *REAL]))
    parser.add_argument("--keep-dir", type=Path, default=None,
                        help="write the inputs here and reuse those already there")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one classification may take before it is reported as over")
    parser.add_argument("--no-launch", action="store_true",
                        help="skip the end-to-end `launch explain` run")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return 0

    chosen = [x for x in args.inputs.split(",") if x] or [*ADVERSARIAL, *REAL]
    unknown = [x for x in chosen if x not in ADVERSARIAL and x not in REAL]
    if unknown:
        parser.error(f"unknown inputs: {', '.join(unknown)}")
    tmp = None
    if args.keep_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench_explain_")
        directory = Path(tmp.name)
    else:
        directory = args.keep_dir
        directory.mkdir(parents=True, exist_ok=True)
    ok = True
    try:
        print(f"{'input':16} {'MB':>7} {'seconds':>8} {'MB/s':>8} {'CPU s':>7} {'MB/CPU-s':>9} "
              f"{'RSS MiB':>8}  diagnosis")
        paths = {}
        for name in chosen:
            gen, mb = (ADVERSARIAL[name], args.size_mb) if name in ADVERSARIAL else (
                REAL[name], args.real_mb)
            path = directory / f"{name}_{mb:g}mb.txt"
            if not path.exists() or path.stat().st_size == 0:
                gen(path, int(mb * 1e6))
            paths[name] = path
            size = path.stat().st_size
            try:
                out = subprocess.run([sys.executable, __file__, "--measure", str(path)],
                                     capture_output=True, text=True, check=True,
                                     timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{name:16} {size / 1e6:7.1f} {'>' + format(args.timeout, '.0f'):>8} "
                      f"{'<' + format(size / 1e6 / args.timeout, '.2f'):>8}")
                ok = False
                continue
            result = json.loads(out.stdout)
            mb_s = size / 1e6 / result["seconds"]
            cpu_mb_s = size / 1e6 / max(result["cpu_seconds"], 1e-9)
            print(f"{name:16} {size / 1e6:7.1f} {result['seconds']:8.2f} {mb_s:8.1f} "
                  f"{result['cpu_seconds']:7.2f} {cpu_mb_s:9.1f} "
                  f"{result['rss_peak_kib'] / 1024:8.1f}  {_short(result['diagnosis'])}",
                  flush=True)
            ok = ok and mb_s >= TARGET_MB_S
        if not args.no_launch:
            name = "random_words" if "random_words" in paths else next(iter(paths))
            path = paths[name]
            command = [*_launch_command(), "explain", str(path), "--json"]
            shown = ("launch" if len(command) == 4 else "python -c 'launcher.cli.entry()'")
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            out = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
            seconds = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            if out.returncode != 0:
                print(f"launch explain failed ({out.returncode}): {out.stderr[-500:]}")
                ok = False
            else:
                size = path.stat().st_size
                print(f"end to end: `{shown} explain {path.name} --json`: {size / 1e6:.1f} MB in "
                      f"{seconds:.2f} s ({size / 1e6 / seconds:.1f} MB/s), CPU {cpu:.2f} s "
                      f"(start-up and import included); {_short(json.loads(out.stdout))}")
        return 0 if ok else 1
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
