"""Diagnosis: the lesson's layered checklist as evidence-based alerts (pure Python).

Each rule watches a run's records and says, after every record, which conditions hold
now; ``Diagnoser`` feeds the rules and turns what they say into incidents: one alert per
root cause, naming the first failing layer and listing the others, with its
consequences folded under it, raised once, held while its condition lasts and cleared
after ``clear_after`` steps without it. Every alert carries its evidence (the numbers
that triggered it), one sentence on what it is a signal of and what it does not prove,
and the next controlled experiments, each changing one thing (``catalog``).

Time is counted in steps, never in records: a fast run's thinned record stands for
several steps and carries their peaks (``views``).

The package follows the checklist: ``vocabulary`` (alert kinds, severities, rungs, each
with how it is shown), ``thresholds``, ``views`` (the records as the rules see them), one
module of rules per rung (``values``, ``tiny_batch``, ``gradient_path``, ``update``,
``evaluation``; the data rung's checks run in the training process), the probe's own
cost (``overhead``), ``incidents`` (what folds under what), ``diagnoser`` and
``catalog``; ``book`` (one run's alert entries, from raised to cleared) and, across a
job's ranks, ``ranks`` (the checks) and ``job`` (their incidents and what they do to the
ranks' alerts). Both the monitor (live and on replay) and headless mode run it; the
training side builds its alerts with it. It imports no torch and no textual.
"""

from probes.kernel.diagnosis.alert import (
    SEVERITY_ORDER,
    Alert,
    AlertChange,
    at_least,
    worst_severity,
)
from probes.kernel.diagnosis.book import AlertBook, AlertEntry, checklist_order, trips_fail_on
from probes.kernel.diagnosis.catalog import CATALOG, RUNGS, rung_of
from probes.kernel.diagnosis.diagnoser import RULES, Diagnoser
from probes.kernel.diagnosis.job import JobDiagnoser
from probes.kernel.diagnosis.rule import Findings, Rule
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import EvalView, RecentPast, RunInfo, StepView, as_number, mean
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

__all__ = [
    "CATALOG",
    "RULES",
    "RUNGS",
    "SEVERITY_ORDER",
    "Alert",
    "AlertBook",
    "AlertChange",
    "AlertEntry",
    "AlertKind",
    "Diagnoser",
    "EvalView",
    "Findings",
    "JobDiagnoser",
    "RecentPast",
    "Rule",
    "RunInfo",
    "Rung",
    "Severity",
    "StepView",
    "Thresholds",
    "as_number",
    "at_least",
    "checklist_order",
    "mean",
    "rung_of",
    "trips_fail_on",
    "worst_severity",
]
