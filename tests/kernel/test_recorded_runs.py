"""Recorded real runs replayed through the monitor, without torch: the diagnosis at full
resolution, what a run's frames become in the monitor's state, ``traintop replay
--headless``, and the shapes of the Hugging Face Trainer, Lightning and a 2-rank DDP job.

The logs in ``tests/data`` are what ``traintop --record`` wrote while the real runs
trained (``scripts/record_test_logs.py`` records them again). The demo scenarios run end
to end, as a user runs them, once: in the gallery (``test_gallery.py``).
"""

from __future__ import annotations

import copy
from itertools import pairwise

import pytest

from probes.kernel.wire import Frame, encode_frame
from tests.recorded import log_frames, log_path, replay
from tui.cli import main

# --- the demo's runs: the diagnosis at full resolution ----------------------------------


def test_healthy_raises_no_alert_at_full_resolution() -> None:
    replayed = replay("healthy")
    run = replayed.run()
    assert run.step_records == 1500  # every step diagnosed, none thinned away
    assert [entry.alert.line() for entry in run.alerts] == []


def test_exploding_names_a_layer_before_any_non_finite() -> None:
    """The root cause first, in time: the non-finite values after the explosion fold
    under it (listed as its consequence, at their later step), not raised on their own."""
    run = replay("exploding").run()
    kinds = [entry.alert.kind for entry in run.alerts]
    assert "exploding_gradient" in kinds and "non_finite" not in kinds
    exploding = run.alerts[kinds.index("exploding_gradient")].alert
    folded = [f for f in exploding.folded if f.startswith("non_finite@")]
    assert len(folded) == 1
    assert exploding.step < int(folded[0].split("@")[1])
    assert exploding.subject in run.layers  # a layer, not just "the total"
    assert exploding.severity == "error"
    assert exploding.evidence["grad_norm"] > 0


def test_fixed_exploding_raises_no_alert() -> None:
    run = replay("exploding-fixed").run()
    assert run.step_records == 200
    assert [entry.alert.line() for entry in run.alerts] == []


def test_a_healthy_runs_records_arrive_as_it_trained() -> None:
    """The demo trainer's frames, as the monitor that recorded them received them."""
    run = replay("healthy").run()
    assert run.name == "healthy"
    assert run.layers == ["0", "2", "4"]
    loss = run.scalars["loss"]
    assert loss.xs[0] == 0 and run.last_step == 1499
    assert all(x < y for x, y in pairwise(loss.xs))
    assert run.eval_scalars["val_loss"].latest < run.eval_scalars["val_loss"].last[0]
    assert all(g is not None and g > 0 for g in run.grad_norms)
    assert run.disconnect_reason == "finished"


# --- traintop replay --headless ---------------------------------------------------------


def headless_replay(
    capsys: pytest.CaptureFixture[str], *paths: str, extra: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    """``traintop replay PATHS --headless``: its exit status and printed lines."""
    status = main(["replay", *paths, "--headless", "--summary-every", "100000", *extra])
    return status, capsys.readouterr().out.splitlines()


def alert_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("ALERT ")]


def test_headless_replay_of_a_healthy_run_prints_no_alert(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, lines = headless_replay(capsys, log_path("healthy"))
    assert status == 0
    assert alert_lines(lines) == []
    assert lines[0].startswith("connected run=healthy ")
    assert any(line.startswith("run=healthy step=1499 ") and "alerts=0" in line for line in lines)
    assert lines[-1] == "disconnected run=healthy reason=finished"


@pytest.mark.parametrize("fail_on", [None, "error"])
def test_headless_replay_of_an_exploding_run_prints_alert_lines(
    capsys: pytest.CaptureFixture[str], fail_on: str | None
) -> None:
    extra = ("--fail-on", fail_on) if fail_on else ()
    status, lines = headless_replay(capsys, log_path("exploding"), extra=extra)
    alerts = alert_lines(lines)
    assert alerts[0].startswith("ALERT error exploding_gradient step=")
    assert " subject=" in alerts[0] and " grad_norm=" in alerts[0]
    if fail_on:
        assert status == 3
        assert "failing: error alert exploding_gradient (--fail-on error)" in lines
    else:
        assert status == 0
        causes = next(line for line in lines if line.startswith("causes run="))
        assert "exploding_gradient@" in causes and "non_finite@" in causes.split("folded=")[1]


# --- the frameworks' shapes -------------------------------------------------------------


def kinds(frames: list[Frame], kind: str) -> list[Frame]:
    return [f for f in frames if f["kind"] == kind]


@pytest.mark.parametrize(
    ("log", "name", "validation"),
    [("hf", "gpt2-tiny", "eval_loss"), ("lightning", "TinyLM", "val_loss")],
)
def test_a_framework_run_replays_with_its_updates_and_evaluations(
    capsys: pytest.CaptureFixture[str], log: str, name: str, validation: str
) -> None:
    """12 updates of 2 accumulated micro-batches each, clipped at 1.0, an evaluation
    every 4 updates: one probe step per update, the framework's own validation loss."""
    frames = log_frames(log)
    hello = frames[0]
    assert hello["kind"] == "hello" and hello["name"] == name
    assert [s["step"] for s in kinds(frames, "step")] == list(range(12))
    assert all(s["clip"]["max_norm"] == 1.0 for s in kinds(frames, "step"))
    replayed = replay(log)
    run = replayed.run()
    assert run.name == name and run.layers == hello["layers"]
    assert run.last_step == 11 and run.step_records == 12
    assert run.validation is not None
    label, series = run.validation
    assert label == validation and series.xs == [3, 7, 11]
    assert replayed.raised() == []
    assert run.disconnect_reason == "finished"

    status, lines = headless_replay(capsys, log_path(log))
    assert status == 0 and alert_lines(lines) == []
    assert lines[0].startswith(f"connected run={name} ")
    assert any(line.startswith(f"run={name} step=11 ") and "@11 " in line for line in lines)


def test_a_ddp_jobs_ranks_replay_as_one_job_and_raise_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    replayed = replay("ddp")
    [job] = replayed.state.jobs.values()
    ranks = list(job.rank_runs(replayed.state.runs))
    assert [run.rank for run in ranks] == [0, 1]
    assert all(run.job == job.job_id and run.world_size == 2 for run in ranks)
    assert all(run.last_step == 59 and run.disconnect_reason == "finished" for run in ranks)
    assert replayed.raised() == [] and job.incidents == []

    status, lines = headless_replay(capsys, log_path("ddp"))
    assert status == 0 and alert_lines(lines) == []
    connected = sorted(line.split(" host=")[0] for line in lines if line.startswith("connected"))
    assert connected == [
        f"connected run=ddp job={job.job_id} rank=0/2",
        f"connected run=ddp job={job.job_id} rank=1/2",
    ]


def test_one_ranks_gradient_nudged_in_the_ddp_log_is_caught(tmp_path) -> None:
    """The cross-rank checks did compare the healthy job's ranks: the same log with one
    layer's gradient norm on rank 1 off by 1% at one step raises ``grads_not_synced``."""
    frames = copy.deepcopy(log_frames("ddp"))
    rank_of = {f["run"]: f["rank"] for f in kinds(frames, "hello")}
    steps = {
        r: {f["step"] for f in kinds(frames, "step") if rank_of[f["run"]] == r} for r in (0, 1)
    }
    common = sorted(steps[0] & steps[1])
    at = common[len(common) // 2]
    [nudged] = [f for f in kinds(frames, "step") if rank_of[f["run"]] == 1 and f["step"] == at]
    nudged["grad_norms"][1] *= 1.01
    path = tmp_path / "ddp-nudged.ndjson"
    path.write_bytes(b"".join(encode_frame(f) for f in frames))
    replayed = replay(str(path))
    kinds_raised = [alert.kind for alert in replayed.raised()]
    assert "grads_not_synced" in kinds_raised, kinds_raised
    [alert] = [a for a in replayed.raised() if a.kind == "grads_not_synced"]
    assert alert.step == at
