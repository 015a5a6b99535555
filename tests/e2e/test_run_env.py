"""``traintop run``: the script's environment is its own (issue 28, item 4).

Only the private folder of the attaching ``sitecustomize`` goes on the child's path;
the script imports its own packages from its own environment. A Python that cannot
import this traintop's probes (another environment, someone else's ``probes``) is
refused with one line before the script runs, never run half-watched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes.kernel.wire import Address
from tui.runner import (
    CHECKED_ENV,
    PROBES_DIR,
    child_environment,
    command_python,
    python_problem,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def traintop_run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", "run", "--headless", *command],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,  # (traintop's own probes: this checkout's)
        capture_output=True,
        text=True,
        timeout=50,
    )


def bare_venv(path: Path, *, with_traintop: bool) -> Path:
    """A virtual environment of the base Python, without pip, torch or traintop (with
    ``with_traintop``: this checkout on its path, as an install there would be); a
    ``torch`` of its own, a stub that says where it is."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=30
    )
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.strip()
    (Path(site) / "torch").mkdir()
    (Path(site) / "torch" / "__init__.py").write_text("OWN = 'the environment own torch'\n")
    if with_traintop:
        (Path(site) / "traintop-checkout.pth").write_text(f"{ROOT}\n")
    return python


def test_only_the_private_folder_goes_on_the_childs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/the/users/own")
    monkeypatch.setenv(CHECKED_ENV, "1")  # (a traintop run inside another: checked afresh)
    env = child_environment("/tmp/traintop-run-x", Address("unix", path="/tmp/x/monitor.sock"))
    assert env["PYTHONPATH"] == os.pathsep.join(["/tmp/traintop-run-x", "/the/users/own"])
    assert CHECKED_ENV not in env
    monkeypatch.delenv("PYTHONPATH")
    env = child_environment("/tmp/traintop-run-x", Address("unix", path="/tmp/x/monitor.sock"))
    assert env["PYTHONPATH"] == "/tmp/traintop-run-x"


def test_the_scripts_sys_path_is_the_one_it_has_without_traintop(tmp_path: Path) -> None:
    script = tmp_path / "path.py"
    script.write_text("import json, sys\nprint('PATH', json.dumps(sys.path))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    alone = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30
    )
    watched = traintop_run(sys.executable, str(script))
    assert watched.returncode == 0, watched.stderr

    def path(output: str) -> list[str]:
        [line] = [x for x in output.splitlines() if x.startswith("PATH ")]
        return list(json.loads(line[5:]))

    private, *rest = path(watched.stdout)[1:]  # (after the script's own folder)
    assert os.path.basename(private).startswith("traintop-run-")
    assert [path(alone.stdout)[0], *rest] == path(alone.stdout)  # nothing else added


def test_a_python_of_another_environment_is_refused_before_the_script_runs(
    tmp_path: Path,
) -> None:
    python = bare_venv(tmp_path / "other", with_traintop=False)
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    started = time.monotonic()
    done = traintop_run(str(python), str(script), env={"PYTHONPATH": ""})
    assert time.monotonic() - started < 20
    assert done.returncode == 1
    [line] = done.stderr.splitlines()  # one line, which says how to fix it
    assert line.startswith(f"traintop: {python} cannot import traintop's probes")
    assert f"{python} -m pip install traintop" in line
    assert "traintop run from it" in line
    assert not ran.exists()  # not run half-watched


def test_a_python_with_traintop_runs_the_script_on_its_own_packages(tmp_path: Path) -> None:
    python = bare_venv(tmp_path / "own", with_traintop=True)
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint('torch:', torch.OWN, torch.__file__)\n")
    done = traintop_run(str(python), str(script), env={"PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    own = str(tmp_path / "own")
    assert f"torch: the environment own torch {own}" in done.stdout  # its torch, not ours


def test_someone_elses_probes_package_is_named_and_refused(tmp_path: Path) -> None:
    python = bare_venv(tmp_path / "other", with_traintop=False)
    theirs = tmp_path / "theirs"
    (theirs / "probes").mkdir(parents=True)
    (theirs / "probes" / "__init__.py").write_text("")
    problem = python_problem(str(python)) or ""
    assert "cannot import traintop's probes" in problem
    done = traintop_run(str(python), "-c", "pass", env={"PYTHONPATH": str(theirs)})
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert "imports a probes package that is not traintop's" in line
    assert str(theirs / "probes") in line


def test_a_launcher_the_check_cannot_see_through_is_refused_by_the_sitecustomize(
    tmp_path: Path,
) -> None:
    """``sh -c 'python train.py'``: no Python to check beforehand; the command's first
    Python refuses in its ``sitecustomize``, before the script runs."""
    python = bare_venv(tmp_path / "other", with_traintop=False)
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    done = traintop_run("sh", "-c", f"exec {python} {script}", env={"PYTHONPATH": ""})
    assert done.returncode == 1
    assert f"traintop: {python} cannot import traintop's probes" in done.stderr
    assert not ran.exists()


def test_a_tool_of_another_environment_that_the_script_starts_is_left_alone(
    tmp_path: Path,
) -> None:
    python = bare_venv(tmp_path / "tool", with_traintop=False)
    script = tmp_path / "train.py"
    script.write_text(
        "import subprocess\n"
        f"tool = subprocess.run([{str(python)!r}, '-c', 'print(42)'], capture_output=True,"
        " text=True)\n"
        "print('tool said', tool.stdout.strip(), 'status', tool.returncode, repr(tool.stderr))\n"
    )
    done = traintop_run(sys.executable, str(script))
    assert done.returncode == 0, done.stderr
    assert "tool said 42 status 0 ''" in done.stdout


def test_the_python_to_check_is_the_one_the_command_names(tmp_path: Path) -> None:
    assert command_python([sys.executable, "train.py"]) is None  # traintop's own: fine
    assert command_python(["definitely-not-a-command-xyz"]) is None
    python = bare_venv(tmp_path / "env", with_traintop=False)
    launcher = tmp_path / "torchrun"
    launcher.write_text(f"#!{python}\nimport sys\n")
    launcher.chmod(0o755)
    assert command_python([str(launcher)]) == str(python)  # through its #! line
    launcher.write_text(f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n")
    assert command_python([str(launcher)]) == str(python)  # pip's long-path launcher
    launcher.write_text("#!/bin/sh\necho hi\n")
    assert command_python([str(launcher)]) is None  # the sitecustomize checks then
    assert command_python([str(python), "train.py"]) == str(python)


def test_this_traintops_probes_pass_the_check() -> None:
    started = time.monotonic()
    python = sys.executable
    # (a Python named by path, not traintop's own: the check runs)
    assert python_problem(python) is None
    assert time.monotonic() - started < 10
    assert os.path.isfile(os.path.join(PROBES_DIR, "attach", "bootstrap.py"))
