"""``tui.dispatch``: monitor events reach the methods marked ``@handles`` for their type,
in order; a handler without one skips the event; every event type has a handler."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tui.app import TraintopApp
from tui.dispatch import EVENT_TYPES, dispatch, handlers_of, handles
from tui.events import FrameRejected, RunPaused
from tui.headless import HeadlessMonitor

#: Whoever shows monitor events.
HANDLERS = (TraintopApp, HeadlessMonitor)


def test_every_event_type_has_a_handler() -> None:
    handled = {kind for cls in HANDLERS for kind in handlers_of(cls)}
    missing = [kind.__name__ for kind in EVENT_TYPES if kind not in handled]
    assert not missing, f"no @handles method anywhere for {missing}"


@pytest.mark.parametrize("cls", HANDLERS, ids=lambda cls: cls.__name__)
def test_each_marked_method_takes_its_event_type(cls: type) -> None:
    for kind, name in handlers_of(cls).items():
        assert kind in EVENT_TYPES
        assert getattr(cls, name).__annotations__["event"] in (kind, kind.__name__)


def test_headless_handles_every_event() -> None:
    assert set(handlers_of(HeadlessMonitor)) == set(EVENT_TYPES)


class Shown:
    def __init__(self) -> None:
        self.seen: list[object] = []

    @handles(FrameRejected)
    def rejected(self, event: FrameRejected) -> None:
        self.seen.append(event)


class Louder(Shown):
    """A subclass: its own handlers, and those it inherits."""

    @handles(RunPaused)
    def paused(self, event: RunPaused) -> None:
        self.seen.append(("paused", event.step))


def test_dispatch_calls_the_marked_methods_in_order_and_skips_the_rest() -> None:
    first, second = FrameRejected("a", "bad"), FrameRejected("b", "worse")
    paused = RunPaused(run=None, step=3, reason="?")  # type: ignore[arg-type]
    shown = Shown()
    dispatch([first, paused, second], shown)
    assert shown.seen == [first, second]  # the pause: no method, skipped
    louder = Louder()
    dispatch([first, paused], louder)
    assert louder.seen == [first, ("paused", 3)]
    dispatch([first], object())  # no handler at all: nothing happens


def test_only_a_monitor_event_can_be_handled() -> None:
    @dataclass
    class NotAnEvent:
        pass

    with pytest.raises(TypeError, match="NotAnEvent is not a monitor event"):
        handles(NotAnEvent)


def test_two_methods_for_one_event_type_are_refused() -> None:
    class Twice:
        @handles(FrameRejected)
        def one(self, event: FrameRejected) -> None: ...

        @handles(FrameRejected)
        def other(self, event: FrameRejected) -> None: ...

    with pytest.raises(TypeError, match="Twice handles FrameRejected twice: one and other"):
        handlers_of(Twice)
