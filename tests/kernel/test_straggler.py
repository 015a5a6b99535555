"""The straggler check across a job's ranks, from synthetic step records (no torch).

A data-parallel step: every rank's cycle is the same (the all-reduce syncs them); a
rank's time before it (data wait + forward) is its own, and the others wait in their
backward for the slowest. The records below are made that way: a base step of 30 ms
(data 3, forward 12, backward 10, optimizer 5), a rank's extra time in data or forward,
and every rank's cycle the base plus the largest extra of the step.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from probes.kernel.diagnosis import Alert, Thresholds
from probes.kernel.diagnosis.alert import Severity
from probes.kernel.diagnosis.book import AlertBook
from probes.kernel.diagnosis.job import JobDiagnoser
from probes.kernel.diagnosis.straggler import Stragglers
from probes.kernel.diagnosis.views import StepView
from probes.kernel.diagnosis.vocabulary import AlertKind
from tests.frames import hello
from tests.frames import step as step_frame
from tui.state import MonitorState

BASE = {"data": 3.0, "forward": 12.0, "backward": 10.0, "optimizer": 5.0}  # ms
# A rank's extra ms at a step: (data, forward)
Extra = Callable[[int, int], tuple[float, float]]


def none(rank: int, step: int) -> tuple[float, float]:
    return 0.0, 0.0


def slow_data(who: int, ms: float = 30.0, steps: range = range(10**9)) -> Extra:
    return lambda rank, step: (ms, 0.0) if rank == who and step in steps else (0.0, 0.0)


def slow_forward(who: int, ms: float = 30.0) -> Extra:
    return lambda rank, step: (0.0, ms) if rank == who else (0.0, 0.0)


def times(extra: Extra, ranks: int, step: int, noise: random.Random) -> list[dict[str, float]]:
    """Each rank's phases (ms) at ``step``: its own data and forward (with a little
    jitter), a backward that waits for the slowest rank, one cycle for all."""
    own = []
    for rank in range(ranks):
        data, forward = extra(rank, step)
        own.append(
            {
                "data": BASE["data"] + data + noise.uniform(-0.5, 0.5),
                "forward": BASE["forward"] + forward + noise.uniform(-0.5, 0.5),
            }
        )
    slowest = max(t["data"] + t["forward"] for t in own)
    for phases in own:
        wait = slowest - phases["data"] - phases["forward"]
        phases["backward"] = BASE["backward"] + wait
        phases["optimizer"] = BASE["optimizer"]
        phases["cycle"] = slowest + BASE["backward"] + BASE["optimizer"]
    return own


def record(
    first: int, last: int, phases: list[dict[str, float]], *, timed: bool = True
) -> StepView:
    """A step record for ``first``..``last`` (thinned when more than one), its phases
    summed over them (seconds), as a probe sends it; ``timed=False``: an older probe's,
    without them."""
    frame: dict[str, Any] = {"kind": "step", "step": last, "scalars": {"loss": 1.0}}
    if first != last:
        frame["span"] = [first, last]
    if timed:
        for name, field in (
            ("cycle", "cycle"),
            ("data", "data_time"),
            ("forward", "forward_time"),
            ("backward", "backward_time"),
            ("optimizer", "optimizer_time"),
        ):
            frame[field] = sum(p[name] for p in phases) / 1000
    return StepView.from_record(frame)


def feed(
    job: JobDiagnoser,
    extra: Extra,
    *,
    ranks: int = 2,
    steps: int = 200,
    start: int = 0,
    span: int = 3,
    timed: bool = True,
) -> list[Alert]:
    """Every rank's records of ``steps`` steps (rank 0 one a step, the others thinned to
    ``span`` steps a record, as the sender sends them); the incidents raised."""
    noise = random.Random(7)
    pending: dict[int, list[dict[str, float]]] = {rank: [] for rank in range(ranks)}
    raised: list[Alert] = []
    for index in range(start, start + steps):
        for rank, phases in enumerate(times(extra, ranks, index, noise)):
            pending[rank].append(phases)
            if rank == 0 or len(pending[rank]) == span or index == start + steps - 1:
                first = index - len(pending[rank]) + 1
                view = record(first, index, pending[rank], timed=timed)
                raised += job.observe_step(rank, view)
                pending[rank] = []
    return raised


def job_of(ranks: int = 2, sync: str = "ddp") -> JobDiagnoser:
    job = JobDiagnoser(ranks)
    for rank in range(ranks):
        job.start(("a", "b"), sync, rank=rank, host=f"node-{rank}")
    return job


def stragglers(raised: list[Alert]) -> list[Alert]:
    return [a for a in raised if a.kind is AlertKind.STRAGGLER]


def active(job: JobDiagnoser) -> list[Alert]:
    return [e.alert for e in job.entries if e.active and e.alert.kind is AlertKind.STRAGGLER]


# --- found ---------------------------------------------------------------------------------


def test_a_rank_waiting_30_ms_more_for_its_data_is_the_straggler() -> None:
    job = job_of()
    [alert] = stragglers(feed(job, slow_data(1)))
    assert alert.subject == "rank 1" and alert.severity is Severity.WARNING
    evidence = alert.evidence
    assert list(evidence) == [
        "rank",
        "host",
        "phase",
        "gap_ms",
        "gap_share",
        "phase_share",
        "steps",
    ]  # the catalog's keys, in its order
    assert evidence["rank"] == 1 and evidence["host"] == "node-1"
    assert evidence["phase"] == "data" and evidence["phase_share"] >= 0.95
    assert evidence["gap_ms"] == pytest.approx(30.0, abs=1.0)
    assert evidence["gap_share"] == pytest.approx(0.5, abs=0.03)  # of a 60 ms step
    assert evidence["steps"] >= Thresholds().straggler_window_steps
    # judged once a window past the warm-up is full, not before
    assert 60 <= alert.step <= 80
    assert active(job) == [alert] and alert.world_size == 2


def test_a_rank_slow_in_its_forward_among_four_is_named_with_its_phase() -> None:
    job = job_of(4, sync="fsdp")
    [alert] = stragglers(feed(job, slow_forward(2, ms=20.0), ranks=4))
    evidence = alert.evidence
    assert alert.subject == "rank 2" and evidence["host"] == "node-2"
    assert evidence["phase"] == "forward" and evidence["gap_ms"] == pytest.approx(20, abs=1)


def test_a_gap_no_one_phase_explains_is_compute() -> None:
    job = job_of(4)
    both: Extra = lambda rank, step: (10.0, 10.0) if rank == 3 else (0.0, 0.0)  # noqa: E731
    [alert] = stragglers(feed(job, both, ranks=4))
    assert alert.evidence["phase"] == "compute" and alert.evidence["rank"] == 3
    assert alert.evidence["phase_share"] == pytest.approx(1.0, abs=0.05)


def test_a_host_not_said_is_none_in_the_evidence() -> None:
    job = JobDiagnoser(2)
    job.start(("a", "b"), "ddp")
    [alert] = stragglers(feed(job, slow_data(1)))
    assert alert.evidence["host"] is None and alert.evidence["rank"] == 1


# --- near misses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "timed"),
    [
        (none, True),
        (slow_data(1, ms=1.5), True),  # a few % of the step: ranks on one host differ so
        (slow_data(1, ms=3000.0, steps=range(100, 101)), True),  # one slow step in 200
        (slow_data(0, ms=3000.0, steps=range(100, 101)), True),  # ... on rank 0
        (slow_data(1, steps=range(10)), True),  # slow only in the warm-up
        (slow_data(1, ms=200.0, steps=range(8)), True),  # ... however slow
        (slow_data(1), False),  # records without the phases' times (an older probe)
    ],
    ids=["even", "a few percent", "one slow step", "one slow step of rank 0", "warm-up",
         "a slow warm-up", "older probe"],
)  # fmt: skip
def test_near_misses_stay_silent(extra: Extra, timed: bool) -> None:
    for ranks in (2, 4):
        job = job_of(ranks)
        assert stragglers(feed(job, extra, ranks=ranks, timed=timed)) == []


def test_a_rank_with_phases_beside_one_without_is_not_judged() -> None:
    job = job_of()
    feed(job, slow_data(1), ranks=1)  # rank 0 alone, with the phases
    assert stragglers(feed(job, slow_data(1), ranks=2, start=200, timed=False)) == []


def test_one_rank_alone_never_raises_it() -> None:
    """A single run (no job) has no job diagnosis: its own rules never raise a straggler;
    and a job of which one rank reports has no other rank to compare with."""
    book = AlertBook()
    noise = random.Random(1)
    for index in range(300):
        phases = times(slow_data(0, ms=60.0), 1, index, noise)
        changes = book.observe(record(index, index, phases))
        assert all(c.alert.kind is not AlertKind.STRAGGLER for c in changes)
    job = job_of()
    assert stragglers(feed(job, slow_data(0), ranks=1, steps=300)) == []


def test_a_job_whose_ranks_do_not_share_gradients_is_not_judged() -> None:
    job = job_of(sync="unknown")  # a pipeline's stages do not wait in one collective
    assert job.stragglers is None and stragglers(feed(job, slow_data(1))) == []


# --- held and cleared ---------------------------------------------------------------------


def test_the_alert_is_held_while_the_gap_lasts_and_cleared_when_it_ends() -> None:
    job = job_of(4)
    [alert] = stragglers(feed(job, slow_data(1, steps=range(0, 200)), ranks=4, steps=400))
    [entry] = [e for e in job.entries if e.alert is alert]
    assert not entry.active and entry.cleared_at is not None
    # held past the gap's end until the window shows it no more (half of it at most)
    assert 200 < entry.cleared_at <= 200 + Thresholds().straggler_window_steps


def test_a_gap_that_comes_back_is_a_new_incident() -> None:
    job = job_of()
    again = slow_data(1, steps=range(300, 500))
    first = stragglers(feed(job, slow_data(1, steps=range(0, 150)), steps=300))
    second = stragglers(feed(job, again, start=300, steps=200))
    assert len(first) == len(second) == 1 and second[0].step > first[0].step
    assert [e.active for e in job.entries] == [False, True]


def test_a_gap_about_the_bound_is_one_incident() -> None:
    """A straggler whose gap moves about the raising bound (share 0.15) is held: it
    clears only under half of it."""
    job = job_of()
    wobble: Extra = lambda rank, step: (  # noqa: E731
        (6.0 if (step // 40) % 2 else 12.0, 0.0) if rank == 1 else (0.0, 0.0)
    )
    assert len(stragglers(feed(job, wobble, steps=600))) == 1
    assert len(active(job)) == 1


# --- the rank's own data wait -------------------------------------------------------------


def input_bound(step: int) -> Alert:
    evidence = {"data_share": 0.5, "data_ms_per_step": 33.0, "step_ms": 60.0, "steps": 200}
    return Alert(AlertKind.INPUT_BOUND, Severity.WARNING, step, "", evidence, "", ())


def test_the_straggler_s_own_input_bound_folds_under_it_and_no_other_rank_s() -> None:
    job = job_of()
    [straggler] = stragglers(feed(job, slow_data(1)))
    job.hold(1, [input_bound(190)], now=0.0)
    job.hold(0, [input_bound(191)], now=0.0)
    released = job.release(None, 0.0, {0, 1})
    assert [(r, a.kind, k) for r, a, k in released.folded] == [(1, "input_bound", "straggler")]
    assert [r for r, _ in released.raised] == [0]  # rank 0's wait is its own
    assert job.entries[-1].alert.folded == ("input_bound@190",)
    assert straggler.folded == ()  # (the entry shows the fold; the alert raised stays)


def test_an_input_bound_is_not_the_straggler_s_when_its_gap_is_its_forward() -> None:
    job = job_of()
    stragglers(feed(job, slow_forward(1)))
    job.hold(1, [input_bound(190)], now=0.0)
    assert [r for r, _ in job.release(None, 0.0, {0, 1}).raised] == [1]


def test_an_input_bound_after_the_straggler_cleared_is_raised() -> None:
    job = job_of()
    feed(job, slow_data(1, steps=range(0, 150)), steps=300)
    assert active(job) == []
    job.hold(1, [input_bound(290)], now=0.0)
    assert [r for r, _ in job.release(None, 0.0, {0, 1}).raised] == [1]


# --- in the monitor ---------------------------------------------------------------------------


def test_the_monitor_shows_the_straggler_in_every_rank_s_alerts() -> None:
    state = MonitorState()
    for rank in range(2):
        frame = hello(run=f"r{rank}", name="ddp-run")
        frame.update(job="job-1", rank=rank, local_rank=rank, world_size=2, sync="ddp")
        state.apply(rank, frame)
    noise = random.Random(3)
    for index in range(120):
        for rank, phases in enumerate(times(slow_data(1), 2, index, noise)):
            frame = step_frame(index, run=f"r{rank}", loss=1.0)
            frame.update(
                cycle=phases["cycle"] / 1000,
                data_time=phases["data"] / 1000,
                forward_time=phases["forward"] / 1000,
            )
            state.apply(rank, frame)
    for run in state.runs.values():
        [alert] = [a for a in run.book.active if a.kind is AlertKind.STRAGGLER]
        assert alert.subject == "rank 1" and alert.evidence["phase"] == "data"


def test_a_straggler_check_alone_compares_ranks_by_their_windows() -> None:
    check = Stragglers()
    noise = random.Random(5)
    found = []
    for index in range(100):
        for rank, phases in enumerate(times(slow_data(1), 3, index, noise)):
            raised, ended = check.observe(rank, record(index, index, [phases]))
            assert ended is None
            found += [raised] if raised is not None else []
    assert [a.subject for a in found] == ["rank 1"] and check.current is found[0]
