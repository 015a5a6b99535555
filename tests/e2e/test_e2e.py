"""End to end: the bundled trainer in a subprocess, the monitor's real server here.

What a run's records become in the monitor is tested on recorded runs
(``test_recorded_runs.py``); the demos run end to end, as a user runs them, in the
gallery. Here: a monitor that starts late, and a trainer with no monitor at all.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from probes.kernel.wire import Address
from tests.waiting import until
from tui.monitor import Monitor
from tui.run import RunState
from tui.server import MonitorServer


def start_trainer(address: Address, *args: str) -> subprocess.Popen:
    env = {**os.environ, "TRAINTOP_ADDRESS": str(address), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "demo", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def wait_for_run(monitor: Monitor, timeout: float = 60.0) -> RunState:
    """The first run, once it has said bye and disconnected."""

    def finished() -> RunState | None:
        runs = list(monitor.state.runs.values())
        return runs[0] if runs and runs[0].ended and not runs[0].connected else None

    return await until(finished, "the run to finish", timeout)


@pytest.mark.slow  # (a trainer child, a monitor started after it: 20 s)
async def test_monitor_started_late_still_sees_step_zero(socket_path: str) -> None:
    address = Address("unix", path=socket_path)
    trainer = start_trainer(address, "healthy", "--steps", "400", "--delay", "0.005")
    assert trainer.stdout is not None
    first_line = await asyncio.to_thread(trainer.stdout.readline)
    assert first_line.startswith(b"step 0"), first_line  # training is under way
    # further along (it prints every 100 steps), still with nobody listening
    later = await asyncio.wait_for(asyncio.to_thread(trainer.stdout.readline), 60)
    assert later.startswith(b"step 100 "), later
    monitor = Monitor()
    server = MonitorServer(address, monitor)
    await server.start()
    try:
        run = await wait_for_run(monitor)
    finally:
        await server.close()
        trainer.communicate(timeout=60)
    assert trainer.returncode == 0
    assert run.scalars["loss"].xs[0] == 0  # step 0, from the replayed history
    assert run.last_step == 399
    assert run.eval_scalars["val_loss"].xs[0] == 1  # the first eval: after step 0's update


def test_trainer_with_no_monitor_completes(socket_path: str) -> None:
    trainer = start_trainer(
        Address("unix", path=socket_path), "healthy", "--steps", "100", "--delay", "0"
    )
    output = trainer.communicate(timeout=60)[0].decode()
    assert trainer.returncode == 0, output
    assert "step 99 " in output
    assert "Traceback" not in output
