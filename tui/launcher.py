"""``traintop demo``: the bundled trainer in a subprocess, the monitor in front.

The trainer and the monitor meet on a private Unix socket in a fresh 0700 folder, so
the demo never collides with a monitor already running. The trainer's own output goes
to a log file beside it (it would tear the screen otherwise). Quitting the monitor
stops the demo trainer: it is the demo's child, not a run of yours.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from demo.catalog import SCENARIOS, listing
from probes.wire import ADDRESS_ENV, Address


def run_demo(args: argparse.Namespace) -> int:
    """Start ``python -m demo SCENARIO`` and a monitor connected to it; return a status."""
    if args.list:
        print(listing())
        return 0
    if args.scenario not in SCENARIOS:
        print(f"traintop: unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="traintop-demo-")  # mode 0700
    address = Address("unix", path=os.path.join(folder, "monitor.sock"))
    log_path = os.path.join(folder, "trainer.log")
    trainer = _start_trainer(args, address, log_path)
    try:
        from tui.cli import serve
        from tui.sources import ServerSource

        status = serve(ServerSource(address), headless=args.headless, record=args.record,
                       summary_every=args.summary_every, exit_when_done=args.headless,
                       fail_on=args.fail_on, thresholds=args.thresholds,
                       companion=trainer.poll)
    finally:
        trainer_status = _stop(trainer)
        if trainer_status not in (0, None):
            print(_tail(log_path), file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
    if status == 0 and trainer_status not in (0, None):
        print(f"traintop: the demo trainer exited with status {trainer_status}", file=sys.stderr)
        return 1
    return status


def _start_trainer(args: argparse.Namespace, address: Address, log_path: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "demo", args.scenario]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    if args.delay is not None:
        command += ["--delay", str(args.delay)]
    if args.fixed:
        command.append("--fixed")
    env = {**os.environ, ADDRESS_ENV: str(address), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def _stop(trainer: subprocess.Popen) -> int | None:
    """The trainer's exit status; terminated (None) if it was still running."""
    if trainer.poll() is not None:
        return trainer.returncode
    trainer.terminate()
    try:
        trainer.wait(3)
    except subprocess.TimeoutExpired:
        trainer.kill()
        trainer.wait()
    return None


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""
