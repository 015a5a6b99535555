"""An address that cannot work never stops training, and no folder is made for it.

A typo in ``TRAINTOP_ADDRESS``, or a socket folder that does not exist, is one line on
stderr; the run trains to the end, bit for bit as it would unwatched. The monitor
refuses such an address in one line instead of making the folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import probes
from tui.cli import main

#: A short loop, trained once per address named on the command line (``-``: no probe at
#: all), each in the same process from the same seed; prints a digest of the trained
#: weights per address, and marks on stderr where each address's training begins. One
#: process for every address: each is its own probe, and torch starts once.
TRAINER = """
import hashlib, os, sys, torch
from torch import nn
for address in sys.argv[1:]:
    print("--- " + address, file=sys.stderr, flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = None
    if address != "-":
        import probes
        os.environ["TRAINTOP_ADDRESS"] = address
        probe = probes.watch(model, optimizer)
    for i in range(30):
        x = torch.randn(16, 4)
        if probe is not None:
            probe.begin_step()
        optimizer.zero_grad()
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if probe is not None:
            probe.log(loss=loss)
            probe.end_step()
    if probe is not None:
        probe.close()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    print("trained", digest.hexdigest(), flush=True)
"""

BAD_ADDRESSES = [
    ("tcp://nowhere", "TRAINTOP_ADDRESS: bad TCP address 'tcp://nowhere'"),
    ("http://monitor:7007", "TRAINTOP_ADDRESS: unsupported address"),
    ("127.0.0.1:7007", "write tcp://127.0.0.1:7007 for TCP"),
    ("unix:{tmp}/absent/dir/m.sock", "absent/dir does not exist"),
    ("unix:{tmp}/a-file/m.sock", "a-file is not a folder"),
]


@dataclass(frozen=True)
class Trained:
    digest: str  # the stdout line of this address's training
    stderr: list[str]  # what it wrote on stderr


@dataclass(frozen=True)
class Trainings:
    status: int
    folder: Path  # where the addresses' folders would have been made
    by_address: dict[str, Trained]  # "-": trained with no probe
    output: str


@pytest.fixture(scope="module")
def trainings(tmp_path_factory: pytest.TempPathFactory) -> Trainings:
    folder = tmp_path_factory.mktemp("addresses")
    (folder / "a-file").write_text("not a folder")
    addresses = ["-"] + [address.format(tmp=folder) for address, _ in BAD_ADDRESSES]
    environment = {
        k: v for k, v in os.environ.items() if k not in ("TRAINTOP_TOKEN", "TRAINTOP_ADDRESS")
    }
    result = subprocess.run(
        [sys.executable, "-c", TRAINER, *addresses],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    digests = result.stdout.splitlines()
    stderr_by_address: dict[str, list[str]] = {}
    for line in result.stderr.splitlines():
        if line.startswith("--- "):
            stderr_by_address[line[4:]] = []
        elif stderr_by_address:
            stderr_by_address[list(stderr_by_address)[-1]].append(line)
    by_address = {
        address: Trained(digest, stderr_by_address.get(address, []))
        for address, digest in zip(addresses, digests, strict=False)
    }
    return Trainings(result.returncode, folder, by_address, result.stdout + result.stderr)


# One worker for every address: the module-scoped training would run once a worker
# (6 s of torch starting and training six times).
@pytest.mark.xdist_group("bad addresses")
@pytest.mark.parametrize(("address", "said"), BAD_ADDRESSES)
def test_an_unusable_address_is_one_line_and_the_run_trains_unchanged(
    address: str, said: str, trainings: Trainings
) -> None:
    assert trainings.status == 0, trainings.output
    unwatched = trainings.by_address["-"]
    assert unwatched.digest.startswith("trained ") and unwatched.stderr == []
    trained = trainings.by_address.get(address.format(tmp=trainings.folder))
    assert trained is not None, trainings.output
    assert trained.digest == unwatched.digest  # bit for bit what it trains unwatched
    assert len(trained.stderr) == 1, trainings.output
    assert trained.stderr[0].startswith("traintop: ") and said in trained.stderr[0]
    assert "the run trains unwatched" in trained.stderr[0]
    assert sorted(p.name for p in trainings.folder.iterdir()) == ["a-file"]  # nothing made


def test_a_bad_address_given_to_watch_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Linear(2, 1)
    for address in ("tcp://host:port", f"unix:{tmp_path}/no/such/m.sock"):
        with probes.watch(model, address=address) as probe, probe.step():
            model(torch.ones(1, 2)).sum().backward()
        assert probe.address is None and probe.step_index == 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the run trains unwatched" in err
    assert list(tmp_path.iterdir()) == []


def test_the_monitor_refuses_a_missing_folder_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"unix:{tmp_path}/absent/dir/m.sock"
    assert main(["--headless", "--address", address]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("traintop: cannot listen on")
    assert "absent/dir does not exist" in err and "create it" in err
    assert list(tmp_path.iterdir()) == []


def test_the_monitor_keeps_a_socket_in_a_folder_of_ones_own(socket_path: str) -> None:
    from tui.server import prepare_socket_path

    prepare_socket_path(socket_path)  # the folder exists: fine, nothing made
    assert os.listdir(os.path.dirname(socket_path)) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a socket to another user needs root")
def test_a_probe_will_not_connect_to_another_users_socket(
    socket_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen()
    os.chown(socket_path, 4242, -1)  # someone else's listener where we were told to look
    listener.settimeout(0.3)
    try:
        model = nn.Linear(2, 1)
        with probes.watch(model, address=f"unix:{socket_path}") as probe, probe.step():
            model(torch.ones(1, 2)).sum().backward()
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "belongs to uid 4242, not to you" in err
