"""No module of the probe or the monitor grows past what one can hold in one's head."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500
MODULES = sorted(p for part in ("probes", "tui") for p in (ROOT / part).rglob("*.py"))


def test_there_are_modules_to_check() -> None:
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_at_most_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it"
