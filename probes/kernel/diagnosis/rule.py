"""What every rule shares: the base class, streaks counted in steps, and the evidence
of an alert that stands for several layers."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast, StepView

Findings = list[Alert] | None  # None: this record says nothing new to this rule


class Rule:
    """A check over a run's history; ``on_step``/``on_eval`` return the findings that
    hold now (at most one alert per kind: several layers make one incident)."""

    kind: str = "rule"
    kinds: tuple[str, ...] = ()  # every kind it raises, when more than ``kind``
    severity: Severity = Severity.WARNING
    # It reads what every replica of a DDP job holds alike (the all-reduced gradients,
    # the weights they update, what follows from them on every rank at once): under
    # DDP it runs on rank 0 alone, and what it finds holds for every rank.
    replicated: bool = False

    @classmethod
    def raises(cls) -> tuple[str, ...]:
        """The kinds of alert this rule raises."""
        return cls.kinds or (cls.kind,)

    def __init__(self, thresholds: Thresholds) -> None:
        self.t = thresholds

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        return None

    def on_eval(self, history: RecentPast, view: EvalView) -> Findings:
        return None

    def alert(
        self,
        step: int,
        subject: str,
        evidence: dict[str, Any],
        *,
        kind: str | None = None,
        severity: Severity | None = None,
        layers: Sequence[str] = (),
    ) -> Alert:
        """An alert of this rule's kind, its signal and experiments from the catalog."""
        kind = kind or self.kind
        described = entry(kind)
        return Alert(
            kind,
            severity or self.severity,
            step,
            subject,
            evidence,
            described.said,
            described.experiments,
            layers=tuple(layers),
        )


class Streaks:
    """Per key (a layer, an activation ...), the first step of the run of steps over
    which a condition has held; lengths are in steps, whatever the records."""

    def __init__(self) -> None:
        self.since: dict[Hashable, int] = {}

    def update(
        self, key: Hashable, holds: bool, view: StepView, start: int | None = None
    ) -> int | None:
        """Note whether the condition holds over ``view``'s steps (from ``start``, when
        only the last steps of its span show it); the first step of the current run, or
        None when it does not hold."""
        if not holds:
            self.since.pop(key, None)
            return None
        return self.since.setdefault(key, view.first if start is None else start)

    def drop(self, key: Hashable) -> None:
        self.since.pop(key, None)


def reached_at(since: int, length: int, view: StepView) -> int | None:
    """The step at which a condition holding since ``since`` reached ``length`` steps,
    if ``view`` covers it (or came after it); None if it is still shorter."""
    step = since + length - 1
    return None if view.step < step else step


def first_failing(since: dict[int, int]) -> list[int]:
    """Indices ordered the lesson's way: the first to fail, then model order."""
    return sorted(since, key=lambda index: (since[index], index))


def spread(names: Sequence[str]) -> dict[str, Any]:
    """Evidence for an alert that stands for several layers: how many, from which to
    which (nothing for one)."""
    if len(names) < 2:
        return {}
    return {"layers_affected": len(names), "range": f"{names[0]}..{names[-1]}"}


COUNT_KEYS = ("layers_affected", "layers_over")  # the evidence that counts an alert's layers


def respread(
    evidence: dict[str, Any], layers: Sequence[str], order: Sequence[str]
) -> dict[str, Any]:
    """``evidence`` of an alert that came to concern ``layers``: its count of layers and
    their range follow the list, so the numbers shown agree with the layers listed."""
    if len(layers) < 2:
        return evidence
    ordered = ordered_range(layers, order)
    count = next((key for key in COUNT_KEYS if key in evidence), COUNT_KEYS[0])
    return {**evidence, count: len(layers), "range": f"{ordered[0]}..{ordered[-1]}"}


def ordered_range(names: Sequence[str], order: Sequence[str]) -> list[str]:
    """``names`` in model order (as ``order`` lists them), for the range."""
    position = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda name: position.get(name, len(position)))
