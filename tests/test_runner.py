"""The runner API without the CLI: typed inputs in, dataclass results out, nothing printed."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from launcher.context import Environment
from launcher.runner import NO_SCRIPT, PlannedRun, Runner, RunResult, run_stem
from launcher.status import ExitStatus, LaunchError, UsageError


@pytest.fixture
def env(tmp_path: Path) -> Environment:
    """The cli fixture's environment: state under tmp_path, no trace; streams that must stay
    empty (the runner prints nothing)."""
    return Environment(stdout=io.StringIO(), stderr=io.StringIO(), cwd=tmp_path,
                       environ={**os.environ, "LAUNCH_STATE_DIR": str(tmp_path / "state"),
                                "LAUNCH_NO_TRACE": "1"},
                       python=sys.executable)


def _silent(env: Environment) -> bool:
    return env.stdout.getvalue() == "" and env.stderr.getvalue() == ""  # type: ignore[attr-defined]


def test_plan_returns_a_planned_run(env, tiny_recipe):
    planned = Runner(env).plan({"script": tiny_recipe, "provider": "local",
                                "micro_batch_size": 2})
    assert isinstance(planned, PlannedRun)
    assert planned.spec.script == tiny_recipe and planned.spec.provider == "local"
    assert "wrap_modules" in planned.info.hooks
    assert planned.provider is not None and planned.provider.name == "local"
    chosen = planned.result.chosen
    assert chosen is not None and (chosen.micro_batch_size, chosen.grad_accum_steps) == (2, 2)
    assert planned.result.status == ExitStatus.SUCCESS
    assert planned.request is None  # a plan, not a dry run; and local sends no request
    data = planned.to_dict()
    assert set(data) >= {"model", "plans", "chosen", "rejected", "notes", "request"}
    assert not (env.cwd / "state" / "runs").exists()  # planning creates no run
    assert _silent(env)


def test_a_dry_run_writes_the_report_and_paths_are_the_cwd_s(env, tiny_recipe):
    options = {"script": tiny_recipe.relative_to(env.cwd)}
    planned = Runner(env).plan(options, dry_run=True, report=Path("plan.html"))
    assert planned.spec.script == tiny_recipe
    assert options == {"script": tiny_recipe.relative_to(env.cwd)}  # the caller's, as given
    assert planned.request is None  # local: no request to show
    assert "<html" in (env.cwd / "plan.html").read_text().lower()


def test_errors_name_the_option_where_it_came_from(env, tiny_recipe):
    with pytest.raises(UsageError, match="steps in launch.toml"):
        Runner(env).plan({"script": tiny_recipe, "steps": -1},
                         {"steps": "steps in launch.toml"})
    with pytest.raises(UsageError, match="describe the model"):
        Runner(env).plan({"script": None})
    with pytest.raises(UsageError, match="unknown provider"):
        Runner(env).plan({"script": tiny_recipe, "provider": "azure"})


def test_run_refuses_a_plan_that_does_not_fit_before_creating_a_run(env, tiny_recipe):
    runner = Runner(env)
    planned = runner.plan({"script": tiny_recipe, "memory_limit": 1024})
    assert planned.result.chosen is None
    with pytest.raises(LaunchError) as caught:
        runner.run(planned)
    assert caught.value.status == ExitStatus.NO_PLAN_FITS
    assert not (env.cwd / "state" / "runs").exists()


def test_run_then_status_logs_attach_and_cancel(env, tiny_recipe):
    runner = Runner(env)
    lines: list[str] = []
    notes: list[str] = []
    # s3_prefix: a provider setting that is no option (a config file's), as the CLI passes it.
    planned = runner.plan({"script": tiny_recipe, "steps": 2, "s3_prefix": "team/x"})
    result = runner.run(planned, on_line=lines.append, on_note=notes.append)
    assert isinstance(result, RunResult)
    # Every setting is recorded, wherever it came from, for status/cancel/attach (issue 30).
    assert result.run.info.settings == {"s3_prefix": "team/x", "steps": 2}
    assert result.status == ExitStatus.SUCCESS and result.message == ""
    assert result.run_id.startswith(run_stem(tiny_recipe) + "-")
    assert [a.outcome for a in result.attempts] == ["success"]
    assert result.summary.steps == 2
    assert notes[0] == f"run {result.run_id} (state in {result.run.path})"
    assert any('"launch": "done"' in line for line in lines)
    assert result.to_dict()["status"] == "success"

    status = runner.status(result.run_id)
    assert (status.run_id, status.provider, status.script) == (
        result.run_id, "local", str(tiny_recipe))
    assert [row.live_state for row in status.attempts] == ["succeeded"]
    assert status.to_dict()["attempts"][0]["live_state"] == "succeeded"

    logged = list(runner.logs(result.run_id[:8]))
    assert any('[rank0]:{"launch": "done"' in line for line in logged)
    with pytest.raises(UsageError, match="has no attempt 7"):
        runner.logs(result.run_id, number=7)  # checked at the call, not when iterated

    attached = runner.attach()  # the newest run; its job has ended
    assert attached.run_id == result.run_id and attached.status == ExitStatus.SUCCESS

    cancelled = runner.cancel(result.run_id)
    assert cancelled.cancelled == [] and cancelled.still_running == []
    assert _silent(env)


def test_run_stem():
    assert run_stem(Path("/w/tinygpt/train.py")) == "tinygpt"
    assert run_stem(Path("/w/tinygpt/finetune.py")) == "finetune"
    assert NO_SCRIPT.name == "(no script)"


def test_a_replan_is_priced_by_the_planner_for_the_plan_that_will_run(env, tiny_recipe):
    """The supervisor's replanner (issue 26 item 4): a remedy's plan gets the step time and
    cost the planner works out for it (checkpointing recomputes: 4/3 the step), not the failed
    plan's, so the budget is checked against what it will cost."""
    from launcher.plan.cost import RECOMPUTE

    planned = Runner(env).plan({"script": tiny_recipe, "provider": "vertex",
                                "machine": "a2-highgpu-1g", "region": "us-central1",
                                "project": "my-project-123", "micro_batch_size": 1,
                                "no_activation_checkpointing": True})
    chosen = planned.result.chosen
    assert chosen is not None and chosen.total_cost_usd and chosen.step_time_s
    fix = Runner(env)._replanner(planned.spec, planned.info)
    fixed, change = fix(chosen, {"cause": "activations", "phase": "forward"})
    assert fixed.checkpointing == "full" and "activation checkpointing" in change
    assert fixed.step_time_s == pytest.approx(chosen.step_time_s * RECOMPUTE["full"])
    assert fixed.total_cost_usd == pytest.approx(chosen.total_cost_usd * RECOMPUTE["full"])
    assert fixed.memory.capacity == chosen.memory.capacity
