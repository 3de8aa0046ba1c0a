"""The submit / watch / replan loop, one for every provider.

For each attempt: render the plan into the run folder, submit it, follow the job's log lines as
they arrive and read the templates' structured events from them. On an out-of-memory event the job
is stopped at once (other ranks would otherwise hang on a collective until a timeout). Whether a
fixed plan can be derived from the failure is the replanner's business (``replan``); when it has
none, or the attempts are used up, the run ends with exit status 5.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launcher import faults
from launcher.events import OomEvent, parse_event
from launcher.plan.plan import Plan
from launcher.providers import LOCAL
from launcher.providers.base import Job, JobState, Provider
from launcher.remedies import Failure
from launcher.render import RenderedJob, TrainSettings, render
from launcher.runs import Attempt, Diagnosed, Outcome, Run, Summary
from launcher.script_info import env_flags
from launcher.spec import Spec
from launcher.status import ExitStatus

MEMORY_FAILURES = ("gpu_oom", "host_oom")
#: How long to wait for the templates' structured OOM line after the allocator's message.
STOP_GRACE_S = 0.5

#: The follower says it is behind once the log it shows trails the job by this many seconds, and
#: again when that doubles or a minute has passed (a chatty job against a log API's read quota).
BEHIND_NOTE_S = 10.0
BEHIND_REPEAT_S = 60.0

#: Replanner: (failed plan, the failure) -> (new plan, what changed and why), None (no change
#: helps), or a sentence (a change would help, but the script cannot see it).
Replanner = Callable[[Plan, Failure], "tuple[Plan, str] | str | None"]

#: Why a job's summary has no steps, loss or peak memory: it wrote no progress events.
UNREPORTED = "the job wrote no progress events"
PLAIN_UNREPORTED = "a plain script reports no progress events"


@dataclass
class Progress:
    """What the structured lines said so far, across ranks."""

    step: int = 0
    loss: float | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    peak_rss: int | None = None
    checkpoint: str | None = None
    resumed_from: int | None = None
    oom: OomEvent | None = None
    done_ranks: set[int] = field(default_factory=set)
    #: Whether any line said where training was (metrics, done, resume, oom): a plain script
    #: writes none, and then its steps are unknown, not 0.
    reported: bool = False

    def update(self, event: dict[str, Any]) -> None:
        kind = event.get("launch")
        rank = event.get("rank", 0)
        if kind in ("metrics", "done", "resume", "oom"):
            self.reported = True
        if kind == "metrics":
            if rank == 0:
                self.step = max(self.step, int(event.get("step", 0)))
                self.loss = event.get("loss", self.loss)
            self.peak_allocated = _max(self.peak_allocated, event.get("peak_allocated_bytes"))
            self.peak_reserved = _max(self.peak_reserved, event.get("peak_reserved_bytes"))
            self.peak_rss = _max(self.peak_rss, event.get("rss_bytes"))
        elif kind == "checkpoint":
            self.checkpoint = event.get("path", self.checkpoint)
        elif kind == "resume" and rank == 0:
            self.resumed_from = event.get("step")
        elif kind == "oom" and self.oom is None:
            self.oom = OomEvent.from_event(event)
        elif kind == "done":
            self.done_ranks.add(rank)
            if rank == 0:
                self.step = max(self.step, int(event.get("step", 0)))
                self.loss = event.get("loss", self.loss)
                self.checkpoint = event.get("checkpoint") or self.checkpoint

    def summary(self, unreported: str = UNREPORTED) -> dict[str, Any]:
        """What the events said; without any, ``steps`` is None (not 0) and ``not_reported``
        says why (``unreported``)."""
        out = {
            "steps": self.step if self.reported else None, "loss": self.loss,
            "peak_allocated_bytes": self.peak_allocated,
            "peak_reserved_bytes": self.peak_reserved, "peak_rss_bytes": self.peak_rss,
            "checkpoint": self.checkpoint, "resumed_from_step": self.resumed_from,
        }
        if not self.reported:
            out["not_reported"] = unreported
        return out


def _max(a: int | None, b: Any) -> int | None:
    if b is None:
        return a
    return int(b) if a is None else max(a, int(b))


#: The longest a quoted line gets in the one-line failure message.
_QUOTE_CHARS = 200


def _one_line(text: object) -> str:
    """The first non-blank line of ``text``, at most :data:`_QUOTE_CHARS` characters."""
    line = next((part.strip() for part in str(text or "").splitlines() if part.strip()), "")
    return line if len(line) <= _QUOTE_CHARS else line[:_QUOTE_CHARS - 3] + "..."


def _failure_line(attempt: Attempt) -> str:
    """Why an attempt failed, in one line: the provider's message ("torchrun: rank 1 failed with
    exit code 1") and the first failure the log shows ("(first failure: ValueError: ...)"). The
    job's own output (a worker's traceback, torchrun's ChildFailedError table) stays in its log,
    as printed; it is never repeated here."""
    line = _one_line(attempt.summary.message) or "the job failed"
    if attempt.diagnosis is None:
        return line
    diagnosis = attempt.diagnosis.diagnosis
    excerpt = _one_line(diagnosis.excerpt)
    if diagnosis.failure != "none" and excerpt and excerpt not in line:
        line += f" (first failure: {excerpt})"
    return line


def _lost_capacity(attempt: Attempt, provider: Provider) -> bool:
    """Preempted, or never given its machines (in the words of the provider's platform:
    ``Provider.lost_capacity``): worth the same plan again (resumed)."""
    if attempt.diagnosis is not None and attempt.diagnosis.diagnosis.signature == "preemption":
        return True
    return provider.lost_capacity(attempt.summary.message or "")


def build_job(spec: Spec, plan: Plan, run_id: str, number: int, run_path: Path) -> Job:
    """The job of one attempt, rendered but not written: ``launch plan`` shows its request."""
    settings = TrainSettings(
        recipe_file=str(spec.script.resolve()), mode=spec.mode,  # type: ignore[arg-type]
        run_id=run_id, attempt=number, checkpoint_dir=str(run_path / "checkpoints"),
        log_every=spec.log_every, checkpoint_every=spec.checkpoint_every, seed=spec.seed,
        max_grad_norm=spec.max_grad_norm, weight_decay=spec.weight_decay,
        framework=spec.framework, pinned=list(spec.pinned),
    )
    # a plain script's learned flags carry this plan's micro-batch (Spec.args_for), or its
    # own environment variables do (script_info.env_flags)
    rendered: RenderedJob = render(plan, settings, spec.args_for(plan))
    own_variables = env_flags(spec.script_flags, plan, spec.pinned)
    if own_variables:
        rendered = replace(rendered, env={**rendered.env, **own_variables})
    attempt_dir = run_path / f"attempt-{number}"
    return Job(
        run_id=run_id, attempt=number, plan=plan, rendered=rendered,
        job_dir=attempt_dir / "job", attempt_dir=attempt_dir,
        checkpoint_dir=run_path / "checkpoints", code_dir=spec.script.resolve().parent,
        memory_limit=spec.memory_limit,
    )


@dataclass
class RunOutcome:
    run: Run
    status: ExitStatus
    attempts: list[Attempt]
    message: str = ""

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]


class Supervisor:
    def __init__(self, provider: Provider, run: Run, *, on_line: Callable[[str], None],
                 on_note: Callable[[str], None], replan: Replanner | None = None,
                 poll_interval_s: float = 0.2):
        self.provider = provider
        self.run = run
        self.on_line = on_line
        self.on_note = on_note
        self.replan = replan
        self.poll_interval_s = poll_interval_s

    def prepare(self, spec: Spec, plan: Plan, number: int) -> Job:
        """Render the plan into ``attempt-<n>/job`` and describe the job for the provider."""
        job = build_job(spec, plan, self.run.id, number, self.run.path)
        job.rendered.write(job.job_dir)
        return job

    def launch(self, spec: Spec, plan: Plan) -> RunOutcome:
        attempts: list[Attempt] = []
        change = "first attempt"
        for number in range(1, spec.max_attempts + 1):
            job = self.prepare(spec, plan, number)
            attempt = self.submit(job, change, cost_usd=0.0 if spec.provider == LOCAL else None)
            job_id = attempt.job_id
            attempts.append(attempt)
            self.on_note(f"attempt {number}: {plan.strategy} on {plan.machine}, micro-batch "
                         f"{plan.micro_batch_size} x {plan.grad_accum_steps} accumulation x "
                         f"{plan.world_size} process(es); job {job_id}")
            self.follow(attempt)
            if attempt.outcome == Outcome.SUCCESS:
                return RunOutcome(self.run, ExitStatus.SUCCESS, attempts)
            if attempt.outcome == Outcome.CANCELLED:
                return RunOutcome(self.run, ExitStatus.INTERRUPTED, attempts,
                                  f"attempt {number} was cancelled")
            if attempt.outcome != Outcome.OOM:
                if _lost_capacity(attempt, self.provider) and number < spec.max_attempts:
                    change = ("the machine was taken away (preemption or no capacity), not a "
                              "fault of the plan: the same plan again, resumed from the last "
                              "checkpoint")
                    self.on_note(change)
                    continue
                return RunOutcome(self.run, ExitStatus.JOB_FAILED, attempts,
                                  f"attempt {number} failed: {_failure_line(attempt)}")
            repeat = _same_failure(attempts)
            if repeat:
                return RunOutcome(self.run, ExitStatus.OUT_OF_MEMORY, attempts, repeat)
            failure = attempt.diagnosis.failure if attempt.diagnosis else Failure()
            fixed = self.replan(plan, failure) if self.replan else None
            if isinstance(fixed, str):  # a change would help, but the script cannot see it
                return RunOutcome(self.run, ExitStatus.OUT_OF_MEMORY, attempts,
                                  f"out of memory: {fixed}")
            if fixed is None:
                diagnosis = attempt.diagnosis.diagnosis if attempt.diagnosis else None
                return RunOutcome(self.run, ExitStatus.OUT_OF_MEMORY, attempts,
                                  f"out of memory (cause: {diagnosis and diagnosis.cause}) and "
                                  f"no change of micro-batch or checkpointing is left to try; "
                                  f"{diagnosis.advice if diagnosis else ''}".rstrip("; "))
            plan, change = fixed
            faults.point("replan.chosen")
            spent = sum(a.cost_usd or 0.0 for a in attempts)
            if spec.budget is not None and plan.total_cost_usd is None:
                # priced by the planner (the runner's replanner); unknown, it cannot be shown
                # to be within the budget, as the planner's rule for a first plan
                return RunOutcome(self.run, ExitStatus.OVER_BUDGET, attempts,
                                  f"${spent:,.2f} spent; the fixed plan's cost is unknown, so "
                                  f"it cannot be shown to stay within the ${spec.budget:,.2f} "
                                  "budget")
            if spec.budget is not None and spent + plan.total_cost_usd > spec.budget:
                return RunOutcome(self.run, ExitStatus.OVER_BUDGET, attempts,
                                  f"${spent:,.2f} spent; the fixed plan's "
                                  f"${plan.total_cost_usd:,.2f} more would pass the "
                                  f"${spec.budget:,.2f} budget")
            self.on_note(f"replanned: {change}")
        return RunOutcome(self.run, ExitStatus.OUT_OF_MEMORY, attempts,
                          f"still out of memory after {spec.max_attempts} attempts")

    def submit(self, job: Job, change: str, cost_usd: float | None = None) -> Attempt:
        """``provider.submit``, with the intent written ahead: the attempt is on disk as
        ``submitting`` before the cloud create, so a launcher killed in between leaves a record
        that the next `status`/`attach` completes by the job's deterministic name (``adopt``)."""
        request = self.provider.dryrun(job)
        attempt = Attempt(number=job.attempt, plan=job.plan, change=change,
                          state=JobState.SUBMITTING, cost_usd=cost_usd)
        self.run.save_attempt(attempt)
        faults.point("submit.recorded")
        try:
            attempt.job_id = self.provider.schedule(request)
        except Exception as exc:  # refused; an interrupt leaves "submitting", for ``adopt``
            attempt.state, attempt.outcome = JobState.NOT_SUBMITTED, Outcome.NOT_SUBMITTED
            attempt.ended_at = time.time()
            attempt.summary = Summary(message=f"not submitted: {exc}")
            self.run.save_attempt(attempt)
            raise
        attempt.state = JobState.RUNNING
        self.run.save_attempt(attempt)
        faults.point("submit.running")
        return attempt

    def follow(self, attempt: Attempt) -> Progress:
        """Stream the job's lines until it ends; stop it on the first out-of-memory line.

        Every line goes through the failure classifier, so an OOM is caught whether or not the
        templates' structured line reports it (a plain script, the kernel's OOM killer); the
        structured line, when there is one, adds the phase, step and micro-batch.
        """
        from launcher.failures import LogWatcher

        assert attempt.job_id is not None
        progress = Progress()
        # A run under --memory-limit: an allocator's failure there is the cap's (oneDNN's
        # "could not create a primitive" is then certainly memory, not probably).
        capped = self.run.info.spec.get("memory_limit") is not None
        watcher = LogWatcher(platform=self.provider.name, capped=capped)
        early = LogWatcher(platform=self.provider.name, capped=capped)  # the event channel's
        cursor: Any = None
        event_cursor: Any = None
        seen_at: float | None = None
        stopped_at: float | None = None
        lag_noted: tuple[float, float] | None = None  # (lag, when) of the last note
        most_behind = 0.0

        def stop_when_due() -> None:
            """The allocator's message usually comes just before the template's structured line
            (phase, step, micro-batch): stop once that line is in, or after a short grace."""
            nonlocal stopped_at
            if seen_at is not None and stopped_at is None and (
                    progress.oom is not None or time.monotonic() - seen_at > STOP_GRACE_S):
                stopped_at = time.monotonic()
                self.provider.stop(attempt.job_id)

        def read_events() -> None:
            """The event channel: an out-of-memory event is said and acted on at once, however
            much of the log is still to be read or shown."""
            nonlocal event_cursor, seen_at
            events, event_cursor = self.provider.events(attempt.job_id, event_cursor)
            for line in events:
                event = parse_event(line)
                if event is None:  # a failure line the channel carries (no templates' line)
                    first = early.feed(line)
                    if first is not None and first.failure in MEMORY_FAILURES and seen_at is None:
                        seen_at = time.monotonic()
                        where = f" on rank {first.rank}" if first.rank is not None else ""
                        self.on_note(f"out of memory{where} ({first.failure}): stopping the job")
                    continue
                progress.update(event)
                if event.get("launch") == "oom" and seen_at is None:
                    seen_at = time.monotonic()
                    self.on_note(f"out of memory on rank {event.get('rank')} in "
                                 f"{event.get('phase')}: stopping the job")
            stop_when_due()

        while True:
            status = self.provider.poll(attempt.job_id)
            read_events()
            lines, cursor = self.provider.logs(attempt.job_id, cursor)
            checked = time.monotonic()
            for line in lines:
                if time.monotonic() - checked >= EVENT_CHECK_S:
                    # a log that arrives faster than it is shown (megabytes a step) must not
                    # hold back what the event channel already knows
                    read_events()
                    checked = time.monotonic()
                self.on_line(line)  # every line, in order: what a view shows is its own
                event = parse_event(line)
                if event is not None:
                    progress.update(event)
                first = watcher.feed(line)
                if first is not None and first.failure in MEMORY_FAILURES and seen_at is None:
                    seen_at = time.monotonic()
                    where = f" on rank {first.rank}" if first.rank is not None else ""
                    self.on_note(f"out of memory{where} ({first.failure}, cause "
                                 f"{first.cause}): stopping the job")
            lag = self.provider.behind(attempt.job_id, cursor)
            if lag is not None and lag >= BEHIND_NOTE_S:
                most_behind = max(most_behind, lag)
                now = time.monotonic()
                if (lag_noted is None or lag >= 2 * lag_noted[0]
                        or now - lag_noted[1] >= BEHIND_REPEAT_S):
                    lag_noted = (lag, now)
                    self.on_note(f"the log shown is {lag:.0f} s behind the job (it writes faster "
                                 f"than the log API's read quota allows); failures come from "
                                 f"their own channel and are not delayed")
            stop_when_due()
            if status.terminal and not lines:
                break
            if not lines:
                time.sleep(self.poll_interval_s)
        faults.point("follow.ended")
        attempt.state = status.state
        attempt.exit_code = status.exit_code
        attempt.ended_at = time.time()
        price = attempt.plan.cost_per_hour_usd
        if price is not None:  # billed time, as the plan's machines cost it
            attempt.cost_usd = round(price * (attempt.ended_at - attempt.started_at) / 3600, 4)
        if status.message:
            watcher.feed(status.message)  # the platform's failure text: a second signal
        diagnosis = watcher.result()
        if diagnosis.failure == "other":
            attempt.diagnosis = Diagnosed.of(diagnosis)
        if status.state == JobState.CANCELLED and stopped_at is None:
            # Stopped by someone (`launch cancel`, the console), not by us for an OOM: the
            # SIGKILL a stop ends with reads as a probable host OOM, and must not be replanned.
            attempt.outcome = Outcome.CANCELLED
        elif progress.oom is not None or diagnosis.failure in MEMORY_FAILURES:
            attempt.outcome = Outcome.OOM
            attempt.diagnosis = Diagnosed.of(diagnosis, progress.oom)  # the event's values win
            if seen_at is not None:
                attempt.summary.stop_latency_s = round(time.monotonic() - seen_at, 3)
        elif status.state == JobState.SUCCEEDED:
            attempt.outcome = Outcome.SUCCESS
        elif status.state == JobState.CANCELLED:
            attempt.outcome = Outcome.CANCELLED
        else:
            attempt.outcome = Outcome.FAILED
        spec = self.run.info.spec
        plain = spec.get("mode") == "script" and not spec.get("framework")
        attempt.summary = replace(attempt.summary,
                                  **progress.summary(PLAIN_UNREPORTED if plain else UNREPORTED),
                                  message=status.message)
        if most_behind:
            attempt.summary.log_behind_s = round(most_behind, 1)
        self.run.save_attempt(attempt)
        self._calibrate(attempt)
        return progress

    def _calibrate(self, attempt: Attempt) -> None:
        """Feed what a GPU run measured back into later estimates (never fatal)."""
        from launcher.estimate.calibration import from_attempt, model_key

        script = Path(self.run.info.script or "")
        try:
            # calibration sits below the run records: it takes their JSON form
            from_attempt(self.run.path.parent.parent, attempt.plan.machine, model_key(script),
                         attempt.plan.to_dict(), attempt.summary.to_dict())
        except OSError:
            pass


def _same_failure(attempts: list[Attempt]) -> str:
    """Why the run stops when its last attempt failed exactly as the one before it did (the
    same phase, the same bytes requested): the change between them did not reach the job, and
    another change of the same kind would not either. Empty when it is a new failure."""
    if len(attempts) < 2:
        return ""
    last, before = (a.diagnosis.diagnosis if a.diagnosis else None
                    for a in attempts[-2:][::-1])
    if last is None or before is None:
        return ""
    asked = last.requested_bytes
    if asked is None or asked != before.requested_bytes or last.phase != before.phase:
        return ""
    from launcher.units import format_bytes

    return (f"attempt {attempts[-1].number} failed exactly as attempt {attempts[-2].number} did "
            f"({last.phase or 'the same phase'}, {format_bytes(asked)} requested): "
            f"the change between them ({attempts[-1].change}) did not reach the job, so no "
            "further attempt is made; check that the script takes the plan's values")


def adopt_unrecorded(run: Run, provider: Provider) -> list[Attempt]:
    """Complete the record of attempts a launcher wrote ahead but did not live to finish: find
    each ``submitting`` attempt's job by its deterministic name; one that was never created ends
    as failed. Returns the run's attempts as they now stand."""
    for attempt in run.attempts():
        if attempt.state != JobState.SUBMITTING or attempt.job_id:
            continue
        job_id = provider.adopt(run.id, attempt.number, run.attempt_dir(attempt.number))
        if job_id is not None:
            run.update_attempt(attempt.number, job_id=job_id, state=JobState.RUNNING)
        else:
            run.update_attempt(
                attempt.number, state=JobState.NOT_SUBMITTED, outcome=Outcome.NOT_SUBMITTED,
                ended_at=time.time(),
                summary=Summary(message="never submitted: the launcher stopped before the "
                                        "job was created"))
    return run.attempts()


#: While a long stretch of log is shown, how often the event channel is read between its lines.
EVENT_CHECK_S = 0.2

#: How long `cancel` waits for a job to reach a terminal state after asking it to stop.
CANCEL_WAIT_S = 30.0


def cancel_attempt(run: Run, provider: Provider, attempt: Attempt,
                   wait_s: float = CANCEL_WAIT_S) -> Attempt:
    """Stop the attempt's job, wait until it has ended and nothing of it runs any more, and
    record the attempt as cancelled (what `launch cancel` and ``--cancel-on-interrupt`` do)."""
    assert attempt.job_id is not None
    provider.stop(attempt.job_id)
    deadline = time.monotonic() + wait_s
    status = provider.poll(attempt.job_id)
    while not status.terminal and time.monotonic() < deadline:
        time.sleep(0.1)
        status = provider.poll(attempt.job_id)
    left = provider.residue(attempt.job_id) if status.terminal else []
    if left:  # a process the stop did not reach: once more, then it is an error
        provider.stop(attempt.job_id)
        left = provider.residue(attempt.job_id)
    message = status.message or "stopped on request"
    if not status.terminal:
        message = f"asked to stop; still {status.state} after {wait_s:g} s"
    if left:
        message += f"; processes {left} are still running"
    return run.update_attempt(
        attempt.number, state=status.state, outcome=Outcome.CANCELLED, exit_code=status.exit_code,
        ended_at=time.time(), summary=replace(attempt.summary, message=message))
