"""Where a step's time and memory go, measured by the probe (``probes.runtime.measure``:
phases, memory, graphs kept, compilations) through the step API and ``watch()`` alone,
and rung 8's alerts from what it measures: each with a near miss that stays silent."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.collector import (
    Frame,
    FrameCollector,
    raised_alerts,
    verdicts,
    wait_for_bye,
    watch_unthinned,
)
from tests.waiting import running_or_runnable

PHASES = ("data_time", "forward_time", "backward_time", "optimizer_time")


def mlp(width: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))


def train(
    collector: FrameCollector,
    steps: int,
    *,
    explicit: bool = True,
    wait: float = 0.0,
    after_step: Callable[[torch.Tensor, int], None] | None = None,
    accumulate: int = 1,
    width: int = 64,
    waited: list[float] | None = None,
) -> list[Frame]:
    """A plain loop; its loader sleeps ``wait`` before each batch; ``after_step`` sees each
    step's loss. The frames the monitor got."""
    model = mlp(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, optimizer, collector)
    for step in range(steps):
        scope = probe.step() if explicit else None
        if scope is not None:
            scope.__enter__()
        optimizer.zero_grad()
        for _ in range(accumulate):
            started, ran = time.perf_counter(), running_or_runnable()
            if wait:
                time.sleep(wait)  # the loader: blocked, as on a worker's queue or a disk
            if waited is not None:  # (what the loop itself measures of its wait: blocked)
                waited.append(time.perf_counter() - started - (running_or_runnable() - ran))
            x, y = torch.randn(32, 16), torch.randn(32, 1)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        optimizer.step()
        if scope is not None:
            scope.__exit__(None, None, None)
        if after_step is not None:
            after_step(loss, step)
    probe.close()
    wait_for_bye(collector)
    return list(collector.frames)


def step_records(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f["kind"] == "step"]


def kinds(frames: list[Frame]) -> set[str]:
    return {a.kind for a in verdicts(raised_alerts(frames))}


# --- the phases -----------------------------------------------------------------------------


def busy(seconds: float) -> None:
    """Compute (hold the CPU) for ``seconds``: the loop's own work between steps."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


@pytest.mark.slow  # (as above: it compares each step's wait to a fraction of a millisecond)
@pytest.mark.parametrize("explicit", [True, False], ids=["step-api", "watch-alone"])
def test_the_wait_for_the_batch_is_the_data_phase_and_the_loops_own_work_is_not(
    collector: FrameCollector, explicit: bool
) -> None:
    waited: list[float] = []
    frames = train(
        collector,
        12,
        explicit=explicit,
        wait=0.005,
        waited=waited,
        after_step=lambda loss, step: busy(0.005),  # an EMA update, say: computing
    )
    records = step_records(frames)[1:]  # (step 0 has no update before it)
    assert len(records) == 11
    extra = []
    for record, wait in zip(records, waited[1:], strict=True):
        # the loader's sleep, all of it (a sleep blocks at least as long as it is asked
        # to, but for the call's own few microseconds)
        assert record["data_time"] >= 0.005 - 0.0002
        assert record["data_time"] >= wait - 0.002  # (and about what the loop measured)
        extra.append(record["data_time"] - wait)
        assert all(record[phase] > 0 for phase in PHASES[1:])
        # the phases fill the step, the probe's own time at its boundaries left out
        assert sum(record[phase] for phase in PHASES) <= record["cycle"]
        assert record["samples"] == 32
    # and not the 5 ms the loop computed between steps (a busy machine stretches some)
    assert sorted(extra)[len(extra) // 2] < 0.0025


@pytest.mark.slow  # (-m slow runs alone: beside a parallel worker's child processes the
# training thread's GIL handoffs blur the microseconds this compares)
def test_accumulated_batches_each_wait_for_their_own_data(collector: FrameCollector) -> None:
    waited: list[float] = []
    records = step_records(train(collector, 8, wait=0.004, accumulate=3, waited=waited))[1:]
    for record, index in zip(records, range(3, 3 * 8, 3), strict=True):
        assert record["data_time"] >= 3 * (0.004 - 0.0002)  # each batch's sleep, all of it
        assert record["data_time"] >= sum(waited[index : index + 3]) - 0.002
    assert all(r["samples"] == 3 * 32 for r in records)


def test_a_closures_forward_and_backward_are_the_optimizers(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    probe = watch_unthinned(model, optimizer, collector)
    for _ in range(6):
        time.sleep(0.003)  # (a quiet machine's: the test asks for a third of it)

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        with probe.step():
            optimizer.step(closure)
    probe.close()
    wait_for_bye(collector)
    for record in step_records(list(collector.frames))[1:]:
        assert record["data_time"] >= 0.001
        assert record["optimizer_time"] > record["forward_time"]  # LBFGS's calls are its own


# --- input_bound ----------------------------------------------------------------------------


@pytest.mark.parametrize("explicit", [True, False], ids=["step-api", "watch-alone"])
def test_a_loop_waiting_for_its_loader_is_input_bound(
    collector: FrameCollector, explicit: bool
) -> None:
    frames = train(collector, 130, explicit=explicit, wait=0.008)
    [alert] = [a for a in verdicts(raised_alerts(frames)) if a.kind == "input_bound"]
    assert alert.evidence["data_ms_per_step"] >= 8.0
    assert kinds(frames) == {"input_bound"}


def test_near_miss_a_loader_that_keeps_up_is_not_input_bound(collector: FrameCollector) -> None:
    assert kinds(train(collector, 200)) == set()


# --- retained_graph -------------------------------------------------------------------------


def summing(kept: list[Any], detached: bool) -> Callable[[torch.Tensor, int], None]:
    def add(loss: torch.Tensor, step: int) -> None:
        kept[0] = kept[0] + (loss.item() if detached else loss)

    return add


def test_total_loss_plus_loss_keeps_every_graph(collector: FrameCollector) -> None:
    total: list[Any] = [0.0]
    frames = train(collector, 80, after_step=summing(total, detached=False))
    [alert] = [a for a in verdicts(raised_alerts(frames)) if a.kind == "retained_graph"]
    # sampled steps 0, 20 and 40 still alive two steps after 40: as early as it shows
    assert alert.step == 42
    assert alert.evidence["origin"] == "the loss of step 0"


def test_a_list_of_losses_kept_as_tensors_keeps_every_graph(collector: FrameCollector) -> None:
    losses: list[torch.Tensor] = []
    frames = train(collector, 80, after_step=lambda loss, step: losses.append(loss))
    assert kinds(frames) == {"retained_graph"}


def test_near_miss_numbers_or_detached_losses_keep_no_graph(collector: FrameCollector) -> None:
    total: list[Any] = [0.0]
    detached: list[torch.Tensor] = []

    def both(loss: torch.Tensor, step: int) -> None:
        summing(total, detached=True)(loss, step)
        detached.append(loss.detach())

    frames = train(collector, 120, after_step=both)
    assert kinds(frames) == set()
    assert all("retained_graphs" not in r for r in step_records(frames))


def test_near_miss_one_best_loss_kept_as_a_tensor_is_not_a_leak(collector: FrameCollector) -> None:
    best: list[Any] = [None]

    def keep_best(loss: torch.Tensor, step: int) -> None:
        if best[0] is None or loss.item() < best[0].item():
            best[0] = loss  # one graph at a time, on purpose

    assert kinds(train(collector, 200, after_step=keep_best)) == set()


# --- memory_creep ---------------------------------------------------------------------------


@pytest.mark.parametrize(("bounded", "expected"), [(False, {"memory_creep"}), (True, set())])
def test_a_cache_that_never_evicts_creeps(
    collector: FrameCollector, bounded: bool, expected: set[str]
) -> None:
    cache: deque[torch.Tensor] = deque(maxlen=8 if bounded else None)
    # 1 MiB a step, filled (its pages touched): the process's resident memory grows; a
    # model whose step takes longer than filling them (a tiny one's would not). The rule
    # asks a rise of 5% of what the process holds over the run's latest half: this
    # pytest worker holds about 1 GB after the tests before it, which 256 KiB a step
    # (43 MB over the parts the rule compares) only just cleared, on some workers not.
    frames = train(
        collector, 460, width=1024, after_step=lambda loss, step: cache.append(torch.ones(2**18))
    )
    assert kinds(frames) == expected, [a.line() for a in verdicts(raised_alerts(frames))]
    records = step_records(frames)
    assert all(r["memory"] > 0 for r in records)


# --- out_of_memory --------------------------------------------------------------------------


class Hungry(nn.Module):
    """Asks, at a step, for more memory than any machine has (in its forward)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.at:
            torch.empty(2**62, dtype=torch.uint8)
        return self.linear(x)


def test_a_step_that_runs_out_of_memory_is_reported_before_the_error_leaves_it(
    collector: FrameCollector, capfd: pytest.CaptureFixture[str]
) -> None:
    model = Hungry(at=5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, optimizer, collector)
    with pytest.raises(RuntimeError, match="can't allocate memory"):  # as it came
        for _ in range(10):
            with probe.step():
                optimizer.zero_grad()
                model(torch.randn(8, 16)).sum().backward()
                optimizer.step()
    probe.close()
    wait_for_bye(collector)
    [alert] = [f["alert"] for f in collector.frames if f["kind"] == "alert"]
    assert alert["kind"] == "out_of_memory" and alert["step"] == 5
    assert alert["evidence"]["phase"] == "forward"
    assert alert["evidence"]["history"]  # the memory of the steps before
    assert "out_of_memory" in capfd.readouterr().err  # and in the run's own output


# --- compiles -------------------------------------------------------------------------------


@pytest.mark.slow  # (dynamo traces the model anew for every shape)
@pytest.mark.parametrize(("changing", "expected"), [(True, {"recompiles"}), (False, set())])
def test_a_compiled_model_that_sees_a_new_shape_every_few_steps_recompiles(
    collector: FrameCollector, changing: bool, expected: set[str]
) -> None:
    import torch._dynamo

    model = mlp()
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(compiled, optimizer, collector)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False, cache_size_limit=64):
        for step in range(200):
            batch = 8 + (step // 10) if changing else 8
            with probe.step():
                optimizer.zero_grad()
                x, y = torch.randn(batch, 16), torch.randn(batch, 1)
                nn.functional.mse_loss(compiled(x), y).backward()
                optimizer.step()
    probe.close()
    wait_for_bye(collector)
    assert kinds(list(collector.frames)) == expected
