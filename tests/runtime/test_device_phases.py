"""The device's side of the phase clock (``probes.runtime.measure.device_phases``) with
stand-in events on a simulated device timeline: no GPU here, the real events' CUDA
checks are in ``scripts/gpu_checks.sh``."""

from __future__ import annotations

from typing import Any

import pytest

from probes.runtime.measure.device_phases import DeviceClock
from probes.runtime.measure.phases import Phase


class Device:
    """A stream: events complete once the device has run up to them."""

    def __init__(self) -> None:
        self.clock_ms = 0.0  # when the device will be free (what it has queued runs till)
        self.ran_to_ms = 0.0  # how far it has run
        self.made = 0

    def run(self, ms: float) -> None:
        """Queue ``ms`` of kernels (they run after what is queued, or now if idle)."""
        self.clock_ms += ms

    def idle(self, ms: float) -> None:
        """The host is late by ``ms``: the device, done with its queue, waits."""
        self.ran_to_ms = self.clock_ms
        self.clock_ms += ms

    def event(self) -> Event:
        self.made += 1
        return Event(self)


class Event:
    def __init__(self, device: Device) -> None:
        self.device, self.at_ms = device, None

    def record(self) -> None:
        self.at_ms = self.device.clock_ms

    def query(self) -> bool:
        return self.at_ms is not None and self.at_ms <= self.device.ran_to_ms

    def elapsed_time(self, end: Event) -> float:
        assert self.query() and end.query(), "read before it completed: a sync"
        return float(end.at_ms - self.at_ms)  # type: ignore[operator]


def one_step(clock: DeviceClock, device: Device, *, idle_ms: float | None) -> dict[str, Any]:
    """A step's marks as the host clock makes them, the device's time between them
    (``idle_ms`` None: the device is still busy with what was queued, nothing completes)."""
    if idle_ms is not None:
        device.idle(idle_ms)  # the host waits for data; the device has nothing queued
    clock.mark(Phase.DATA)  # the forward begins
    device.run(3.0)
    clock.mark(Phase.FORWARD)  # backward begins
    device.run(5.0)
    clock.mark(Phase.BACKWARD)
    clock.mark(Phase.OTHER)  # the update begins
    device.run(1.0)
    clock.mark(Phase.OPTIMIZER)  # it ends
    record: dict[str, Any] = {}
    clock.step_ends(record)
    return record


def test_a_step_is_read_once_its_events_completed_never_before() -> None:
    device = Device()
    clock = DeviceClock(device.event)
    assert one_step(clock, device, idle_ms=0.0) == {}  # queued, not run yet: nothing read
    record = one_step(clock, device, idle_ms=4.0)  # the device ran the first step meanwhile
    assert record["forward_time"] == pytest.approx(0.003)
    assert record["backward_time"] == pytest.approx(0.005)
    assert record["optimizer_time"] == pytest.approx(0.001)


def test_the_data_wait_is_the_time_the_device_sat_idle() -> None:
    device = Device()
    clock = DeviceClock(device.event)
    for _ in range(3):
        record = one_step(clock, device, idle_ms=7.0)
    assert record["data_time"] == pytest.approx(0.007)


def test_a_host_that_runs_ahead_of_the_device_waits_for_no_data() -> None:
    # the host waits for its batch while the device still runs the last step's kernels
    device = Device()
    clock = DeviceClock(device.event)
    records = []
    for _ in range(6):
        device.run(0.0)
        records.append(one_step(clock, device, idle_ms=0.0))
        device.ran_to_ms = device.clock_ms  # (the device catches up later)
    assert [r["data_time"] for r in records[1:]] == [0.0] * 5


def test_events_are_reused_not_made_every_step() -> None:
    device = Device()
    clock = DeviceClock(device.event)
    for _ in range(1000):
        one_step(clock, device, idle_ms=1.0)
    assert device.made < 40


def test_a_device_that_falls_far_behind_drops_its_oldest_steps_unread() -> None:
    device = Device()
    clock = DeviceClock(device.event)
    for _ in range(50):  # nothing ever completes
        device.run(10.0)
        assert one_step(clock, device, idle_ms=None) == {}
    assert device.made < 100  # bounded: the oldest steps' events went back to the pool
