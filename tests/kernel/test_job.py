"""A run's job identity: the ranks of one job say the same job in their hellos."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from probes.runtime.job import JobIdentity, job_identity
from probes.runtime.link.hello import hello_fields
from probes.runtime.measure.layers import map_layers
from probes.runtime.options import WatchOptions

LAUNCHER_VARIABLES = (
    "TRAINTOP_JOB",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)


def hello_of(identity: JobIdentity) -> dict[str, Any]:
    """The hello a probe with this identity sends (its job fields are the identity's)."""
    model = nn.Linear(2, 1)
    layers = map_layers(model)
    return dict(
        hello_fields(
            run_id="r",
            name="n",
            model=model,
            module=model,
            optimizer=None,
            layers=layers,
            activations=[],
            identity=identity,
            sync=None,
            options=WatchOptions(),
        )
    )


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_process_on_its_own_is_a_job_of_one() -> None:
    identity = job_identity()
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        None,
        0,
        0,
        1,
    )
    assert not identity.distributed and identity.host


def test_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "4f2a")
    for name, value in (
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ):
        monkeypatch.setenv(name, value)
    identity = job_identity()
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        "torchrun-4f2a",
        3,
        1,
        4,
    )
    assert hello_of(identity)["job"] == "torchrun-4f2a"


def test_torchrun_without_a_rendezvous_id_uses_the_rendezvous_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (
        ("TORCHELASTIC_RUN_ID", "none"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29511"),
    ):
        monkeypatch.setenv(name, value)
    assert job_identity().job == "127.0.0.1:29511"


def test_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("SLURM_JOB_ID", "881"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
    ):
        monkeypatch.setenv(name, value)
    identity = job_identity()
    assert (identity.job, identity.rank, identity.local_rank, identity.world_size) == (
        "slurm-881.0",
        5,
        1,
        8,
    )


def test_explicit_job_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "4f2a")
    monkeypatch.setenv("TRAINTOP_JOB", "from-env")
    assert job_identity().job == "from-env"
    assert job_identity("sweep-7").job == "sweep-7"
