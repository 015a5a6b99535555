"""The closed vocabularies (alert kinds, severities, rungs): every table keyed by one of
them covers exactly its members, and the values travel as the bare strings they were."""

from __future__ import annotations

import json

import pytest

from probes.kernel.diagnosis import RULES, RUNGS, Alert, AlertKind, Rung, Severity, rung_of
from probes.kernel.diagnosis.catalog import CATALOG, CHECK_RUNGS, ENDED_BY_FIRST_STEP, UNKNOWN_RUNG
from probes.kernel.diagnosis.diagnoser import REPLICA_KINDS, REPLICA_RULES
from probes.kernel.diagnosis.incidents import (
    CONSEQUENCES,
    JOB_CONSEQUENCES,
    JOB_RANK_CONSEQUENCES,
    STICKY,
    WAIT_FOR_CAUSE,
)
from probes.kernel.diagnosis.ranks import _ONE_CAUSE, _SEVERITY
from probes.kernel.diagnosis.vocabulary import (
    _SEVERITY_ORDER,
    RUNG_LABELS,
    SEVERITY_COLOURS,
    SEVERITY_MARKS,
    SEVERITY_STYLES,
)
from tui.run import LAYER_CONDITIONS

KINDS = set(AlertKind)
CROSS_RANK = {
    AlertKind.RANK_OUTLIER,
    AlertKind.GRADS_NOT_SYNCED,
    AlertKind.REPLICAS_DIVERGED,
    AlertKind.RANK_STALLED,
}


# --- tables keyed by a vocabulary: exactly its members ---------------------------------------


def test_every_kind_is_described_once_by_the_catalog_or_the_checks() -> None:
    assert set(CATALOG) | set(CHECK_RUNGS) == KINDS
    assert not set(CATALOG) & set(CHECK_RUNGS)
    assert all(isinstance(kind, AlertKind) for kind in [*CATALOG, *CHECK_RUNGS])


def test_every_kind_the_catalog_explains_has_experiments() -> None:
    """A kind with a signal says what to try next; one without is the training side's,
    whose alert carries its own message and fix."""
    for kind, entry in CATALOG.items():
        assert isinstance(entry.rung, Rung), kind
        assert bool(entry.signal) == bool(entry.experiments), kind


def test_every_severity_has_an_order_a_style_a_colour_and_a_mark() -> None:
    for table in (_SEVERITY_ORDER, SEVERITY_STYLES, SEVERITY_COLOURS, SEVERITY_MARKS):
        assert set(table) == set(Severity)
    assert sorted(Severity, key=lambda s: s.order) == [
        Severity.INFO,
        Severity.WARNING,
        Severity.ERROR,
    ]
    assert len({s.mark for s in Severity}) == len(Severity)


def test_every_rung_has_a_label_and_the_catalog_uses_them_all() -> None:
    assert set(RUNG_LABELS) == set(Rung)
    assert {rung.value: rung.label for rung in Rung} == RUNGS
    assert {rung_of(kind) for kind in AlertKind} == set(Rung)
    assert Rung.VALUES.tag == "shapes" and Rung.DATA.tag == "data_and_split"


def test_consequence_tables_name_only_kinds() -> None:
    for consequence, folds in CONSEQUENCES.items():
        assert consequence in KINDS
        assert all(fold.cause in KINDS for fold in folds), consequence
    assert STICKY <= KINDS and WAIT_FOR_CAUSE <= KINDS
    assert set(WAIT_FOR_CAUSE) <= set(CONSEQUENCES)  # a kind waits only for a cause
    for incident, consequences in JOB_CONSEQUENCES.items():
        assert incident in CROSS_RANK
        assert consequences <= KINDS
    assert set(_SEVERITY) == CROSS_RANK  # every cross-rank kind, and only those
    for incident, explained in JOB_RANK_CONSEQUENCES.items():
        assert incident in KINDS and set(explained) <= KINDS
    assert set(_ONE_CAUSE) | set(_ONE_CAUSE.values()) <= CROSS_RANK
    assert ENDED_BY_FIRST_STEP <= KINDS
    assert set(LAYER_CONDITIONS) <= KINDS


def test_every_kind_a_rule_raises_is_in_the_catalog() -> None:
    raised = {kind for rule in RULES for kind in rule.raises()}
    assert raised <= set(CATALOG)
    assert AlertKind.SATURATED_ACTIVATIONS in raised and AlertKind.EVAL_WITH_GRAD in raised


def test_the_kinds_shared_by_a_ddp_job_are_derived_from_the_replica_rules() -> None:
    """The kinds rank 0 speaks for under DDP: what the rules over the replicated values
    raise (it was a hand-kept copy of them)."""
    assert set(RULES) >= REPLICA_RULES
    assert {
        "exploding_gradient",
        "vanishing_gradient",
        "none_gradients",
        "dead_activations",
        "saturated_activations",
        "grad_not_cleared",
        "updates_not_applied",
        "update_ratio",
        "lr_too_low_to_update",
        "skipped_updates",
        "no_updates",
        "clip_always_active",
        "grads_still_scaled",
    } == REPLICA_KINDS


# --- wire compatibility ---------------------------------------------------------------------


def test_an_alert_travels_with_bare_strings_and_reads_back_as_members() -> None:
    alert = Alert(AlertKind.EXPLODING_GRADIENT, Severity.ERROR, 7, "fc1", {"x": 1.0}, "s", ())
    wire = json.loads(json.dumps(alert.to_dict()))
    assert wire["kind"] == "exploding_gradient" and wire["severity"] == "error"
    assert type(wire["kind"]) is str and type(wire["severity"]) is str
    back = Alert.from_dict(wire)
    assert back == alert
    assert back.kind is AlertKind.EXPLODING_GRADIENT and back.severity is Severity.ERROR
    assert back.line() == alert.line() == "ALERT error exploding_gradient step=7 subject=fc1 x=1"


def test_plain_strings_become_members_and_unknown_kinds_stay_strings() -> None:
    alert = Alert("loss_spike", "warning", 3, "", {}, "", ())  # type: ignore[arg-type]
    assert alert.kind is AlertKind.LOSS_SPIKE and alert.severity is Severity.WARNING
    newer = Alert.from_dict({"kind": "from_a_newer_probe", "severity": "catastrophic"})
    assert newer.kind == "from_a_newer_probe" and type(newer.kind) is str
    assert newer.severity is Severity.WARNING  # as before: an unknown severity warns
    assert newer.rung == UNKNOWN_RUNG


@pytest.mark.parametrize(
    ("severity", "threshold", "trips"),
    [("error", "warning", True), ("warning", "warning", True), ("info", "warning", False)],
)
def test_severity_compares_by_its_order(severity: str, threshold: str, trips: bool) -> None:
    assert Severity(severity).at_least(threshold) is trips
