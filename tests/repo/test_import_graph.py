"""No import circles in ``probes/``, ``tui/`` or ``demo/``: each package's modules form
layers, and the probe knows nothing of the monitor.

The graph is built statically from the source with ``ast``: every ``import`` counts,
at module level, inside a function (a deferred import still ties two modules together;
it only hides the circle until it bites) or under ``if TYPE_CHECKING:`` (a type-only
import never runs, but still says that each module needs to know the other: the shared
type belongs in a module both can import, or is a ``Protocol``). An import of a package
counts as an import of its ``__init__`` (a node of its own); ``from package import
name`` also counts as an import of the submodule ``package.name`` when there is one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("probes", "tui", "demo")

Graph = dict[str, set[str]]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``: module level, deferred, or type-only."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(name: str, source: str, *, package: bool, known: set[str]) -> set[str]:
    """The modules among ``known`` that module ``name`` (of text ``source``) imports."""
    found: set[str] = set()
    for node in all_imports(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = resolve(name, package, node)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        found.update(t for t in targets if t in known and t != name)
    return found


def build_graph(packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Module -> the modules of ``packages`` it imports."""
    paths = {module_name(p): p for pkg in packages for p in (ROOT / pkg).rglob("*.py")}
    known = set(paths)
    return {
        name: imports_of(
            name, path.read_text(encoding="utf-8"), package=path.name == "__init__.py", known=known
        )
        for name, path in paths.items()
    }


def find_cycle(graph: Graph) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child) :], child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_probes_tui_and_demo_have_no_import_circle() -> None:
    cycle = find_cycle(build_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_probe_imports_nothing_of_the_monitor() -> None:
    # (tests/repo/test_imports.py checks what loads at run time: no textual, no rich; this
    # checks every import in the source, type-only and deferred ones included.)
    graph = build_graph()
    assert any(name.startswith("tui") for name in graph)
    wrong = {
        (name, target)
        for name, targets in graph.items()
        if name == "probes" or name.startswith("probes.")
        for target in targets
        if target == "tui" or target.startswith("tui.")
    }
    assert not wrong, f"the probe imports the monitor: {sorted(wrong)}"


def test_the_graph_sees_deferred_and_type_checking_imports() -> None:
    # tui.cli imports the launcher inside main() only: a deferred import counts.
    assert "tui.launcher" in build_graph()["tui.cli"]
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.c import C\n"
        "else:\n"
        "    import pkg.d\n"
        "def later():\n"
        "    from .e import f\n"
    )
    known = {"pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    assert imports_of("pkg.a", source, package=False, known=known) == {
        "pkg.b",
        "pkg.c",
        "pkg.d",
        "pkg.e",
    }


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}, ["b", "b2", "b"]),
    ],
)
def test_find_cycle(graph: Graph, expected: list[str] | None) -> None:
    assert find_cycle(graph) == expected
