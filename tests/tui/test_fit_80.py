"""80 columns that hold what matters: names shortened from the middle, the status line
abbreviated by rule, alert rows and the layer table fitted, the legend out of the plot,
``? Help`` in the footer and every key in the help (issue 19, item 5)."""

from __future__ import annotations

import pytest

from tests.frames import hello, step
from tests.tui.test_snapshots import GPT_LAYERS, gpt_run, quiet, replay_over
from tests.waiting import settle
from tui.format import GIVE_WAY, StatusField, fit_status, status_fields
from tui.state import MonitorState
from tui.text import ELLIPSIS, cut_words, shorten_middle
from tui.widgets.alerts_panel import fit_columns
from tui.widgets.layer_table import COLUMNS, PEAK_COLUMN, SPARK_MIN, SPARK_WIDTH, fit_widths
from tui.widgets.loss_chart import chart_title

# --- shortening a name from the middle -----------------------------------------------


@pytest.mark.parametrize("name", GPT_LAYERS)
@pytest.mark.parametrize("width", [6, 12, 16, 20, 24])
def test_a_shortened_name_keeps_its_start_and_end_in_its_width(name: str, width: int) -> None:
    short = shorten_middle(name, width)
    assert len(short) <= width
    if len(name) <= width:
        assert short == name
    else:
        head, _, tail = short.partition(ELLIPSIS)
        assert short.count(ELLIPSIS) == 1 and name.startswith(head) and name.endswith(tail)
        assert head and tail  # both ends say something


def test_the_end_is_kept_in_whole_segments_and_tells_blocks_apart() -> None:
    assert shorten_middle("transformer.h.0.attn.c_proj", 20) == "transf…0.attn.c_proj"
    assert shorten_middle("transformer.h.11.mlp.c_fc", 18) == "transf…11.mlp.c_fc"
    assert shorten_middle("transformer.h.11.mlp.c_fc", 12) == "tra…mlp.c_fc"
    assert shorten_middle("lm_head", 12) == "lm_head"
    # no whole segment fits: by characters, the end given the larger share
    assert shorten_middle("abcdefghijklmnopqrstuvwxyz", 10) == "abc…uvwxyz"
    assert shorten_middle("anything", 1) == ELLIPSIS and shorten_middle("anything", 0) == ""


def test_a_cut_ends_after_a_word_where_one_is_near() -> None:
    assert cut_words("sigmoid-stack", 9) == "sigmoid-…"
    assert cut_words("shapes cannot be multiplied (64x3 and 4x8)", 20) == "shapes cannot be …"
    assert cut_words("abcdefghijklmnop", 8) == "abcdefg…"  # no word end: by characters
    assert cut_words("short", 8) == "short"


# --- the layer table, the alerts panel, the legend -------------------------------------


def test_at_80_columns_every_layer_column_stays_on_screen() -> None:
    names, spark, peaks = fit_widths(80, GPT_LAYERS, peaks=True)
    fixed = sum(w for key, _, w in COLUMNS if key not in ("layer", "history"))
    assert names + spark + fixed + 2 * len(COLUMNS) + 2 <= 80  # padding, scroll bar
    assert spark == SPARK_MIN and names >= 18  # the history gave way first
    assert not peaks  # ... and the largest element's column before the names
    longest = max(map(len, GPT_LAYERS))
    assert fit_widths(200, GPT_LAYERS) == (longest, SPARK_WIDTH, False)  # not measured
    assert fit_widths(200, GPT_LAYERS, peaks=True) == (longest, SPARK_WIDTH, True)


def test_the_peak_column_shows_where_names_stay_whole_and_the_history_keeps_its_minimum() -> None:
    short = ["fc1", "fc2", "head"]
    names, spark, peaks = fit_widths(80, short, peaks=True)
    fixed = sum(w for key, _, w in (*COLUMNS, PEAK_COLUMN) if key not in ("layer", "history"))
    assert peaks and names == len("layer") and spark >= SPARK_MIN
    assert names + spark + fixed + 2 * (len(COLUMNS) + 1) + 2 <= 80
    # one column narrower than it needs: it gives way, the others keep their widths
    needed = 2 + 2 * (len(COLUMNS) + 1) + fixed + len("layer") + SPARK_MIN
    assert fit_widths(needed, short, peaks=True)[2]
    assert not fit_widths(needed - 1, short, peaks=True)[2]


def test_alert_columns_fit_80_and_keep_the_folded_count() -> None:
    rows = [("1,234", "exploding_gradient", "transformer.h.11.mlp.c_fc +3", "+2 folded: a, b")]
    step_w, kind, subject, state = fit_columns(80, rows)
    assert 1 + step_w + kind + subject + state + 2 * 5 + 2 <= 80
    assert step_w == 5 and kind == len("exploding_gradient")
    assert state >= len("+2 folded")  # the count whole, the names if there is room
    long_kind = [("7", "bce_with_logits_given_probabilities", "run", "")]
    assert fit_columns(80, long_kind)[1] <= 24  # shortened, from the middle


def test_the_legend_is_abbreviated_by_rule_and_keeps_its_marks() -> None:
    legend = [("train loss", "cyan"), ("validation (val_loss)", "dark_orange")]
    wide = chart_title(160, True, True, 23.0, legend).plain
    assert "loss, log scale, train smoothed" in wide and "non-finite from step 23" in wide
    assert "train loss" in wide and "validation (val_loss)" in wide
    narrow = chart_title(60, True, True, 23.0, legend)
    assert len(narrow.plain) + 2 <= 60
    assert "nan@23" in narrow.plain and "val_loss" in narrow.plain and "train" in narrow.plain
    assert narrow.plain.count("━━") == 2
    assert {span.style for span in narrow.spans} == {"cyan", "dark_orange"}


# --- the status line ---------------------------------------------------------------


def busy_state(name: str = "exploding-gradients-lr-0.5") -> MonitorState:
    """A run with every field: the probe's share, two runs, no drops."""
    state = MonitorState()
    state.apply(1, hello(name=name))
    for i in range(30):
        frame = step(i)
        frame["probe_time"] = 0.16 * frame["duration"]
        state.apply(1, frame)
    state.apply(2, hello(run="run-b", name="other"))
    return state


@pytest.mark.parametrize("width", range(40, 121, 4))
def test_a_status_field_is_shown_whole_or_not_at_all(width: int) -> None:
    state = busy_state()
    run = state.runs["run-a"]
    fields, separator = fit_status(run, state, "x", width)
    whole = {str(f) for f in status_fields(run, state, "x")} | {
        str(f) for f in status_fields(run, state, "x", short=True)
    }
    assert len(separator.join(fields)) <= width or width < 60
    for field in fields[1:]:  # (the name may be cut, with an ellipsis)
        assert str(field) in whole, field
    assert fields[0] == run.name or fields[0].endswith(ELLIPSIS)


def test_fields_give_way_in_order() -> None:
    state = busy_state()
    run = state.runs["run-a"]
    available = {getattr(f, "role", "") for f in status_fields(run, state, "x", short=True)}
    assert {"probe", "runs", "dropped_none"} <= available
    for width in range(40, 121):
        present = {getattr(f, "role", "") for f in fit_status(run, state, "x", width)[0]}
        for index, role in enumerate(GIVE_WAY):
            if role in available and role not in present:  # all before it went first
                assert not present & set(GIVE_WAY[:index]), (width, present)
        assert {"name", "step", "alerts"} <= present and present & {"connection", "control"}
    at_80, _ = fit_status(run, state, "x", 78)  # (the status line's width at 80)
    roles = {getattr(f, "role", "") for f in at_80}
    assert "probe" not in roles and {"runs", "dropped_none", "speed"} <= roles
    assert at_80[0].startswith("exploding-gradients")  # the room left goes to the name


def test_a_drop_count_above_zero_outlasts_drop_zero() -> None:
    assert "dropped" in GIVE_WAY and GIVE_WAY.index("dropped") > GIVE_WAY.index("dropped_none")
    assert StatusField("x", role="probe").role == "probe"


# --- the footer and the help ---------------------------------------------------------


async def test_at_80x24_help_is_in_the_footer_and_the_table_keeps_its_columns() -> None:
    from textual.widgets._footer import FooterKey

    from tui.app import make_app
    from tui.sources import FrameListSource
    from tui.widgets import AlertsPanel, LayerTable, LossChart

    app = quiet(make_app(FrameListSource(gpt_run())))
    async with app.run_test(size=(80, 24)) as pilot:
        panel, table = app.query_one(AlertsPanel), app.query_one(LayerTable)
        await settle(pilot, lambda: replay_over(app) and bool(panel.entries))
        # the footer lays its keys out after it composes them
        await settle(pilot, lambda: any(k.region.width for k in app.screen.query(FooterKey)))
        help_key = next(k for k in app.screen.query(FooterKey) if k.key == "question_mark")
        assert help_key.region.right <= 80 and help_key.region.width > 0
        status = table.columns[list(table.columns)[-1]]
        assert table.virtual_size.width <= table.size.width, status  # no sideways scroll
        row = table.row_text("transformer.h.0.attn.c_proj")
        assert row[0].startswith("transf") and row[0].endswith("attn.c_proj")
        assert row[5] == "exploding"
        alert_row = [str(cell) for cell in panel.get_row_at(0)]
        assert alert_row[3].endswith("attn.c_proj +1")
        chart = app.query_one(LossChart)
        assert "━━ train loss" in chart.title_text


def test_the_help_lists_every_key_of_the_main_screen() -> None:
    from tui.app import TraintopApp
    from tui.screens.help import keys_for

    shown = {"minus": "-", "plus": "+", "equals_sign": "+", "question_mark": "?"}
    for mode in ("live", "demo", "replay"):
        listed = {token for key, _ in keys_for(mode) for token in key.split()}
        for binding in TraintopApp.BINDINGS:
            for key in binding.key.split(","):  # type: ignore[union-attr]
                assert shown.get(key, key) in listed, (mode, key)
    said = dict(keys_for("live"))
    assert "rank" in said["k"] and "q" in said["ctrl+c"]
