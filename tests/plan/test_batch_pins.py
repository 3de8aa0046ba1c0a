"""Every combination of layout and batch pins is a plan, a no-fit with reasons (exit 3), or a
usage error (exit 2) only when the pins the user wrote contradict each other; a global batch the
user did not give never makes a layout an error (issue 14, item 1)."""

from __future__ import annotations

import itertools

import pytest

from launcher.status import ExitStatus

NODES = (None, 1, 2)
GPUS = (None, 1, 8)
MICRO = (None, 1, 3)
GLOBAL = (None, 4, 6, 16)


@pytest.mark.parametrize("provider", ["sagemaker", "vertex"])
def test_every_combination_of_pins_is_a_plan_a_no_fit_or_a_contradiction(cli, write_script,
                                                                         provider):
    script = write_script("print('plain')\n")
    seen = set()
    for nodes, gpus, micro, batch in itertools.product(NODES, GPUS, MICRO, GLOBAL):
        args = ["plan", str(script), "--provider", provider, "--params", "1B", "--json"]
        for flag, value in (("--nodes", nodes), ("--gpus-per-node", gpus),
                            ("--micro-batch-size", micro), ("--global-batch-size", batch)):
            if value is not None:
                args += [flag, str(value)]
        result = cli(*args)
        case = (nodes, gpus, micro, batch, result.stderr)
        seen.add(result.status)
        assert result.status in (ExitStatus.SUCCESS, ExitStatus.USAGE,
                                 ExitStatus.NO_PLAN_FITS), case
        if result.status == ExitStatus.USAGE:
            assert batch is not None, case  # a derived global batch is never the user's error
            assert result.stderr.count("\n") == 2 or result.stderr.startswith("launch: error:")
            assert "global batch" in result.stderr and "()" not in result.stderr, case
            if nodes is not None and gpus is not None:  # the whole layout was written
                assert batch % ((micro or 1) * nodes * gpus), case
            continue
        chosen = result.json()["chosen"]
        if chosen is None:
            continue
        world = chosen["nodes"] * chosen["gpus_per_node"]
        assert chosen["micro_batch_size"] * chosen["grad_accum_steps"] * world == \
            chosen["global_batch_size"], case
        if batch is not None:
            assert chosen["global_batch_size"] == batch, case
        for key, pinned in (("nodes", nodes), ("gpus_per_node", gpus),
                            ("micro_batch_size", micro)):
            assert pinned is None or chosen[key] == pinned, case
    assert {ExitStatus.SUCCESS, ExitStatus.USAGE} <= seen


def test_the_issues_examples(cli, write_script):
    script = write_script("print('plain')\n")
    pinned = cli("plan", str(script), "--params", "30e9", "--provider", "sagemaker",
                 "--machine", "ml.p4de.24xlarge", "--nodes", "2", "--gpus-per-node", "8",
                 "--micro-batch-size", "1", "--json")
    assert pinned.status == 0, pinned.stderr
    assert pinned.json()["chosen"]["global_batch_size"] == 16  # derived: 1 x 16 processes
    searched = cli("plan", str(script), "--params", "7e9", "--layers", "32", "--hidden-size",
                   "4096", "--heads", "32", "--vocab-size", "32000", "--seq-len", "2048",
                   "--provider", "vertex", "--global-batch-size", "8", "--json")
    assert searched.status == 0, searched.stderr
    data = searched.json()
    assert data["chosen"]["global_batch_size"] == 8
    assert any("cannot be split evenly over 16 processes" in r["reason"]
               for r in data["rejected"])
