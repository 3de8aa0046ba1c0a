"""docs/architecture.md's module map stays true: every module of the package has its line, and
no line names a module that is gone (a newcomer reads the map before the code)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "launcher"
DOC = ROOT / "docs" / "architecture.md"


def _mapped() -> list[str]:
    """The paths the "Every module, one line" block names, relative to launcher/."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Every module, one line", 1)[1]
    block = section.split("```", 2)[1]
    return [m.group(1) for line in block.splitlines()
            if (m := re.match(r"([\w/]+\.py)\s", line + " "))]


def test_every_module_has_its_line_in_the_map() -> None:
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))
    mapped = _mapped()
    missing, gone = sorted(set(modules) - set(mapped)), sorted(set(mapped) - set(modules))
    assert not missing, f"not in {DOC.name}: {missing}"
    assert not gone, f"gone but mapped: {gone}"
    assert mapped == sorted(mapped), "keep the map in path order"
