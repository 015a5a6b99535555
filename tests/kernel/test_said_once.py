"""A loss's broken contract seen by two checks (the batch check's shapes, then torch's
own warning during a step) is one incident: the second folds under the first."""

from __future__ import annotations

from probes.kernel.diagnosis import Alert, AlertBook


def probe_alert(kind: str, subject: str, step: int = 0) -> Alert:
    return Alert(kind, "error", step, subject, {}, "s", (), layers=(subject,))


def test_a_second_check_of_the_same_broken_loss_folds_under_the_first() -> None:
    book = AlertBook()
    assert book.probe_alert(probe_alert("broadcast_in_loss", "targets"), steps_seen=False)
    assert not book.probe_alert(probe_alert("broadcast_in_loss", "loss", 3), steps_seen=True)
    [entry] = book.entries
    assert entry.alert.subject == "targets"
    assert entry.alert.folded == ("broadcast_in_loss@3",)


def test_near_miss_two_wiring_alerts_stay_two() -> None:
    """Parameters left out at watch() and others unfrozen later: two incidents."""
    book = AlertBook()
    assert book.probe_alert(probe_alert("params_not_in_optimizer", "head"), steps_seen=False)
    later = probe_alert("params_not_in_optimizer", "embed", 20)
    assert book.probe_alert(later, steps_seen=True)
    assert [e.alert.subject for e in book.entries] == ["head", "embed"]
