"""Real multi-rank jobs (DistributedDataParallel on gloo, CPU) watched by the real
monitor: one job of its ranks, commands at one step on every rank, cross-rank alerts.

Each job is a subprocess (``demo.ddp.run_job``) whose ranks connect to a monitor running
in this process. The gallery runs ``ddp-desync`` (drifting replicas) and its fix (a
healthy job raises nothing) through the command line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.collector import LiveMonitor, verdicts

JOB_TIMEOUT_S = 90


@pytest.fixture
def monitor(socket_path: str) -> Iterator[LiveMonitor]:
    live = LiveMonitor(socket_path)
    yield live
    live.close()


def start_job(monitor: LiveMonitor, **options: object) -> subprocess.Popen[str]:
    fields = ", ".join(f"{name}={value!r}" for name, value in options.items())
    code = f"from demo.ddp import JobOptions, run_job; run_job(JobOptions({fields}))"
    env = {**os.environ, "TRAINTOP_ADDRESS": str(monitor.address), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(job: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        output, _ = job.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job.returncode, output


def ranks_of(monitor: LiveMonitor) -> list:
    """The job's ranks' runs (one job only), by rank."""

    def members() -> list:
        [job] = monitor.monitor.state.jobs.values()
        return list(job.rank_runs(monitor.monitor.state.runs))

    return monitor.call(members)


@pytest.mark.slow  # (a two-rank job, paused and resumed: 12 s)
def test_pause_stops_every_rank_at_one_step_and_resume_goes_on(monitor: LiveMonitor) -> None:
    job = start_job(monitor, name="ddp-pause", steps=200, delay=0.01, timeout_s=30.0)
    state = monitor.monitor.state
    assert monitor.wait_for(
        lambda: (
            len(state.jobs) == 1
            and all(r.connected and r.last_step > 30 for r in state.runs.values())
            and len(state.runs) == 2
        )
    )
    [rank0, rank1] = ranks_of(monitor)
    assert (rank0.rank, rank1.rank) == (0, 1) and rank0.job == rank1.job
    assert monitor.call(lambda: monitor.monitor.send_command(rank1.run_id, "pause")) is None
    assert monitor.wait_for(lambda: rank0.control.get("paused") and rank1.control.get("paused"))
    acks = [e.ack for e in list(monitor.events) if type(e).__name__ == "AckReceived"]
    assert len(acks) == 2 and acks[0]["step"] == acks[1]["step"] == acks[0]["at_step"]
    assert not any(a["late"] for a in acks)
    paused_at = acks[0]["step"]
    assert monitor.wait_for(lambda: rank0.last_step == rank1.last_step == paused_at - 1)
    assert monitor.call(lambda: monitor.monitor.send_command(rank0.run_id, "resume")) is None
    status, output = finish(job)  # a collective left waiting would time out in 30 s
    assert status == 0, output
    assert monitor.wait_for(lambda: rank0.last_step == rank1.last_step == 199)
    assert verdicts(monitor.raised()) == []  # a healthy job


def test_a_bad_shard_is_pinned_to_its_rank_and_a_dead_rank_stalls_the_job(
    monitor: LiveMonitor,
) -> None:
    job = start_job(
        monitor,
        name="ddp-bad",
        steps=400,
        delay=0.002,
        bad_shard=(1, 80),
        die=(1, 150),
        timeout_s=5.0,
    )
    status, output = finish(job)
    assert status != 0, output  # rank 1 died, and rank 0 gave up waiting for it
    assert monitor.wait_for(
        lambda: not any(r.connected for r in monitor.monitor.state.runs.values())
    )
    raised = verdicts(monitor.raised())
    kinds = [alert.kind for alert in raised]
    assert kinds == ["rank_outlier", "rank_stalled"], [a.line() for a in raised]
    outlier, stalled = raised
    assert outlier.evidence["rank"] == 1 and outlier.step == 80
    assert outlier.evidence["others"] == "fine" and "rank=1" in outlier.line()
    [job] = monitor.monitor.state.jobs.values()
    assert any(name.startswith("exploding_gradient@") for name in job.incidents[0].folded), (
        "the explosion the bad shard caused folds under it"
    )
    assert job.entries[0].alert.folded == job.incidents[0].folded  # as the panel shows it
    assert stalled.evidence["rank"] == 1 and stalled.subject == "rank 1"
