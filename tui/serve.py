"""The monitor on a frame source: the Textual app, or headless printing.

Its own module, not ``tui.cli``'s, so that the command line and the demo launcher
(``tui.launcher``, which the command line starts) both use it without importing each
other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from tui.sources import FrameSource
from tui.state import MonitorState

if TYPE_CHECKING:
    from tui.options import MonitorOptions
    from tui.screens.confirm_stop import StoppableScript


def serve(
    source: FrameSource,
    options: MonitorOptions,
    *,
    companion: Callable[[], int | None] | None = None,
    script: StoppableScript | None = None,
) -> int:
    """Run the monitor on ``source``: the Textual app, or headless printing.

    ``options``: the user's, from the command line (``MonitorOptions.from_args``).
    ``companion`` gives the exit status of a process the monitor was started for (the
    demo trainer, the script of ``traintop run``), None while it runs: a trainer that
    dies is reported, and a headless monitor then stops instead of waiting for a run
    that will never come. ``script``: the screen's ``X`` stops it (``traintop run``).
    """
    state = MonitorState(options.thresholds)
    if options.headless:
        from tui.headless import HeadlessMonitor, run_headless

        monitor = HeadlessMonitor(
            summary_every=options.summary_every,
            record_path=options.record,
            fail_on=options.fail_on,
            state=state,
        )
        return asyncio.run(
            run_headless(
                source,
                monitor,
                exit_when_done=options.exit_when_done,
                companion=companion,
            )
        )
    from tui.app import make_app

    app = make_app(
        source,
        record_path=options.record,
        state=state,
        companion=companion,
        script=script,
        mode=options.mode,
        compare_on_start=options.compare_on_start,
    )
    result = app.run()
    return app.return_code or (result or 0)
