"""Shared fixtures: private socket paths, a frame collector, small models."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from tests.collector import FrameCollector

# CI saw `OSError: [Errno 14] Bad address` from execve once, in the gallery, whose
# threads start monitors while other threads of the same worker read their pipes.
# With vfork the child execs from memory it shares with those threads; a plain fork
# gives it its own copy. This is CPython's documented switch (3.11 "Disabling use of
# vfork()"); it costs a few milliseconds a start in these tests, nothing in traintop.
subprocess._USE_VFORK = False  # type: ignore[misc]

# A suite started as a background job of a shell without job control (``cmd &`` in a
# script, CI runners' wrappers) inherits SIGINT ignored, and so would every process its
# tests start: the scripts that must take a Ctrl-C (``traintop run``'s SIGINT tests)
# would never see it, and hang. A terminal's foreground job, as a user runs traintop,
# has it at its default: restore that (a Python handler is reset to the default in a
# child at exec, where an ignored signal would stay ignored).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_worker() -> Iterator[None]:
    """Under pytest-xdist each worker has a core of its own: torch's pool of two
    threads per worker would spin against the other worker's (the tiny models here
    ran several times slower so). Alone, torch keeps its own count."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def socket_path() -> Iterator[str]:
    """A Unix socket path in a fresh private folder (short: sun_path is ~100 bytes)."""
    folder = tempfile.mkdtemp(prefix="tt-")
    yield os.path.join(folder, "m.sock")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def collector(socket_path: str) -> Iterator[FrameCollector]:
    """A stand-in monitor listening on ``socket_path``."""
    frames = FrameCollector(socket_path)
    yield frames
    frames.close()


def resume_when_paused(frame: dict) -> list[dict]:
    """A stand-in monitor's reply: resume a run as soon as it says it paused."""
    if frame.get("kind") == "event" and frame.get("name") == "paused":
        return [{"v": 1, "kind": "command", "id": 0, "command": "resume"}]
    return []


@pytest.fixture
def resuming_collector(socket_path: str) -> Iterator[FrameCollector]:
    """A stand-in monitor that resumes every pause (a person pressing p at once)."""
    frames = FrameCollector(socket_path, reply=resume_when_paused)
    yield frames
    frames.close()


@pytest.fixture(autouse=True)
def _no_default_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never let a test talk to a real monitor on the default address."""
    folder = tempfile.mkdtemp(prefix="tt-none-")
    monkeypatch.setenv("TRAINTOP_ADDRESS", f"unix:{folder}/nobody.sock")
