"""What a pre-training check found, readable on its own and sendable as alerts.

Every check returns a ``CheckReport``: printable (``print(report)``), testable
(``report.kinds``, ``report.ok``) and, when a probe is given, sent to the monitor as a
``check_report`` event plus one alert per finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from probes.kernel.diagnosis import Alert, Severity
from probes.kernel.schema.spec import EventName


class Probe(Protocol):
    """What ``CheckReport.send`` uses of a probe (``probes.runtime.probe.Probe``, which
    imports this module by way of the live loss check: a protocol keeps the two out of
    an import circle)."""

    @property
    def closed(self) -> bool: ...

    @property
    def step_index(self) -> int: ...

    def send(self, record: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Finding:
    """One problem: what is wrong, the numbers that show it, and how to fix it."""

    kind: str
    severity: Severity
    subject: str  # the split, column, statistic or tensor concerned
    message: str  # what is wrong
    fix: str  # what to do about it
    evidence: dict[str, Any] = field(default_factory=dict)
    examples: tuple[Any, ...] = ()  # a few indices (or index pairs) that show it

    def line(self) -> str:
        where = f" [{self.subject}]" if self.subject else ""
        return f"{self.severity.upper()} {self.kind}{where}: {self.message}"

    def to_alert(self, step: int, signal: str) -> Alert:
        evidence = dict(self.evidence)
        if self.examples:
            evidence["examples"] = ", ".join(str(e) for e in self.examples[:5])
        return Alert(
            self.kind,
            self.severity,
            step,
            self.subject,
            evidence,
            f"{self.message} {signal}".strip(),
            (self.fix,),
            per_subject=True,
        )


@dataclass
class CheckReport:
    """The result of one check: a title, facts measured, and findings (maybe none)."""

    check: str
    summary: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    signal: str = ""  # what passing or failing this check does and does not prove

    @property
    def ok(self) -> bool:
        """No finding of warning or error severity."""
        return not any(f.severity in ("warning", "error") for f in self.findings)

    @property
    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def __str__(self) -> str:
        lines = [f"{self.check}: {'ok' if self.ok else f'{len(self.findings)} finding(s)'}"]
        lines += [f"  {key}: {_readable(value)}" for key, value in self.summary.items()]
        for finding in self.findings:
            lines.append(f"  - {finding.line()}")
            if finding.examples:
                lines.append(f"      e.g. {', '.join(str(e) for e in finding.examples[:5])}")
            lines.append(f"      fix: {finding.fix}")
        if self.signal:
            lines.append(f"  note: {self.signal}")
        return "\n".join(lines)

    def send(self, probe: Probe | None) -> CheckReport:
        """Report to the monitor through ``probe`` (if given); returns self."""
        if probe is None or probe.closed:
            return self
        step = max(probe.step_index, 0)
        probe.send(
            {
                "kind": "event",
                "name": EventName.CHECK_REPORT,
                "step": step,
                "check": self.check,
                "ok": self.ok,
                "summary": _plain(self.summary),
                "findings": [f.line() for f in self.findings],
                "text": str(self),
            }
        )
        for finding in self.findings:
            alert = finding.to_alert(step, self.signal)
            probe.send({"kind": "alert", "step": step, "alert": _plain(alert.to_dict())})
        return self


def _readable(value: Any) -> str:
    """A summary value for people: floats to 4 significant digits, nested ones too."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_readable(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_readable(v) for v in value) + "]"
    return str(value)


def _plain(value: Any) -> Any:
    """JSON-safe copy: numbers, strings, lists and dicts only."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
