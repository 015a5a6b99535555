"""Cross-rank checks and one job in the monitor, from synthetic records (no torch)."""

from __future__ import annotations

import math

from probes.diagnosis import Thresholds
from probes.diagnosis.ranks import JobChecks
from probes.diagnosis.views import StepView

LAYERS = ("encoder", "hidden", "head")


def view(step: int, loss: float = 1.0, grads: tuple[float, ...] = (0.5, 0.4, 0.3),
         params: tuple[float, ...] | None = None, first: int | None = None) -> StepView:
    record: dict = {"kind": "step", "step": step, "scalars": {"loss": loss},
                    "grad_norms": list(grads), "grad_norm_total": math.hypot(*grads)}
    if params is not None:
        record["param_norms"] = list(params)
    if first is not None:
        record["span"] = [first, step]
    return StepView.from_record(record)


def test_ddp_ranks_that_agree_raise_nothing() -> None:
    checks = JobChecks(LAYERS, "ddp")
    for step in range(60):
        params = (3.0, 2.0, 1.0) if step % 20 == 0 else None
        for rank in (0, 1, 2):
            assert checks.observe(rank, view(step, loss=1.0 + 0.1 * rank,
                                             params=params)) == []


def test_unsynced_gradients_name_the_first_layer_and_the_ranks() -> None:
    checks = JobChecks(LAYERS, "ddp")
    assert checks.observe(0, view(7, grads=(0.5, 0.4, 0.3))) == []
    [alert] = checks.observe(1, view(7, grads=(0.5, 0.41, 0.33)))
    assert alert.kind == "grads_not_synced" and alert.subject == "hidden"
    assert alert.layers == ("hidden", "head") and alert.evidence["ranks"] == [0, 1]
    assert alert.step == 7 and alert.severity == "error"
    assert checks.observe(0, view(8, grads=(0.9, 0.4, 0.3))) == []  # once per job
    assert checks.observe(1, view(8, grads=(0.5, 0.4, 0.3))) == []


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
    for step in range(10):
        for rank in range(4):
            checks.observe(rank, view(step, loss=2.0 - 0.1 * step + 0.05 * rank))
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
