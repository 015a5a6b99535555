"""A small DistributedDataParallel job on the CPU (gloo), one process per rank.

``run_job`` starts the ranks with ``torch.multiprocessing`` and waits for them. Each rank
trains an MLP on its own shard of a synthetic regression task, under a probe; the
options reproduce what goes wrong in real multi-rank runs:

- ``desync``: the loop calls the inner module (``ddp.module(x)``) on every other step,
  so those backwards skip DDP's all-reduce and the replicas train apart while every
  loss looks fine (a pattern from a public report on multi-GPU fine-tuning);
- ``bad_shard``: one rank's data turns corrupt (inputs and targets scaled by 1e3) from a
  step on;
- ``die``: one rank dies (``os._exit``) at a step, as a killed process does;
- ``slow_loader``: one rank's loader takes longer for each batch, and every other rank
  waits for it in each all-reduce (a straggler).

``JOB_BUGS`` holds what each job scenario of the gallery sets (``--fixed``: none of it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import probes
from demo.catalog import JOB_SCENARIOS
from demo.data import Batches, Split, teacher_regression


@dataclass(frozen=True)
class JobOptions:
    """What the job does; picklable (it travels to each rank's process)."""

    name: str = "ddp"
    world_size: int = 2
    steps: int = 300
    delay: float = 0.0  # seconds added to each step, for watching
    desync: bool = False
    bad_shard: tuple[int, int] | None = None  # (rank, from step)
    die: tuple[int, int] | None = None  # (rank, at step)
    slow_loader: tuple[int, float] | None = None  # (rank, seconds it takes for each batch)
    seed: int = 0
    timeout_s: float = 60.0  # gloo's collective timeout: a dead rank fails the job


#: What each job scenario sets in ``JobOptions``: its bug (``--fixed`` sets none of it).
JOB_BUGS: dict[str, dict[str, Any]] = {
    "ddp-desync": {"desync": True},
    # rank 1 waits 25 ms for each batch, on steps that compute in a few
    "straggler": {"slow_loader": (1, 0.025)},
}
assert set(JOB_BUGS) == JOB_SCENARIOS, "demo.catalog and demo.ddp disagree on the jobs"


# Forked ranks start in a fraction of a second; spawned ones import torch again each
# (2 to 3 s on two cores). Fork is safe here: this process runs no torch op and no
# thread before the ranks start. Elsewhere than Linux (macOS: fork is unsafe with its
# system frameworks), spawn.
RANK_START_METHOD = "fork" if sys.platform == "linux" else "spawn"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def run_job(options: JobOptions) -> None:
    """Start every rank on this machine (loopback rendezvous) and wait for them.

    Raises:
        torch.multiprocessing.ProcessRaisedException / ProcessExitedException: a rank
            failed (``die`` makes one exit on purpose).
    """
    port = free_port()
    mp.start_processes(
        _rank_main,
        args=(options, port),
        nprocs=options.world_size,
        join=True,
        start_method=RANK_START_METHOD,
    )


def _rank_main(rank: int, options: JobOptions, port: int) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(options.world_size),
        }
    )
    torch.set_num_threads(1)  # tiny models; ranks share the machine
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=options.world_size,
        timeout=timedelta(seconds=options.timeout_s),
    )
    try:
        _train(rank, options)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _train(rank: int, options: JobOptions) -> None:
    torch.manual_seed(options.seed)  # the same initial weights on every rank
    model = nn.Sequential(
        nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    train, _ = teacher_regression(2048, 256, seed=options.seed)
    batches = rank_batches(rank, options, train)
    loss_fn = nn.MSELoss()
    with probes.watch(ddp, optimizer, run=options.name) as probe:
        for step in range(options.steps):
            if options.die is not None and options.die == (rank, step):
                os._exit(3)  # as a killed process: no goodbye, no flush
            x, y = batches.next()
            if (
                options.bad_shard is not None
                and rank == options.bad_shard[0]
                and (step >= options.bad_shard[1])
            ):
                x, y = x * 1e3, y * 1e3
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                # The bug: the inner module on odd steps, so no all-reduce on those.
                forward = ddp.module if options.desync and step % 2 else ddp
                loss = loss_fn(forward(x), y)
                loss.backward()
                if options.delay:  # (in the step: a pause between steps reads as data)
                    time.sleep(options.delay)
                optimizer.step()
                probe.log(loss=loss)


def rank_batches(rank: int, options: JobOptions, train: Split) -> Batches:
    """The rank's shard of ``train``, in batches of 32; slow where ``slow_loader`` says."""
    shard = Split(train.x[rank :: options.world_size], train.y[rank :: options.world_size])
    slow = options.slow_loader
    delay = slow[1] if slow is not None and slow[0] == rank else 0.0
    return Batches(shard, 32, seed=options.seed + rank, delay=delay)
