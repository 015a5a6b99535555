"""Bounded, decimated run history: merging, thinning and replay."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import pytest

from probes.kernel.merge import has_non_finite
from probes.kernel.replay import ReplayHistory
from probes.kernel.thinning import RECORDS, Thinner, span_of

Record = dict[str, Any]


def step(index: int, loss: float | None = None, **fields: Any) -> Record:
    loss = 1.0 / (index + 1) if loss is None else loss
    return {"kind": "step", "step": index, "scalars": {"loss": loss}, **fields}


def covered(records: list[Record]) -> list[tuple[int, int]]:
    return [span_of(r) for r in records if r.get("kind") == "step"]


# --- has_non_finite --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"kind": "step", "step": 1, "loss": 0.5}, False),
        ({"kind": "step", "loss": math.nan}, True),
        ({"kind": "step", "loss": math.inf}, True),
        ({"kind": "step", "loss": -math.inf}, True),
        ({"a": {"b": {"c": [1.0, 2.0, [3.0, math.nan]]}}}, True),
        ({"a": {"b": {"c": [1.0, 2.0, [3.0, 4.0]]}}}, False),
        ({"a": [{"x": 1.0}, {"y": math.inf}]}, True),
        ({"a": (1.0, (2.0, -math.inf))}, True),
        ({"a": [None, "nan", True, 10**400 // 10**399]}, False),
        ({"a": [], "b": {}}, False),
        ({}, False),
    ],
)
def test_has_non_finite(record: Record, expected: bool) -> None:
    assert has_non_finite(record) is expected


# --- collapse -------------------------------------------------------------------------


def test_merge_single_record_unchanged() -> None:
    record = step(3)
    assert RECORDS.collapse([record]) is record


def test_merge_keeps_last_and_sets_span() -> None:
    records = [step(i) for i in range(4, 9)]
    merged = RECORDS.collapse(records)
    assert merged["step"] == 8
    assert merged["scalars"] == records[-1]["scalars"]
    assert merged["span"] == [4, 8]
    assert "span" not in records[-1]  # inputs are not modified


def test_merge_keeps_first_non_finite() -> None:
    records = [step(0), step(1, math.nan), step(2), step(3, math.inf), step(4)]
    merged = RECORDS.collapse(records)
    assert merged["step"] == 1
    assert math.isnan(merged["scalars"]["loss"])
    assert merged["span"] == [0, 4]


def test_merge_non_finite_last() -> None:
    records = [step(0), step(1), step(2, -math.inf)]
    merged = RECORDS.collapse(records)
    assert merged["step"] == 2
    assert has_non_finite(merged)
    assert merged["span"] == [0, 2]


def test_merge_already_merged_records() -> None:
    left = RECORDS.collapse([step(i) for i in range(0, 5)])
    right = RECORDS.collapse([step(i) for i in range(5, 10)])
    merged = RECORDS.collapse([left, right])
    assert merged["span"] == [0, 9]
    assert merged["step"] == 9

    with_nan = RECORDS.collapse([step(10), step(11, math.nan), step(12)])
    merged = RECORDS.collapse([merged, with_nan, RECORDS.collapse([step(13), step(14)])])
    assert merged["span"] == [0, 14]
    assert merged["step"] == 11
    assert has_non_finite(merged)


# --- thinning, over step records as dicts -----------------------------------------------


def thin_steps(records: list[Record], budget: int, keep_first: bool = False) -> list[Record]:
    """The sender's thinning policy over records, one collect."""
    return Thinner(RECORDS, first_alone=keep_first).thin(records, budget)


def test_thin_within_budget_unchanged() -> None:
    records = [step(i) for i in range(10)]
    assert thin_steps(records, 10) is records
    assert thin_steps(records, 50) is records
    assert thin_steps(records, 0) is records


@pytest.mark.parametrize(("count", "budget"), [(11, 10), (100, 10), (1000, 7), (37, 36), (5, 1)])
def test_thin_respects_budget(count: int, budget: int) -> None:
    records = [step(i) for i in range(count)]
    thinned = thin_steps(records, budget)
    assert 1 <= len(thinned) <= budget
    spans = covered(thinned)
    # The spans tile the input with no gap and no overlap, in order.
    assert spans[0][0] == 0
    assert spans[-1][1] == count - 1
    for (_, end), (start, _) in pairwise(spans):
        assert start == end + 1
    # The most recent record survives exactly.
    assert thinned[-1]["step"] == count - 1
    assert thinned[-1]["scalars"] == records[-1]["scalars"]


@pytest.mark.parametrize("position", [0, 1, 50, 98, 99])
def test_thin_never_drops_non_finite(position: int) -> None:
    records = [step(i) for i in range(100)]
    records[position] = step(position, math.nan)
    thinned = thin_steps(records, 7)
    bad = [r for r in thinned if has_non_finite(r)]
    assert len(bad) == 1
    assert bad[0]["step"] == position
    first, last = span_of(bad[0])
    assert first <= position <= last


def test_thin_keeps_every_non_finite_group() -> None:
    records = [step(i, math.nan if i % 25 == 3 else None) for i in range(100)]
    thinned = thin_steps(records, 4)
    assert [r["step"] for r in thinned if has_non_finite(r)] == [3, 28, 53, 78]


def test_thin_keeps_other_kinds_in_order() -> None:
    records: list[Record] = []
    others: list[Record] = []
    for i in range(60):
        records.append(step(i))
        if i % 20 == 10:
            event = {"kind": "event", "name": f"e{i}", "step": i}
            records.append(event)
            others.append(event)
        if i % 30 == 29:
            evaluation = {"kind": "eval", "step": i, "scalars": {"val_loss": 0.1}}
            records.append(evaluation)
            others.append(evaluation)
    thinned = thin_steps(records, 6)
    kept_others = [r for r in thinned if r.get("kind") != "step"]
    assert kept_others == others
    assert all(a is b for a, b in zip(kept_others, others, strict=True))
    steps = covered(thinned)
    assert len(steps) < 60
    # Every step record lies before / after the other records as it did in the input.
    for index, record in enumerate(thinned):
        if record.get("kind") == "step":
            continue
        before = covered(thinned[:index])
        after = covered(thinned[index + 1 :])
        assert all(end <= record["step"] for _, end in before)
        assert all(start > record["step"] for start, _ in after)


def test_thin_keep_first() -> None:
    records = [step(i) for i in range(100)]
    thinned = thin_steps(records, 10, keep_first=True)
    assert thinned[0] is records[0]
    assert "span" not in thinned[0]
    assert len(thinned) <= 11
    spans = covered(thinned)
    assert spans[0] == (0, 0)
    assert spans[1][0] == 1
    assert spans[-1][1] == 99

    without = thin_steps(records, 10)
    assert without[0] is not records[0]
    assert span_of(without[0])[0] == 0
    assert span_of(without[0])[1] > 0


# --- ReplayHistory -------------------------------------------------------------------------


def test_capacity_too_small() -> None:
    for capacity in (-1, 0, 3):
        with pytest.raises(ValueError):
            ReplayHistory(capacity)
    assert ReplayHistory(4).capacity == 4


def test_history_small_run_kept_exactly() -> None:
    history = ReplayHistory(capacity=64)
    records = [step(i) for i in range(30)]
    for record in records:
        history.add(record)
    assert history.replay() == records
    assert len(history) == 30


def test_history_long_run_bounded() -> None:
    capacity = 64
    history = ReplayHistory(capacity=capacity)
    records = [step(i) for i in range(10_000)]
    for record in records:
        history.add(record)
        assert len(history) <= capacity + 1
    replay = history.replay()
    assert len(replay) == len(history)
    # The first step, exactly as given.
    assert replay[0] is records[0]
    assert replay[0]["step"] == 0
    # The most recent step, exactly as given.
    assert replay[-1] is records[-1]
    # Steps in increasing order, covering the whole run without overlap.
    spans = covered(replay)
    assert spans[0] == (0, 0)
    assert spans[-1] == (9_999, 9_999)
    for (_, end), (start, _) in pairwise(spans):
        assert start == end + 1
    # Resolution falls off with age: the recent records are exact.
    assert all("span" not in r for r in replay[-capacity // 4 :])


def test_history_replay_order() -> None:
    history = ReplayHistory(capacity=8)
    added_others: list[Record] = []
    added_evals: list[Record] = []
    for i in range(50):
        history.add(step(i))
        if i % 5 == 0:
            evaluation = {"kind": "eval", "step": i, "scalars": {"val_loss": 1.0 / (i + 1)}}
            history.add(evaluation)
            added_evals.append(evaluation)
        if i % 7 == 0:
            event = {"kind": "event", "name": f"e{i}", "step": i}
            history.add(event)
            added_others.append(event)
        if i == 20:
            alert = {"kind": "alert", "message": "loss spike", "step": i}
            history.add(alert)
            added_others.append(alert)
    replay = history.replay()
    kinds = [r["kind"] for r in replay]
    n_steps = kinds.count("step")
    n_evals = kinds.count("eval")
    assert kinds[:n_steps] == ["step"] * n_steps
    assert kinds[n_steps : n_steps + n_evals] == ["eval"] * n_evals
    assert all(k not in ("step", "eval") for k in kinds[n_steps + n_evals :])
    assert n_steps <= 8 + 1
    assert n_evals <= 8

    step_spans = covered(replay)
    assert [s for s, _ in step_spans] == sorted(s for s, _ in step_spans)
    assert step_spans[0] == (0, 0)
    assert step_spans[-1] == (49, 49)
    eval_spans = [span_of(r) for r in replay if r["kind"] == "eval"]
    assert eval_spans[-1] == (45, 45)
    assert [s for s, _ in eval_spans] == sorted(s for s, _ in eval_spans)

    # Other records: the most recent `capacity`, in the order added.
    assert replay[n_steps + n_evals :] == added_others[-8:]
    assert len(history) == len(replay) <= 1 + 3 * 8


def test_history_keeps_non_finite_after_heavy_thinning() -> None:
    history = ReplayHistory(capacity=16)
    for i in range(5_000):
        history.add(step(i, math.nan if i == 5 else None))
    replay = history.replay()
    bad = [r for r in replay if has_non_finite(r)]
    assert len(bad) == 1
    assert bad[0]["step"] == 5
    first, last = span_of(bad[0])
    assert first <= 5 <= last
    assert last - first > 1  # it really was merged with its neighbours
    assert replay[-1]["step"] == 4_999


def test_history_first_step_non_finite() -> None:
    history = ReplayHistory(capacity=4)
    history.add(step(0, math.inf))
    for i in range(1, 200):
        history.add(step(i))
    replay = history.replay()
    assert replay[0]["step"] == 0
    assert math.isinf(replay[0]["scalars"]["loss"])
    assert len(history) <= 5


def test_merged_history_records_updated_if_any_step_did() -> None:
    records = [{"kind": "step", "step": n, "optimizer_step": False} for n in range(3)]
    assert RECORDS.collapse(records)["optimizer_step"] is False
    records[1].pop("optimizer_step")  # step 1 updated
    assert "optimizer_step" not in RECORDS.collapse(records)
