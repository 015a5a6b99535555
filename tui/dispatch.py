"""One dispatch of monitor events to whoever shows them (the app, headless mode).

A handler marks the method that shows an event type with ``@handles(EventType)``;
``dispatch`` calls them in order and skips the events a handler has no method for. The
registry is by type, never by name: mypy checks that a method takes the event it is
marked for, and a test (``tests/tui/test_dispatch.py``) that every event has a handler.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TypeVar, get_args

from tui.events import MonitorEvent

EVENT_TYPES: tuple[type, ...] = get_args(MonitorEvent)

_Event = TypeVar("_Event")
_Handler = TypeVar("_Handler")
_MARK = "__handles_event__"
_TABLES: dict[type, dict[type, str]] = {}  # handlers_of's, by handler class


def handles(
    kind: type[_Event],
) -> Callable[[Callable[[_Handler, _Event], None]], Callable[[_Handler, _Event], None]]:
    """Mark a method as its class's handler of the monitor event type ``kind``."""
    if kind not in EVENT_TYPES:
        raise TypeError(f"{kind.__name__} is not a monitor event (tui.events.MonitorEvent)")

    def mark(method: Callable[[_Handler, _Event], None]) -> Callable[[_Handler, _Event], None]:
        setattr(method, _MARK, kind)
        return method

    return mark


def handlers_of(cls: type) -> dict[type, str]:
    """Event type -> the name of the method of ``cls`` (its own or inherited, the
    subclass's first) marked ``@handles`` it; two in one class for one type: an error."""
    if cls in _TABLES:
        return _TABLES[cls]
    table: dict[type, str] = {}
    for klass in reversed(cls.__mro__):
        own: dict[type, str] = {}
        for name, member in vars(klass).items():
            kind = getattr(member, _MARK, None) if inspect.isfunction(member) else None
            if kind is None:
                continue
            if kind in own:
                raise TypeError(
                    f"{klass.__name__} handles {kind.__name__} twice: {own[kind]} and {name}"
                )
            own[kind] = name
        table.update(own)
    _TABLES[cls] = table
    return table


def dispatch(events: Iterable[MonitorEvent], handler: object) -> None:
    """Call ``handler``'s method for each event, in order (none: the event is skipped)."""
    table = handlers_of(type(handler))
    for event in events:
        name = table.get(type(event))
        if name is not None:
            getattr(handler, name)(event)
