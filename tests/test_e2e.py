"""End to end: the bundled trainer in a subprocess, the monitor's real server here."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from probes.wire import Address
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
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        runs = list(monitor.state.runs.values())
        if runs and runs[0].ended and not runs[0].connected:
            return runs[0]
        assert asyncio.get_running_loop().time() < deadline, "the run did not finish in time"
        await asyncio.sleep(0.05)


async def test_demo_trainer_connects_and_its_steps_arrive(socket_path: str) -> None:
    address = Address("unix", path=socket_path)
    monitor = Monitor()
    server = MonitorServer(address, monitor)
    await server.start()
    trainer = start_trainer(address, "healthy", "--steps", "150", "--delay", "0")
    try:
        run = await wait_for_run(monitor)
    finally:
        await server.close()
        output = trainer.communicate(timeout=60)[0].decode()
    assert trainer.returncode == 0, output
    assert run.name == "healthy"
    assert run.layers == ["0", "2", "4"]
    loss = run.scalars["loss"]
    assert loss.xs[0] == 0 and run.last_step == 149
    assert all(x < y for x, y in zip(loss.xs, loss.xs[1:], strict=False))
    assert run.eval_scalars["val_loss"].latest < run.eval_scalars["val_loss"].last[0]
    assert all(g is not None and g > 0 for g in run.grad_norms)
    assert run.disconnect_reason == "finished"


async def test_monitor_started_late_still_sees_step_zero(socket_path: str) -> None:
    address = Address("unix", path=socket_path)
    trainer = start_trainer(address, "healthy", "--steps", "400", "--delay", "0.005")
    assert trainer.stdout is not None
    first_line = await asyncio.to_thread(trainer.stdout.readline)
    assert first_line.startswith(b"step 0"), first_line  # training is under way
    await asyncio.sleep(0.5)  # further along, still with nobody listening
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
    assert run.eval_scalars["val_loss"].xs[0] == 0


def test_trainer_with_no_monitor_completes(socket_path: str) -> None:
    trainer = start_trainer(
        Address("unix", path=socket_path), "healthy", "--steps", "100", "--delay", "0"
    )
    output = trainer.communicate(timeout=60)[0].decode()
    assert trainer.returncode == 0, output
    assert "step 99 " in output
    assert "Traceback" not in output
