"""Keys that work or say why: Enter opens an alert whatever has the focus, Ctrl-C quits
as q does, and in a replay the command keys say the run is not live."""

from __future__ import annotations

import pytest

from tests.frames import exploding_run, probe_alert, short_run
from tests.waiting import settle
from tui.app import REPLAY_NOT_LIVE, TraintopApp, make_app
from tui.screens.alert_detail import AlertDetail
from tui.screens.confirm import Confirm
from tui.screens.help import HelpScreen
from tui.sources import FrameListSource
from tui.widgets import AlertsPanel, LayerTable, RunList


def two_alerts() -> list:
    """A run with two alerts in its panel: a probe's data check, then an explosion."""
    frames = exploding_run()
    frames.insert(1, probe_alert("leakage", "error", 0, seq=100))
    return frames


async def alerts_shown(pilot, app: TraintopApp, count: int) -> AlertsPanel:
    panel = app.query_one(AlertsPanel)
    await settle(pilot, lambda: len(panel.entries) >= count)
    return panel


@pytest.mark.parametrize("focused", [LayerTable, RunList, None])
async def test_enter_opens_the_first_alert_whatever_has_the_focus(focused) -> None:
    app = make_app(FrameListSource(two_alerts()))
    async with app.run_test(size=(120, 40)) as pilot:
        panel = await alerts_shown(pilot, app, 2)
        if focused is None:
            app.set_focus(None)
        else:
            app.query_one(focused).focus()
        await pilot.pause()
        await pilot.press("enter")
        await settle(pilot, lambda: isinstance(app.screen, AlertDetail))
        assert app.screen.entry is panel.entries[0]


async def test_enter_opens_the_alert_under_the_cursor() -> None:
    app = make_app(FrameListSource(two_alerts()))
    async with app.run_test(size=(120, 40)) as pilot:
        panel = await alerts_shown(pilot, app, 2)
        panel.move_cursor(row=1)
        app.query_one(LayerTable).focus()
        await pilot.pause()
        await pilot.press("enter")
        await settle(pilot, lambda: isinstance(app.screen, AlertDetail))
        assert app.screen.entry is panel.entries[1]


async def test_enter_with_no_alert_says_so() -> None:
    app = make_app(FrameListSource(short_run(5)))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: app.current_run is not None)
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is app.screen_stack[0]
        assert any(n.message == "no alert to open" for n in app._notifications)


async def test_enter_on_another_screen_is_that_screens_own() -> None:
    app = make_app(FrameListSource(two_alerts()))
    async with app.run_test(size=(120, 40)) as pilot:
        await alerts_shown(pilot, app, 2)
        await pilot.press("question_mark")
        await settle(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)  # no alert opened over the help


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
async def test_ctrl_c_quits_as_q_does(key: str) -> None:
    app = make_app(FrameListSource(short_run(5)))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: app.current_run is not None)
        await pilot.press(key)
        await pilot.pause()
        assert not app.is_running
    assert app.return_code == 0


async def test_ctrl_c_quits_from_a_modal_screen_too() -> None:
    app = make_app(FrameListSource(short_run(5)))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: app.current_run is not None)
        await pilot.press("question_mark")
        await settle(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert not app.is_running
    assert app.return_code == 0


@pytest.mark.parametrize("key", ["p", "n", "a", "g", "minus", "plus"])
async def test_in_a_replay_the_command_keys_say_the_run_is_not_live(key: str) -> None:
    app = make_app(FrameListSource(short_run(5)), mode="replay")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: app.current_run is not None)
        await pilot.press(key)
        await settle(pilot, lambda: any(n.message == REPLAY_NOT_LIVE for n in app._notifications))
        assert not isinstance(app.screen, Confirm)  # no question for a command never sent
        assert app.count_prefix == 0


async def test_live_the_command_keys_still_send() -> None:
    app = make_app(FrameListSource(short_run(5)), mode="live")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: app.current_run is not None)
        await pilot.press("minus")
        await settle(pilot, lambda: isinstance(app.screen, Confirm))  # it asks first
        assert not any(n.message == REPLAY_NOT_LIVE for n in app._notifications)
