"""One dispatch of monitor events to whoever shows them (the app, headless mode).

A handler defines ``handle_<event>`` methods for the events it shows (``handle_run_connected``
for ``RunConnected``, ...); ``dispatch`` calls them in order and skips the events a handler
has no method for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import get_args

from tui.events import MonitorEvent

EVENT_TYPES: tuple[type, ...] = get_args(MonitorEvent)
HANDLER_NAMES: dict[type, str] = {
    kind: "handle_" + re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__).lower() for kind in EVENT_TYPES
}


def dispatch(events: Iterable[MonitorEvent], handler: object) -> None:
    """Call ``handler``'s method for each event, in order (none: the event is skipped)."""
    for event in events:
        method = getattr(handler, HANDLER_NAMES[type(event)], None)
        if method is not None:
            method(event)
