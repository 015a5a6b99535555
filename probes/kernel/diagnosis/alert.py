"""An alert: one diagnosis, with its evidence, what it signals and what to try next."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from probes.kernel.diagnosis.catalog import rung_of
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

SEVERITY_ORDER: dict[str, int] = {severity.value: severity.order for severity in Severity}
_KINDS: dict[str, AlertKind] = {kind.value: kind for kind in AlertKind}


@dataclass(frozen=True)
class Alert:
    """One diagnosis: what, how bad, where, on what evidence, and what to try next.

    An alert is an incident: one per root cause. ``subject`` names the first failing
    layer (or the field, module or check it concerns; "" for the run); ``layers`` lists
    every model layer it concerns, the first failing one first; ``folded`` names the
    consequences seen since and folded under it (``kind@step``), which are not raised as
    alerts of their own.

    ``kind`` is an ``AlertKind`` (a kind no member names, from a newer probe, stays the
    string it came as) and ``severity`` a ``Severity``, whatever they were given as.
    """

    kind: str
    severity: Severity
    step: int
    subject: str  # the layer, parameter or field it concerns ("" for the run)
    evidence: dict[str, Any]
    signal: str  # what it is a signal of, and what it does not prove
    experiments: tuple[str, ...]  # the next controlled experiments, one change each
    per_subject: bool = False  # one alert per subject (else one per run and kind)
    layers: tuple[str, ...] = ()  # every layer it concerns, the first failing one first
    folded: tuple[str, ...] = ()  # consequences folded under it, as "kind@step"
    ranks: tuple[int, ...] = ()  # in a multi-rank job: the ranks that raised it
    world_size: int = 0  # ... and how many ranks the job has (0: not a job's)

    def __post_init__(self) -> None:
        if type(self.severity) is not Severity:
            object.__setattr__(self, "severity", Severity.of(self.severity))
        if type(self.kind) is not AlertKind:
            object.__setattr__(self, "kind", _KINDS.get(self.kind, self.kind))

    @property
    def key(self) -> str:
        """Identity for hysteresis: one alert per kind, or per kind and subject."""
        return f"{self.kind}:{self.subject}" if self.per_subject else self.kind

    @property
    def rung(self) -> Rung:
        """Its rung on the lesson's checklist (1 data ... 6 evaluation; 7 the probe)."""
        return rung_of(self.kind)

    def line(self) -> str:
        """``ALERT <severity> <kind> step=<n> subject=<s> key=value ... [folded=...]``."""
        parts = [f"ALERT {self.severity} {self.kind} step={self.step}"]
        if self.subject:
            parts.append(f"subject={self.subject}")
        parts += [f"{k}={_short(v)}" for k, v in self.evidence.items()]
        if self.ranks and "rank" not in self.evidence and "ranks" not in self.evidence:
            parts.append(self.rank_label)
        if self.folded:
            parts.append(f"folded={_short(self.folded)}")
        return " ".join(parts)

    @property
    def rank_label(self) -> str:
        """``rank=R``, ``ranks=R,S`` or ``ranks=all`` ("" outside a multi-rank job)."""
        if not self.ranks:
            return ""
        if len(self.ranks) == 1:
            return f"rank={self.ranks[0]}"
        if self.world_size and len(self.ranks) == self.world_size:
            return "ranks=all"
        return "ranks=" + ",".join(str(rank) for rank in self.ranks)

    def with_folded(self, consequence: str) -> Alert:
        """This alert with one more consequence folded under it."""
        return replace(self, folded=(*self.folded, consequence))

    def to_dict(self) -> dict[str, Any]:
        data = {
            "kind": self.kind,
            "severity": self.severity,
            "step": self.step,
            "subject": self.subject,
            "evidence": dict(self.evidence),
            "signal": self.signal,
            "experiments": list(self.experiments),
            "per_subject": self.per_subject,
        }
        if self.layers:
            data["layers"] = list(self.layers)
        if self.folded:
            data["folded"] = list(self.folded)
        if self.ranks:
            data["ranks"] = list(self.ranks)
            data["world_size"] = self.world_size
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        return cls(
            kind=str(data["kind"]),
            severity=Severity.of(str(data.get("severity", "warning"))),
            step=int(data.get("step", 0)),
            subject=str(data.get("subject", "")),
            evidence=dict(data.get("evidence") or {}),
            signal=str(data.get("signal", "")),
            experiments=tuple(str(e) for e in data.get("experiments") or ()),
            per_subject=bool(data.get("per_subject", False)),
            layers=tuple(str(name) for name in data.get("layers") or ()),
            folded=tuple(str(name) for name in data.get("folded") or ()),
            ranks=tuple(int(rank) for rank in data.get("ranks") or ()),
            world_size=int(data.get("world_size", 0) or 0),
        )


@dataclass(frozen=True)
class AlertChange:
    """An alert raised or cleared."""

    alert: Alert
    raised: bool  # False: cleared


def _short(value: Any) -> str:
    """A value as one word of an alert line (lists joined by commas, spaces as _)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(_short(item) for item in value)
    return str(value).replace(" ", "_")


def worst_severity(alerts: Sequence[Alert]) -> Severity | None:
    """The most severe of ``alerts`` (None for none)."""
    if not alerts:
        return None
    return max((a.severity for a in alerts), key=lambda severity: severity.order)


def at_least(severity: str, threshold: str) -> bool:
    """True if ``severity`` is ``threshold`` or worse."""
    return Severity(severity).at_least(threshold)
