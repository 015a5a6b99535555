"""A rank's own gradients, before the all-reduce (issue 18 item 9): measured by tensor
hooks on sampled steps of a data-parallel job, gone after; compared across ranks, the
rank whose local gradients stand apart is named while its inputs look normal."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from probes.kernel.diagnosis import Severity
from probes.kernel.diagnosis.ranks import JobChecks
from probes.kernel.diagnosis.views import StepView
from probes.runtime.measure.local_grads import LocalGradients
from tests.collector import FrameCollector, wait_for_bye, watch_unthinned
from tests.runtime.test_loop_shapes import free_port, loss_of, mlp

LAYERS = ("encoder", "hidden", "head")


def test_the_incoming_gradients_are_measured_and_the_hooks_removed() -> None:
    """Two backward passes (an accumulation): their norms in quadrature; the gradients
    themselves are those of the same passes without the hooks, to the bit."""
    model, twin = mlp(), mlp()
    errors: list[Exception] = []
    local = LocalGradients(list(model.parameters()), errors.append)
    local.attach()
    passes = []
    for seed in (0, 1):
        loss_of(model, seed).backward()
        loss_of(twin, seed).backward()
    for seed in (0, 1):  # each pass's own gradient, on a fresh copy
        fresh = mlp()
        loss_of(fresh, seed).backward()
        norms = [p.grad.norm() for p in fresh.parameters() if p.grad is not None]
        passes.append(torch.linalg.vector_norm(torch.stack(norms)))
    total = local.take()
    assert total is not None and not errors
    expected = float(torch.linalg.vector_norm(torch.stack(passes)))
    assert math.isclose(float(total), expected, rel_tol=1e-5)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert all(not p._backward_hooks for p in model.parameters())  # every handle removed
    assert local.take() is None  # nothing seen since


def test_nothing_attached_nothing_taken() -> None:
    local = LocalGradients(list(mlp().parameters()), lambda exc: None)
    assert local.take() is None


def ddp_frames(collector: FrameCollector, *, data_parallel: str | None) -> list[dict[str, Any]]:
    """A one-rank DDP group in this process, watched as a DDP job's rank."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        model = nn.parallel.DistributedDataParallel(mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        probe = watch_unthinned(model, opt, collector, sample_every=4, data_parallel=data_parallel)
        for i in range(9):
            with probe.step():
                opt.zero_grad()
                loss_of(model, i).backward()
                opt.step()
        probe.close()
        wait_for_bye(collector)
        assert all(not p._backward_hooks for p in model.parameters())  # none left
    finally:
        dist.destroy_process_group()
    return [f for f in collector.frames if f["kind"] == "step"]


def test_a_ddp_rank_sends_its_local_gradient_norm_on_sampled_steps(
    collector: FrameCollector,
) -> None:
    steps = {f["step"]: f for f in ddp_frames(collector, data_parallel="ddp")}
    for n, frame in steps.items():
        if n % 4 == 0:  # one rank: the all-reduce averages over 1, local == shared
            assert math.isclose(frame["local_grad_norm"], frame["grad_norm_total"], rel_tol=1e-4)
        else:
            assert "local_grad_norm" not in frame


def test_not_a_data_parallel_job_measures_nothing_local(collector: FrameCollector) -> None:
    """Near miss: one process (no job): no hooks, no field."""
    assert all("local_grad_norm" not in f for f in ddp_frames(collector, data_parallel=None))


# --- compared across ranks ---------------------------------------------------------------


def view(step: int, local: float, inputs: float = 1.0) -> StepView:
    return StepView.from_record(
        {
            "kind": "step",
            "step": step,
            "scalars": {"loss": 1.0},
            "grad_norms": [0.5, 0.5, 0.5],
            "grad_norm_total": 0.87,
            "input_rms": inputs,
            "local_grad_norm": local,
        }
    )


def run_job(checks: JobChecks, norms: dict[int, list[float]]) -> list[Any]:
    found = []
    for index in range(len(next(iter(norms.values())))):
        for rank, values in norms.items():
            found += checks.observe(rank, view(index * 20, values[index]))
    return found


def test_a_rank_whose_own_gradients_stand_apart_is_named() -> None:
    """Rank 1's batches turn bad at step 40 (labels of another task): its inputs look
    normal, its own gradients are 12x the other's; the averaged ones show nothing."""
    checks = JobChecks(LAYERS, "ddp")
    [alert] = run_job(checks, {0: [1.0, 1.2, 0.9, 1.1], 1: [1.1, 0.9, 12.0, 11.0]})
    assert (alert.kind, alert.subject, alert.step, alert.severity) == (
        "rank_outlier",
        "local_gradients",
        40,
        Severity.ERROR,
    )
    assert alert.evidence["rank"] == 1 and alert.evidence["times"] > 4
    assert alert.evidence["its_first_local_grad_norm"] == 1.1
    assert "rank=1" in alert.line()


def test_ranks_whose_own_gradients_agree_within_noise_raise_nothing() -> None:
    """Near miss: shards' gradients differ step to step, never 4x."""
    checks = JobChecks(LAYERS, "ddp")
    assert run_job(checks, {0: [1.0, 2.0, 0.7, 1.5], 1: [1.8, 0.9, 1.4, 3.5]}) == []


#: A real 2-rank job's local gradient norms on its sampled steps (Lightning, DDP on 2 CPU
#: processes, a small CNN trained to a loss of 3e-5): from 0.46 at the start to a
#: thousandth of it, where one batch's differ from the next's several times over.
CONVERGED = {
    0: [0.4589, 0.6613, 0.904, 0.002743, 0.001223, 0.0005911, 0.00277, 0.001114],
    1: [0.4764, 0.801, 0.9261, 0.006689, 0.001476, 0.003328, 0.002282, 0.003079],
}


def test_a_converged_jobs_local_gradients_apart_by_the_noise_of_small_values_raise_nothing() -> (
    None
):
    # At step 100 rank 0's was 5.6x below rank 1's: raised as a rank_outlier on a
    # healthy job, though the two differ by a thousandth of where the job began.
    assert run_job(JobChecks(LAYERS, "ddp"), CONVERGED) == []


def test_a_bad_shard_after_convergence_is_still_named() -> None:
    # Rank 1's batches turn bad once the job has converged: its own gradients are back
    # at the start's scale, far above the other's.
    norms = {0: [*CONVERGED[0], 0.0021], 1: [*CONVERGED[1], 0.74]}
    [alert] = run_job(JobChecks(LAYERS, "ddp"), norms)
    assert (alert.subject, alert.evidence["rank"], alert.step) == ("local_gradients", 1, 160)


# --- two real ranks (gloo, a subprocess of two) -----------------------------------------


def weighted_rank(rank: int, address: str, port: int, weight: float) -> None:
    """One rank of a 2-rank DDP job; from step 8 rank 1 backpropagates its loss times
    ``weight`` (a loss term only it adds) while it logs the loss as it was."""
    import os

    import probes

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = nn.parallel.DistributedDataParallel(mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        probe = probes.watch(model, opt, address=address, max_steps_per_s=1e9, sample_every=4)
        for i in range(16):
            with probe.step():
                opt.zero_grad()
                loss = loss_of(model, 2 * i + rank)
                scale = weight if rank == 1 and i >= 8 else 1.0
                (loss * scale).backward()
                opt.step()
                probe.log(loss=loss)
        probe.close()
    finally:
        dist.destroy_process_group()


def weighted_job(address: str, weight: float) -> None:
    torch.multiprocessing.spawn(weighted_rank, args=(address, free_port(), weight), nprocs=2)


def two_rank_steps(collector: FrameCollector, weight: float) -> dict[int, dict[int, Any]]:
    """rank -> step -> its record, of a real 2-rank job."""
    import os
    import subprocess
    import sys

    address = str(collector.address)
    code = (
        "from tests.runtime.test_local_grads import weighted_job; "
        f"weighted_job({address!r}, {weight})"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=120, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert collector.wait_for(lambda frames: sum(f["kind"] == "bye" for f in frames) == 2)
    frames = list(collector.frames)
    rank_of = {f["run"]: f.get("rank") for f in frames if f["kind"] == "hello"}
    steps: dict[int, dict[int, Any]] = {0: {}, 1: {}}
    for f in frames:
        if f["kind"] == "step":
            steps[rank_of[f["run"]]][f["step"]] = f
    return steps


def job_alerts(steps: dict[int, dict[int, Any]]) -> list[Any]:
    checks = JobChecks(LAYERS, "ddp")
    found = []
    for n in sorted(steps[0]):
        for rank in (0, 1):
            found += checks.observe(rank, StepView.from_record(steps[rank][n]))
    return found


@pytest.mark.slow  # two spawned ranks: tens of seconds on a loaded machine (-m slow)
def test_two_ranks_local_gradients_are_their_own_and_the_odd_rank_is_named(
    collector: FrameCollector,
) -> None:
    steps = two_rank_steps(collector, weight=20.0)
    for n in (0, 4, 8, 12):  # sampled: the shared norm agrees, the local ones do not
        zero, one = steps[0][n], steps[1][n]
        assert math.isclose(zero["grad_norm_total"], one["grad_norm_total"], rel_tol=1e-5)
        assert zero["local_grad_norm"] != one["local_grad_norm"]
    assert steps[1][8]["local_grad_norm"] > 4 * steps[0][8]["local_grad_norm"]
    [alert] = job_alerts(steps)
    assert (alert.subject, alert.evidence["rank"], alert.step) == ("local_gradients", 1, 8)


@pytest.mark.slow
def test_two_healthy_ranks_stand_apart_in_nothing(collector: FrameCollector) -> None:
    assert job_alerts(two_rank_steps(collector, weight=1.0)) == []
