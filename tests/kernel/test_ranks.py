"""Cross-rank checks and one job in the monitor, from synthetic records (no torch)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from probes.kernel.diagnosis import Alert, Thresholds
from probes.kernel.diagnosis.incidents import replica_cause
from probes.kernel.diagnosis.job import HOLD_S
from probes.kernel.diagnosis.ranks import JobChecks
from probes.kernel.diagnosis.views import StepView
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity
from probes.kernel.wire import pack_float32, unpack_float32
from tests.frames import hello, probe_alert, step
from tui.events import AlertRaised, RunConnected, RunDisconnected
from tui.format import alerts_label
from tui.monitor import Monitor, boundary_ahead
from tui.server import Connection
from tui.state import MonitorState

LAYERS = ("encoder", "hidden", "head")


def view(
    step: int,
    loss: float = 1.0,
    grads: tuple[float, ...] = (0.5, 0.4, 0.3),
    params: tuple[float, ...] | None = None,
    first: int | None = None,
    shown: int | None = None,
) -> StepView:
    """A record of ``step`` (a span from ``first``, shown by its step ``shown``: its
    last unless said)."""
    record: dict = {
        "kind": "step",
        "step": step if shown is None else shown,
        "scalars": {"loss": loss},
        "grad_norms": list(grads),
        "grad_norm_total": math.hypot(*grads),
    }
    if params is not None:
        record["param_norms"] = list(params)
    if first is not None:
        record["span"] = [first, step]
    return StepView.from_record(record)


def test_ddp_ranks_that_agree_raise_nothing() -> None:
    checks = JobChecks(LAYERS, "ddp")
    for index in range(60):
        params = (3.0, 2.0, 1.0) if index % 20 == 0 else None
        for rank in (0, 1, 2):
            assert checks.observe(rank, view(index, loss=1.0 + 0.1 * rank, params=params)) == []


def test_unsynced_gradients_name_the_first_layer_and_the_ranks() -> None:
    checks = JobChecks(LAYERS, "ddp")
    assert checks.observe(0, view(7, grads=(0.5, 0.4, 0.3))) == []
    [alert] = checks.observe(1, view(7, grads=(0.5, 0.41, 0.33)))
    assert alert.kind == "grads_not_synced" and alert.subject == "hidden"
    assert alert.layers == ("hidden", "head") and alert.evidence["ranks"] == [0, 1]
    assert alert.step == 7 and alert.severity == "error"
    assert checks.observe(0, view(8, grads=(0.9, 0.4, 0.3))) == []  # once per job
    assert checks.observe(1, view(8, grads=(0.5, 0.4, 0.3))) == []


def packed(step: int, grads: tuple[float, ...]) -> StepView:
    """A record of ``step`` whose gradient norms came packed, as a probe sends them."""
    text = pack_float32(list(grads))
    assert text is not None
    record = {"kind": "step", "step": step, "scalars": {"loss": 1.0}}
    record["grad_norms"] = unpack_float32("grad_norms", text)
    return StepView.from_record(record)


def test_packed_gradients_compare_by_value() -> None:
    checks = JobChecks(LAYERS, "ddp")
    for index, (first, second) in enumerate(
        [
            ((0.5, 0.4, 0.3), (0.5, 0.4, 0.3)),  # the same bytes
            ((0.5, 0.0, 0.3), (0.5, -0.0, 0.3)),  # bytes apart, the same values
            ((0.5, math.nan, 0.3), (0.5, math.nan, 0.3)),  # non-finite: not compared
        ]
    ):
        assert checks.observe(0, packed(index, first)) == []
        assert checks.observe(1, packed(index, second)) == []
    assert checks.observe(0, packed(9, (0.5, 0.4, 0.3))) == []
    [alert] = checks.observe(1, packed(9, (0.5, 0.4, 0.36)))
    assert alert.kind == "grads_not_synced" and alert.subject == "head"


def test_gradients_within_rounding_agree() -> None:
    checks = JobChecks(LAYERS, "ddp")
    checks.observe(0, view(3, grads=(0.5, 0.4, 0.3)))
    assert checks.observe(1, view(3, grads=(0.5 * (1 + 1e-6), 0.4, 0.3))) == []


def test_replicas_diverged_at_a_sampled_step() -> None:
    checks = JobChecks(LAYERS, "ddp")
    checks.observe(0, view(20, params=(3.0, 2.0, 1.0)))
    [alert] = checks.observe(1, view(20, params=(3.0, 2.0, 1.0001)))
    assert alert.kind == "replicas_diverged" and alert.subject == "head"


def test_sharded_or_unknown_jobs_compare_only_losses() -> None:
    for sync in ("fsdp", "unknown"):
        checks = JobChecks(LAYERS, sync)
        checks.observe(0, view(20, grads=(1.0, 1.0, 1.0), params=(3.0, 2.0, 1.0)))
        assert checks.observe(1, view(20, grads=(2.0, 1.0, 1.0), params=(1.0, 2.0, 1.0))) == []


def test_one_ranks_loss_far_above_the_others_names_that_rank() -> None:
    checks = JobChecks(LAYERS, "ddp")
    for index in range(10):
        for rank in range(4):
            checks.observe(rank, view(index, loss=2.0 - 0.1 * index + 0.05 * rank))
    for rank in (0, 1, 3):
        assert checks.observe(rank, view(10, loss=1.0)) == []
    [alert] = checks.observe(2, view(10, loss=900.0))
    assert alert.kind == "rank_outlier" and alert.evidence["rank"] == 2
    assert alert.evidence["others"] == "fine" and alert.evidence["other_ranks_median"] == 1.0
    assert "rank=2" in alert.line()


def test_a_non_finite_loss_on_one_rank_is_an_outlier() -> None:
    checks = JobChecks(LAYERS, "unknown")
    checks.observe(0, view(5, loss=1.0))
    [alert] = checks.observe(1, view(5, loss=math.nan))
    assert alert.kind == "rank_outlier" and alert.evidence["rank"] == 1


def test_small_losses_apart_by_a_factor_are_not_outliers() -> None:
    """Late in training, 0.01 against 0.05 is noise between shards, not a bad one."""
    checks = JobChecks(LAYERS, "ddp")
    checks.observe(0, view(0, loss=2.3))
    checks.observe(1, view(0, loss=2.3))
    checks.observe(0, view(500, loss=0.01))
    assert checks.observe(1, view(500, loss=0.05)) == []


def test_spans_shown_by_their_first_non_finite_step_compare_at_that_step() -> None:
    # A run gone non-finite shows each thinned span by its first non-finite step: rank
    # 1's span 66..73 shows step 66 (a finite loss still climbing, its gradients inf),
    # rank 0's 69..73 shows step 69 (an infinite loss). Compared as step 73's, rank 0
    # read as far above the others: a false rank_outlier in a real 2-rank explosion.
    checks = JobChecks(LAYERS, "ddp")
    climbing = (0.0, math.inf, 7e13)
    assert checks.observe(1, view(73, loss=3.8e25, grads=climbing, first=66, shown=66)) == []
    gone = (math.inf, math.inf, math.inf)
    assert checks.observe(0, view(73, loss=math.inf, grads=gone, first=69, shown=69)) == []
    # Spans that end apart but show one step are compared (one rank's NaN is its own).
    checks = JobChecks(LAYERS, "unknown")
    assert checks.observe(0, view(84, loss=1.0, first=80, shown=80)) == []
    [alert] = checks.observe(1, view(88, loss=math.nan, first=80, shown=80))
    assert alert.kind == "rank_outlier" and (alert.step, alert.evidence["rank"]) == (80, 1)


def test_records_of_different_steps_do_not_compare() -> None:
    checks = JobChecks(LAYERS, "ddp", Thresholds())
    checks.observe(0, view(10, grads=(0.5, 0.4, 0.3)))
    assert checks.observe(1, view(11, grads=(9.0, 9.0, 9.0), first=5)) == []


def test_a_rank_that_stopped_is_named_once() -> None:
    checks = JobChecks(LAYERS, "ddp")
    alert = checks.stalled(1, last_step=99, reason="connection lost", others={0: 104})
    assert alert is not None and alert.kind == "rank_stalled"
    assert alert.evidence["rank"] == 1 and alert.step == 99
    assert checks.stalled(2, last_step=99, reason="connection lost", others={0: 104}) is None
    assert JobChecks(LAYERS).stalled(1, last_step=5, reason="gone", others={}) is None


def test_unsynced_gradients_after_diverged_replicas_are_one_incident() -> None:
    checks = JobChecks(LAYERS, "ddp")
    checks.observe(0, view(20, params=(3.0, 2.0, 1.0)))
    [incident] = checks.observe(1, view(20, params=(3.1, 2.0, 1.0)))
    assert incident.kind == "replicas_diverged"
    checks.observe(0, view(21, grads=(0.5, 0.4, 0.3)))
    assert checks.observe(1, view(21, grads=(0.6, 0.4, 0.3))) == []  # folded, not raised
    assert checks.found["replicas_diverged"].folded == ("grads_not_synced@21",)


# --- one job in the monitor ------------------------------------------------------------


def rank_hello(rank: int, world: int = 2, job: str = "job-7", sync: str = "ddp") -> dict:
    frame = hello(run=f"r{rank}", name="ddp-run")
    frame.update(
        job=job, rank=rank, local_rank=rank, world_size=world, sync=sync, host=f"node{rank}"
    )
    return frame


def exploding(index: int, run: str) -> dict:
    return step(index, run=run, grad_norms=[0.5, 0.4, 0.3] if index < 30 else [500.0, 4.0, 3.0])


def job_state(world: int = 2) -> tuple[MonitorState, list]:
    state = MonitorState()
    events = []
    for rank in range(world):
        events += state.apply(rank, rank_hello(rank, world))
    return state, events


def test_the_ranks_of_a_job_are_one_job() -> None:
    state, events = job_state(3)
    assert [type(e) for e in events] == [RunConnected] * 3
    [job] = state.jobs.values()
    assert job.job_id == "job-7" and job.world_size == 3 and sorted(job.ranks) == [0, 1, 2]
    assert [r.rank for r in job.rank_runs(state.runs)] == [0, 1, 2]
    lonely = MonitorState()
    lonely.apply(0, hello())
    assert lonely.jobs == {} and lonely.runs["run-a"].job is None


def test_ranks_that_stepped_before_measuring_raise_nothing_once_they_measure() -> None:
    # Each rank's probe said "no step has begun" (an LR range test before the loop);
    # held for the job, then over before every rank reported a step: never raised.
    state, _ = job_state()
    events = []
    for rank in (0, 1):
        events += state.apply(rank, probe_alert("steps_not_measured", "warning", 0, f"r{rank}"))
    for index in range(3):
        for rank in (0, 1):
            events += state.apply(rank, step(index, run=f"r{rank}", seq=index + 2))
    events += state.tick(time.monotonic() + 10)  # past any hold
    assert [e for e in events if isinstance(e, AlertRaised)] == []
    assert all(not entry.active for run in state.runs.values() for entry in run.alerts)


def test_the_same_alert_on_every_rank_is_one_alert_naming_all() -> None:
    state, _ = job_state()
    raised: list[AlertRaised] = []
    for index in range(40):
        for rank in (0, 1):  # rank 0's records arrive first, as they do
            raised += [
                e
                for e in state.apply(rank, exploding(index, f"r{rank}"))
                if isinstance(e, AlertRaised)
            ]
    assert [e.alert.kind for e in raised] == ["exploding_gradient"]
    assert raised[0].alert.ranks == (0, 1) and "ranks=all" in raised[0].alert.line()
    # Found on rank 0 for both: rank 1's panel shows it too (it read "alerts 0" there,
    # in tmux, while the job's root cause was an error), one entry for both ranks.
    zero, one = (state.runs[f"r{rank}"] for rank in (0, 1))
    assert [e.alert.kind for e in one.raised_alerts] == ["exploding_gradient"]
    assert one.raised_alerts[0] is zero.raised_alerts[0]
    assert alerts_label(one, short=True) == "alerts 1/1"


def raised_in_job(frames_of: Callable[[int, str], dict], steps: int) -> list[AlertRaised]:
    """What a 2-rank DDP job raises over ``steps`` steps of ``frames_of(index, run)``,
    rank 0's record of each step first (as they arrive), and past any hold at the end."""
    state, _ = job_state()
    events = []
    for index in range(steps):
        for rank in (0, 1):
            events += state.apply(rank, frames_of(index, f"r{rank}"))
    events += state.tick(time.monotonic() + 10)
    return [e for e in events if isinstance(e, AlertRaised)]


def test_what_follows_an_all_reduced_explosion_on_another_rank_folds_under_it() -> None:
    # The all-reduced gradients explode on every rank; each rank's own loss climbs, then
    # is NaN. Rank 0's explosion holds for both ranks, and rank 1's loss rules (the
    # ones it runs itself) find the same consequences rank 0 folded: they fold too (they
    # were raised as rank 1's, with no explosion beside them: three alerts for one cause).
    def frames(index: int, run: str) -> dict:
        growth = 1.5 ** max(0, index - 20) if index < 50 else math.inf
        own = 0.01 * int(run[1:])
        loss = (0.6 + own) * (growth if index >= 20 else 1 / (1 + index / 8))
        grads = [0.5 * growth, 0.9 * growth, 0.4 * growth]
        return step(index, run=run, loss=loss if index < 50 else math.nan, grad_norms=grads)

    raised = raised_in_job(frames, 60)
    assert [(e.alert.kind, e.alert.ranks) for e in raised] == [("exploding_gradient", (0, 1))]


def test_a_replicated_streak_is_rank_0s_and_what_follows_it_folds_on_every_rank() -> None:
    # optimizer.step() never runs on any rank (the gradients are fine): the weights stand
    # still, so every rank's loss is flat. The streak is judged on rank 0 alone, for both
    # ranks; rank 1's flat loss is its consequence there too.
    def frames(index: int, run: str) -> dict:
        frame = step(index, run=run, loss=1.0 + 0.001 * math.sin(index))
        frame["optimizer_step"] = False
        return frame

    raised = raised_in_job(frames, 260)
    assert [(e.alert.kind, e.alert.ranks) for e in raised] == [("no_updates", (0, 1))]
    assert raised[0].run.rank == 0


def test_a_ranks_loss_apart_while_the_rate_is_far_too_high_folds_under_the_rate() -> None:
    # Rank 0 finds the update ratios far too high from the first sampled step, for every
    # rank. Later one rank's loss jumps far above the other's: a rate that high throws
    # each shard's loss about (a 2-rank LSTM under torchrun at Adam 0.5 raised the rate,
    # then a rank_outlier of its local gradients: the data rung's alert first, for a
    # rate). The outlier, and the spike on that rank that follows from it, fold under it.
    def frames(index: int, run: str) -> dict:
        rank = int(run[1:])
        loss = 400.0 if (rank, index) == (1, 40) else 2.0 + 0.3 * math.sin(index + rank)
        frame = step(index, run=run, loss=loss)
        if index % 10 == 0:
            frame["update_ratios"] = [0.9, 0.8, 0.95]
        return frame

    raised = raised_in_job(frames, 60)
    assert [(e.alert.kind, e.alert.evidence.get("side")) for e in raised] == [
        ("update_ratio", "high")
    ]
    # Each rank's status line counts what it lists: the folded outlier is in neither
    # count (it read "alerts 2/1" in a real run: two active of one raised).
    assert alerts_label(raised[0].run, short=True) == "alerts 1/1"


@pytest.mark.parametrize(
    ("subject", "cause_step", "cause_severity", "folded"),
    [
        ("loss", 0, Severity.ERROR, True),
        ("local_gradients", 0, Severity.ERROR, True),
        ("inputs", 0, Severity.ERROR, False),  # data, measured before the model
        ("loss", 40, Severity.ERROR, False),  # the cause is not first: a shard's may be
        ("loss", 0, Severity.WARNING, False),  # milder: folding never lowers --fail-on
    ],
)
def test_which_rank_outliers_a_rate_far_too_high_explains(
    subject: str, cause_step: int, cause_severity: Severity, folded: bool
) -> None:
    outlier = Alert(AlertKind.RANK_OUTLIER, Severity.ERROR, 40, subject, {"rank": 1}, "", ())
    rate = Alert(AlertKind.UPDATE_RATIO, cause_severity, cause_step, "", {"side": "high"}, "", ())
    found = replica_cause(outlier, {AlertKind.UPDATE_RATIO: rate})
    assert (found is rate) if folded else (found is None)


def test_a_ranks_alert_waits_for_the_other_ranks_step() -> None:
    state, _ = job_state()
    for index in range(31):
        assert not [
            e for e in state.apply(0, exploding(index, "r0")) if isinstance(e, AlertRaised)
        ]  # rank 1 has not reported step 30 yet
    for index in range(31):
        events = state.apply(1, exploding(index, "r1"))
    assert [e.alert.kind for e in events if isinstance(e, AlertRaised)] == ["exploding_gradient"]


def test_consequences_of_a_bad_rank_fold_under_it() -> None:
    state, _ = job_state()
    raised = []
    for index in range(40):
        for rank in (0, 1):
            frame = exploding(index, f"r{rank}")
            if rank == 1 and index == 30:
                frame["scalars"] = {"loss": 5000.0}  # the bad shard, first seen here
            raised += [e.alert for e in state.apply(rank, frame) if isinstance(e, AlertRaised)]
    assert [a.kind for a in raised] == ["rank_outlier"]
    [job] = state.jobs.values()
    assert any(name.startswith("exploding_gradient@") for name in job.incidents[0].folded)
    for run in state.runs.values():  # each rank's panel: the incident, not what folded
        shown = [e.alert.kind for e in run.alerts if not e.folded_under]
        assert shown == ["rank_outlier"]


def test_a_rank_gone_without_a_goodbye_stalls_the_job() -> None:
    state, _ = job_state()
    for index in range(10):
        for rank in (0, 1):
            state.apply(rank, step(index, run=f"r{rank}"))
    events = state.connection_closed(1, "connection lost")
    stalled = [e.alert for e in events if isinstance(e, AlertRaised)]
    assert [a.kind for a in stalled] == ["rank_stalled"] and stalled[0].evidence["rank"] == 1
    clean, _ = job_state()
    clean.apply(1, {"v": 1, "kind": "bye", "run": "r1", "reason": "closed"})
    assert not [e for e in clean.connection_closed(1, "closed") if isinstance(e, AlertRaised)]


def ended_with(state: MonitorState, rank: int, reason: str) -> list[AlertRaised]:
    """Rank ``rank`` says bye with ``reason`` and its connection closes: what is raised."""
    events = state.apply(rank, {"v": 1, "kind": "bye", "run": f"r{rank}", "reason": reason})
    events += state.connection_closed(rank, "connection closed by the run")
    return [e for e in events if isinstance(e, AlertRaised)]


def test_a_job_whose_every_rank_raised_one_error_has_no_stall() -> None:
    # A shape bug on every rank (Lightning DDP on 2 processes): each rank ended with the
    # same error. No one rank stalled the job (a rank_stalled naming rank 0 was raised).
    state, _ = job_state()
    for index in range(10):
        for rank in (0, 1):
            state.apply(rank, step(index, run=f"r{rank}"))
    error = "error: RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x9 and 8x16)"
    assert ended_with(state, 0, error) == []
    assert ended_with(state, 1, error) == []
    assert [e for e in state.tick(time.monotonic() + 10) if isinstance(e, AlertRaised)] == []


@pytest.mark.parametrize("then", ["time passes", "the other rank is killed", "the replay ends"])
def test_a_rank_gone_with_an_error_of_its_own_stalls_the_job(then: str) -> None:
    state, _ = job_state()
    for index in range(10):
        for rank in (0, 1):
            state.apply(rank, step(index, run=f"r{rank}"))
    assert ended_with(state, 1, "error: ValueError: a corrupt record in shard 1") == []
    if then == "time passes":
        events = state.tick(time.monotonic() + HOLD_S + 0.5)
    elif then == "the other rank is killed":
        events = state.connection_closed(0, "connection lost")
    else:
        events = state.mark_offline("the end of the run log")
    [raised] = [e for e in events if isinstance(e, AlertRaised)]
    assert (raised.alert.kind, raised.alert.evidence["rank"], raised.run.rank) == (
        "rank_stalled",
        1,
        1,
    )
    assert "ValueError" in raised.alert.evidence["reason"]


def test_a_quiet_rank_behind_the_others_stalls_the_job() -> None:
    state, _ = job_state()
    for index in range(10):
        for rank in (0, 1):
            if rank == 1 and index > 4:
                continue  # rank 1 stops sending at step 4
            state.apply(rank, step(index, run=f"r{rank}"))
    now = state.runs["r0"].last_frame_at
    state.runs["r1"].last_frame_at = now - 30.0
    events = state.tick(now + 1.0)
    assert [e.alert.kind for e in events if isinstance(e, AlertRaised)] == ["rank_stalled"]
    assert state.tick(now + 2.0) == []  # once per job


class Wire:
    """A connection whose frames land in a list."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, frame: dict) -> None:
        self.sent.append(frame)


def test_a_command_goes_to_every_rank_for_one_step_ahead_of_all() -> None:
    monitor = Monitor()
    wires = {}
    for rank in (0, 1):
        conn = Connection(rank, f"rank{rank}", None)
        wires[rank] = Wire()
        conn.send = wires[rank].send  # type: ignore[method-assign]
        monitor.frame_received(conn, rank_hello(rank))
    for index in range(20):
        for rank in (0, 1):
            if not (rank == 1 and index == 19):
                monitor.state.apply(rank, step(index, run=f"r{rank}", rate=100.0))
    assert monitor.send_command("r1", "pause") is None
    at = [wires[rank].sent[0]["args"]["at_step"] for rank in (0, 1)]
    assert at[0] == at[1] == boundary_ahead(list(monitor.state.runs.values()))
    assert at[0] > 19 + 100 * 0.9  # ahead of every rank by what they run in a second
    for run in monitor.state.runs.values():
        run.control["paused"] = True
    monitor.send_command("r0", "resume")  # a paused job: at once, no step
    assert all("at_step" not in wires[rank].sent[1]["args"] for rank in (0, 1))


def job_frames(steps: int = 30) -> list[dict]:
    frames = [rank_hello(0), rank_hello(1)]
    for index in range(steps):
        for rank in (0, 1):
            frame = step(index, run=f"r{rank}", loss=1.0 / (1 + index) + 0.1 * rank)
            frame["seq"] = index + 2
            frames.append(frame)
    return frames


def test_headless_lines_name_job_and_rank() -> None:
    import io

    from tui.headless import HeadlessMonitor

    out = io.StringIO()
    monitor = HeadlessMonitor(out=out, summary_every=10)
    conns = [Connection(rank, f"rank{rank}", None) for rank in (0, 1)]
    for frame in job_frames(12):
        monitor.frame_received(conns[int(frame["run"][1])], frame)
    for index in range(12, 40):  # both ranks' gradients explode at step 30 (all-reduced)
        for rank in (0, 1):
            monitor.frame_received(conns[rank], {**exploding(index, f"r{rank}"), "seq": index + 2})
    lines = out.getvalue().splitlines()
    assert "connected run=ddp-run job=job-7 rank=0/2 host=node0 id=r0" in lines[0]
    assert "connected run=ddp-run job=job-7 rank=1/2 host=node1 id=r1" in lines[1]
    assert any(line.startswith("run=ddp-run rank=1 step=10 ") for line in lines)
    [alert] = [line for line in lines if line.startswith("ALERT")]
    assert "exploding_gradient" in alert and "ranks=all" in alert


async def test_the_app_shows_the_job_its_ranks_and_k_picks_one() -> None:
    from tests.waiting import settle
    from tui.app import make_app
    from tui.sources import FrameListSource
    from tui.widgets import LayerTable, RanksPanel, RunList
    from tui.widgets.run_list import list_items

    app = make_app(FrameListSource(job_frames()))
    app.notify = lambda *args, **kwargs: None  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(RanksPanel)
        await settle(pilot, lambda: panel.display and panel.row_count == 2)
        assert app.current_run is not None and app.current_run.rank == 0  # rank 0 first
        assert "job job-7: 2 of 2 ranks" in str(panel.border_title)
        assert "spread 0.1" in str(panel.border_title)
        cells = [panel.get_row_at(i) for i in range(2)]
        assert [str(row[0]).strip() for row in cells] == ["▶r0", "r1"]
        assert [str(row[1]) for row in cells] == ["node0", "node1"]  # (plain text cells)
        items = list_items(app.state)
        assert [(item_id, header) for item_id, _, header in items] == [
            ("job:job-7", True),
            ("r0", False),
            ("r1", False),
        ]
        # one job alone: its ranks panel lists the ranks; no run list beside it
        assert not app.query_one(RunList).has_class("-several")
        await pilot.press("k")
        await settle(pilot, lambda: app.current_run.rank == 1)
        await settle(pilot, lambda: str(panel.get_row_at(1)[0]).strip() == "▶r1")
        assert app.query_one(LayerTable).display


def test_a_converged_jobs_spread_losses_are_not_scanned_for_an_outlier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ranks at 0.001 to 0.009 after a start at 2.0: the highest is 9x the lowest, but
    8 thousandths above it is no visible part of the start, so no record looks for the
    outlier (each such look reads every rank's loss at the step)."""
    checks = JobChecks(LAYERS, "ddp")
    assert checks.observe(0, view(0, loss=2.0)) == []

    def scan(*args: object) -> None:
        raise AssertionError("scanned every rank for an outlier that cannot be one")

    monkeypatch.setattr(checks, "_outlier", scan)
    for index in range(1, 20):
        for rank in range(8):
            assert checks.observe(rank, view(index, loss=0.001 * (1 + rank))) == []


def test_a_non_finite_loss_that_came_first_is_still_the_outlier() -> None:
    checks = JobChecks(LAYERS, "ddp")
    assert checks.observe(1, view(5, loss=math.inf)) == []  # alone: nothing to compare
    [alert] = checks.observe(0, view(5, loss=1.0))
    assert alert.kind == "rank_outlier" and alert.evidence["rank"] == 1


def test_the_ranks_of_an_ended_job_are_kept_together() -> None:
    from tui.state import MAX_ENDED_RUNS

    state, _ = job_state(MAX_ENDED_RUNS + 14)  # a job of more ranks than runs kept
    for rank in range(MAX_ENDED_RUNS + 14):
        state.connection_closed(rank, "connection closed by the run")
    assert len(state.runs) == MAX_ENDED_RUNS + 14 and len(state.jobs) == 1
    for index in range(MAX_ENDED_RUNS):  # later runs push the job out as one entry
        state.apply(1000 + index, hello(run=f"solo-{index}"))
        state.connection_closed(1000 + index, "connection closed by the run")
    assert len(state.runs) == MAX_ENDED_RUNS and state.jobs == {}


def test_a_job_ending_forgets_older_runs_at_its_last_rank_only() -> None:
    from tui.state import MAX_ENDED_RUNS

    state = MonitorState()
    for index in range(MAX_ENDED_RUNS):  # as many ended runs as are kept
        state.apply(1000 + index, hello(run=f"solo-{index}"))
        state.connection_closed(1000 + index, "connection closed by the run")
    for rank in range(3):
        state.apply(rank, rank_hello(rank, 3))
    for rank in (2, 0):  # a rank of the job is still there: nothing is forgotten
        state.connection_closed(rank, "connection closed by the run")
        assert "solo-0" in state.runs and len(state.runs) == MAX_ENDED_RUNS + 3
    state.connection_closed(1, "connection closed by the run")  # the job has ended
    assert "solo-0" not in state.runs and "solo-1" in state.runs
    assert len(state.runs) == MAX_ENDED_RUNS - 1 + 3 and len(state.jobs) == 1


def test_a_job_that_outlived_shorter_runs_is_kept_when_it_ends() -> None:
    """The runs kept are those that went last, not those that came last: a long job,
    begun before as many short runs as are kept came and went, is kept at its end."""
    from tui.state import MAX_ENDED_RUNS

    state = MonitorState()
    for rank in range(2):
        state.apply(rank, rank_hello(rank, 2))
    for index in range(MAX_ENDED_RUNS):
        state.apply(1000 + index, hello(run=f"solo-{index}"))
        state.connection_closed(1000 + index, "connection closed by the run")
    state.connection_closed(1, "connection closed by the run")
    events = state.connection_closed(0, "connection closed by the run")
    [job] = state.jobs.values()
    assert all(run_id in state.runs for run_id in job.ranks.values())
    assert "solo-0" not in state.runs and "solo-1" in state.runs
    assert [type(e) for e in events] == [RunDisconnected]
