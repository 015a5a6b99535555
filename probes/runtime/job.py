"""Which distributed job a run belongs to, and its place in it (rank, local rank, world).

The ranks of one job (torchrun, SLURM, plain torch.distributed, or ``watch(job=...)``)
carry the same job id in their hellos, so the monitor shows them as one job. Read from
the environment the launchers set, or from an initialised process group; a process on
its own is a job of one.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

JOB_ENV = "TRAINTOP_JOB"


@dataclass(frozen=True)
class JobIdentity:
    """A run's place in its job."""

    job: str | None  # None: a process on its own
    rank: int
    local_rank: int
    world_size: int
    host: str

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def job_identity(explicit_job: str | None = None) -> JobIdentity:
    """The job, rank, local rank and world size of this process, and its host.

    Args:
        explicit_job: ``watch(job=...)``; else ``$TRAINTOP_JOB``, torchrun's
            ``TORCHELASTIC_RUN_ID``, SLURM's job and step ids, or the rendezvous
            address (``MASTER_ADDR:MASTER_PORT``) of a multi-process run.
    """
    environ = os.environ
    rank, world = _rank_and_world()
    local_rank = _int(environ.get("LOCAL_RANK", environ.get("SLURM_LOCALID")), 0)
    job = explicit_job or environ.get(JOB_ENV) or _launcher_job(world)
    return JobIdentity(
        job=job, rank=rank, local_rank=local_rank, world_size=world, host=socket.gethostname()
    )


def _launcher_job(world: int) -> str | None:
    environ = os.environ
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchrun-{run_id}"
    if environ.get("SLURM_JOB_ID") and world > 1:
        step = environ.get("SLURM_STEP_ID")
        return f"slurm-{environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    if world > 1 and environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        return f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return None


def _rank_and_world() -> tuple[int, int]:
    """From an initialised process group, else the launcher's environment."""
    import torch.distributed as dist  # (the probe has torch loaded already)

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    environ = os.environ
    rank = _int(environ.get("RANK", environ.get("SLURM_PROCID")), 0)
    world = _int(environ.get("WORLD_SIZE", environ.get("SLURM_NTASKS")), 1)
    return rank, max(world, 1)


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


_SYNC_OF_WRAPPER = {"DistributedDataParallel": "ddp", "FullyShardedDataParallel": "fsdp"}


def sync_of(model: object, identity: JobIdentity) -> str | None:
    """How a job's ranks share gradients, from the model's wrapper: ``"ddp"``,
    ``"fsdp"``, ``"unknown"`` (several ranks, no wrapper known), None (one process).
    FSDP2's ``fully_shard`` marks the module itself (its class name says FSDP)."""
    if not identity.distributed:
        return None
    name = type(model).__name__
    if name in _SYNC_OF_WRAPPER:
        return _SYNC_OF_WRAPPER[name]
    return "fsdp" if name.startswith("FSDP") else "unknown"
