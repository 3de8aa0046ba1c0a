"""The plan as people read it: a table that fits 100 columns, the rows worth reading, small
times and costs that still say something, and progress only for a person at a terminal."""

from __future__ import annotations

import io
import os
import sys

from launcher.cli import main
from launcher.context import Environment
from launcher.report import format_seconds, format_usd

DESCRIBED = ["--params", "7e9", "--layers", "32", "--hidden-size", "4096", "--heads", "32",
             "--vocab-size", "32000", "--seq-len", "2048", "--global-batch-size", "64"]


def test_small_times_and_costs_keep_three_digits():
    assert format_seconds(0.0000412) == "41.2us"
    assert format_seconds(0.0123) == "12.3ms"
    assert format_seconds(2.5) == "2.5s" and format_seconds(1864.2) == "1,864s"
    assert format_usd(0.000123) == "0.00012" and format_usd(12.345) == "12.35"
    assert format_seconds(None) == format_usd(None) == "-"


def test_every_provider_s_plan_fits_in_100_columns_with_the_best_rows(cli, tiny_recipe, tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('plain')\n")
    for provider in ("vertex", "sagemaker", "local"):
        result = cli("plan", str(script), "--provider", provider, *DESCRIBED)
        lines = result.stdout.splitlines()
        assert max(len(line.rstrip()) for line in lines) <= 100, (provider, result.stdout)
        rows = [line for line in lines if line.startswith(("   ", "→  "))]
        assert any(line.startswith("→") for line in rows) == ("chosen:" in result.stdout)
        full = cli("plan", str(script), "--provider", provider, "--all", *DESCRIBED)
        all_rows = [line for line in full.stdout.splitlines() if line.startswith(("   ", "→  "))]
        assert len(rows) <= len(all_rows)
        if provider != "local":
            assert len(rows) < 20 < len(all_rows)  # the best per strategy and GPU, not all
            assert "more candidate(s): --all shows every one" in result.stdout
            # where the chosen plan's settings came from
            assert "settings: global batch 64 (--global-batch-size); steps 100 (launch's " \
                "default); lr 0.0003 (launch's default); optimizer adamw (launch's default); " \
                "precision fp32 (plain.py's own: launch does not change a script's precision); " \
                "sequence length 2048 (--seq-len)" in " ".join(result.stdout.split())
    demo = cli("plan", str(tiny_recipe))
    assert max(len(line.rstrip()) for line in demo.stdout.splitlines()) <= 100


def test_a_summary_says_what_the_job_did_not_report_instead_of_0_none_or_a_question_mark():
    """A plain script writes no progress events: its steps, loss and peak memory are not
    known, and the summary says so (it said ``steps 0``, ``loss None``, ``peak memory ?``)."""
    from launcher.report import console, print_summary
    from launcher.runs import Summary

    stream = io.StringIO()
    print_summary(console(stream), "run-1", "succeeded", Summary(
        not_reported="a plain script reports no progress events"), 1)
    text = stream.getvalue()
    assert "steps       not reported (a plain script reports no progress events)" in text
    assert "loss        not reported" in text and "peak memory not reported" in text
    assert "None" not in text and "?" not in text and " 0\n" not in text
    stream = io.StringIO()
    print_summary(console(stream), "run-2", "succeeded", Summary(
        steps=3, loss=0.5, peak_rss_bytes=2**30, checkpoint="/c/step-3"), 1)
    assert "steps       3\n  loss        0.5000\n  peak memory 1.0 GiB RSS" in stream.getvalue()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_shown_on_a_terminal_only(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('plain')\n")

    def run(stderr: io.StringIO, *extra: str) -> str:
        outside = {k: v for k, v in os.environ.items() if k != "CI"}  # CI makes plan strict
        env = Environment(stdout=io.StringIO(), stderr=stderr, cwd=tmp_path,
                          environ={**outside, "LAUNCH_STATE_DIR": str(tmp_path / "s")},
                          python=sys.executable)
        assert main(["plan", str(script), "--provider", "sagemaker", *DESCRIBED, *extra],
                     env) == 0
        return stderr.getvalue()

    assert "estimating memory" in run(_Terminal())
    assert run(_Terminal(), "--json") == ""
    assert run(io.StringIO()) == ""


def test_the_local_cpu_plan_s_memory_is_host_memory_per_process(cli, tiny_recipe):
    """Issue 29: "13.0 MiB of 23.5 GiB per GPU" on a machine with no GPU."""
    result = cli("plan", str(tiny_recipe))
    assert result.status == 0, result.stderr
    assert "per process (host memory)" in result.stdout and "per GPU\n" not in result.stdout


def test_a_report_s_command_line_counts_the_script_s_arguments_and_shows_none():
    from launcher.report import shown_command

    assert shown_command(["plan", "train.py", "--provider", "vertex"]) == (
        "launch plan train.py --provider vertex")
    assert shown_command(["plan", "train.py", "--", "--hf_token", "hf_s3cr3t"]) == (
        "launch plan train.py -- (2 script arguments)")


def test_the_memory_legend_breaks_between_its_items_at_100_columns(cli, tmp_path):
    """Issue 29: the legend wrapped mid-phrase ("optimizer-step temporaries" / its size)."""
    import re

    script = tmp_path / "plain.py"
    script.write_text("print('plain')\n")
    for provider in ("vertex", "sagemaker"):
        result = cli("plan", str(script), "--provider", provider, *DESCRIBED,
                     environ={"COLUMNS": "100"})
        legend = [line for line in result.stdout.splitlines() if line.startswith("■")]
        assert legend, result.stdout
        for line in legend:
            assert len(line) <= 100, line
            for item in line.split("■")[1:]:
                item = item.split("(not estimated")[0]
                assert re.fullmatch(r" [a-zA-Z +-]+ [\d.]+ [KMGT]?i?B\s*", item), (item, line)


def test_the_chosen_plan_shows_its_headroom(cli):
    """issue 25: how far the chosen plan is from the memory it may use, in a line."""
    data = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes",
               "2", "--params", "30B", "--json").json()
    memory = data["chosen"]["memory"]
    text = cli("plan", "--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes",
               "2", "--params", "30B").stdout
    from launcher.units import format_bytes

    usable = int(memory["capacity"] * 0.95)
    assert (f"headroom {format_bytes(usable - memory['total'])} per GPU "
            f"({format_bytes(usable)} usable of 80.0 GiB, 5% kept free)") in text


def test_a_plan_names_the_scripts_own_optimizer_by_the_class_its_step_built():
    """A script's own Adadelta is shown as Adadelta, not as launch's default name; untraced,
    the name is said to be only launch's default."""
    from launcher.plan.plan import OWN_OPTIMIZERS, Plan
    from launcher.plan.planner import PlanResult
    from launcher.report import origin_words

    plan = Plan(strategy="single", machine="g2-standard-4", nodes=1, gpus_per_node=1,
                micro_batch_size=64, grad_accum_steps=1, global_batch_size=64, precision="fp32",
                optimizer="adamw", activation_checkpointing=False, steps=112, lr=1.0,
                optimizer_class="Adadelta")
    traced = PlanResult(parameters=53_470, source="traced", plans=[plan], chosen=plan,
                        origins={"optimizer": OWN_OPTIMIZERS[0]})
    assert origin_words(traced) == "optimizer Adadelta (the script's own optimizer)"
    assert Plan.from_dict(plan.to_dict()).optimizer_class == "Adadelta"  # plan.json keeps it
    untraced = PlanResult(parameters=53_470, source="counted", plans=[plan], chosen=plan.replace(
        optimizer_class=None), origins={"optimizer": OWN_OPTIMIZERS[0]})
    assert origin_words(untraced) == ("optimizer adamw (the script's own optimizer (the name "
                                      "is launch's default))")
    out = io.StringIO()
    from rich.console import Console

    from launcher.report import _print_chosen
    _print_chosen(Console(file=out, width=100), traced)
    assert ", Adadelta (global batch 64)" in out.getvalue()
