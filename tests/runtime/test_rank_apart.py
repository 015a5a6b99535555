"""A rank standing apart is named (issue 18 item 9): one rank's inputs, their scale on
sampled steps, far from the others' while the all-reduced gradients explode on every
rank; the rank is named in one incident, and the ranks' explosions fold under it for
as long as it lasts. Unit tests feed per-rank views; one tiny probe run checks that the
scale is measured."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from probes.kernel.diagnosis import Alert, Severity
from probes.kernel.diagnosis.job import JobDiagnoser
from probes.kernel.diagnosis.ranks import JobChecks
from probes.kernel.diagnosis.views import StepView
from tests.collector import FrameCollector, wait_for_bye, watch_unthinned

LAYERS = ("encoder", "hidden", "head")


def view(step: int, *, inputs: float | None = None, grads: float = 0.5) -> StepView:
    record: dict[str, Any] = {
        "kind": "step",
        "step": step,
        "scalars": {"loss": 1.0},
        "grad_norms": [grads, grads, grads],
        "grad_norm_total": grads * math.sqrt(3),
    }
    if inputs is not None:
        record["input_rms"] = inputs
    return StepView.from_record(record)


def run_job(checks: JobChecks, scales: dict[int, list[float]], every: int = 20) -> list[Alert]:
    """Each rank's inputs' scale at the sampled steps 0, every, 2 x every, ..."""
    found = []
    for index in range(len(next(iter(scales.values())))):
        for rank, values in scales.items():
            found += checks.observe(rank, view(index * every, inputs=values[index]))
    return found


def test_a_rank_reading_a_corrupt_shard_mid_run_is_named() -> None:
    checks = JobChecks(LAYERS, "ddp")
    found = run_job(checks, {0: [1.0, 1.1, 0.9, 1.0, 1.0], 1: [1.05, 0.95, 1.0, 30.0, 31.0]})
    [alert] = found  # one incident, not one per sampled step
    assert (alert.kind, alert.subject, alert.step, alert.severity) == (
        "rank_outlier",
        "inputs",
        60,
        Severity.ERROR,
    )
    assert alert.evidence["rank"] == 1
    assert alert.evidence["times"] == pytest.approx(30.0)
    assert "rank=1" in alert.line()


def test_with_three_ranks_the_one_far_from_the_others_median_is_named() -> None:
    checks = JobChecks(LAYERS, "ddp")
    [alert] = run_job(checks, {0: [1.0, 1.0], 1: [1.2, 0.01], 2: [0.9, 1.1]})
    assert alert.evidence["rank"] == 1 and alert.evidence["times"] < 1 / 4


def test_ranks_whose_inputs_agree_within_noise_raise_nothing() -> None:
    """The near miss: shards of one dataset differ in scale a little, never 4x."""
    checks = JobChecks(LAYERS, "ddp")
    assert run_job(checks, {0: [1.0, 1.3, 0.8, 1.0], 1: [0.7, 1.9, 1.2, 2.5]}) == []


def test_two_ranks_apart_from_the_start_name_neither() -> None:
    """With two ranks apart from their first step there is no telling which is odd."""
    checks = JobChecks(LAYERS, "ddp")
    assert run_job(checks, {0: [1.0, 1.0, 1.0], 1: [10.0, 10.0, 10.0]}) == []


def test_jobs_not_known_to_be_data_parallel_compare_no_inputs() -> None:
    """A pipeline's stages (sync unknown) feed each other inputs of their own scales."""
    checks = JobChecks(LAYERS, "unknown")
    assert run_job(checks, {0: [1.0, 1.0], 1: [1.0, 30.0], 2: [1.0, 1.0]}) == []
    fsdp = JobChecks(LAYERS, "fsdp")
    [alert] = run_job(fsdp, {0: [1.0, 1.0], 1: [1.0, 30.0], 2: [1.0, 1.0]})
    assert alert.evidence["rank"] == 1


def test_records_without_the_scale_compare_as_before() -> None:
    checks = JobChecks(LAYERS, "ddp")
    assert checks.observe(0, view(0)) == [] and checks.observe(1, view(0)) == []


def exploding(step: int) -> Alert:
    return Alert("exploding_gradient", Severity.ERROR, step, "hidden", {}, "", ())


def test_the_ranks_explosions_fold_under_the_named_rank_while_it_lasts() -> None:
    job = JobDiagnoser(2)
    job.start(LAYERS, "ddp")
    for step in (0, 20, 40):
        for rank in (0, 1):
            assert job.observe_step(rank, view(step, inputs=1.0)) == []
    assert job.observe_step(0, view(60, inputs=1.0, grads=500.0)) == []
    [incident] = job.observe_step(1, view(60, inputs=40.0, grads=500.0))
    assert incident.evidence["rank"] == 1
    # the all-reduced explosion on both ranks, then raised again much later: folded each time
    for step in (61, 130, 200):
        job.hold(0, [exploding(step)], now=0.0)
        job.hold(1, [exploding(step)], now=0.0)
        released = job.release(step, now=0.0, ranks=(0, 1))
        assert released.raised == []
        assert {kind for _, _, kind in released.folded} == {"rank_outlier"}
    assert len(job.incidents) == 1
    assert "exploding_gradient@61" in job.incidents[0].folded


def test_a_probe_records_its_inputs_scale_on_sampled_steps(collector: FrameCollector) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector, sample_every=2)
    inputs = [torch.randn(8, 3) * (1 + i) for i in range(4)]
    for x in inputs:
        with probe.step():
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            probe.log(loss=loss)
    probe.close()
    wait_for_bye(collector)
    steps = [f for f in collector.frames if f["kind"] == "step"]
    assert [s.get("input_rms") is not None for s in steps] == [True, False, True, False]
    for record in (steps[0], steps[2]):
        expected = inputs[record["step"]].pow(2).mean().sqrt().item()
        assert record["input_rms"] == pytest.approx(expected, rel=1e-5)
        assert "input/rms" not in record["scalars"]
