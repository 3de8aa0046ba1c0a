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


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """A PNG's width, height and rows of RGB(A) bytes (8-bit truecolour, as Chromium writes its
    screenshots), decoded with zlib: no imaging library in the test environment."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytes(width * 4)
    previous = bytes(stride)
    for y in range(height):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        kind, row = line[0], bytearray(line[1:])
        for x in range(stride):
            a = row[x - channels] if x >= channels else 0
            b, c = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                row[x] = (row[x] + a) & 255
            elif kind == 2:
                row[x] = (row[x] + b) & 255
            elif kind == 3:
                row[x] = (row[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(row))
        previous = bytes(row)
    return width, channels, rows


def test_a_local_plan_s_report_says_its_command_and_date_and_draws_its_bar(cli, tmp_path,
                                                                           chromium):
    """Issue 29: the local plan's page had no command line, date or notes, and an empty bar
    (KiB of GiB). A screenshot in headless Chromium shows the bar's first part drawn."""
    from launcher.report import _HTML_COLORS
    from tests.conftest import TINY_RECIPE

    script = tmp_path / "tiny.py"
    script.write_text(TINY_RECIPE)
    report = tmp_path / "plan.html"
    result = cli("plan", str(script), "--report", str(report))
    assert result.status == 0, result.stderr
    page = report.read_text()
    assert "launch plan " in html.unescape(page) and " UTC" in page
    assert "Per process (host memory)" in page and "<h2>Notes</h2>" in page
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1000,700",
                    report.as_uri()], capture_output=True, timeout=120, check=True)
    width, channels, rows = _png_pixels(shot.read_bytes())
    first = bytes.fromhex(_HTML_COLORS[0][1:])
    # a column of that colour as tall as the bar (28 px), not the legend's 13 px swatch
    tallest = max(sum(1 for row in rows if all(abs(row[x + i] - first[i]) <= 3
                                               for i in range(3)))
                  for x in range(0, width * channels, channels))
    assert tallest >= 22, tallest
