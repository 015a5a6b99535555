"""Rung 8's rules on synthetic records: where the step's time and memory go
(``input_bound``, ``memory_creep``, ``retained_graph``, ``recompiles``), each with a
positive and a near miss that stays silent."""

from __future__ import annotations

import random
from typing import Any

from probes.kernel.diagnosis import Severity
from probes.kernel.units import human_bytes
from tests.kernel.test_diagnosis import Record, raised, run, step

GRADS = [1.0, 0.8, 0.5]


def timed(n: int, data_ms: float, compute_ms: float = 20.0, **fields: Any) -> Record:
    """A step whose loop waited ``data_ms`` for its batch and computed ``compute_ms``."""
    data, compute = data_ms / 1000, compute_ms / 1000
    return step(
        n,
        loss=1.0 / (1 + n / 100),
        grads=GRADS,
        cycle=data + compute,
        data_time=data,
        forward_time=compute / 3,
        backward_time=compute / 2,
        optimizer_time=compute / 6,
        samples=64,
        **fields,
    )


# --- input_bound ---------------------------------------------------------------------------


def test_a_loop_that_waits_longer_than_it_computes_is_input_bound_as_an_error() -> None:
    _, changes = run(timed(n, data_ms=30.0) for n in range(200))
    alert = raised(changes, "input_bound")[0]
    assert alert.severity is Severity.ERROR
    assert alert.evidence["data_share"] == 0.6
    assert alert.evidence["data_ms_per_step"] == 30.0
    assert alert.evidence["samples_per_s"] == round(64 / 0.05, 1)
    assert alert.step == 109  # as soon as the window (100 steps past the warm-up) is full


def test_a_quarter_to_half_of_the_step_waiting_is_a_warning() -> None:
    _, changes = run(timed(n, data_ms=10.0) for n in range(200))
    alert = raised(changes, "input_bound")[0]
    assert alert.severity is Severity.WARNING
    assert alert.evidence["data_share"] == round(10 / 30, 3)


def test_one_step_in_four_stalled_on_its_loader_counts() -> None:
    # a PNG loader that stalls one batch in four: most steps do not wait at all
    _, changes = run(timed(n, data_ms=80.0 if n % 4 == 0 else 0.5) for n in range(300))
    assert raised(changes, "input_bound")


def test_near_miss_a_small_wait_on_every_step_is_silent() -> None:
    # the loop's own work between updates (zero_grad, moving the batch): a tenth
    _, changes = run(timed(n, data_ms=2.0 + random.Random(n).random()) for n in range(1000))
    assert not raised(changes, "input_bound")


def test_near_miss_a_tiny_models_loop_overhead_is_not_an_input_path_to_speed_up() -> None:
    # 0.4 ms between updates (zero_grad, a random batch) on a 0.6 ms step: 40% of it,
    # but less than what a worker's hand-over of a batch would cost
    _, changes = run(timed(n, data_ms=0.4, compute_ms=0.6) for n in range(1000))
    assert not raised(changes, "input_bound")


def test_near_miss_a_checkpoint_now_and_then_is_an_event_not_the_input_path() -> None:
    # a 2 s checkpoint save every 150 steps, on 20 ms steps: most windows hold one
    _, changes = run(timed(n, data_ms=2000.0 if n % 150 == 149 else 1.0) for n in range(1000))
    assert not raised(changes, "input_bound")


def test_near_miss_records_without_phases_say_nothing() -> None:
    _, changes = run(step(n, loss=1.0 / (1 + n / 100), grads=GRADS) for n in range(300))
    assert not raised(changes, "input_bound")


def test_input_bound_clears_once_the_loader_keeps_up() -> None:
    records = [timed(n, data_ms=30.0 if n < 300 else 0.5) for n in range(800)]
    _, changes = run(records)
    assert raised(changes, "input_bound")
    assert any(not c.raised and c.alert.kind == "input_bound" for c in changes)


# --- memory_creep --------------------------------------------------------------------------

BASE = 400 * 2**20  # what a process with torch and a small model holds


def test_memory_that_keeps_growing_is_a_creep() -> None:
    records = [timed(n, 1.0, memory=BASE + 400_000 * n) for n in range(600)]
    _, changes = run(records)
    alert = raised(changes, "memory_creep")[0]
    assert alert.step < 500
    assert alert.evidence["per_step"] == human_bytes(400_000)
    assert alert.evidence["source"] == "rss"


def test_near_miss_memory_that_steps_up_then_levels_off_is_no_creep() -> None:
    # the optimizer's state, then a cache filled once: a step up at 80 and 300, then flat
    def memory(n: int) -> float:
        return BASE + (30 * 2**20 if n >= 80 else 0) + (60 * 2**20 if n >= 300 else 0)

    _, changes = run(timed(n, 1.0, memory=memory(n)) for n in range(1500))
    assert not raised(changes, "memory_creep")


def test_near_miss_memory_that_hovers_is_no_creep() -> None:
    rng = random.Random(3)
    records = [timed(n, 1.0, memory=BASE + rng.uniform(0, 40 * 2**20)) for n in range(2000)]
    _, changes = run(records)
    assert not raised(changes, "memory_creep")


def test_near_miss_a_slow_growth_below_the_runs_own_scale_is_no_creep() -> None:
    # a log of floats kept by the script: a few bytes a step on 400 MiB
    _, changes = run(timed(n, 1.0, memory=BASE + 64 * n) for n in range(3000))
    assert not raised(changes, "memory_creep")


# --- retained_graph ------------------------------------------------------------------------


def sampled(n: int, graphs: int, origin: str | None) -> Record:
    fields: dict[str, Any] = {"param_norms": [1.0, 1.0, 1.0]}
    if graphs:
        fields.update(retained_graphs=graphs, retained_origin=origin)
    return timed(n, 1.0, **fields)


def test_the_losses_of_several_steps_kept_alive_are_a_retained_graph() -> None:
    # total_loss += loss: every sampled step's loss stays alive
    records = [
        sampled(n, n // 20, "the loss of step 0") if n % 20 == 0 else timed(n, 1.0)
        for n in range(200)
    ]
    _, changes = run(records)
    alert = raised(changes, "retained_graph")[0]
    assert alert.step == 60  # the third sampled step found alive: as early as allowed
    assert alert.subject == "loss"
    assert alert.evidence == {"graphs": 3, "origin": "the loss of step 0", "steps": 60}


def test_the_creep_it_causes_folds_under_the_retained_graph() -> None:
    records = [
        timed(
            n,
            1.0,
            memory=BASE + 500_000 * n,
            param_norms=[1.0] * 3,
            retained_graphs=n // 20,
            retained_origin="the loss of step 0",
        )
        if n % 20 == 0
        else timed(n, 1.0, memory=BASE + 500_000 * n)
        for n in range(800)
    ]
    _, changes = run(records)
    assert raised(changes, "retained_graph")
    assert not raised(changes, "memory_creep")


def test_near_miss_one_best_loss_kept_on_purpose_is_not_a_retained_graph() -> None:
    records = [
        sampled(n, 1, "the loss of step 40") if n % 20 == 0 and n >= 60 else timed(n, 1.0)
        for n in range(400)
    ]
    _, changes = run(records)
    assert not raised(changes, "retained_graph")


# --- recompiles ----------------------------------------------------------------------------


def test_a_model_that_compiles_on_every_few_steps_recompiles() -> None:
    # a new shape every 10 steps, each compiled again
    _, changes = run(timed(n, 1.0, compiles=1 + n // 10) for n in range(300))
    alert = raised(changes, "recompiles")[0]
    assert alert.evidence["new"] >= 4


def test_near_miss_compiles_at_the_start_a_last_batch_and_an_evaluation_are_expected() -> None:
    def compiles(n: int) -> int:
        return 1 + (n >= 1) + (n >= 5) + (n >= 180) + (n >= 400)  # warm-up, last batch, eval

    _, changes = run(timed(n, 1.0, compiles=compiles(n)) for n in range(1000))
    assert not raised(changes, "recompiles")
