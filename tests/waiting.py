"""Waiting in tests: poll a condition until it holds or a deadline passes.

No test sleeps a fixed time for something to happen: it polls for it, here. (A test
whose point is that nothing happens for a while, a run that stays paused, may still
pause a fixed time and then assert on what happened meanwhile; it says so where it does.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from textual.pilot import Pilot

T = TypeVar("T")

POLL_S = 0.02  # between two looks: short against the waits, long against a look


def poll(predicate: Callable[[], T], timeout: float = 10.0, *, every: float = POLL_S) -> T | None:
    """``predicate()``'s first truthy value, polled every ``every`` s for at most
    ``timeout`` s (at least one look); None if it never held."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(every)


def wait_until(
    predicate: Callable[[], T], what: str, timeout: float = 10.0, *, every: float = POLL_S
) -> T:
    """``poll``, failing the test with "timed out after N s waiting for WHAT"."""
    value = poll(predicate, timeout, every=every)
    assert value, f"timed out after {timeout:g} s waiting for {what}"
    return value


async def until(
    predicate: Callable[[], T],
    what: str = "the condition",
    timeout: float = 10.0,
    *,
    pause: Callable[[float], Awaitable[object]] | None = None,
    every: float = 0.05,
) -> T:
    """The async ``wait_until``: between looks, ``pause`` (``pilot.pause``, so that an
    app redraws; default ``asyncio.sleep``, so that a server in this loop runs)."""
    pause = pause or asyncio.sleep
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert loop.time() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await pause(every)


async def settle(pilot: Pilot[object], predicate: Callable[[], T], timeout: float = 5.0) -> T:
    """Let a Textual app (under ``pilot``) redraw until ``predicate()`` holds (its views
    redraw on a timer, not per frame)."""
    return await until(predicate, "the screen", timeout, pause=pilot.pause)


def running_or_runnable() -> float:
    """This thread's seconds on a CPU or waiting for one (Linux: its run-queue wait from
    ``/proc/thread-self/schedstat``; elsewhere its CPU time): a sleep's wall time less
    these is the time it was blocked (on a crowded machine a woken thread also waits for
    a core, which is not waiting for data). The probe's phase clock reads the same."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return time.thread_time() + int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return time.thread_time()
