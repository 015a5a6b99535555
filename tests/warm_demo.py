"""Demo runs for the gallery: the monitor a user starts, and the demo trainer forked
from one warm interpreter.

A run is what a user gets from ``traintop --headless --exit-when-done`` in one shell and
``python -m demo SCENARIO`` in another: the real headless monitor, a subprocess, and the
demo's own ``main``. Only the trainer's start is shared: torch takes about 2.5 s of CPU
to import, and torch._dynamo (which the first optimizer's ``__init__`` loads) another
1.8 s, and the gallery runs nearly thirty scenarios. So one interpreter imports them,
the probes and the demo once and forks a fresh trainer per run (before any torch work,
so no thread pool is copied). Each trainer is its own process with its own probe,
environment and output file; its exit status is written beside that file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: The warm interpreter: one JSON request a line on stdin, a forked trainer each.
ZYGOTE = r"""
import json, os, signal, sys, traceback
import torch, probes.runtime.probe, demo.__main__, demo.scenarios, demo.trainer
import torch._dynamo  # (loaded on the first optimizer's __init__: 1.8 s, once here)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # trainers are reaped as they end
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if os.fork() == 0:
        status = 1
        try:
            os.setsid()  # its own group: a trainer that hangs is killed with its children
            with open(request["log"] + ".pid", "w") as pid:
                pid.write(str(os.getpid()))
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            sys.stdin = open(os.devnull)
            os.environ.update(request["env"])
            status = demo.__main__.main(request["argv"]) or 0
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            with open(request["log"] + ".status", "w") as done:
                done.write(str(status))
            os._exit(status)
"""


@dataclass(frozen=True)
class DemoRun:
    """What one run showed: the monitor's status and lines, the trainer's status."""

    monitor_status: int
    trainer_status: int | None  # None: it never said (it hung, or died by a signal)
    stdout: str  # the monitor's
    output: str  # the monitor's stdout and stderr, then the trainer's output


class WarmTrainers:
    """One warm interpreter that forks demo trainers; thread-safe."""

    def __init__(self) -> None:
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        assert self._process.stdout is not None
        ready = self._process.stdout.readline()
        assert ready.strip() == "ready", f"the warm trainer did not start: {ready!r}"
        self._lock = threading.Lock()

    def run(self, argv: list[str], monitor_args: list[str], timeout_s: float) -> DemoRun:
        """Start a headless monitor with ``monitor_args``, then a trainer running
        ``python -m demo ARGV`` against it; wait for both."""
        folder = Path(tempfile.mkdtemp(prefix="tt-gallery-"))
        address = f"unix:{folder}/monitor.sock"
        command = [sys.executable, "-m", "tui.cli", "--headless", "--exit-when-done"]
        monitor = subprocess.Popen(
            [*command, "--address", address, *monitor_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert monitor.stdout is not None
        first = monitor.stdout.readline()  # "listening on ...": the socket is there
        log = folder / "trainer.log"
        self._fork(argv, {"TRAINTOP_ADDRESS": address}, log)
        try:
            stdout, stderr = monitor.communicate(timeout=timeout_s)
            monitor_status = monitor.returncode
        except subprocess.TimeoutExpired:
            os.killpg(monitor.pid, signal.SIGKILL)
            stdout, stderr = monitor.communicate()
            stderr += f"\nthe monitor timed out after {timeout_s} s"
            monitor_status = -1
            _kill_group(Path(str(log) + ".pid"))
        trainer_status = _status(log, wait_s=30 if monitor_status != -1 else 0)
        trainer_output = log.read_text(errors="replace") if log.exists() else ""
        shutil.rmtree(folder, ignore_errors=True)
        stdout = first + stdout
        return DemoRun(
            monitor_status, trainer_status, stdout, stdout + stderr + "\n" + trainer_output
        )

    def _fork(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        request = json.dumps({"argv": argv, "env": env, "log": str(log)})
        with self._lock:
            assert self._process.stdin is not None
            self._process.stdin.write(request + "\n")
            self._process.stdin.flush()

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _kill_group(pid_file: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def _status(log: Path, wait_s: float) -> int | None:
    """The trainer's exit status, once it has written it (it ends after its bye)."""
    deadline = time.monotonic() + wait_s
    path = Path(str(log) + ".status")
    while True:
        if path.exists() and (text := path.read_text()):
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
