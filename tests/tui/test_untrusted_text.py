"""A run's own text is text: hostile strings in every string field of every frame kind
reach the screen as plain text (never markup), bounded, with no control characters, and
the app survives and draws them (its main screen, the alert detail, the anomaly report,
the checks view, help, the heatmap).

A fixed, broad list of hostile strings stands in for a property test's generator
(hypothesis is not a dependency): markup of Rich and of Textual, terminal escape
sequences, control characters and NUL, lone surrogates, wide, combining and
zero-width characters, right-to-left text and overrides, and a 100 kB name.
"""

from __future__ import annotations

import io
import unicodedata
from typing import Any

import pytest
from rich.console import Console
from textual.app import App

from probes.kernel.wire import make_frame
from tests.frames import anomaly_report, evaluation, hello, step
from tests.waiting import settle
from tui.app import make_app
from tui.screens.alert_detail import AlertDetail
from tui.screens.anomaly_report import AnomalyReportScreen
from tui.screens.checks import ChecksScreen
from tui.screens.help import HelpScreen
from tui.sources import FrameListSource
from tui.text import NAME_LIMIT, plain_block, plain_line, plain_name
from tui.widgets import RunList, StatusLine

HOSTILE: dict[str, str] = {
    "closing tag": "[/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:537] Connection closed",
    "open tag": "[bold",
    "link": "[link=https://example.invalid/x]click[/link]",
    "action": "[@click=app.quit]quit[/]",
    "style and close": "[red on white]red[/red] [/]",
    "escaped bracket": "\\[not markup] and a trailing backslash\\",
    "textual variable": "$accent [$error]x[/]",
    "ansi colour": "\x1b[31mred\x1b[0m text",
    "ansi screen": "\x1b[2J\x1b[H\x1b[?1049l cleared",
    "osc title": "\x1b]0;owned\x07 title",
    "8-bit csi": "\x9b31m eight-bit",
    "controls": "a\x00b\x07c\x08d\x7fe\x1bf",
    "line breaks": "one\ntwo\r\nthree\rfour\u2028five",
    "tabs": "col\tcol\tcol",
    "wide": "表格の名前" * 20,
    "combining": "e\u0301" * 40 + "a" + "\u0300" * 300,
    "zero width": "a\u200bb\u200dc\ufeffd\u2060e",
    "rtl": "שלום עולם مرحبا",
    "rtl override": "\u202eevil\u202c and \u2066isolate\u2069",
    "emoji": "🙂👩‍👩‍👧🏳️‍🌈",
    "lone surrogate": "bad \ud800 surrogate",
    "format strings": "%s %d {0} {name!r}",
    "only markup": "[]" * 2000,
    "huge name": "x" * 100_000,
    "huge markup": "[/" * 50_000,
    "empty": "",
    "spaces": "   ",
}
ENDED_WITH = "error: RuntimeError: "
ALONE = ("empty", "huge name", "huge markup")  # what they test is their whole size
_JOINED = [case for case in HOSTILE if case not in ALONE]
# The app walk is the costly part (about 3 s a run): every hostile string goes through
# it, three joined into one where they need not be alone (their ingredients side by side
# in every field, which only adds ways for them to combine into markup).
APP_CASES: dict[str, str] = {
    **{
        " + ".join(_JOINED[i : i + 3]): "".join(HOSTILE[c] for c in _JOINED[i : i + 3])
        for i in range(0, len(_JOINED), 3)
    },
    **{case: HOSTILE[case] for case in ALONE},
}


def hostile_frames(text: str) -> list[dict[str, Any]]:
    """A run whose every string field holds ``text``, then a 2-rank job whose id, name
    and hosts do: hello (name, layers, params, host, job, model, optimizer), steps
    (scalar names), evals (scalar names), events, a probe alert (kind, subject,
    evidence, signal, experiments, layers, folded), an anomaly report, a check report,
    acks and a bye whose reason is an error of ``text``."""
    layers = [text, text + ".1", "head"]
    greeting = {
        **hello(name=text, layers=layers),
        "host": text,
        "model": text,
        "optimizer": text,
        "params": [text, text + ".bias", "head.weight"],
        "argv": [text],
        "torch": text,
    }
    frames: list[dict[str, Any]] = [greeting]
    for i in range(12):
        record = step(i, seq=i + 1)
        record["scalars"] = {"loss": 1.0 / (1 + i), text: 1.0, "lr" + text: 0.1}
        frames.append(record)
    frames.append(
        {**evaluation(11, seq=20), "scalars": {"val_loss" + text: 0.5, text: 0.4, "val_loss": 0.6}}
    )
    frames.append(make_frame("event", run="run-a", name=text, step=3, message=text, seq=21))
    frames.append(make_frame("event", run="run-a", name="lr_scale", step=4, reason=text, seq=22))
    frames.append(
        make_frame(
            "alert",
            run="run-a",
            step=5,
            seq=23,
            alert={
                "kind": text,
                "severity": text,
                "step": 5,
                "subject": text,
                "evidence": {text: text, "rows": 12, "ratio": 0.5, "names": [text, text]},
                "signal": text,
                "experiments": [text, text],
                "layers": [text, text + ".1"],
                "folded": [f"{text}@6", "non_finite@7"],
            },
        )
    )
    report = anomaly_report(8)
    report["backward_op"] = text
    report["module_of_backward_op"] = text
    report["batch"] = text
    report["first_non_finite"] = {**report["first_non_finite"], "name": text, "type": text}
    report["first_non_finite"]["inputs"][0] = {**report["first_non_finite"]["inputs"][0]}
    report["first_non_finite"]["inputs"][0]["shape"] = [text, 3]
    report["forward_traceback"] = [
        {"file": text, "line": text, "function": text, "code": text},
        {"file": "model.py", "line": 12, "function": "forward", "code": text},
    ]
    report["replayed"] = True  # opened with v below, not popped up at once
    frames.append(report)
    frames.append(
        make_frame(
            "event",
            run="run-a",
            name="check_report",
            step=0,
            check=text,
            ok=False,
            summary={text: text},
            findings=[text],
            text=text + "\n" + text,
            seq=24,
        )
    )
    frames.append(make_frame("ack", run="run-a", command=text, ok=False, result=text, state={}))
    frames.append(make_frame("bye", run="run-a", reason=ENDED_WITH + text))
    # A job: its id and name, its ranks' hosts (the run list's header, the ranks panel).
    for rank in (0, 1):
        frames.append(
            {
                **hello(run=f"rank-{rank}", name=text, layers=["a", "b"]),
                "job": "job " + text,  # (an empty id is no job)
                "rank": rank,
                "world_size": 2,
                "host": text,
            }
        )
        frames.append(step(0, run=f"rank-{rank}", layers=2))
    return frames


def screen_text(app: App[Any]) -> str:
    """What the terminal shows now, as plain text (the screen drawn whole, as a
    screenshot draws it)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text()


FORBIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def assert_plain(shown: str, where: str) -> None:
    """Nothing drawn holds an escape, a control or a format character (bidi overrides,
    zero-width characters) or a surrogate: line breaks of the screen's rows aside."""
    bad = {ch for ch in shown if ch != "\n" and unicodedata.category(ch) in FORBIDDEN}
    assert not bad, f"{where}: {sorted(map(hex, map(ord, bad)))}"


def fragment(text: str, length: int = 6) -> str:
    """The start of ``text`` as the screen shows it (cleaned), to look for."""
    return plain_name(text)[:length].strip()


@pytest.mark.parametrize("case", list(APP_CASES))
async def test_hostile_text_in_every_field_is_shown_as_plain_text(case: str) -> None:
    text = APP_CASES[case]
    app = make_app(FrameListSource(hostile_frames(text)))
    async with app.run_test(size=(80, 24)) as pilot:
        status = app.query_one(StatusLine)
        await settle(pilot, lambda: ENDED_WITH.strip() in status.text and len(app.state.runs) == 3)
        await pilot.pause()
        shown = screen_text(app)
        assert_plain(shown, "main screen")
        assert fragment(text, 5) in status.text  # the run's name, escaped not parsed
        assert "error: RuntimeError" in status.text  # how the run ended, its text cut
        assert app.query_one(RunList).has_class("-several")  # the run and the job

        await pilot.press("enter")  # the alert, whatever has the focus
        await settle(pilot, lambda: isinstance(app.screen, AlertDetail))
        await pilot.pause()
        shown = screen_text(app)
        assert_plain(shown, "alert detail")
        assert fragment(text) in shown.replace("\n", "")
        await pilot.press("escape")

        await pilot.press("v")
        await settle(pilot, lambda: isinstance(app.screen, AnomalyReportScreen))
        await pilot.pause()
        shown = screen_text(app)
        assert_plain(shown, "anomaly report")
        assert fragment(text) in shown.replace("\n", "")
        await pilot.press("escape")

        await pilot.press("c")
        await settle(pilot, lambda: isinstance(app.screen, ChecksScreen))
        await pilot.pause()
        assert_plain(screen_text(app), "checks")
        await pilot.press("escape")

        await pilot.press("question_mark")
        await settle(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        assert_plain(screen_text(app), "help")
        await pilot.press("escape")

        await pilot.press("h")  # the heatmap names the layers too
        await pilot.pause()
        await pilot.press("r")  # the job's rank: the ranks panel, its hosts, its title
        await settle(pilot, lambda: app.current_run is not None and app.current_run.job)
        await pilot.pause()
        assert_plain(screen_text(app), "job view")
        assert app.is_running
        # the toasts held the run's words as plain text too
        messages = [n.message for n in app._notifications] + [n.title for n in app._notifications]
        assert all(not n.markup for n in app._notifications)
        for message in messages:
            assert_plain(message, "a toast")


@pytest.mark.parametrize("case", list(HOSTILE))
def test_plain_text_is_clean_and_bounded(case: str) -> None:
    text = HOSTILE[case]
    for cleaned, limit in (
        (plain_line(text), 400),
        (plain_name(text), NAME_LIMIT),
        (plain_block(text), 8000),
    ):
        assert len(cleaned) <= limit
        assert not {ch for ch in cleaned if ch != "\n" and unicodedata.category(ch) in FORBIDDEN}
        assert "\x1b" not in cleaned
    assert "\n" not in plain_line(text)


def test_plain_text_keeps_what_is_printable() -> None:
    assert plain_line("[/x.cc:1] boom") == "[/x.cc:1] boom"  # markup is kept, as text
    assert plain_line("\x1b[31mred\x1b[0m") == "red"  # escapes go whole
    assert plain_line("a\tb\nc") == "a b c"
    assert plain_block("a\r\nb\rc") == "a\nb\nc"
    assert plain_line("表格") == "表格" and plain_line("e\u0301") == "e\u0301"
    assert plain_line("\u202eevil") == "evil"
    assert plain_line("x" * 1000, 10) == "x" * 9 + "…"
    assert len(plain_block("line\n" * 1000).split("\n")) == 200


def test_every_hostile_string_goes_through_the_app() -> None:
    joined = "".join(APP_CASES.values())
    assert all(HOSTILE[case] in joined for case in HOSTILE if HOSTILE[case])
