"""Taking the wheel of a live run: a real trainer subprocess, the real monitor."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from probes.kernel.wire import Address
from tests.waiting import until
from tui.app import make_app
from tui.monitor import Monitor
from tui.run import RunState
from tui.screens.anomaly_report import AnomalyReportScreen
from tui.server import MonitorServer
from tui.sources import ServerSource


def start_trainer(address: Address, *args: str, grace: float = 10.0) -> subprocess.Popen:
    env = {**os.environ, "TRAINTOP_ADDRESS": str(address), "TRAINTOP_PAUSE_GRACE": str(grace)}
    return subprocess.Popen(
        [sys.executable, "-m", "demo", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def trainer(socket_path: str) -> Iterator[Callable[..., subprocess.Popen]]:
    started: list[subprocess.Popen] = []

    def start(*args: str, grace: float = 10.0) -> subprocess.Popen:
        process = start_trainer(Address("unix", path=socket_path), *args, grace=grace)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


async def test_pause_step_anomaly_resume_from_the_keyboard(
    socket_path: str, trainer: Callable[..., subprocess.Popen]
) -> None:
    app = make_app(ServerSource(Address("unix", path=socket_path)))
    async with app.run_test(size=(120, 40)) as pilot:
        trainer("healthy", "--steps", "100000", "--delay", "0.02")
        pause = pilot.pause  # between looks: the app redraws

        def run() -> RunState | None:
            return app.current_run

        await until(lambda: run() is not None and run().last_step >= 5, "step 5", 60, pause=pause)
        await pilot.press("p")
        await until(lambda: run().control.get("paused") is True, "the pause", pause=pause)
        paused_at = next(e["step"] for e in reversed(run().events) if e["name"] == "paused")
        # the step before the boundary where it paused is flushed before it blocks
        await until(lambda: run().last_step == paused_at - 1, "the flush", pause=pause)
        stopped_at = run().last_step
        await pilot.pause(0.6)  # the point: the run stays where it paused meanwhile
        assert run().last_step == stopped_at, "the run went on while paused"
        assert "paused" in app.query_one("#status").text

        await pilot.press("n")
        await until(lambda: run().last_step == stopped_at + 1, "one step", pause=pause)
        await pilot.pause(0.5)  # the point: no second step comes meanwhile
        assert run().last_step == stopped_at + 1, "n must run exactly one step"

        await pilot.press("a")
        await until(lambda: bool(run().anomaly_reports), "the report", 20, pause=pause)
        report = run().anomaly_reports[-1]
        assert report["outcome"] == "clean" and report["step"] == stopped_at + 2
        await until(
            lambda: isinstance(app.screen, AnomalyReportScreen), "its screen", 5, pause=pause
        )
        await pilot.press("escape")
        await until(lambda: run().last_step == stopped_at + 2, "the anomaly step", pause=pause)
        assert run().control.get("paused") is True

        await pilot.press("p")
        await until(lambda: run().last_step > stopped_at + 10, "the run to go on", 20, pause=pause)
        assert run().control.get("paused") is False


@pytest.mark.slow  # (a trainer child and a monitor that dies: 14 s)
async def test_a_run_paused_by_a_monitor_that_dies_finishes(
    socket_path: str, trainer: Callable[..., subprocess.Popen]
) -> None:
    address = Address("unix", path=socket_path)
    monitor = Monitor()
    server = MonitorServer(address, monitor)
    await server.start()
    process = trainer("healthy", "--steps", "120", "--delay", "0.01", grace=1.0)
    await until(lambda: any(r.last_step >= 3 for r in monitor.state.runs.values()), "step 3", 30)
    [run] = monitor.state.runs.values()
    assert monitor.send_command(run.run_id, "pause") is None
    await until(lambda: run.control.get("paused") is True, "the pause")
    paused_at = next(e["step"] for e in reversed(run.events) if e["name"] == "paused")
    await until(lambda: run.last_step == paused_at - 1, "the flush")
    stopped_at = run.last_step
    await server.close()  # the monitor dies with the run paused
    output = (await asyncio.to_thread(process.communicate, timeout=60))[0].decode()
    assert process.returncode == 0, output
    assert stopped_at < 119
    assert "step 119 " in output  # it went on to the end
    assert "no monitor connected while the run was paused; resumed after 1 s" in output
