"""Human-readable output: the plan table, the memory bar, the run summary (rich, to a stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

from launcher.plan.plan import OWN_OPTIMIZERS, Plan
from launcher.plan.planner import PlanResult
from launcher.units import format_bytes, format_count

if TYPE_CHECKING:
    from launcher.runs import Summary

_COLORS = ("blue", "magenta", "yellow", "green", "cyan", "white")
#: The plan table fits in this many columns (issue 14: it wrapped at 80 and at 140).
TABLE_WIDTH = 100
_PRECISION = {"fp32": "fp32", "bf16_mixed": "bf16m", "bf16": "bf16"}
#: The checkpointing column: "yes" is full checkpointing, as it was before selective existed.
_CKPT = {"none": "no", "selective": "sel", "full": "yes"}


def console(stream: TextIO, *, color: bool | None = None) -> Any:
    from rich.console import Console

    # A terminal's own width; a pipe or file (CI logs) gets 100 columns, which the table fits.
    width = None if getattr(stream, "isatty", lambda: False)() else TABLE_WIDTH
    return Console(file=stream, highlight=False, soft_wrap=True,
                   force_terminal=color, no_color=color is False, width=width)


def memory_parts(plan: Plan) -> list[tuple[str, int | None]]:
    """What one GPU holds at the peak, in parts that add up to ``memory.total``.

    Activations (forward/backward) and the optimizer step's temporaries are not alive at the
    same time, so the larger of the two is the peak's third part.
    """
    m = plan.memory
    act, temp = m.activations, m.temporary
    if act is not None and temp is not None and temp > act:
        step = ("optimizer-step temporaries", temp)
    else:
        step = ("activations", act)
    slack = (None if m.peak_reserved is None or m.peak_allocated is None
             else m.peak_reserved - m.peak_allocated)
    parts: list[tuple[str, int | None]] = [
        ("parameters", m.parameters), ("gradients", m.gradients), ("optimizer", m.optimizer),
        step]
    if slack is not None:
        parts.append(("allocator reserve", slack))
    if m.framework_overhead is not None:
        parts.append(("CUDA context + NCCL", m.framework_overhead))
    return parts


#: The memory bar's legend lines are at most this wide (a 100-column terminal, and a margin).
LEGEND_WIDTH = 98


def memory_bar(plan: Plan, width: int = 50) -> str:
    """One stacked bar per GPU (rich markup): the peak's parts against the capacity."""
    mem = plan.memory
    parts = memory_parts(plan)
    known = [(name, value) for name, value in parts if value is not None]
    used = mem.total if mem.total is not None else sum(v for _, v in known)
    scale = max(mem.capacity or 0, used) or 1
    cells = [(color, round(width * value / scale)) for (_, value), color in
             zip(known, _COLORS, strict=False)]
    bar = "".join(f"[{color}]{'█' * n}[/]" for color, n in cells)
    bar += "░" * max(0, width - sum(n for _, n in cells))
    items = [(f"[{c}]■[/] {p} {format_bytes(v)}", len(f"■ {p} {format_bytes(v)}"))
             for (p, v), c in zip(known, _COLORS, strict=False)]
    unknown = [name for name, value in parts if value is None]
    if unknown:
        note = f"(not estimated: {', '.join(unknown)})"
        items.append((note, len(note)))
    # broken between items, never inside one: a 100-column terminal wrapped "optimizer-step
    # temporaries" from its size
    lines: list[str] = []
    width_used = 0
    for markup, length in items:
        if lines and width_used + 2 + length <= LEGEND_WIDTH:
            lines[-1] += "  " + markup
            width_used += 2 + length
        else:
            lines.append(markup)
            width_used = length
    legend, tail = "\n".join(lines), ""
    # the local CPU's plan is of host memory, a process's share of it, not a GPU's
    unit = "per process (host memory)" if plan.machine == "local-cpu" else "per GPU"
    return f"{bar} {format_bytes(used)} of {format_bytes(mem.capacity)} {unit}\n{legend}{tail}"


def family(machine: str) -> str:
    """What a machine offers, for grouping candidates: its GPU type from the catalogs (an
    ``a2-highgpu-8g`` and an ``a2-megagpu-16g`` are both A100 40GB), else its name's family
    (``ml.p4de`` of ``ml.p4de.24xlarge``)."""
    kind = _gpu_kinds().get(machine)
    if kind:
        return kind
    if "+" in machine:  # Vertex's MACHINE+GPUxCOUNT
        return machine.split("+", 1)[1].rsplit("x", 1)[0].upper()
    if machine.startswith("ml."):
        return machine.rsplit(".", 1)[0]
    return machine.rsplit("-", 1)[0] if "-" in machine else machine


def _gpu_kinds() -> dict[str, str]:
    from launcher.plan.catalog import load_catalog
    from launcher.providers import catalogued

    if not _GPU_KINDS:
        for provider in catalogued():
            try:
                _GPU_KINDS.update({m.name: m.gpu for m in load_catalog(provider).machines})
            except Exception:  # noqa: BLE001 - grouping falls back on names
                pass
    return _GPU_KINDS


_GPU_KINDS: dict[str, str] = {}


def shown_plans(result: PlanResult, show_all: bool = False) -> list[Plan]:
    """The rows worth reading: the chosen plan; per strategy and GPU type, the best candidate
    that fits (then the cheapest, then the smallest per-GPU memory); and for a strategy with
    none that fits, its closest try. Every candidate with ``show_all``. In the planner's
    order."""
    if show_all:
        return [p for _, rows, _, _ in grouped_plans(result) for p in rows]

    def rank(plan: Plan) -> tuple[int, float, float]:
        return ({True: 0, None: 1, False: 2}[plan.fits],
                plan.total_cost_usd if plan.total_cost_usd is not None else float("inf"),
                float(plan.memory.total or plan.memory.model_states or 0))

    best: dict[tuple[str, str], Plan] = {}
    closest: dict[str, Plan] = {}
    for plan in result.plans:
        if plan.fits is not False:
            key = (plan.strategy, family(plan.machine))
            if key not in best or rank(plan) < rank(best[key]):
                best[key] = plan
        elif plan.strategy not in closest or (plan.memory.total or 0) < (
                closest[plan.strategy].memory.total or 0):
            closest[plan.strategy] = plan
    fitting = {p.strategy for p in best.values()}
    keep = {id(p) for p in best.values()} | {
        id(p) for s, p in closest.items() if s not in fitting}
    if result.chosen is not None:
        keep.add(id(result.chosen))
    return [p for p in result.plans if id(p) in keep]


def grouped_plans(result: PlanResult) -> list[tuple[str, list[Plan], int, int]]:
    """``--all``: every candidate, read by GPU type: per type (in the planner's order), its
    best candidate per strategy (fits first, then the cheapest, then the smallest per-GPU
    memory: the closest try where none fits), with how many candidates the type had and how
    many fit. A 70B search over a catalog is thousands of candidates, mostly the same
    strategy at another micro-batch or node count; ``--json`` keeps every one."""
    def rank(plan: Plan) -> tuple[int, float, float]:
        return ({True: 0, None: 1, False: 2}[plan.fits],
                plan.total_cost_usd if plan.total_cost_usd is not None else float("inf"),
                float(plan.memory.total or plan.memory.model_states or 0))

    groups: dict[str, list[Plan]] = {}
    for plan in result.plans:
        groups.setdefault(family(plan.machine), []).append(plan)
    out = []
    for kind, plans in groups.items():
        best: dict[str, Plan] = {}
        for plan in plans:
            label = plan.strategy_label
            if label not in best or rank(plan) < rank(best[label]):
                best[label] = plan
        if any(p is result.chosen for p in plans):  # the chosen plan stands for its strategy
            best[result.chosen.strategy_label] = result.chosen  # type: ignore[union-attr]
        keep = {id(p) for p in best.values()}
        rows = [p for p in plans if id(p) in keep]
        out.append((kind, rows, len(plans), sum(1 for p in plans if p.fits)))
    return out


def format_seconds(value: float | None) -> str:
    """Three significant digits at any scale: ``0.00s`` said nothing about a 40 us step."""
    if value is None:
        return "-"
    if value >= 1 or value == 0:
        return f"{value:.3g}s" if value < 100 else f"{value:,.0f}s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g}ms"
    return f"{value * 1e6:.3g}us"


def format_usd(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or value >= 1:
        return f"{value:,.2f}"
    return f"{value:.2g}"


def print_plan(out: Any, result: PlanResult, show_all: bool = False,
               script_args: tuple[str, ...] | list[str] = ()) -> None:
    """The plan table, the chosen plan and its memory, the rejections and notes; first the
    script's own arguments when it has any (quoted as a shell would need them: a display only,
    the script gets the list)."""
    import shlex

    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if script_args:
        out.print(f"script arguments: {escape(shlex.join(script_args))}", soft_wrap=False,
                  highlight=False)
    out.print(f"model: {format_count(result.parameters)} parameters ({result.source})")
    groups = grouped_plans(result) if show_all else [("", shown_plans(result), 0, 0)]
    rows = [p for _, members, _, _ in groups for p in members]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    for name in ("", "strategy", "machine", "procs", "batch", "prec", "ckpt", "per GPU",
                 "fits", "step", "total $"):
        table.add_column(name, no_wrap=True,
                         justify="right" if name in ("per GPU", "step", "total $") else "left")
    for kind, members, tried, fitting in groups:
        if kind:
            table.add_row("", f"[bold]{kind}[/]", f"[dim]{fitting} of {tried} fit[/]",
                          *[""] * 8)
        for plan in members:
            _add_row(table, plan, result.chosen)
    out.print(table)
    hidden = len(result.plans) - len(rows)
    if hidden and show_all:
        out.print(f"[dim]{len(result.plans)} candidates: the best per strategy and GPU type "
                  "above; --json lists every one; batch is micro-batch x accumulation[/]",
                  soft_wrap=False)
    elif hidden:
        out.print(f"[dim]{hidden} more candidate(s): --all shows every one; batch is micro-batch "
                  "x accumulation[/]", soft_wrap=False)
    _print_chosen(out, result)


def _add_row(table: Any, plan: Plan, chosen: Plan | None) -> None:
    """One candidate's row of the plan table."""
    mark = "→" if plan is chosen else ""
    per_gpu = (format_bytes(plan.memory.total) if plan.memory.total is not None
               else f">{format_bytes(plan.memory.model_states)}"
               if plan.memory.model_states is not None else "?")
    table.add_row(
        mark, plan.strategy_label, plan.machine, f"{plan.nodes}x{plan.gpus_per_node}",
        f"{plan.micro_batch_size}x{plan.grad_accum_steps}",
        _PRECISION.get(plan.precision, plan.precision),
        _CKPT[plan.checkpointing or "none"], per_gpu,
        {True: "yes", False: "NO", None: "?"}[plan.fits],
        format_seconds(plan.step_time_s), format_usd(plan.total_cost_usd),
    )


def _print_chosen(out: Any, result: PlanResult) -> None:
    """The chosen plan, its memory and headroom, where its settings came from; then the
    rejected options and the notes."""
    if result.chosen is not None:
        c = result.chosen
        price = "" if c.cost_per_hour_usd is None else f", ${format_usd(c.cost_per_hour_usd)}/h"
        every = ", reduce-scatter every micro-step" if c.reduce_every_micro_step else ""
        out.print(f"chosen: {c.strategy_label} on {c.nodes} x {c.machine}{price}, "
                  f"{c.optimizer_class or c.optimizer}{every} (global batch "
                  f"{c.global_batch_size})", soft_wrap=False)
        out.print(memory_bar(result.chosen), soft_wrap=False)
        room = headroom_words(result.chosen)
        if room:
            out.print(room, soft_wrap=False)
        settings = origin_words(result)
        if settings:
            out.print(f"settings: {settings}", soft_wrap=False)
    for rejection in result.rejected:  # wrapped by words at the console's width
        out.print(f"[red]rejected[/] {rejection.option}: {rejection.reason}", soft_wrap=False)
    for note in result.notes:
        out.print(f"[dim]note: {note}[/]", soft_wrap=False)


def headroom_words(plan: Plan) -> str | None:
    """``headroom 16.6 GiB per GPU (76.0 GiB usable of 80.0 GiB, 5% kept free)``: how far the
    chosen plan is from the memory it may use; None where its total is not known."""
    from launcher.estimate.overheads import SAFETY_MARGIN

    m = plan.memory
    if m.headroom is None or m.usable is None or m.capacity is None:
        return None
    unit = "per process" if plan.machine == "local-cpu" else "per GPU"
    sized = (f"; one rank traced at its world size of {plan.world_size}" if m.rank_traced
             else "")
    return (f"headroom {format_bytes(m.headroom)} {unit} ({format_bytes(m.usable)} usable "
            f"of {format_bytes(m.capacity)}, {SAFETY_MARGIN:.0%} kept free{sized})")


#: The plan's settings as the plan line names them, in this order.
_SETTING_NAMES = {"global_batch_size": "global batch", "micro_batch_size": "micro-batch",
                  "steps": "steps", "lr": "lr", "optimizer": "optimizer",
                  "precision": "precision", "strategy": "strategy", "machine": "machine",
                  "nodes": "nodes", "gpus_per_node": "processes per node",
                  "checkpointing": "checkpointing", "seq_len": "sequence length"}


def origin_words(result: PlanResult) -> str:
    """The chosen plan's settings with where each came from: ``steps 2 (the script's own: 1
    epoch of 2 batches); lr 0.0003 (launch's default)``. A framework script's unknown length
    reads ``steps unknown``."""
    chosen = result.chosen
    if chosen is None:
        return ""
    parts = []
    for key, name in _SETTING_NAMES.items():
        if key not in result.origins:
            continue
        value, origin = getattr(chosen, key), result.origins[key]
        if key == "optimizer" and chosen.optimizer_class:  # the script's own, as traced
            value = chosen.optimizer_class
        elif key == "optimizer" and origin in OWN_OPTIMIZERS:  # not traced: only a name
            origin += " (the name is launch's default)"
        shown = "unknown" if value is None else f"{value:g}" if isinstance(value, float) else value
        parts.append(f"{name} {shown} ({origin})")
    return "; ".join(parts)


def print_summary(out: Any, run_id: str, status_name: str, summary: Summary,
                  attempts: int | list[Any]) -> None:
    """A run's last attempt, in words: what its events did not report is said to be unknown
    (a plain script writes none), never shown as 0, None or ?. Given the attempts themselves
    (``runs.Attempt``), each one's outcome and change, and the plan the last one ran."""
    why = summary.not_reported
    unknown = f"not reported ({why})" if why else "not reported"
    peak, rss = summary.peak_allocated_bytes, summary.peak_rss_bytes
    peak_text = (f"{format_bytes(peak)} allocated, "
                 f"{format_bytes(summary.peak_reserved_bytes)} reserved (max over ranks)"
                 if peak is not None else f"{format_bytes(rss)} RSS (max over ranks)"
                 if rss is not None else "not reported")
    loss, steps = summary.loss, summary.steps
    out.print(f"\nrun {run_id}: {status_name}")
    out.print(f"  steps       {steps if steps is not None else unknown}")
    out.print(f"  loss        {loss:.4f}" if isinstance(loss, (int, float))
              else "  loss        not reported")
    out.print(f"  peak memory {peak_text}")
    out.print(f"  checkpoint  {summary.checkpoint or 'none'}")
    if isinstance(attempts, int):
        out.print(f"  attempts    {attempts}")
        return
    out.print(f"  attempts    {len(attempts)}")
    if len(attempts) > 1:
        for attempt in attempts:
            outcome = getattr(attempt.outcome, "value", attempt.outcome) or attempt.state
            out.print(f"    {attempt.number}: {outcome:<13} {attempt.change}")
    if attempts:
        out.print(f"  plan        {plan_words(attempts[-1].plan)}")


def plan_words(plan: Plan) -> str:
    """A recorded plan in a line: ``fsdp on 2 x ml.p4d.24xlarge (8 GPUs each), micro-batch 2 x
    4 accumulation, bf16_mixed, full checkpointing``."""
    each = f" ({plan.gpus_per_node} GPUs each)" if plan.gpus_per_node > 1 else ""
    checkpointing = plan.checkpointing or "none"
    return (f"{plan.strategy} on {plan.nodes} x {plan.machine}{each}, micro-batch "
            f"{plan.micro_batch_size} x {plan.grad_accum_steps} accumulation, {plan.precision}"
            + ("" if checkpointing == "none" else f", {checkpointing} checkpointing"))


def format_log_line(line: str) -> str:
    """A job's output line for a person: the templates' JSON events become short sentences. A
    line that only looks like an event (a field of the wrong type, nested too deep) is shown as
    written."""
    try:
        return _format_event(line)
    except (TypeError, ValueError, AttributeError, RecursionError):
        return line


def _format_event(line: str) -> str:
    from launcher.events import parse_event
    from launcher.units import format_bytes

    event = parse_event(line)
    if event is None:
        return line
    prefix = f"[rank{event.get('rank', '?')}] "
    kind = event.get("launch")
    if kind == "metrics":
        peak = event.get("peak_allocated_bytes")
        memory = (f"peak {format_bytes(peak)} alloc / "
                  f"{format_bytes(event.get('peak_reserved_bytes'))} reserved"
                  if peak is not None else f"rss {format_bytes(event.get('rss_bytes'))}")
        loss = event.get("loss")
        loss_text = f"{loss:.4f}" if isinstance(loss, (int, float)) else str(loss)
        rate = event.get("samples_per_s") or 0.0
        return (f"{prefix}step {event.get('step')}  loss {loss_text}  "
                f"{rate:.0f} samples/s  {memory}")
    if kind == "checkpoint":
        return f"{prefix}checkpoint at step {event.get('step')}: {event.get('path')}"
    if kind == "resume":
        return f"{prefix}resumed from step {event.get('step')}: {event.get('path')}"
    if kind == "done":
        return f"{prefix}done at step {event.get('step')}"
    if kind == "oom":
        return (f"{prefix}OUT OF MEMORY in {event.get('phase')} at step {event.get('step')} "
                f"micro-step {event.get('micro_step')}: {event.get('message')}")
    return line


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_loss(value: Any) -> str:
    """A loss to 4 significant digits (``3.283``, ``0.0001235``, ``nan``)."""
    return f"{value:.4g}"


def format_attempt(attempt: Any, state: str) -> str:
    """One attempt of `launch status` for a person: its state, then only what is known
    (outcome, steps, loss to 4 significant digits, cost, what changed): never ``None``."""
    summary = attempt.summary
    parts = [f"attempt {attempt.number}: {state:<10}"]
    if attempt.outcome is not None:
        parts.append(f"outcome={attempt.outcome}")
    steps = summary.steps
    if _number(steps):
        parts.append(f"step={steps:g}" if isinstance(steps, float) else f"step={steps}")
    loss = summary.loss
    if _number(loss):
        parts.append(f"loss={format_loss(loss)}")
    if _number(attempt.cost_usd) and attempt.cost_usd:
        parts.append(f"cost=${format_usd(attempt.cost_usd)}")
    line = " ".join(parts)
    return (f"{line}  {attempt.change}" if attempt.change else line).rstrip()


def format_age(seconds: float) -> str:
    """How long ago, in the largest unit that is at least 1: ``3 min ago``, ``2 h ago``."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return "-"
    if seconds < 60:
        return "just now" if seconds < 5 else f"{int(seconds)} s ago"
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {'day' if unit == 'days' and count == 1 else unit} ago"
    return "-"


def format_runs(runs: list[Any], state_dir: Any, home: str | None, now: float | None = None
                ) -> str:
    """`launch runs` for a person: a table, newest first; the folder column says where each
    run's project is (``.`` for this folder's state folder)."""
    import os
    import time

    now = time.time() if now is None else now
    here = os.path.normpath(str(state_dir))
    rows = [("RUN", "SCRIPT", "PROVIDER", "STATE", "ATTEMPTS", "COST", "AGE", "FOLDER")]
    for run in runs:
        folder = os.path.normpath(str(run.path.parent.parent))
        if folder == here:
            where = "."
        else:
            project = os.path.dirname(folder) if os.path.basename(folder) == ".launch" else folder
            if home and (project + "/").startswith(home.rstrip("/") + "/"):
                project = "~" + project[len(home.rstrip("/")):]
            where = project
        state = run.state or "-"
        if run.outcome and run.outcome not in ("success", state):
            state = f"{state} ({run.outcome})"
        rows.append((run.run_id, os.path.basename(run.script) if run.script else "-",
                     run.provider or "-", state, str(run.attempts),
                     "-" if run.cost_usd is None else f"${format_usd(run.cost_usd)}",
                     format_age(now - run.created_at), where))
    # Cells come from state files: nothing in them may move the cursor or break the table.
    rows = [tuple("".join(c if c.isprintable() else "?" for c in cell) for cell in row)
            for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
                   + "  " + row[-1] + "\n" for row in rows)


_HTML_COLORS = ("#4a78c2", "#b05ab8", "#d9a520", "#4caf50", "#26a6b8", "#9e9e9e")


#: The narrowest a known part of the HTML memory bar is drawn (percent): a plan of KiB on a
#: machine of GiB would otherwise draw an empty bar.
MIN_BAR_PERCENT = 0.8


def plan_html(result: PlanResult, title: str, command: str = "") -> str:
    """The plan as a self-contained HTML page (CI artifact): the command that made it and
    when, the chosen plan's memory bar, every candidate, the rejected options and the notes.
    Rendered by jinja2 with autoescaping: every value is text."""
    import datetime

    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("launcher", "report_templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    chosen = result.chosen
    parts, used, capacity = [], "?", "?"
    if chosen is not None:
        known = [(n, v) for n, v in memory_parts(chosen) if v is not None]
        total = chosen.memory.total if chosen.memory.total is not None else sum(
            v for _, v in known)
        scale = max(chosen.memory.capacity or 0, total) or 1
        parts = [{"name": n, "size": format_bytes(v),
                  "percent": f"{max(100 * v / scale, MIN_BAR_PERCENT if v else 0):.2f}",
                  "color": c} for (n, v), c in zip(known, _HTML_COLORS, strict=False)]
        used, capacity = format_bytes(total), format_bytes(chosen.memory.capacity)
    rows = [{
        "chosen": p is chosen, "strategy": p.strategy_label, "machine": p.machine,
        "layout": f"{p.nodes} x {p.gpus_per_node}",
        "batch": f"{p.micro_batch_size} x {p.grad_accum_steps}",
        "ckpt": _CKPT[p.checkpointing or "none"],
        "states": format_bytes(p.memory.model_states), "total": format_bytes(p.memory.total),
        "capacity": format_bytes(p.memory.capacity),
        "fits": {True: "yes", False: "no", None: "?"}[p.fits],
        "fits_class": {True: "yes", False: "no", None: ""}[p.fits],
        "price": format_usd(p.cost_per_hour_usd), "cost": format_usd(p.total_cost_usd),
    } for p in shown_plans(result)]  # the terminal's rows
    unit = ("Per process (host memory)" if chosen is not None and chosen.machine == "local-cpu"
            else "Per GPU")
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return env.get_template("plan.html.j2").render(
        title=title, parameters=format_count(result.parameters), source=result.source,
        chosen=chosen, parts=parts, used=used, capacity=capacity, rows=rows, unit=unit,
        rejected=result.rejected, notes=result.notes, command=command, when=when)


def shown_command(argv: list[str]) -> str:
    """The command line for a report: launch's own options as given; the script's arguments
    (after ``--``) counted, not shown (they may carry a token; plan.json has them)."""
    import shlex

    own = argv[:argv.index("--")] if "--" in argv else list(argv)
    rest = len(argv) - len(own) - 1 if "--" in argv else 0
    return shlex.join(["launch", *own]) + (f" -- ({rest} script argument"
                                           f"{'' if rest == 1 else 's'})" if rest else "")
