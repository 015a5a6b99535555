"""What the screen app's toasts say of the monitor's events, and how often they come.

A toast holds a run's own words (its name, an error's message, a probe's result): it is
plain text, shown with ``markup=False``, cut and cleaned by ``tui.text``. Pure Python
(no textual): the app only hands a ``Toast`` to ``notify``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from probes.kernel.diagnosis import Severity as AlertSeverity
from probes.kernel.endings import Ending
from tui.events import (
    AckReceived,
    AlertRaised,
    AnomalyReported,
    FrameRejected,
    ProbeSwitchedOff,
    RunConnected,
    RunDisconnected,
)
from tui.text import plain_line, plain_name

Severity = Literal["information", "warning", "error"]  # Textual's SeverityLevel
TOAST_GAP_S = 2.0  # at most one toast per topic (alerts, rejected frames) this often
# A run's end: an error stays up longer, in red (the status line keeps it after).
END_SEVERITY: dict[Ending, Severity] = {
    Ending.FINISHED: "information",
    Ending.INTERRUPTED: "warning",
}


@dataclass(frozen=True)
class Toast:
    """One toast: plain text (never markup), its title, severity and seconds shown."""

    message: str
    title: str = ""
    severity: Severity = "information"
    timeout: float = 4.0


def run_connected(event: RunConnected) -> Toast:
    return Toast(f"{plain_name(event.run.name)} connected", timeout=3)


def run_disconnected(event: RunDisconnected) -> Toast:
    """How the run ended, in its ending's severity."""
    ending = event.run.ending.ending if event.run.ending is not None else Ending.FINISHED
    return Toast(
        f"{plain_name(event.run.name)}: {plain_line(event.reason)}",
        severity=END_SEVERITY.get(ending, "error"),
        timeout=4 if ending is Ending.FINISHED else 8,
    )


def frame_rejected(event: FrameRejected) -> Toast:
    return Toast(plain_line(event.message), title="frame rejected", severity="warning", timeout=5)


def ack_received(event: AckReceived) -> Toast:
    ack = event.ack
    return Toast(
        plain_line(ack.get("result", "")),
        title=plain_name(ack.get("command")),
        severity="information" if ack.get("ok") else "warning",
    )


def probe_switched_off(event: ProbeSwitchedOff) -> Toast:
    return Toast(
        f"{plain_name(event.run.name)}: the probe switched itself off: "
        + plain_line(event.message),
        severity="error",
        timeout=10,
    )


def automatic_check(event: AnomalyReported) -> Toast:
    """The probe's own check of the step after a non-finite value: said, not pushed
    over the screen (nobody asked for it); ``v`` shows the report."""
    report = event.report
    step = report.get("step")
    module = report.get("first_non_finite") or report.get("module_of_backward_op")
    op = report.get("backward_op")
    found = " ".join(plain_name(str(x)) for x in (module, op) if x)
    what = f"names {found}" if found else f"says {plain_line(str(report.get('outcome')))}"
    return Toast(
        f"{plain_name(event.run.name)}: the automatic check of step {plain_line(str(step))} "
        f"{what} (v: the report)",
        title="anomaly check",
        timeout=6,
    )


def alert_raised(event: AlertRaised) -> Toast:
    alert = event.alert
    return Toast(
        f"{plain_name(alert.kind)} at step {alert.step:,}"
        + (f" on {plain_name(alert.subject)}" if alert.subject else ""),
        title=plain_name(alert.severity),
        severity="error" if alert.severity == AlertSeverity.ERROR else "warning",
        timeout=6,
    )


class ToastGate:
    """At most one toast per topic every ``gap_s``: a run raising alerts by the hundred
    (or a stream of bad frames) must not bury the screen. The next toast of the topic
    counts the ones held back; the panels list them all."""

    def __init__(self, gap_s: float = TOAST_GAP_S) -> None:
        self.gap_s = gap_s
        self._shown: dict[str, tuple[float, int]] = {}  # topic -> (last shown, held back)

    def admit(self, topic: str, now: float) -> int | None:
        """How many of the topic's toasts were held back since its last, if this one may
        be shown at ``now`` (a monotonic time); None if it is held back too."""
        last, held = self._shown.get(topic, (-self.gap_s, 0))
        if now - last < self.gap_s:
            self._shown[topic] = (last, held + 1)
            return None
        self._shown[topic] = (now, 0)
        return held
