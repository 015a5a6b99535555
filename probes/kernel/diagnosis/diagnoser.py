"""The diagnoser: feeds the rules, folds consequences under their causes, and raises
one alert per root cause with hysteresis (raised once, held while its condition lasts,
cleared once it has been absent ``clear_after`` steps, ``hold_steps`` for the kinds whose
numbers hover about their bound: ``incidents.HELD``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from probes.kernel.diagnosis.alert import Alert, AlertChange
from probes.kernel.diagnosis.clipping import ClipAlwaysActive, GradsStillScaled
from probes.kernel.diagnosis.divergence import LossDiverged
from probes.kernel.diagnosis.evaluation import EvalMode, OverfittingSignal
from probes.kernel.diagnosis.exploding import ExplodingGradient
from probes.kernel.diagnosis.gradient_path import (
    Activations,
    NoneGradients,
    VanishingGradient,
)
from probes.kernel.diagnosis.incidents import (
    EVENTS,
    HELD,
    RECOVERABLE,
    STICKY,
    cause_for,
    depth,
    folded_name,
    lists_kind,
    waits_for_cause,
)
from probes.kernel.diagnosis.memory import MemoryCreep, RetainedGraph
from probes.kernel.diagnosis.overhead import ProbeOverhead
from probes.kernel.diagnosis.precision import LrTooLowToUpdate
from probes.kernel.diagnosis.reductions import LossReductionMismatch
from probes.kernel.diagnosis.rule import Findings, Rule, respread
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.timing import InputBound, Recompiles
from probes.kernel.diagnosis.tiny_batch import FlatLoss
from probes.kernel.diagnosis.update import (
    GradNotCleared,
    LossSpike,
    NoUpdates,
    SkippedUpdates,
    UpdatesNotApplied,
)
from probes.kernel.diagnosis.update_ratio import UpdateRatio
from probes.kernel.diagnosis.values import NonFinite
from probes.kernel.diagnosis.views import EvalView, RecentPast, RunInfo, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind, Evidence
from probes.kernel.schema.spec import FrameKind

Record = Mapping[str, Any]

#: Every rule, along the checklist: when several alerts rise on one record, they are
#: reported in this order (and the growth that led to a non-finite value before it).
#: A new rule is added here; what it needs (replicated or not) it says on itself, and
#: how its alerts are kept (sticky, held, waiting for a cause) its kind's catalog entry
#: says (``Entry.traits``).
RULES: tuple[type[Rule], ...] = (
    NonFinite,
    FlatLoss,
    ExplodingGradient,
    VanishingGradient,
    NoneGradients,
    Activations,
    GradNotCleared,
    UpdatesNotApplied,
    UpdateRatio,
    LrTooLowToUpdate,
    SkippedUpdates,
    NoUpdates,
    LossSpike,
    EvalMode,
    OverfittingSignal,
    ProbeOverhead,
    LossDiverged,
    ClipAlwaysActive,
    GradsStillScaled,
    LossReductionMismatch,
    InputBound,
    RetainedGraph,
    MemoryCreep,
    Recompiles,
)

#: Rules over what every replica of a DDP job holds alike (``Rule.replicated``): on a
#: rank other than 0 they would repeat rank 0's findings, so they run on rank 0 alone
#: and what they find holds for every rank. A rank's own values (its shard's loss, its
#: inputs, its time) are judged on every rank, and where one rank's replicated values
#: part from the others', the cross-rank checks say so.
REPLICA_RULES: frozenset[type[Rule]] = frozenset(rule for rule in RULES if rule.replicated)

#: What the replica rules raise: under DDP, rank 0's finding holds for every rank.
REPLICA_KINDS: frozenset[str] = frozenset(kind for rule in REPLICA_RULES for kind in rule.raises())


def producer_evidence(report: Record) -> dict[str, Any]:
    """An anomaly report's producer of a non-finite value, as evidence: the module
    (``producer``), the backward op and the forward line where one was named, the step
    checked and, for the probe's automatic check, what it cost (empty: none found)."""
    first = report.get("first_non_finite") or {}
    module = first.get("name") or report.get("module_of_backward_op")
    op = report.get("backward_op")
    if not module and not op:
        return {}
    found: dict[str, Any] = {Evidence.PRODUCER: module or "-"}
    if op:
        found["producer_op"] = op
    frames = report.get("forward_traceback") or []
    if frames and isinstance(frames[-1], Mapping):
        found["producer_line"] = f"{frames[-1].get('file')}:{frames[-1].get('line')}"
    found["checked_step"] = report.get("step")
    auto = report.get("auto")
    if isinstance(auto, Mapping):
        found["check_cost"] = "one step (automatic)"
    return found


class Diagnoser:
    """Feed a run's records; get one alert per root cause, raised once and cleared when
    its condition ends.

    Args:
        info: what the run's hello says (layer names, activations, ...).
        thresholds: every rule's thresholds.

    Example::

        diagnoser = Diagnoser(RunInfo.from_hello(hello))
        for record in records:
            for change in diagnoser.observe(record):
                print(("RAISED " if change.raised else "cleared ") + change.alert.line())
    """

    def __init__(self, info: RunInfo | None = None, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self.history = RecentPast(info or RunInfo())
        replica_rules = self.history.info.replica_rules
        self.rules = [
            rule(self.thresholds) for rule in RULES if replica_rules or rule not in REPLICA_RULES
        ]
        # Each rule that reads step records, by index (a rule whose ``on_step`` is the
        # base's reads none): every record of every rank goes through these.
        self._step_rules = [
            (index, rule.on_step)
            for index, rule in enumerate(self.rules)
            if type(rule).on_step is not Rule.on_step
        ]
        self.last_view: StepView | None = None  # the latest step record, as read
        self.active: dict[str, Alert] = {}  # raised and holding, by key
        self.raised_count: dict[str, int] = {}
        self.incidents: dict[str, Alert] = {}  # the latest version of every raised alert
        self.probe_alerts: dict[str, Alert] = {}  # raised in the training process
        self.folded: dict[str, str] = {}  # consequence key -> the key of its root cause
        # root key -> the most severe consequence ever folded under it (for --fail-on)
        self.worst_folded: dict[str, Alert] = {}
        self.revision = 0  # bumped when an alert gains a consequence or layers
        self._causes: dict[str, Alert] = {}  # kind -> latest raised, folded or from probe
        self._roots: dict[str, str] = {}  # kind -> key of the raised alert it folds into
        self._pending: dict[str, Alert] = {}  # consequences waiting for a cause
        self._findings: dict[int, list[Alert]] = {}
        self._absent_since: dict[str, int] = {}
        # kind -> the smoothed training loss when a recoverable sticky cause was raised
        self._loss_at_damage: dict[str, float | None] = {}
        self._last_total: float | None = None  # the latest record's total gradient norm
        self._total_at_spike: dict[str, float | None] = {}  # a waiting spike's key -> then

    # --- input ------------------------------------------------------------------------

    def observe(self, record: Record) -> list[AlertChange]:
        """Take one step or eval record; return the alerts raised or cleared by it.

        The rules keep the record's per-layer lists for their windows, unchanged: a
        caller must not change a record's lists after passing it."""
        kind = record.get("kind")
        if kind == FrameKind.STEP:
            return self.observe_step(StepView.from_record(record))
        if kind == FrameKind.EVAL:
            return self.observe_eval(EvalView.from_record(record))
        return []

    def observe_step(self, view: StepView) -> list[AlertChange]:
        """Take one step record, parsed (``probes.kernel.schema``: the monitor parses once)."""
        total = view.grad_norm_total
        if total is not None and math.isfinite(total):
            self._last_total = total  # (a spike waits while the gradients climb: ``_due``)
        self.last_view = view
        history, found = self.history, self._findings
        history.add_step(view, keep_first=self.thresholds.smoothing_steps)
        for index, on_step in self._step_rules:
            findings = on_step(history, view)
            if findings is not None:  # (None: the rule has nothing new to say)
                found[index] = findings
        return self._settle(view.first, view.step)

    def observe_eval(self, view: EvalView) -> list[AlertChange]:
        """Take one eval record, parsed."""
        self.history.evals.append(view)
        for index, rule in enumerate(self.rules):
            self._update(index, rule.on_eval(self.history, view))
        return self._settle(view.step, view.step)

    def note_probe_alert(self, alert: Alert) -> None:
        """An alert raised in the training process (a structural or data check, the
        guard): a cause that consequences fold under from now on."""
        self.probe_alerts[alert.key] = alert
        self._causes[alert.kind] = alert
        self._roots[alert.kind] = alert.key

    def withdraw_probe_alert(self, alert: Alert) -> None:
        """A probe alert whose condition ended: no longer a cause, nor live at the end."""
        self.probe_alerts.pop(alert.key, None)
        cause = self._causes.get(alert.kind)
        if cause is not None and cause.key == alert.key:
            del self._causes[alert.kind]
            self._roots.pop(alert.kind, None)

    def note_anomaly(self, report: Record) -> bool:
        """A step checked for the producer of a non-finite value (the probe's automatic
        check, or the ``a`` key's anomaly step): what it found (the module, the op, the
        forward line) joins the non-finite incident, in its evidence. False when it
        found none, or there is no such incident."""
        found = producer_evidence(report)
        key = self._roots.get(AlertKind.NON_FINITE)
        if not found or key is None:
            return False
        joined = False
        for table in (self.incidents, self.active, self.probe_alerts):
            alert = table.get(key)
            if alert is not None and Evidence.PRODUCER not in alert.evidence:
                table[key] = replace(alert, evidence={**alert.evidence, **found})
                joined = True
        self.revision += joined
        return joined

    def finish(self) -> list[AlertChange]:
        """The run ended: raise the consequences still waiting for a cause."""
        changes = []
        for key, alert in sorted(
            self._pending.items(), key=lambda kv: (depth(kv[1].kind), kv[1].rung)
        ):
            del self._pending[key]
            cause = cause_for(alert, self.live_causes())
            if cause is not None:
                self._fold(key, alert, cause)
            else:
                changes.append(self._raise(alert))
        return sorted(changes, key=lambda change: change.alert.rung)

    def _update(self, index: int, findings: Findings) -> None:
        if findings is not None:
            self._findings[index] = findings

    # --- settling ------------------------------------------------------------------------

    def _settle(self, first: int, step: int) -> list[AlertChange]:
        """Fold what is a consequence, raise what is new (or waited long enough), clear
        what has been absent ``clear_after`` steps."""
        if not (self.active or self.folded or self._pending) and not any(self._findings.values()):
            return []  # nearly every record of a healthy run: nothing to settle
        current = {a.key: a for findings in self._findings.values() for a in findings}
        raised: list[AlertChange] = []
        ended: list[AlertChange] = []
        for key, alert in sorted(current.items(), key=lambda kv: (depth(kv[1].kind), kv[1].rung)):
            ended += self._end_event(key, alert)
            self._absent_since.pop(key, None)
            if key in self.active:
                self._refresh(key, alert)
                continue
            if key in self.folded:
                continue
            cause = cause_for(alert, self.live_causes())
            if cause is not None:
                self._fold(key, alert, cause)
                self._pending.pop(key, None)
                continue
            waiting = self._pending.get(key)
            if (
                waiting is None
                and waits_for_cause(alert)
                and (self.thresholds.consequence_grace_steps > 0)
            ):
                self._pending[key] = alert
                continue
            if waiting is not None:
                continue  # judged below, with every other waiting one
            raised.append(self._raise(alert))
        raised += self._due(step)
        raised.sort(key=lambda change: change.alert.rung)
        return ended + raised + self._clear(first, step, current)

    def _end_event(self, key: str, alert: Alert) -> list[AlertChange]:
        """An event's rule (``incidents.EVENTS``) says when a new incident begins: a
        finding first seen at another step ends the one held (cleared, or no longer a
        folded consequence), so the new one is raised or folded as its own. (One
        thinned record can hold the end of one burst of spikes and the start of the
        next.)"""
        if alert.kind not in EVENTS:
            return []
        held = self.active.get(key)
        if held is not None and held.step != alert.step:
            del self.active[key]
            return [AlertChange(held, raised=False)]
        if key in self.folded and self._causes.get(alert.kind, alert).step != alert.step:
            del self.folded[key]
        return []

    def _due(self, step: int) -> list[AlertChange]:
        """Waiting consequences whose grace is over: folded if a cause came, else raised
        (even when their condition has passed: a spike is an event)."""
        changes = []
        grace = self.thresholds.consequence_grace_steps
        for key, alert in sorted(
            self._pending.items(), key=lambda kv: (depth(kv[1].kind), kv[1].rung)
        ):
            cause = cause_for(alert, self.live_causes())
            if cause is not None:
                del self._pending[key]
                self._total_at_spike.pop(key, None)
                self._fold(key, alert, cause)
                continue
            waiting_causes = {a.kind: a for k, a in self._pending.items() if k != key}
            if self._climbing_under(key, alert, step):
                continue
            if step >= alert.step + grace and cause_for(alert, waiting_causes) is None:
                del self._pending[key]
                self._total_at_spike.pop(key, None)
                changes.append(self._raise(alert))  # as first found: its step, its evidence
        return changes

    def _climbing_under(self, key: str, alert: Alert, step: int) -> bool:
        """Does a waiting loss spike (or divergence) wait longer? While the gradients
        have grown at least twice what they were when it was found: the explosion it is
        the consequence of shows the later the slower it grows (50x its level), so it
        waits while that evidence builds, up to the explosion's window more."""
        if alert.kind not in (AlertKind.LOSS_SPIKE, AlertKind.LOSS_DIVERGED):
            return False
        then = self._total_at_spike.setdefault(key, self._last_total)
        now = self._last_total
        late = alert.step + self.thresholds.consequence_grace_steps
        return (
            then is not None
            and now is not None
            and now >= 2 * then
            and step < late + self.thresholds.exploding_window
        )

    def _clear(self, first: int, step: int, current: dict[str, Alert]) -> list[AlertChange]:
        changes = []
        for key in [k for k in (*self.active, *self.folded) if k not in current]:
            since = self._absent_since.setdefault(key, first)
            if step - since + 1 < self._clear_after(key):
                continue
            del self._absent_since[key]
            if key in self.folded:
                del self.folded[key]  # the consequence passed, silently
            else:
                changes.append(AlertChange(self.active.pop(key), raised=False))
        return changes

    def _clear_after(self, key: str) -> int:
        """Steps an incident must be absent to clear (longer for those that hover about
        their bound while their cause persists)."""
        if key.split(":")[0] in HELD:
            return max(self.thresholds.clear_after, self.thresholds.hold_steps)
        return self.thresholds.clear_after

    def _raise(self, alert: Alert) -> AlertChange:
        self.active[alert.key] = alert
        self.incidents[alert.key] = alert
        self.raised_count[alert.kind] = self.raised_count.get(alert.kind, 0) + 1
        self._causes[alert.kind] = alert
        self._roots[alert.kind] = alert.key
        if alert.kind in RECOVERABLE:
            self._loss_at_damage[alert.kind] = self.history.smoothed_loss(
                alert.step, self.thresholds.smoothing_steps
            )
        return AlertChange(alert, raised=True)

    def _recovered(self, kind: str) -> bool:
        """A recoverable sticky cause (``incidents.RECOVERABLE``) that has cleared, the
        smoothed training loss now below where it stood when it was raised."""
        if kind not in RECOVERABLE or self._roots.get(kind) in self.active:
            return False
        before = self._loss_at_damage.get(kind)
        view = self.last_view
        if before is None or view is None or not math.isfinite(before):
            return False
        now = self.history.smoothed_loss(view.step, self.thresholds.smoothing_steps)
        return now is not None and now < before

    def live_causes(self) -> dict[str, Alert]:
        """Causes by kind: alerts that hold now (raised or folded), and sticky ones that
        were ever raised (what a new finding is folded under)."""
        live = {a.kind: a for a in self.active.values()}
        for kind, alert in self._causes.items():
            if (
                (kind in STICKY and not self._recovered(kind))
                or self._roots.get(kind) in self.active
                or any(key.split(":")[0] == kind for key in self.folded)
            ):
                live.setdefault(kind, alert)
        live.update({a.kind: a for a in self.probe_alerts.values()})
        return live

    def _fold(self, key: str, alert: Alert, cause: Alert) -> None:
        """List ``alert`` under the raised alert at the root of ``cause``'s chain."""
        root_key = self._roots.get(cause.kind, cause.key)
        self.folded[key] = root_key
        worst = self.worst_folded.get(root_key)
        if worst is None or alert.severity.order > worst.severity.order:
            self.worst_folded[root_key] = alert
        self._causes[alert.kind] = alert
        self._roots[alert.kind] = root_key
        name = folded_name(alert)
        for table in (self.incidents, self.active, self.probe_alerts):
            root = table.get(root_key)
            if root is not None and not lists_kind(root, alert.kind):
                table[root_key] = root.with_folded(name)
        self.revision += 1

    def _refresh(self, key: str, alert: Alert) -> None:
        """An incident that holds may come to concern more layers (a cause's layers
        decide which consequences fold under it): it lists every layer it has concerned
        while it held, the first failing first, and its evidence's count and range of
        layers follow the list (the line printed when it was raised stays as it was).
        A finding on the other side of a band (update ratios now low, where the alert
        said high) is not the incident's: its layers are not added."""
        active = self.active[key]
        if alert.evidence.get(Evidence.SIDE) != active.evidence.get(Evidence.SIDE):
            return
        grown = tuple(dict.fromkeys((*active.layers, *alert.layers)))
        if grown != active.layers:
            evidence = respread(active.evidence, grown, self.history.info.layers)
            self.active[key] = self.incidents[key] = replace(
                active, layers=grown, evidence=evidence
            )
            self.revision += 1
