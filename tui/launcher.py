"""``traintop demo``: the bundled trainer in a subprocess, the monitor in front.

The trainer and the monitor meet on a private Unix socket in a fresh 0700 folder, so
the demo never collides with a monitor already running. The trainer's own output goes
to a log file beside it (it would tear the screen otherwise). Quitting the monitor
stops the demo trainer: it is the demo's child, not a run of yours.

The trainer runs in a process group of its own, so a terminal's signals (Ctrl-C in
headless mode, the hang-up of a closed window) reach the monitor alone, and the monitor
stops the whole group and removes the folder however it ends: q, SIGTERM, SIGHUP or
SIGINT (the screen app turns these into a clean exit), or an error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

import demo
from demo.catalog import SCENARIOS, listing
from probes.kernel.wire import ADDRESS_ENV, Address

if TYPE_CHECKING:
    from tui.options import MonitorOptions


def run_demo(args: argparse.Namespace, options: MonitorOptions) -> int:
    """Start the installed demo's ``SCENARIO`` (``trainer_command``) and a monitor
    connected to it (``options``: the monitor's); return a status."""
    if args.list:
        print(listing())
        return 0
    if args.scenario not in SCENARIOS:
        print(
            f"traintop: unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    folder = tempfile.mkdtemp(prefix="traintop-demo-")  # mode 0700
    address = Address("unix", path=os.path.join(folder, "monitor.sock"))
    log_path = os.path.join(folder, "trainer.log")
    trainer = _start_trainer(args, address, log_path)
    try:
        from tui.serve import serve
        from tui.sources import ServerSource

        status = serve(ServerSource(address), options, companion=trainer.poll)
    finally:
        # A second signal must not cut the clean-up short (the trainer left running,
        # the folder left behind): held off while it runs, a second or so.
        held = _hold_signals()
        try:
            trainer_status = _stop(trainer)
            if trainer_status not in (0, None):
                print(_tail(log_path), file=sys.stderr)
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            _restore_signals(held)
    if status == 0 and trainer_status not in (0, None):
        print(f"traintop: the demo trainer exited with status {trainer_status}", file=sys.stderr)
        return 1
    return status


# ``python -m demo`` would put the working folder first on the import path, where a
# ``demo/`` (or ``probes/``) package of the user's would run instead of ours: the
# trainer runs the demo package this monitor imported, from the folder that holds it.
# (``python -P`` would drop the working folder only; the runner also puts ours first.)
TRAINER_RUNNER = (
    "import runpy, sys\n"
    "if not getattr(sys.flags, 'safe_path', False): del sys.path[0]  # the working folder\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "runpy.run_module('demo', run_name='__main__', alter_sys=True)\n"
)


def trainer_command(scenario: str) -> list[str]:
    """The command that runs the installed demo's ``scenario``, whatever the folder."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(demo.__file__)))
    return [sys.executable, "-c", TRAINER_RUNNER, root, scenario]


def _start_trainer(args: argparse.Namespace, address: Address, log_path: str) -> subprocess.Popen:
    command = trainer_command(args.scenario)
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    if args.delay is not None:
        command += ["--delay", str(args.delay)]
    if args.fixed:
        command.append("--fixed")
    env = {**os.environ, ADDRESS_ENV: str(address), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _stop(trainer: subprocess.Popen) -> int | None:
    """The trainer's exit status; terminated (None) if it was still running. The whole
    process group is signalled: anything the trainer started goes with it."""
    if trainer.poll() is not None:
        return trainer.returncode
    _signal_group(trainer, signal.SIGTERM)
    try:
        trainer.wait(3)
    except subprocess.TimeoutExpired:
        _signal_group(trainer, signal.SIGKILL)
        trainer.wait()
    return None


def _signal_group(trainer: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(trainer.pid, signum)  # its own session: the group id is its pid


CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _hold_signals() -> dict[int, object]:
    held: dict[int, object] = {}
    for signum in CLEANUP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            held[signum] = signal.signal(signum, signal.SIG_IGN)
    return held


def _restore_signals(held: dict[int, object]) -> None:
    for signum, handler in held.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""
