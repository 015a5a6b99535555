"""``traintop run --headless``: unmodified scripts (``tests/run_scripts``, no traintop
line in them), watched; their numbers bit for bit those of the same training without
traintop, their healthy twins raising nothing, the broken ones named."""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest

from tests.collector import Frame, raised_alerts, verdict_lines, verdicts
from tui.cli import split_run
from tui.runner import child_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "run_scripts")


def traintop_run(
    tmp_path: Any, script: str, *args: str, launcher: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Frame]]:
    """``traintop run --headless --record LOG [launcher] script args``: the process and
    the frames the monitor received."""
    log = os.path.join(tmp_path, f"{script}.ndjson")
    command = [
        sys.executable,
        "-m",
        "tui.cli",
        "run",
        "--headless",
        "--record",
        log,
        *(launcher or [sys.executable]),
        os.path.join(SCRIPTS, f"{script}.py"),
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    frames = []
    if os.path.exists(log):
        with open(log, encoding="utf-8") as handle:
            frames = [json.loads(line) for line in handle if line.strip()]
    return done, frames


def untouched(script: str, **kwargs: Any) -> str:
    """The script's own result line, trained here, with no traintop anywhere near."""
    module = runpy.run_path(os.path.join(SCRIPTS, f"{script}.py"), run_name="not_main")
    return str(module["train"](**kwargs))


def untouched_process(script: str) -> str:
    """The script's own result line, run as a process of its own without traintop (a
    framework's run in this test process differs in the last digits: state of the
    test process's own)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, f"{script}.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [line] = result_lines(done.stdout)
    return line


def result_lines(output: str) -> list[str]:
    """The scripts' result lines (the monitor's lines share the stream: one may be cut
    into by the script's own write)."""
    return re.findall(rf"result\d* {_FLOAT} {_FLOAT}", output)


_FLOAT = r"(?:-?\d+(?:\.\d+)?(?:e[-+]\d+)?|nan|-?inf)"  # a float's repr


def kinds(frames: list[Frame]) -> set[str]:
    """The kinds of the verdicts (warnings and errors) a monitor raises on ``frames``."""
    return {alert.kind for alert in verdicts(raised_alerts(frames))}


def losses(frames: list[Frame]) -> dict[int, float | None]:
    """Every step the records stand for (a thinned one: several), with its loss."""
    found: dict[int, float | None] = {}
    for frame in frames:
        if frame["kind"] != "step":
            continue
        for step, loss in frame.get("step_losses") or [
            (frame["step"], frame.get("scalars", {}).get("loss"))
        ]:
            found[step] = loss
    return found


def steps(frames: list[Frame]) -> list[int]:
    return sorted(losses(frames))


@pytest.mark.parametrize(
    ("script", "kwargs", "count"),
    [
        ("plain", {"clear": True}, 24),
        # (-m slow: a traintop run child each; tests/runtime/test_loop_shapes.py has
        # these shapes in the test process by default)
        pytest.param("amp_accumulation", {}, 8, marks=pytest.mark.slow),
        pytest.param("lbfgs", {}, 6, marks=pytest.mark.slow),
        pytest.param("hand_sgd", {"clear": True}, 20, marks=pytest.mark.slow),
    ],
)
def test_a_healthy_script_is_watched_unchanged_and_raises_nothing(
    tmp_path: Any, script: str, kwargs: dict[str, Any], count: int
) -> None:
    done, frames = traintop_run(tmp_path, script)
    assert done.returncode == 0, done.stderr
    assert result_lines(done.stdout) == [untouched(script, **kwargs)]  # bit for bit
    assert "traintop: not attached" not in done.stderr
    assert [f["kind"] for f in frames].count("hello") == 1
    assert steps(frames) == list(range(count))  # every update, one step each
    assert None not in losses(frames).values()  # each step's loss, from its backward
    assert kinds(frames) == set()


@pytest.mark.parametrize("script", ["plain", pytest.param("hand_sgd", marks=pytest.mark.slow)])
def test_a_missing_zero_grad_is_named(tmp_path: Any, script: str) -> None:
    done, frames = traintop_run(tmp_path, script, "--no-zero-grad")
    assert done.returncode == 0, done.stderr
    assert result_lines(done.stdout) == [untouched(script, clear=False)]
    assert "grad_not_cleared" in kinds(frames)
    assert "ALERT error grad_not_cleared" in done.stdout  # the headless monitor's line


def test_the_scripts_exit_status_is_its_own(tmp_path: Any) -> None:
    script = os.path.join(tmp_path, "fails.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write("import sys\nprint('trained a bit')\nsys.exit(7)\n")
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--", script]
    done = subprocess.run(
        command, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True
    )
    assert done.returncode == 7
    assert "trained a bit" in done.stdout  # its output passed through


def test_the_environments_own_sitecustomize_still_runs(tmp_path: Any) -> None:
    """traintop's sitecustomize comes first on the path; the one it shadows (a conda
    environment's, a cluster's) runs after it, as it would without traintop."""
    site = os.path.join(tmp_path, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        # (in the process itself: traintop's own process runs it too, and an environment
        # variable would reach the script from there)
        handle.write("import sys\nsys.site_says = 'hello'\n")
    script = os.path.join(tmp_path, "show.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write("import sys\nprint('site:', getattr(sys, 'site_says', None))\n")
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--", script]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, site])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "site: hello" in done.stdout
    assert "traintop:" not in done.stderr


def test_the_command_line_splits_traintops_options_from_the_scripts() -> None:
    assert split_run(["run", "--headless", "python", "train.py", "--lr", "1"]) == (
        ["run", "--headless"],
        ["python", "train.py", "--lr", "1"],
    )
    assert split_run(["run", "--fail-on", "error", "-m", "pkg.train"]) == (
        ["run", "--fail-on", "error"],
        ["-m", "pkg.train"],
    )
    assert split_run(["run", "--", "--weird.py"]) == (["run"], ["--weird.py"])
    assert split_run(["run", "--help"]) == (["run", "--help"], [])  # traintop's own help
    assert split_run(["run", "train.py", "--help"]) == (["run"], ["train.py", "--help"])
    assert split_run(["run", "--stop-on-quit", "python", "t.py"]) == (
        ["run", "--stop-on-quit"],
        ["python", "t.py"],
    )
    assert child_command(["train.py", "--x"]) == [sys.executable, "train.py", "--x"]
    assert child_command(["-m", "pkg"]) == [sys.executable, "-m", "pkg"]
    assert child_command(["torchrun", "--nproc-per-node", "2", "t.py"])[0] == "torchrun"


@pytest.mark.slow
def test_a_hugging_face_trainer_script_gets_the_callback(tmp_path: Any) -> None:
    done, frames = traintop_run(tmp_path, "hf_trainer")
    assert done.returncode == 0, done.stderr
    assert result_lines(done.stdout) == [untouched_process("hf_trainer")], done.stdout + done.stderr
    assert [f["kind"] for f in frames].count("hello") == 1  # the callback's run, only
    assert steps(frames) == list(range(6))
    assert kinds(frames) == set()


@pytest.mark.slow
def test_a_lightning_script_gets_the_callback(tmp_path: Any) -> None:
    done, frames = traintop_run(tmp_path, "lightning_script")
    assert done.returncode == 0, done.stderr
    assert result_lines(done.stdout) == [untouched_process("lightning_script")]
    assert [f["kind"] for f in frames].count("hello") == 1
    assert len(steps(frames)) == 8
    assert kinds(frames) == set()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def torchrun() -> list[str]:
    """torchrun, 2 ranks on this machine (a free loopback port)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
    ]


@pytest.mark.slow
def test_a_torchrun_ddp_script_is_one_job_of_two_ranks(tmp_path: Any) -> None:
    done, frames = traintop_run(tmp_path, "ddp", launcher=torchrun())
    assert done.returncode == 0, done.stderr
    hellos = [f for f in frames if f["kind"] == "hello"]
    assert sorted(h["rank"] for h in hellos) == [0, 1]
    assert len({h["job"] for h in hellos}) == 1
    assert sorted(result_lines(done.stdout))[0].startswith("result0 ")
    for hello in hellos:
        mine = [f for f in frames if f.get("run") == hello["run"]]
        assert steps(mine) == list(range(8))
        assert kinds(mine) == set()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lr", "expected"),
    [(3e-3, []), (0.5, [("update_ratio", "ranks=all")])],
    ids=["healthy", "rate-far-too-high"],
)
def test_a_ddp_lstm_raises_one_alert_for_the_job_or_none(
    tmp_path: Any, lr: float, expected: list[tuple[str, str]]
) -> None:
    # A rate far too high, found on rank 0 for both ranks, and nothing else: the other
    # rank's diverging loss, its local gradients and its non-finite values are the
    # rate's (each was raised on its own before: three or four alerts for one cause).
    done, _ = traintop_run(tmp_path, "ddp_lstm", "--lr", str(lr), launcher=torchrun())
    assert done.returncode == 0, done.stderr
    alerts = [line.split() for line in verdict_lines(done.stdout)]
    assert [(words[2], words[-2]) for words in alerts] == expected, done.stdout


def test_ctrl_c_reaches_the_script_as_without_traintop(tmp_path: Any) -> None:
    script = os.path.join(tmp_path, "forever.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(
            "import time\n"  # (started inside the try: a Ctrl-C just after it is caught)
            "try:\n    print('started', flush=True)\n    while True:\n        time.sleep(0.05)\n"
            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n"
        )
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", sys.executable, script]
    child = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's process group of its own
    )
    assert child.stdout is not None
    for line in child.stdout:
        if "started" in line:
            break
    os.killpg(child.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    out, err = child.communicate(timeout=60)
    assert "interrupted" in out
    assert "KeyboardInterrupt" in err  # the script's own traceback
    assert child.returncode == 130  # the script's status, as a shell says it


OUT_OF_MEMORY = """\
import torch
from torch import nn
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    if step == 3:
        print('about to run out', flush=True)
        torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator refuses at once
"""


@pytest.mark.slow  # (traintop run's child and the bare twin: 19 s; the step API's report
# is in the default tier, tests/runtime/test_step_resources.py)
def test_an_out_of_memory_error_ends_the_script_as_without_traintop(tmp_path: Any) -> None:
    script = os.path.join(tmp_path, "oom.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(OUT_OF_MEMORY)
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    watched = subprocess.run(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    bare = subprocess.run(
        [sys.executable, script], env=env, capture_output=True, text=True, timeout=300
    )
    assert watched.returncode == bare.returncode == 1
    last = bare.stderr.strip().splitlines()[-1]
    assert "DefaultCPUAllocator: can't allocate memory" in last
    assert last in watched.stderr  # the script's own traceback, as it ends bare
    assert "about to run out" in watched.stdout
    # and the report, before the script ended: between steps (after an update), the
    # memory of the steps before it
    [report] = [line for line in watched.stdout.splitlines() if line.startswith("ALERT error out_")]
    assert report.startswith("ALERT error out_of_memory step=4 subject=data phase=data")
    assert "traintop: ALERT error out_of_memory" in watched.stdout + watched.stderr  # its log
    assert 'history="' in report and "largest=" in report
