"""One run's alert book: every alert entry's life, from raised to cleared (pure Python).

The book holds the run's ``Diagnoser`` and the entries the monitor shows: it raises what
the diagnoser raises, clears what it clears, shows each incident as the diagnoser last
saw it (consequences folded under it, layers it came to concern), takes the alerts the
training process raised, and marks those a job's incident explains. It says which
entries are the run's root causes, in the checklist's order, and whether an alert trips
``--fail-on``. The monitor's state (``tui.run``, ``tui.state``) holds one per run; a
job's incidents (``job``) are entries shared by the books of its ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from probes.kernel.diagnosis.alert import Alert, AlertChange
from probes.kernel.diagnosis.catalog import ENDED_BY_FIRST_STEP
from probes.kernel.diagnosis.diagnoser import Diagnoser
from probes.kernel.diagnosis.incidents import SAID_ONCE_A_RUN, folded_name
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RunInfo, StepView
from probes.kernel.diagnosis.vocabulary import Severity

MAX_ALERTS = 1000  # alert entries kept per run (raised ones; each is rare)


@dataclass
class AlertEntry:
    """An alert as the monitor shows it: raised at a step, maybe cleared since."""

    alert: Alert
    active: bool = True
    cleared_at: int | None = None
    from_probe: bool = False  # raised in the training process (a data check, the guard)
    folded_under: str = ""  # a job incident (across ranks) it is a consequence of
    withdrawn: bool = False  # its condition proved passing (no step yet): not a cause


class AlertBook:
    """A run's alerts, one entry per raised alert, oldest first (``entries``).

    Args:
        thresholds: the diagnosis' thresholds (kept when the run starts anew).
    """

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.diagnoser = Diagnoser(thresholds=thresholds)
        self.entries: list[AlertEntry] = []
        self.awaiting_a_step = False  # a probe alert says no step has begun (yet)
        self._synced = 0  # the diagnoser's revision the entries reflect
        # This rank's alerts folded under its job's incident or rank 0's cause: judged
        # for --fail-on as if raised (folding never lowers the verdict)
        self._folded_by_job: list[Alert] = []

    def start(self, info: RunInfo) -> None:
        """The run's hello, before any step: diagnose from its start, with what it says."""
        self.diagnoser = Diagnoser(info, self.diagnoser.thresholds)

    # --- raising and clearing --------------------------------------------------------------

    def observe(self, view: StepView | EvalView) -> list[AlertChange]:
        """Run the diagnosis on a step or eval record; keep what it raises and clears."""
        if isinstance(view, StepView):
            return self._keep(self.diagnoser.observe_step(view), view.step)
        return self._keep(self.diagnoser.observe_eval(view), view.step)

    def finish(self, last_step: int) -> list[AlertChange]:
        """The run ended: what the diagnoser still held back (a consequence that waited
        for a cause that never came)."""
        return self._keep(self.diagnoser.finish(), last_step)

    def probe_alert(self, alert: Alert, *, steps_seen: bool) -> bool:
        """An alert raised in the training process: entered, and a cause its
        consequences fold under. False (not entered) for one that says no step has begun
        when steps are measured already (a history replayed out of order)."""
        if alert.kind in ENDED_BY_FIRST_STEP and steps_seen:
            return False
        if alert.kind in SAID_ONCE_A_RUN:
            said = next(
                (e for e in self.entries if e.from_probe and e.alert.kind == alert.kind), None
            )
            if said is not None:  # the same broken contract, seen by a second check
                said.alert = replace(said.alert, folded=(*said.alert.folded, folded_name(alert)))
                return False
        self._enter(alert, from_probe=True)
        self.diagnoser.note_probe_alert(alert)
        return True

    def first_measured_step(self, step: int) -> list[Alert]:
        """A measured step arrived: the probe's alerts saying none had begun
        (``steps_not_measured``) are over, cleared at ``step`` and no longer causes;
        the alerts cleared (none unless ``awaiting_a_step``)."""
        if not self.awaiting_a_step:
            return []
        self.awaiting_a_step = False
        ended = []
        for entry in self.entries:
            if entry.active and entry.from_probe and entry.alert.kind in ENDED_BY_FIRST_STEP:
                entry.active = False
                entry.cleared_at = step
                entry.withdrawn = True
                self.diagnoser.withdraw_probe_alert(entry.alert)
                ended.append(entry.alert)
        return ended

    def anomaly_report(self, report: dict[str, object]) -> bool:
        """An anomaly report: the producer it names joins the non-finite incident
        (``Diagnoser.note_anomaly``); True when it did."""
        joined = self.diagnoser.note_anomaly(report)
        self._sync_incidents()
        return joined

    def entry_for(self, alert: Alert) -> AlertEntry | None:
        """The latest entry this book raised for ``alert`` (its key, at its step)."""
        return next(
            (
                e
                for e in reversed(self.entries)
                if e.alert.key == alert.key and e.alert.step == alert.step and not e.from_probe
            ),
            None,
        )

    def share(self, entry: AlertEntry) -> None:
        """A job's incident, shown among this rank's alerts (one entry, every rank's)."""
        self.entries.append(entry)

    def fold_under(self, alert: Alert, incident_kind: str) -> None:
        """This rank's ``alert`` is a consequence of a job incident (or of a cause rank 0
        found for every replica): shown under it."""
        for entry in self.entries:
            if entry.alert.key == alert.key and entry.alert.step == alert.step:
                entry.folded_under = incident_kind
        if len(self._folded_by_job) < MAX_ALERTS:
            self._folded_by_job.append(alert)

    def _keep(self, changes: list[AlertChange], step: int) -> list[AlertChange]:
        for change in changes:
            if change.raised:
                self._enter(change.alert)
            else:
                self._clear(change.alert, step)
        self._sync_incidents()
        return changes

    def _enter(self, alert: Alert, *, from_probe: bool = False) -> None:
        self.entries.append(AlertEntry(alert, from_probe=from_probe))
        if from_probe and alert.kind in ENDED_BY_FIRST_STEP:
            self.awaiting_a_step = True
        if len(self.entries) > MAX_ALERTS:
            del self.entries[0]

    def _clear(self, alert: Alert, step: int) -> None:
        for entry in reversed(self.entries):
            if entry.active and entry.alert.key == alert.key and not entry.from_probe:
                entry.active = False
                entry.cleared_at = step
                return

    def _sync_incidents(self) -> None:
        """Alerts gain consequences (and layers) after they are raised: the latest entry
        of each key shows the diagnoser's latest version."""
        if self.diagnoser.revision == self._synced:
            return
        self._synced = self.diagnoser.revision
        seen: set[tuple[str, bool]] = set()
        for entry in reversed(self.entries):
            key = (entry.alert.key, entry.from_probe)
            if key in seen:
                continue
            seen.add(key)
            source = self.diagnoser.probe_alerts if entry.from_probe else self.diagnoser.incidents
            latest = source.get(entry.alert.key)
            if latest is not None and latest.step == entry.alert.step:
                entry.alert = latest

    # --- reading ---------------------------------------------------------------------------

    @property
    def active(self) -> list[Alert]:
        """The alerts raised and holding (not those folded under a job's incident)."""
        return [entry.alert for entry in self.entries if entry.active and not entry.folded_under]

    @property
    def raised(self) -> list[AlertEntry]:
        """Every alert raised for the run, one per root cause (a rank's alert folded under
        its job's incident is shown there, not here)."""
        return [entry for entry in self.entries if not entry.folded_under]

    def causes(self) -> list[AlertEntry]:
        """The run's root causes in the checklist's order (then by step), without those
        whose condition proved passing."""
        return [
            entry
            for entry in sorted(self.raised, key=lambda e: (e.alert.rung, e.alert.step))
            if not entry.withdrawn
        ]

    def highest_severity(self) -> Severity | None:
        """The run's highest severity: over its raised entries and every consequence
        folded under them (a warning folded under an info cause is still a warning)."""
        severities = [e.alert.severity for e in self.raised if not e.withdrawn]
        severities += [a.severity for a in self.diagnoser.worst_folded.values()]
        severities += [a.severity for a in self._folded_by_job]
        return max(severities, key=lambda s: s.order, default=None)

    def folded_tripping(self, threshold: str | None) -> Alert | None:
        """A consequence folded under a less severe cause that trips ``--fail-on
        threshold`` on its own (folding never lowers the verdict); None if none does."""
        if not threshold:
            return None
        roots = {e.alert.key: e for e in self.raised if not e.withdrawn}
        for root_key, folded in self.diagnoser.worst_folded.items():
            root = roots.get(root_key)
            if root is not None and trips_fail_on(folded, threshold):
                return folded
        return next((a for a in self._folded_by_job if trips_fail_on(a, threshold)), None)

    def unmeasured(self) -> list[Alert]:
        """The probe's alerts, still active, saying no step was measured (judged for
        ``--fail-on`` when the run ends)."""
        return [
            entry.alert
            for entry in self.raised
            if entry.active and entry.alert.kind in ENDED_BY_FIRST_STEP
        ]


def checklist_order(entries: list[AlertEntry]) -> list[AlertEntry]:
    """Active before cleared; then along the checklist (its rung); within a rung errors
    before warnings before infos; then by step (then in the order raised). Entries
    folded under a job's incident are listed under it, not here."""
    return sorted(
        (e for e in entries if not e.folded_under),
        key=lambda e: (not e.active, e.alert.rung, -e.alert.severity.order, e.alert.step),
    )


def trips_fail_on(alert: Alert, threshold: str | None, *, run_ended: bool = False) -> bool:
    """True if ``alert`` trips ``--fail-on threshold`` (None: off): it is that severe or
    worse. An alert saying no step was measured trips it only once its run has ended
    still holding it (``AlertBook.unmeasured``): a loop measured after all clears it."""
    if not threshold or (alert.kind in ENDED_BY_FIRST_STEP and not run_ended):
        return False
    return Severity(alert.severity).at_least(threshold)
