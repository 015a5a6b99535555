"""What happens in the monitor, of note to a person: small past-tense records.

``MonitorState.apply`` returns them; the app turns them into toasts and screens,
headless mode into lines (``tui.dispatch`` routes them to either).
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.kernel.diagnosis import Alert
from probes.kernel.wire import Frame
from tui.run import RunState


@dataclass(frozen=True)
class RunConnected:
    run: RunState
    replayed: bool  # a run seen before, connecting again


@dataclass(frozen=True)
class RunDisconnected:
    run: RunState
    reason: str


@dataclass(frozen=True)
class FrameRejected:
    peer: str
    message: str


@dataclass(frozen=True)
class AckReceived:
    run: RunState
    ack: Frame


@dataclass(frozen=True)
class AnomalyReported:
    run: RunState
    report: Frame


@dataclass(frozen=True)
class RunPaused:
    run: RunState
    step: int
    reason: str


@dataclass(frozen=True)
class ProbeSwitchedOff:
    run: RunState
    message: str


@dataclass(frozen=True)
class AlertRaised:
    run: RunState
    alert: Alert


@dataclass(frozen=True)
class AlertCleared:
    run: RunState
    alert: Alert
    step: int


MonitorEvent = (
    RunConnected
    | RunDisconnected
    | FrameRejected
    | AlertRaised
    | AlertCleared
    | AckReceived
    | AnomalyReported
    | RunPaused
    | ProbeSwitchedOff
)
