"""A run's alert book and a job's diagnoser, on their own (no monitor, no socket); the
status line's styles, asked of the state; the hello read by ``RunInfo`` alone."""

from __future__ import annotations

from typing import Any

import pytest

from probes.kernel.diagnosis import (
    Alert,
    AlertBook,
    AlertEntry,
    AlertKind,
    JobDiagnoser,
    RunInfo,
    Severity,
    checklist_order,
    trips_fail_on,
)
from probes.kernel.diagnosis.job import HOLD_S, RankProgress
from probes.kernel.wire import make_frame
from tests.frames import hello, step
from tui.format import status_fields
from tui.state import MonitorState


def alert(kind: str, severity: str = "warning", step: int = 5, subject: str = "") -> Alert:
    return Alert(kind, Severity(severity), step, subject, {}, "", ())


# --- the book ------------------------------------------------------------------------------


def test_a_probe_alert_saying_no_step_began_is_over_at_the_first_measured_step() -> None:
    book = AlertBook()
    unmeasured = alert("steps_not_measured", "error", step=-1)
    assert book.probe_alert(unmeasured, steps_seen=False)
    assert book.awaiting_a_step and book.unmeasured() == [unmeasured]
    assert book.diagnoser.probe_alerts  # a cause, while it holds
    assert book.first_measured_step(3) == [unmeasured]
    [entry] = book.entries
    assert not entry.active and entry.cleared_at == 3 and entry.withdrawn
    assert book.unmeasured() == [] and book.causes() == []  # passing: no cause
    assert book.diagnoser.probe_alerts == {}
    assert book.first_measured_step(4) == []  # once
    assert not book.probe_alert(unmeasured, steps_seen=True)  # a replay out of order
    assert len(book.entries) == 1


def test_a_fold_under_a_job_incident_takes_the_entry_out_of_the_runs_causes() -> None:
    book = AlertBook()
    spike = alert("loss_spike", step=9)
    book.probe_alert(spike, steps_seen=True)
    incident = AlertEntry(alert("rank_outlier", "error", step=8))
    book.share(incident)
    assert [e.alert.kind for e in book.raised] == ["loss_spike", "rank_outlier"]
    book.fold_under(spike, "rank_outlier")
    assert [e.alert.kind for e in book.raised] == ["rank_outlier"]
    assert book.active == [incident.alert]
    assert book.entries[0].folded_under == "rank_outlier"


def test_checklist_order_active_first_then_rung_then_severity_then_step() -> None:
    entries = [
        AlertEntry(alert("loss_spike", "warning", step=1)),  # rung 5
        AlertEntry(alert("non_finite", "error", step=9)),  # rung 2
        AlertEntry(alert("exploding_gradient", "warning", step=2), active=False),  # cleared
        AlertEntry(alert("update_ratio", "error", step=4)),  # rung 5, an error
        AlertEntry(alert("update_ratio", "error", step=3), folded_under="rank_outlier"),
    ]
    shown = [(e.alert.kind, e.alert.step) for e in checklist_order(entries)]
    assert shown == [
        ("non_finite", 9),
        ("update_ratio", 4),
        ("loss_spike", 1),
        ("exploding_gradient", 2),
    ]


@pytest.mark.parametrize(
    ("kind", "severity", "threshold", "run_ended", "trips"),
    [
        ("loss_spike", "error", "warning", False, True),
        ("loss_spike", "info", "warning", False, False),
        ("loss_spike", "error", None, False, False),
        ("steps_not_measured", "error", "warning", False, False),  # judged at the end
        ("steps_not_measured", "error", "warning", True, True),
        ("steps_not_measured", "warning", "error", True, False),
    ],
)
def test_fail_on(
    kind: str, severity: str, threshold: str | None, run_ended: bool, trips: bool
) -> None:
    assert trips_fail_on(alert(kind, severity), threshold, run_ended=run_ended) is trips


# --- the job's diagnoser ---------------------------------------------------------------


def test_a_ranks_alert_folded_under_a_milder_cause_still_trips_fail_on() -> None:
    # Rank 1's loss diverged (an error) after rank 0 found the update ratios high (a
    # warning, for every replica): folded under that cause, as on rank 0, it must still
    # fail a --fail-on error run, as a fold within one run does.
    book = AlertBook()
    diverged = alert("loss_diverged", "error", step=30)
    book.fold_under(diverged, "update_ratio")
    assert book.folded_tripping("error") is diverged
    assert book.highest_severity() is Severity.ERROR
    assert AlertBook().folded_tripping("error") is None


def job(sync: str = "ddp") -> JobDiagnoser:
    diagnoser = JobDiagnoser(2)
    diagnoser.start(("a", "b"), sync)
    return diagnoser


def test_held_alerts_wait_for_every_rank_then_one_alert_names_both() -> None:
    diagnoser = job(sync="fsdp")
    diagnoser.hold(0, [alert("loss_spike", step=5)], now=0.0)
    diagnoser.hold(1, [alert("loss_spike", step=6)], now=0.0)
    assert diagnoser.holding
    assert diagnoser.release(4, 0.1, {0, 1}) == ([], [])  # rank at step 4: not yet
    raised, folded = diagnoser.release(6, 0.1, {0, 1})
    assert folded == [] and [(rank, a.ranks, a.world_size) for rank, a in raised] == [
        (0, (0, 1), 2)
    ]
    assert diagnoser.raised_by(0, "loss_spike") and not diagnoser.raised_by(1, "loss_spike")
    assert not diagnoser.holding


def test_a_held_alert_waits_at_most_hold_s() -> None:
    diagnoser = job()
    diagnoser.hold(1, [alert("loss_spike", step=50)], now=0.0)
    assert diagnoser.release(10, HOLD_S / 2, {0, 1}).raised == []
    assert [rank for rank, _ in diagnoser.release(10, HOLD_S + 0.1, {0, 1}).raised] == [1]


def test_under_ddp_rank_0_speaks_for_every_rank_on_layer_kinds() -> None:
    diagnoser = job(sync="ddp")
    diagnoser.hold(0, [alert("exploding_gradient", "error", subject="a")], now=0.0)
    [(_, raised)] = diagnoser.release(5, 0.0, {0, 1}).raised
    assert raised.ranks == (0, 1)


def rank_0_at_9() -> dict[int, int]:
    """The ranks still there when a rank ends: rank 0, at step 9."""
    return {0: 9}


def not_asked() -> dict[int, int]:
    raise AssertionError("the ranks still there were made for an end that cannot stall")


def test_a_consequence_of_a_job_incident_folds_under_it() -> None:
    diagnoser = job()
    stalled = diagnoser.rank_gone(1, last_step=7, clean=False, reason="gone", others=rank_0_at_9)
    assert stalled is not None and stalled.kind is AlertKind.RANK_STALLED
    assert diagnoser.rank_gone(1, last_step=7, clean=False, reason="gone", others=not_asked) is None
    diagnoser.incidents[0] = diagnoser.entries[0].alert = alert("rank_outlier", "error", 4)
    diagnoser.hold(0, [alert("loss_spike", step=6)], now=0.0)
    diagnoser.hold(1, [alert("loss_spike", step=7)], now=0.0)  # the same, on rank 1
    released = diagnoser.release(None, 0.0, {0, 1})
    assert released.raised == [] and [(r, a.kind, k) for r, a, k in released.folded] == [
        (0, "loss_spike", "rank_outlier"),
        (1, "loss_spike", "rank_outlier"),
    ]
    assert diagnoser.entries[0].alert.folded == ("loss_spike@6",)  # listed once


def test_a_clean_end_is_no_stall_and_a_quiet_rank_is() -> None:
    diagnoser = job()
    ended = diagnoser.rank_gone(1, last_step=7, clean=True, reason="closed", others=not_asked)
    assert ended is None
    live = [RankProgress(0, 20, 99.0), RankProgress(1, 7, 10.0)]
    found = diagnoser.quiet_ranks(live, now=100.0)
    assert found is not None and found[0] == 1
    assert found[1].evidence["reason"] == "quiet for 90 s"
    assert diagnoser.quiet_ranks(live, now=100.0) is None  # once per job


# --- RunInfo: the one reader of the hello ---------------------------------------------------


def rank_hello(**fields: Any) -> dict[str, Any]:
    return {**hello(), "job": "j1", "rank": 1, "world_size": 2, "sync": "ddp", **fields}


def test_run_info_reads_who_the_run_is() -> None:
    info = RunInfo.from_hello(rank_hello(state={"paused": True}))
    assert (info.name, info.host, info.pid) == ("mlp", "box", 123)
    assert (info.job, info.rank, info.world_size, info.sync) == ("j1", 1, 2, "ddp")
    assert info.param_counts == (10, 10, 10) and info.control == {"paused": True}
    assert not info.replica_rules  # rank 1 of a DDP job: rank 0's gradients
    alone = RunInfo.from_hello(rank_hello(world_size=1, rank=True, sync=None))
    assert (alone.job, alone.rank, alone.world_size, alone.sync) == (None, 0, 1, "unknown")
    assert RunInfo.from_hello({"kind": "hello"}).name is None


def test_the_monitor_reads_the_hello_through_run_info() -> None:
    state = MonitorState()
    state.apply(1, rank_hello())
    run = state.runs["run-a"]
    assert run.info == RunInfo.from_hello(rank_hello())
    assert (run.name, run.job, run.rank, run.world_size) == ("mlp", "j1", 1, 2)
    assert state.jobs["j1"].diagnoser.checks is not None
    assert state.jobs["j1"].diagnoser.checks.sync == "ddp"
    [summary] = state.jobs["j1"].summary(state.runs, now=0.0)
    assert summary.host == "box"


# --- the status line: styles from the state -------------------------------------------------


def styles(state: MonitorState) -> dict[str, str]:
    run = state.runs["run-a"]
    return {str(f): getattr(f, "style", "") for f in status_fields(run, state, "x")[1:]}


def test_status_styles_come_from_the_state() -> None:
    state = MonitorState()
    state.apply(1, hello())
    for i in range(3):
        state.apply(1, step(i))
    shown = styles(state)
    assert shown["connected"] == "green" and shown["running"] == ""
    assert shown["alerts 0"] == "" and shown["dropped 0"] == ""
    run = state.runs["run-a"]
    run.book.probe_alert(alert("mostly_frozen", "info"), steps_seen=True)
    run.control["paused"] = True
    run.dropped = 4
    shown = styles(state)
    assert shown["alerts 1 active / 1 raised"] == Severity.WARNING.style  # worth a look
    assert shown["paused"] == "bold yellow" and shown["dropped 4"] == Severity.WARNING.style
    run.book.probe_alert(alert("non_finite", "error"), steps_seen=True)
    assert styles(state)["alerts 2 active / 2 raised"] == Severity.ERROR.style
    state.apply(2, make_frame("step", step=1))  # no hello on this connection
    state.connection_closed(1, "reset")
    shown = styles(state)
    assert shown["disconnected (reset)"] == shown["rejected 1"] == Severity.ERROR.style
    run.probe_error = "boom"
    assert styles(state)["probe off"] == Severity.ERROR.style  # (not the probe's share's)


def test_short_status_fields_keep_their_styles() -> None:
    state = MonitorState()
    state.apply(1, hello())
    state.apply(1, step(0))
    state.runs["run-a"].control["anomaly_armed"] = 2
    fields = status_fields(state.runs["run-a"], state, "x", short=True)
    shown = {str(f): getattr(f, "style", "") for f in fields[1:]}
    assert shown["running+anomaly(2)"] == "bold yellow" and shown["drop 0"] == ""
