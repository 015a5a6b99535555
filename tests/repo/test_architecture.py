"""ARCHITECTURE.md's module list is the tree as it is: every module of ``probes/``,
``tui/`` and ``demo/`` named on a line of its own, once, and nothing that is not there.

The list is the fenced block under "## Modules": a folder is a line whose first word ends
in ``/``, a module one whose first word ends in ``.py``; two spaces of indent a level. A
line whose first word is neither continues the line above. A package's ``__init__.py``
may be named (``probes/__init__.py`` is: it holds the public API) but need not be.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("probes", "tui", "demo")


def listed_modules(text: str) -> list[str]:
    """The paths the "## Modules" block names, in order (repeats kept)."""
    block = re.search(r"^## Modules\n+```\n(.*?)^```", text, re.S | re.M)
    assert block, 'ARCHITECTURE.md has a "## Modules" section with a fenced block'
    folders: list[str] = []
    paths: list[str] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"an odd indent: {line!r}"
        depth, word = indent // 2, line.split()[0]
        if word.endswith("/"):
            folders[depth:] = [word]
        elif word.endswith(".py"):
            assert depth <= len(folders), f"a module deeper than its folder: {line!r}"
            paths.append("".join(folders[:depth]) + word)
    return paths


def test_architecture_names_every_module_once() -> None:
    listed = listed_modules((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    modules = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    repeated = sorted(name for name, count in Counter(listed).items() if count > 1)
    assert repeated == [], f"named more than once: {repeated}"
    assert sorted(set(listed) - modules) == [], "named, but not in the tree"
    missing = sorted(m for m in modules - set(listed) if not m.endswith("/__init__.py"))
    assert missing == [], f"not named in ARCHITECTURE.md's module list: {missing}"


def test_the_list_is_read_by_folder() -> None:
    text = "## Modules\n\n```\na/\n  b.py    one\n  c/\n    d.py  two\n      more\n  e.py\n```\n"
    assert listed_modules(text) == ["a/b.py", "a/c/d.py", "a/e.py"]
