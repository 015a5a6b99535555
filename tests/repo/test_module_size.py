"""No function of the probe or the monitor grows past one screen: the budget is per
function. A module is cut where its concept ends, not at a line count (a cap of 500
lines once cut modules in the middle of one idea); past a backstop of twice that, a
module holds two concepts for certain."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Not a budget, a backstop: the largest concept here is about 500 lines.
MAX_LINES = 1000
MODULES = sorted(p for part in ("probes", "tui") for p in (ROOT / part).rglob("*.py"))


def test_there_are_modules_to_check() -> None:
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_within_the_backstop(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: cut it by concept"


# --- the budget per function -----------------------------------------------------------------

#: A function one reads whole, on one screen of a split editor: past this it holds more
#: than one idea, and the ideas want names of their own.
MAX_FUNCTION_LINES = 80


def functions(path: Path) -> list[tuple[str, int, int]]:
    """Each function's (qualified name, first line, lines), nested ones too."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    end = child.end_lineno or child.lineno
                    found.append((name, child.lineno, end - child.lineno + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_function_is_within_its_budget(path: Path) -> None:
    over = [
        f"{name} (line {at}): {n} lines"
        for name, at, n in functions(path)
        if n > MAX_FUNCTION_LINES
    ]
    assert not over, f"{path.relative_to(ROOT)}: over {MAX_FUNCTION_LINES} lines: {over}"


def test_the_function_budget_sees_a_long_function(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long.write_text(f"class A:\n    def f(self):\n{body.replace('    ', '        ')}\n")
    [(name, at, lines)] = functions(long)
    assert (name, at, lines) == ("A.f", 2, MAX_FUNCTION_LINES + 1)
