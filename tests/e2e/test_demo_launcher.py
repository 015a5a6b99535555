"""``traintop demo`` runs the installed demo, whatever folder it is started in; the
gallery (docs/gallery.md) lists every scenario of the catalog, and the README counts them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from demo.catalog import SCENARIOS
from tui.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GALLERY = ROOT / "docs" / "gallery.md"
LOUD = (
    "import pathlib, sys\n"
    "pathlib.Path({marker!r}).write_text('ran')\n"
    "sys.exit('the user\\'s own {package} package ran instead of traintop\\'s')\n"
)


def a_project_with_its_own_packages(folder: Path) -> Path:
    """A folder holding a ``demo/`` and a ``probes/`` package of its own, each of which
    leaves a marker and fails at import."""
    marker = folder / "user-code-ran"
    for package in ("demo", "probes"):
        (folder / package).mkdir()
        code = LOUD.format(marker=str(marker), package=package)
        (folder / package / "__init__.py").write_text(code)
        (folder / package / "__main__.py").write_text(code)
    return marker


def test_the_demo_runs_the_installed_trainer_from_a_folder_with_its_own_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = a_project_with_its_own_packages(tmp_path)
    monkeypatch.chdir(tmp_path)  # the trainer starts here, as from a user's shell
    status = main(
        ["demo", "healthy", "--headless", "--steps", "5", "--delay", "0", "--summary-every", "1000"]
    )
    out = capsys.readouterr()
    assert not marker.exists(), out.err
    assert status == 0, out.out + out.err
    assert "disconnected run=healthy reason=finished" in out.out


def test_the_trainer_command_names_the_installed_demo_package() -> None:
    import demo
    from tui.launcher import trainer_command

    command = trainer_command("healthy")
    root = Path(command[3])
    assert (root / "demo" / "__init__.py").resolve() == Path(demo.__file__).resolve()
    assert command[-1] == "healthy" and "-m" not in command


NUMBER_WORDS = {
    14: "fourteen",
    15: "fifteen",
    16: "sixteen",
    17: "seventeen",
    18: "eighteen",
    19: "nineteen",
    20: "twenty",
}


def gallery_table(gallery: str) -> list[str]:
    """The scenario names of the gallery's table, in its order."""
    section = gallery.split("# The gallery\n", 1)[1]
    table = section.split("| scenario |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)


def test_the_gallery_lists_every_scenario_of_the_catalog() -> None:
    assert gallery_table(GALLERY.read_text(encoding="utf-8")) == list(SCENARIOS)
    readme = README.read_text(encoding="utf-8")
    counted = re.search(r"`traintop demo --list` lists the (\w+) scenarios", readme)
    assert counted is not None
    assert counted.group(1) == NUMBER_WORDS[len(SCENARIOS)]
