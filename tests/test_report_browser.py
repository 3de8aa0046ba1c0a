"""The HTML plan report (`launch plan --report`) as a person sees it: opened in a real headless
Chromium (Debian's `chromium`, which `make test` installs where apt can), its rendered DOM shows
the plan rows and the memory bar the terminal shows."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest

from tests.test_report import DESCRIBED

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (make test installs it with apt-get)")
        pytest.skip("chromium is not installed here (make test installs it with apt-get)")
    return CHROMIUM


def test_the_report_in_a_browser_shows_the_terminal_s_plan_and_bar(cli, tmp_path, chromium):
    script = tmp_path / "plain.py"
    script.write_text("print('plain')\n")
    report = tmp_path / "plan.html"
    terminal = cli("plan", str(script), "--provider", "vertex", *DESCRIBED,
                   "--report", str(report))
    assert terminal.status == 0, terminal.stderr
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         report.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
    words = " ".join(text.split())
    # The chosen line: strategy and machine, as the terminal says them.
    chosen = re.search(r"chosen: (\S+) on \d+ x (\S+),", terminal.stdout)
    assert chosen is not None
    assert chosen.group(1) in words and chosen.group(2) in words
    # The same rows: every machine in the terminal's table is in the page, and no more rows.
    machines = [line.split()[2 if line.startswith("→") else 1]
                for line in terminal.stdout.splitlines()
                if line.startswith(("   ", "→  ")) and line.split()[0] != "strategy"]
    rows = re.findall(r"<tr[^>]*>\s*<td", dom)
    assert len(rows) == len(machines)
    assert all(m in words for m in machines)
    # The bar's parts with their sizes, as in the terminal's legend.
    legend = next(line for line in terminal.stdout.splitlines() if line.startswith("■"))
    for part in re.findall(r"■ ([a-zA-Z +-]+?) ([\d.]+ [KMGT]?i?B)", legend):
        assert f"{part[0].strip()} {part[1]}" in words or (part[0].strip() in words
                                                         and part[1] in words), part
