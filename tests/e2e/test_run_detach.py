"""``traintop run`` with the screen: quitting detaches, the script trains on (issue 28,
item 3).

Quitting (``q``, Ctrl-C in the app, a signal) or a monitor that fails leaves the
script running in a session of its own, its output in the log file, and prints that
file and the command that watches the run again; a monitor started with that command
sees the run from step 0. Stopping the script is ``X`` (asked first: SIGINT once,
SIGTERM only if asked again), ``--stop-on-quit`` (SIGINT once, no SIGKILL) or
``--fail-on`` tripping (SIGINT once).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tui.runner
import tui.serve
from tests.waiting import wait_until
from tui.cli import parse
from tui.options import MonitorOptions
from tui.runner import Script, run_script
from tui.screens.confirm_stop import ConfirmStop

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]

#: A script that says it started, sleeps, and says it ended (or was interrupted);
#: ``ignore`` as its second argument: SIGINT does nothing to it.
SLEEPER = """\
import signal, sys, time
if sys.argv[2:] == ["ignore"]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    print("started", flush=True)
    time.sleep(float(sys.argv[1]))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise
print("final line", flush=True)
sys.exit(7 if sys.argv[2:] == ["seven"] else 0)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.fixture
def sleeper(tmp_path: Path) -> str:
    path = tmp_path / "sleeper.py"
    path.write_text(SLEEPER)
    return str(path)


@pytest.fixture
def started() -> Iterator[list[Script]]:
    """The scripts a test started: none is left running, whatever happens."""
    scripts: list[Script] = []
    yield scripts
    for script in scripts:
        if script.child.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.child.wait()
        shutil.rmtree(os.path.dirname(script.log_path), ignore_errors=True)


def arguments(
    *child: str, stop_on_quit: bool = False, headless: bool = False
) -> tuple[argparse.Namespace, MonitorOptions]:
    """``traintop run [--stop-on-quit] [--headless] -- CHILD...``, parsed."""
    flags = ["--stop-on-quit"] * stop_on_quit + ["--headless"] * headless
    return parse(["run", *flags, "--", *child])


def fake_screen(
    monkeypatch: pytest.MonkeyPatch,
    started: list[Script],
    until: Callable[[Script], bool],
    then: Callable[[], int] = lambda: 0,
) -> list[dict[str, Any]]:
    """``serve`` as the screen would be: it runs until ``until(script)``, then ends as
    ``then`` says (0: q; 1: the app failed; raising: serve failed)."""
    calls: list[dict[str, Any]] = []

    def serve(source: Any, options: MonitorOptions, **kwargs: Any) -> int:
        script = kwargs["script"]
        started.append(script)
        calls.append({**kwargs, "mode": options.mode, "sid": os.getsid(script.pid)})
        wait_until(lambda: until(script), "the script to get there", 20)
        return then()

    monkeypatch.setattr(tui.serve, "serve", serve)
    return calls


def said_started(script: Script) -> bool:
    return "started" in Path(script.log_path).read_text()


def detached(err: str) -> tuple[int, str, str]:
    """The pid, log and command that the detach lines print."""
    pid = int(re.search(r"the script \(pid (\d+)\) trains on", err)[1])  # type: ignore[index]
    log = re.search(r"its output: +(\S+)", err)[1]  # type: ignore[index]
    command = re.search(r"watch it: +(.+)", err)[1]  # type: ignore[index]
    assert f"stop it:      kill -INT {pid}" in err
    return pid, log, command


def test_quitting_the_screen_detaches_and_the_script_trains_on(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    sleeper: str,
    started: list[Script],
) -> None:
    calls = fake_screen(monkeypatch, started, said_started)
    assert run_script(*arguments(sleeper, "2")) == 0  # detached: 0
    [script] = started
    out, err = capfd.readouterr()
    assert calls[0]["mode"] == "run" and calls[0]["sid"] == script.pid  # a session of its own
    pid, log, command = detached(err)
    assert pid == script.pid and log == script.log_path and alive(pid)
    assert command.endswith(f"--address unix:{os.path.dirname(log)}/monitor.sock")
    assert "started" not in out  # (its log is not shown: it still runs)
    wait_until(lambda: "final line" in Path(log).read_text(), "the script to train on", 20)
    assert "interrupted" not in Path(log).read_text()
    assert script.child.wait(5) == 0
    assert os.path.isdir(os.path.dirname(log))  # the folder stays: the log is there


@pytest.mark.parametrize("how", ["raises", "app status 1"])
def test_a_monitor_that_fails_detaches_and_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    sleeper: str,
    started: list[Script],
    how: str,
) -> None:
    def fail() -> int:
        if how == "raises":
            raise RuntimeError("boom")
        return 1

    fake_screen(monkeypatch, started, said_started, fail)
    assert run_script(*arguments(sleeper, "2")) == 1
    err = capfd.readouterr().err
    first = err.splitlines()[0]
    if how == "raises":
        assert (
            first
            == "traintop: the monitor failed (RuntimeError: boom); detached, the script trains on"
        )
    else:
        assert first == "traintop: the monitor failed; detached, the script trains on"
    pid, log, _ = detached(err)
    assert alive(pid)
    wait_until(lambda: "final line" in Path(log).read_text(), "the script to train on", 20)


def test_quitting_after_the_script_ended_shows_its_log_and_returns_its_status(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    sleeper: str,
    started: list[Script],
) -> None:
    fake_screen(monkeypatch, started, lambda script: script.status() is not None)
    assert run_script(*arguments(sleeper, "0.2", "seven")) == 7
    out, err = capfd.readouterr()
    assert "started\nfinal line\n" in out and "detached" not in err
    assert not os.path.exists(started[0].log_path)  # nothing runs: the folder goes


def test_stop_on_quit_sends_sigint_once_and_waits(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    sleeper: str,
    started: list[Script],
) -> None:
    fake_screen(monkeypatch, started, said_started)
    assert run_script(*arguments(sleeper, "30", stop_on_quit=True)) == 130  # its own status
    out, err = capfd.readouterr()
    assert "interrupted" in out and "KeyboardInterrupt" in out  # its log, shown
    assert f"stopping the script (SIGINT to pid {started[0].pid})" in err


def test_stop_on_quit_never_kills_a_script_that_goes_on(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    sleeper: str,
    started: list[Script],
) -> None:
    monkeypatch.setattr(tui.runner, "STOP_WAIT_S", 0.5)
    fake_screen(monkeypatch, started, said_started)
    assert run_script(*arguments(sleeper, "30", "ignore", stop_on_quit=True)) == 1
    [script] = started
    err = capfd.readouterr().err
    assert (
        f"traintop: the script (pid {script.pid}) still runs 0.5 s after SIGINT; left "
        f"running (kill {script.pid} ends it)"
    ) in err
    assert f"its output:   {script.log_path}" in err
    time.sleep(0.5)  # (nothing else is sent to it: it still runs a while later)
    assert alive(script.pid)


def test_a_headless_run_keeps_the_terminals_session(
    monkeypatch: pytest.MonkeyPatch, sleeper: str, started: list[Script]
) -> None:
    sessions: list[int] = []

    def serve(source: Any, options: MonitorOptions, **kwargs: Any) -> int:
        assert kwargs["script"] is None and kwargs["companion"] is not None
        sessions.append(os.getsid(0))
        wait_until(lambda: kwargs["companion"]() is not None, "the script to end", 20)
        return 0

    monkeypatch.setattr(tui.serve, "serve", serve)
    assert run_script(*arguments(sleeper, "0.1", "seven", headless=True)) == 7
    assert sessions == [os.getsid(0)]


def test_a_headless_monitor_that_fails_says_so_and_the_script_trains_on(
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    sleeper: str,
) -> None:
    def serve(source: Any, options: MonitorOptions, **kwargs: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(tui.serve, "serve", serve)
    # (the script's own status when it is not 0)
    assert run_script(*arguments(sleeper, "0.5", headless=True)) == 1
    out, err = capfd.readouterr()
    [line] = err.splitlines()
    assert line.startswith("traintop: the monitor failed (RuntimeError: boom); the script ")
    assert "--address unix:" in line
    assert "started\nfinal line\n" in out  # its output, the terminal's: it trained on


# --- X: stop the script, asked first ----------------------------------------------


def start_script(sleeper: str, *args: str, log: Path) -> Script:
    with open(log, "wb") as handle:
        child = subprocess.Popen(
            [sys.executable, sleeper, *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    script = Script(child, str(log), own_group=True)
    wait_until(lambda: said_started(script), "the script to start", 20)
    return script


async def test_x_asks_then_sends_sigint_once(
    tmp_path: Path, sleeper: str, started: list[Script]
) -> None:
    from tui.app import make_app
    from tui.sources import FrameListSource

    script = start_script(sleeper, "30", log=tmp_path / "script.log")
    started.append(script)
    app = make_app(FrameListSource([]), companion=script.status, script=script, mode="run")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("X")
        assert isinstance(app.screen, ConfirmStop)
        assert "SIGINT" in str(app.screen.question) and str(script.pid) in app.screen.question
        await pilot.press("n")  # no: nothing is sent
        assert not isinstance(app.screen, ConfirmStop)
        time.sleep(0.3)
        assert script.status() is None
        await pilot.press("X", "y")
        assert script.wait(10) == 130  # SIGINT, as Ctrl-C: its KeyboardInterrupt
    assert "interrupted" in Path(script.log_path).read_text()


async def test_x_asks_again_before_sigterm_and_never_kills(
    tmp_path: Path, sleeper: str, started: list[Script]
) -> None:
    from tui.app import make_app
    from tui.sources import FrameListSource

    script = start_script(sleeper, "30", "ignore", log=tmp_path / "script.log")
    started.append(script)
    app = make_app(FrameListSource([]), script=script, mode="run")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("X", "y")
        time.sleep(0.5)
        assert script.status() is None  # it ignores SIGINT: nothing more was sent
        await pilot.press("X")
        assert isinstance(app.screen, ConfirmStop)
        assert "still runs" in app.screen.question and "SIGTERM" in app.screen.question
        await pilot.press("y")
        assert script.wait(10) == 128 + signal.SIGTERM
        await pilot.press("X")  # it has ended: said, not asked
        assert not isinstance(app.screen, ConfirmStop)


async def test_x_is_not_there_without_a_script() -> None:
    from textual.widgets._footer import FooterKey

    from tui.app import make_app
    from tui.sources import FrameListSource

    app = make_app(FrameListSource([]))
    async with app.run_test(size=(120, 24)) as pilot:
        await pilot.press("X")
        assert app.screen is app.screen_stack[0]
        await pilot.pause()
        assert "X" not in [k.key for k in app.screen.query(FooterKey)]


def test_the_help_says_what_q_and_x_do_in_each_mode() -> None:
    from tui.screens.help import keys_for

    run = dict(keys_for("run"))
    assert "detaches" in run["q"] and "script trains on" in run["q"]
    assert "--stop-on-quit" in run["q"]
    assert "SIGINT" in run["X"] and "asks first" in run["X"]
    assert "detaches" in dict(keys_for("live"))["q"]
    assert "stops the demo trainer" in dict(keys_for("demo"))["q"]
    for mode in ("live", "demo", "replay"):
        assert "here there is none" in dict(keys_for(mode))["X"]


# --- --fail-on: SIGINT once -------------------------------------------------------


def test_fail_on_stops_the_script_with_one_sigint(tmp_path: Path) -> None:
    script = tmp_path / "no_zero_grad.py"
    script.write_text(
        "import time, torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "try:\n"
        "    for _ in range(100000):\n"
        "        model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()\n"
        "        time.sleep(0.01)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    raise SystemExit(130)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--fail-on", "error", str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ALERT error grad_not_cleared" in done.stdout
    assert done.stdout.count("interrupted") == 1  # SIGINT reached it, once


# --- as a user: tmux, q, then the printed command ---------------------------------

TRAIN = """\
import sys, time, torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(STEPS):
    x = torch.randn(16, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print("step", step, flush=True)
    time.sleep(0.1)
print("final line", flush=True)
"""
STEPS = 80


@pytest.mark.slow  # a real terminal and two monitors: about 10 s (-m slow)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_q_detaches_and_the_printed_command_watches_the_run_from_step_0(
    tmp_path: Path,
) -> None:
    from tests.e2e.test_terminal import Tmux

    folder = Path(tempfile_short())
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("STEPS", str(STEPS)))
    # ``python`` as the user types it: this test's (first on the PATH)
    path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    env = f"TMPDIR={folder} PYTHONPATH={ROOT} OMP_NUM_THREADS=1 PATH={shlex.quote(path)}"
    term = Tmux(
        f"cd {ROOT} && env {env} {sys.executable} -m tui.cli run python {script}; echo EXIT=$?"
    )
    pid = 0
    try:
        wait_until(lambda: _step_shown(term.screen()) >= 3, "the run on the screen", 30, every=0.1)
        term.tmux("send-keys", "-t", "t", "q")
        wait_until(lambda: "#dead" in _dead(term), "traintop to exit", 20, every=0.1)
        # (long lines joined; the history too: the pane is 24 rows)
        printed = term.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")
        assert "EXIT=0" in printed, printed  # detached: 0
        pid, log, command = detached(printed)
        assert alive(pid), printed  # it trains on after traintop is gone
        steps_then = Path(log).read_text().count("step ")
        assert steps_then < STEPS
        record = tmp_path / "second.ndjson"
        second = subprocess.run(
            [*shlex.split(command), "--headless", "--exit-when-done", "--record", str(record)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=40,
        )
        assert second.returncode == 0, second.stderr
        frames = [json.loads(line) for line in record.read_text().splitlines()]
        assert [f["kind"] for f in frames].count("hello") == 1
        shown: set[int] = set()  # the steps the step records stand for
        for frame in frames:
            if frame["kind"] == "step":
                first, last = frame.get("span") or (frame["step"], frame["step"])
                shown.update(range(first, last + 1))
        assert shown == set(range(STEPS)), sorted(set(range(STEPS)) ^ shown)  # from step 0
        assert "disconnected" in second.stdout and "reason=finished" in second.stdout
        text = Path(log).read_text()
        assert text.rstrip().endswith("final line")  # written after traintop had exited
        assert text.count("step ") == STEPS
    finally:
        term.close()
        if pid and alive(pid):
            os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def tempfile_short() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="tt-")  # short: a socket path must fit sun_path


def _step_shown(screen: str) -> int:
    found = re.search(r"step (\d+)", screen.splitlines()[0] if screen else "")
    return int(found[1]) if found else -1


def _dead(term: Any) -> str:
    return "#dead" if term.tmux("display", "-p", "-t", "t", "#{pane_dead}").strip() == "1" else ""
