"""The oldest Python the project declares is the one its checkers read the code for.

mypy checks the standard library's API against ``python_version`` (it flags a name that
version lacks, as ``enum.StrEnum`` on 3.10) and ruff's ``target-version`` picks the
syntax and upgrades it allows: both must be the oldest version ``requires-python``
admits, or the code can use what that version lacks and nothing fails. The README and
CONTRIBUTING say the same version.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def declared() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def oldest() -> tuple[int, int]:
    spec = declared()["project"]["requires-python"]  # type: ignore[index]
    found = re.fullmatch(r">=\s*3\.(\d+)", str(spec))
    assert found, f"requires-python {spec!r}: expected '>=3.N'"
    return 3, int(found.group(1))


def test_mypy_and_ruff_check_the_code_for_the_oldest_declared_python() -> None:
    major, minor = oldest()
    tools = declared()["tool"]
    assert tools["mypy"]["python_version"] == f"{major}.{minor}"  # type: ignore[index]
    assert tools["ruff"]["target-version"] == f"py{major}{minor}"  # type: ignore[index]


def test_the_docs_name_the_oldest_declared_python() -> None:
    major, minor = oldest()
    for name in ("README.md", "CONTRIBUTING.md"):
        said = set(re.findall(r"Python (\d+\.\d+)\+", (ROOT / name).read_text(encoding="utf-8")))
        assert said == {f"{major}.{minor}"}, f"{name} says Python {sorted(said)}+"
