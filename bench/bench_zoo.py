"""The estimator on models nobody on this project wrote: transformers' own classes.

Every model of bench/zoo_hf.py (decoder LMs, encoder-decoders, encoders, vision, mixture of
experts: transformers' classes from small configs, random init, the configs' default dropout, the
model's own loss) is traced on fake tensors (``trace_recipe``) and really run on the CPU
(``measure_recipe``: two optimizer steps, the peak from the CPU allocator's own events), and the
two peaks compared.

One trace per (model, precision, checkpointing) answers every (micro-batch, accumulation): it is
traced at micro-batches ``--sizes`` (1, 2, 4) with ``grad_accum_steps=2`` (its first micro-step
is a step without accumulation, its second one with; ``peak_at(b, accum)``), and the larger
micro-batches measured here (8, 32) come from its fitted lines only, so they test the fit too.

Rows (``--quick``: part 1 only):

1. every model at micro-batch 8, accumulation 1 and 4, fp32, no checkpointing;
2. ``--grid-models`` across the other axes: fp32 and bf16_mixed, checkpointing off and on,
   micro-batches ``--grid-batches`` (1, 8, 32: 1 for fp32 without checkpointing only),
   accumulation 1 and 4;
3. ``--dist-models`` under DDP and FSDP at 2 ranks: rank 0 traced in one process
   (``strategy={...}``; a strategy trace answers only its own side of accumulation, so accum 1
   is traced with ``grad_accum_steps=1`` and accum 4 with 2) against a real 2-process gloo run
   (``bench_estimate_dist.measure_world``), the real peak without gloo's own buffers (the raw
   peak is in the JSON), the worse rank.

    .venv/bin/python bench/bench_zoo.py --json /tmp/zoo.json          # everything, ~20 min
    .venv/bin/python bench/bench_zoo.py --quick                         # part 1, ~5 min
    .venv/bin/python bench/bench_zoo.py --models llama,bert --grid-models llama --dist-models ''

Every trace and real run is a child process (the launcher's own); ``--jobs`` of them at a time.
A model that fails to trace gets rows with the error and the real step's peak alone (or its
error too, when the real step fails as well: then it is the model's or the template's failure,
not the estimator's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from launcher.estimate.traced import measure_recipe, trace_recipe  # noqa: E402

#: Part 1's models, in the table's order (zoo_hf.MODELS, without importing torch here).
MODELS = ("llama", "llama_masked", "gpt2", "qwen2", "t5", "bart", "whisper", "bert", "roberta",
          "vit", "swin", "convnext", "mixtral", "mixtral_eager", "qwen2_moe")
GRID_MODELS = ("llama", "gpt2", "t5", "bert", "vit")
DIST_MODELS = ("llama", "bert", "t5")
TIMEOUT_S = 900


@dataclass
class Row:
    model: str
    b: int
    accum: int
    precision: str
    ckpt: bool
    strategy: str
    traced: int | None = None
    real: int | None = None
    error: float | None = None
    kind: str | None = None  # traced | real_run | upper_bound
    fitted: bool = False  # b was not a traced size: the fit's answer
    real_raw: list[int] = field(default_factory=list)  # distributed: each rank, gloo included
    real_ranks: list[int] = field(default_factory=list)  # distributed: each rank, without gloo
    trace_s: float | None = None
    real_s: float | None = None
    failure: str | None = None  # the trace's or the real run's one-line error


@dataclass
class Group:
    """One trace and the rows it answers."""

    model: str
    precision: str
    ckpt: bool
    strategy: str  # single | ddp | fsdp
    trace_accum: int  # grad_accum_steps of the trace
    cases: list[tuple[int, int]]  # (b, accum)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


def plan(models: list[str], grid_models: list[str], dist_models: list[str],
         grid_batches: list[int], quick: bool) -> list[Group]:
    groups: dict[tuple[Any, ...], Group] = {}

    def add(model: str, precision: str, ckpt: bool, strategy: str, b: int, accum: int) -> None:
        trace_accum = 2 if strategy == "single" or accum > 1 else 1
        key = (model, precision, ckpt, strategy, trace_accum)
        group = groups.setdefault(key, Group(model, precision, ckpt, strategy, trace_accum, []))
        if (b, accum) not in group.cases:
            group.cases.append((b, accum))

    for model in models:
        for accum in (1, 4):
            add(model, "fp32", False, "single", 8, accum)
    if not quick:
        for model in grid_models:
            for precision in ("fp32", "bf16_mixed"):
                for ckpt in (False, True):
                    batches = grid_batches if (precision, ckpt) == ("fp32", False) else [
                        b for b in grid_batches if b != 1]
                    for b in batches:
                        for accum in (1, 4):
                            add(model, precision, ckpt, "single", b, accum)
        for model in dist_models:
            for strategy in ("ddp", "fsdp"):
                for accum in (1, 4):
                    add(model, "fp32", False, strategy, 8, accum)
    return list(groups.values())


def run_group(group: Group, directory: Path, sizes: tuple[int, ...],
              report: Any) -> list[Row]:
    import zoo_hf

    recipe = zoo_hf.write_recipe(group.model, directory)
    strategy = None if group.strategy == "single" else {"name": group.strategy, "world_size": 2}
    rows = [Row(group.model, b, a, group.precision, group.ckpt, group.strategy)
            for b, a in group.cases]
    started = time.perf_counter()
    try:
        trace = trace_recipe(recipe, device="cpu", micro_batch_sizes=sizes,
                             grad_accum_steps=group.trace_accum, precision=group.precision,
                             activation_checkpointing=group.ckpt, strategy=strategy,
                             timeout_s=TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a failure is a result here
        trace, failure = None, f"trace: {_one_line(exc)}"
    trace_s = round(time.perf_counter() - started, 1)
    for row in rows:
        row.trace_s = trace_s
        if trace is None:
            # Still run the real step: does it fail too (the model, not the estimator)?
            row.failure = failure
        else:
            row.kind, row.fitted = trace.kind, row.b not in trace.per_size
            try:
                row.traced = trace.peak_at(row.b, row.accum)
            except Exception as exc:  # noqa: BLE001
                row.failure = f"peak_at: {_one_line(exc)}"
        started = time.perf_counter()
        try:
            if strategy is None:
                row.real = measure_recipe(
                    recipe, micro_batch=row.b, grad_accum_steps=row.accum,
                    precision=group.precision, activation_checkpointing=group.ckpt,
                    timeout_s=TIMEOUT_S).peak_allocated
            else:
                from bench_estimate_dist import measure_world

                ranks = measure_world(recipe, strategy, micro_batch=row.b,
                                      grad_accum_steps=row.accum, precision=group.precision,
                                      activation_checkpointing=group.ckpt, timeout_s=TIMEOUT_S)
                row.real_raw = [r["peak_allocated"] for r in ranks]
                row.real_ranks = [r["without_backend"]["peak"] for r in ranks]
                # the rank the trace is furthest from
                row.real = max(row.real_ranks, key=lambda r: abs((row.traced or 0) - r))
        except Exception as exc:  # noqa: BLE001
            real = f"real run: {_one_line(exc)}"
            row.failure = f"{row.failure}; {real}" if row.failure else real
        else:
            if row.failure:
                row.failure += "; the real run works"
        row.real_s = round(time.perf_counter() - started, 1)
        if row.real and row.traced is not None:
            row.error = (row.traced - row.real) / row.real
        report(row)
    return rows


def summary(rows: list[Row]) -> dict[str, Any]:
    done = [r for r in rows if r.error is not None]
    if not done:
        return {"rows": len(rows), "compared": 0, "failed": len(rows)}
    under = min(done, key=lambda r: r.error)
    over = max(done, key=lambda r: r.error)

    def where(r: Row) -> dict[str, Any]:
        return {"model": r.model, "b": r.b, "accum": r.accum, "precision": r.precision,
                "ckpt": r.ckpt, "strategy": r.strategy, "error": r.error}

    return {
        "rows": len(rows), "compared": len(done), "failed": len(rows) - len(done),
        "median_abs_error": statistics.median(abs(r.error) for r in done),
        "mean_abs_error": statistics.fmean(abs(r.error) for r in done),
        "within_0.1%": sum(abs(r.error) <= 0.001 for r in done),
        "within_1%": sum(abs(r.error) <= 0.01 for r in done),
        "worst_under": where(under) if under.error < 0 else None,
        "worst_over": where(over) if over.error > 0 else None,
    }


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.3f}%"


def _abs_pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:.4f}%"


def _bytes(x: int | None) -> str:
    return "" if x is None else f"{x:,}"


def print_table(rows: list[Row]) -> None:
    print("\n| model | b | accum | precision | ckpt | strategy | traced (B) | real (B) "
          "| traced - real (B) | error | how |")
    print("| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        how = r.failure or f"{r.kind}{', fit' if r.fitted else ''}"
        print(f"| {r.model} | {r.b} | {r.accum} | {r.precision} | {'on' if r.ckpt else 'off'} | "
              f"{r.strategy} | {_bytes(r.traced)} | {_bytes(r.real)} | "
              f"{_bytes(None if r.error is None else r.traced - r.real)} | {_pct(r.error)} | "
              f"{how} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="part 1's models")
    parser.add_argument("--grid-models", default=",".join(GRID_MODELS),
                        help="part 2's models (precision x checkpointing x b x accum)")
    parser.add_argument("--dist-models", default=",".join(DIST_MODELS),
                        help="part 3's models (DDP and FSDP at 2 gloo ranks)")
    parser.add_argument("--grid-batches", default="1,8,32")
    parser.add_argument("--sizes", default="1,2,4", help="traced micro-batches")
    parser.add_argument("--quick", action="store_true", help="part 1 only")
    parser.add_argument("--jobs", type=int, default=2, help="traces/real runs at a time")
    parser.add_argument("--json", default=None, help="also write rows and summary here")
    args = parser.parse_args(argv)

    def names(text: str) -> list[str]:
        return [n for n in text.split(",") if n]

    import zoo_hf

    for name in names(args.models) + names(args.grid_models) + names(args.dist_models):
        if name not in zoo_hf.MODELS:
            parser.error(f"unknown model {name!r} ({', '.join(zoo_hf.MODELS)})")
    groups = plan(names(args.models), names(args.grid_models), names(args.dist_models),
                  [int(x) for x in args.grid_batches.split(",")], args.quick)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    directory = Path(tempfile.mkdtemp(prefix="bench_zoo_"))
    lock = threading.Lock()
    started = time.perf_counter()

    def report(row: Row) -> None:
        with lock:
            print(f"[{time.perf_counter() - started:6.0f}s] {row.model} b={row.b} "
                  f"accum={row.accum} {row.precision} ckpt={row.ckpt} {row.strategy}: "
                  f"traced {_bytes(row.traced)} real {_bytes(row.real)} {_pct(row.error)}"
                  f"{' ' + row.failure if row.failure else ''}", file=sys.stderr, flush=True)

    print(f"{len(groups)} traces, {sum(len(g.cases) for g in groups)} rows, recipes in "
          f"{directory}", file=sys.stderr, flush=True)
    # Distributed groups (two ranks each) first, so that the last minutes are not them alone.
    order = sorted(groups, key=lambda g: g.strategy == "single")
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = dict(zip(map(id, order),
                           pool.map(lambda g: run_group(g, directory, sizes, report), order),
                           strict=True))
    rows = [row for g in groups for row in results[id(g)]]
    wall = round(time.perf_counter() - started, 1)

    print_table(rows)
    out = summary(rows)
    print(f"\n{out['compared']} rows compared ({out['failed']} without a comparison) in {wall} s: "
          f"median |error| {_abs_pct(out.get('median_abs_error'))}, "
          f"{out.get('within_0.1%', 0)} within 0.1%, {out.get('within_1%', 0)} within 1%")
    for label in ("worst_under", "worst_over"):
        w = out.get(label)
        if w:
            print(f"  {label.replace('_', ' ')}: {_pct(w['error'])} ({w['model']}, b={w['b']}, "
                  f"accum {w['accum']}, {w['precision']}, ckpt {'on' if w['ckpt'] else 'off'}, "
                  f"{w['strategy']})")
        else:
            print(f"  {label.replace('_', ' ')}: none")
    failures = sorted({(r.model, r.failure) for r in rows if r.failure})
    if failures:
        print("\nFailures:")
        for model, failure in failures:
            print(f"  {model}: {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"wall_s": wall, "sizes": list(sizes), "summary": out,
             "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
