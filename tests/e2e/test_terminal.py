"""The screen app in a real terminal (tmux): a signal must give the terminal back as it
was, stop the demo trainer and remove the demo's private socket folder.

Skipped where tmux is not installed (``.ci/run`` installs it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes.kernel.wire import encode_frame
from tests.frames import short_run
from tests.waiting import wait_until
from tui.launcher import TRAINER_RUNNER

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]
REPO = Path(__file__).resolve().parents[2]
MODES = (
    "#{pane_dead} #{alternate_on} #{mouse_any_flag} #{mouse_button_flag} "
    "#{mouse_standard_flag} #{mouse_sgr_flag}"
)


class Tmux:
    """A private tmux server with one 80x24 window running ``command``."""

    def __init__(self, command: str) -> None:
        self.socket = f"traintop-test-{os.getpid()}-{time.monotonic_ns()}"
        self.tmux("new-session", "-d", "-s", "t", "-x", "80", "-y", "24", command)
        self.tmux("set-option", "-t", "t", "remain-on-exit", "on")  # read it after death

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def modes(self) -> dict[str, str]:
        names = ["dead", "alternate", "mouse_any", "mouse_button", "mouse_standard", "mouse_sgr"]
        return dict(zip(names, self.tmux("display", "-p", "-t", "t", MODES).split(), strict=True))

    def pid(self) -> int:
        return int(self.tmux("display", "-p", "-t", "t", "#{pane_pid}").strip())

    def close(self) -> None:
        self.tmux("kill-server")


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(entry.name), cmdline))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def private_tmp() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="tt-")  # short: a socket path must fit sun_path
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def command(tmp: str, *args: str) -> str:
    env = f"TMPDIR={tmp} PYTHONPATH={REPO} OMP_NUM_THREADS=1"
    return f"cd {REPO} && exec env {env} {sys.executable} -m tui.cli " + " ".join(args)


def test_sigterm_restores_the_terminal_stops_the_trainer_and_removes_the_folder(
    private_tmp: str,
) -> None:
    term = Tmux(command(private_tmp, "demo", "healthy", "--steps", "100000", "--delay", "0.01"))
    trainers: list[int] = []
    try:
        wait_until(
            lambda: "running" in term.screen(), "the demo to show a running run", 60, every=0.1
        )
        monitor = term.pid()
        trainers += [
            pid for pid, cmd in children(monitor) if TRAINER_RUNNER in cmd and " healthy " in cmd
        ]
        folders = list(Path(private_tmp).glob("traintop-demo-*"))
        assert len(trainers) == 1 and len(folders) == 1
        assert (folders[0] / "monitor.sock").exists()
        before = term.modes()
        assert before["alternate"] == "1" and before["mouse_any"] == "1"  # the app's
        os.kill(monitor, signal.SIGTERM)
        wait_until(lambda: term.modes()["dead"] == "1", "the monitor to exit", 60, every=0.1)
        after = term.modes()
        assert after == {
            "dead": "1",
            "alternate": "0",
            "mouse_any": "0",
            "mouse_button": "0",
            "mouse_standard": "0",
            "mouse_sgr": "0",
        }
        wait_until(lambda: not alive(trainers[0]), "the demo trainer to stop", every=0.1)
        assert not folders[0].exists()
    finally:
        term.close()
        for pid in trainers:  # a failed run must not leave the trainer training
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_a_hang_up_restores_the_terminal_of_a_replay(private_tmp: str) -> None:
    log = Path(private_tmp) / "run.ndjson"
    log.write_bytes(b"".join(encode_frame(f) for f in short_run(20)))
    term = Tmux(command(private_tmp, "replay", str(log)))
    try:
        wait_until(lambda: "step 19" in term.screen(), "the replay to show", 60, every=0.1)
        assert term.modes()["alternate"] == "1"
        os.kill(term.pid(), signal.SIGHUP)
        wait_until(lambda: term.modes()["dead"] == "1", "the monitor to exit", 60, every=0.1)
        modes = term.modes()
        assert modes["alternate"] == "0" and modes["mouse_any"] == "0"
    finally:
        term.close()


def test_a_terminal_that_hangs_up_with_no_sighup_ends_the_monitor_and_its_demo(
    private_tmp: str,
) -> None:
    # A shell that runs more after the monitor (``; sleep``) is the pane's process: when
    # the terminal hangs up (the tmux server killed, as an SSH session dropped), the
    # shell gets the SIGHUP and forwards none. The monitor must find out for itself.
    demo = command(private_tmp, "demo", "healthy", "--steps", "100000", "--delay", "0.01")
    term = Tmux(demo.replace("&& exec env", "&& env") + "; sleep 600")
    monitors: list[int] = []
    trainers: list[int] = []
    try:
        wait_until(
            lambda: "running" in term.screen(), "the demo to show a running run", 60, every=0.1
        )
        monitors += [pid for pid, cmd in children(term.pid()) if "tui.cli demo" in cmd]
        assert len(monitors) == 1
        trainers += [pid for pid, cmd in children(monitors[0]) if TRAINER_RUNNER in cmd]
        assert len(trainers) == 1
        term.close()  # the terminal hangs up
        wait_until(lambda: not alive(monitors[0]), "the monitor to leave", 30, every=0.1)
        wait_until(lambda: not alive(trainers[0]), "the demo trainer to stop", 30, every=0.1)
        assert not list(Path(private_tmp).glob("traintop-demo-*"))  # its folder removed
    finally:
        term.close()
        for pid in monitors + trainers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
