"""The recorded run logs of ``tests/data`` (``scripts/record_test_logs.py`` makes them
from real runs), replayed as ``traintop replay`` replays them: no torch, no socket."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.kernel.diagnosis import Alert, Thresholds
from probes.kernel.wire import Frame, FrameError
from tui.events import AlertRaised, MonitorEvent
from tui.monitor import Monitor
from tui.run import RunState
from tui.runlog import read_run_log
from tui.sources import ReplaySource
from tui.state import MonitorState

DATA = Path(__file__).resolve().parent / "data"


def log_path(name: str) -> str:
    """The path of the recorded log ``name`` (``tests/data/NAME.ndjson``)."""
    path = DATA / f"{name}.ndjson"
    assert path.is_file(), f"{path} is missing: python scripts/record_test_logs.py {name}"
    return str(path)


def log_frames(name: str) -> list[Frame]:
    """Every frame of the log ``name``, in order (a bad line fails the test)."""
    frames = []
    for item in read_run_log(log_path(name)):
        assert not isinstance(item, FrameError), f"{name}: {item}"
        frames.append(item)
    return frames


@dataclass
class Replayed:
    """What a monitor made of a replay: its state, and the events it reported."""

    state: MonitorState
    events: list[MonitorEvent] = field(default_factory=list)

    def run(self) -> RunState:
        """The one run of a single-run log."""
        [run] = self.state.runs.values()
        return run

    def raised(self) -> list[Alert]:
        """The alerts raised, in the order the monitor reported them."""
        return [event.alert for event in self.events if isinstance(event, AlertRaised)]


def replay(*logs: str, thresholds: Thresholds | None = None, **options: Any) -> Replayed:
    """Replay ``logs`` (names in tests/data, or paths) through a ``Monitor`` as
    ``traintop replay`` does (``tui.sources.ReplaySource``: each log on a connection
    of its own)."""
    replayed = Replayed(MonitorState(thresholds))
    monitor = Monitor(replayed.state, on_events=replayed.events.extend, **options)
    paths = [log if os.sep in log else log_path(log) for log in logs]
    asyncio.run(ReplaySource(*paths).run(monitor))
    monitor.close()
    return replayed
