"""Pre-training data checks: check_split on crafted splits, check_preprocessing."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import probes
from probes.checks import data_checks, split_rows
from probes.checks.data_checks import check_preprocessing, check_split
from probes.checks.reports import CheckReport, Finding
from tests.collector import FrameCollector

# --- crafting splits ---------------------------------------------------------------------
#
# Every split is first made as a float64 NumPy array of rows [N, F] whose LAST column is
# the target, then turned into one of four containers:
#   tensor  - a float32 torch tensor (torch's default dtype), rows are the whole row
#   numpy   - the float64 array itself
#   tuples  - a list of (features, target) tuples: (ndarray of F-1, float)
#   dataset - a TensorDataset(features float32 [N, F-1], targets float32 [N])

KINDS = ("tensor", "numpy", "tuples", "dataset")
FEATURES = 4  # columns before the target


def make(rows: np.ndarray, kind: str) -> Any:
    if kind == "tensor":
        return torch.tensor(rows, dtype=torch.float32)
    if kind == "numpy":
        return rows.copy()
    x, y = rows[:, :-1], rows[:, -1]
    if kind == "tuples":
        return [(x[i].copy(), float(y[i])) for i in range(len(rows))]
    if kind == "dataset":
        return TensorDataset(
            torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
        )
    raise AssertionError(kind)


def column(kind: str, index: int) -> int | Callable[[Any], Any]:
    """A selector for column ``index`` of the crafted rows (-1: the target)."""
    if kind in ("tensor", "numpy"):
        return index
    if index == -1:
        return 1  # the target field of an (x, y) row
    return lambda row: row[0][index]


def random_rows(n: int, seed: int, *, target: np.ndarray | None = None) -> np.ndarray:
    """``n`` distinct random rows; the target column is ``target`` (or random)."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(n, FEATURES + 1))
    if target is not None:
        rows[:, -1] = target
    return rows


def only(report: CheckReport, kind: str) -> Finding:
    found = [f for f in report.findings if f.kind == kind]
    assert len(found) == 1, f"expected one {kind}, got:\n{report}"
    return found[0]


# --- duplicates --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_duplicates_within_a_split(kind: str) -> None:
    train = random_rows(30, seed=1)
    train[7] = train[3]
    train[12] = train[3]
    val = random_rows(10, seed=2)

    report = check_split(make(train, kind), make(val, kind))

    assert report.kinds == ["duplicate_rows"]
    finding = report.findings[0]
    assert finding.severity == "warning"
    assert finding.subject == "train"
    assert finding.evidence == {"duplicates": 2, "rows": 30}
    assert finding.examples == ((3, 7), (3, 12))
    assert not report.ok
    assert report.summary["rows"] == {"train": 30, "val": 10}


@pytest.mark.parametrize("kind", KINDS)
def test_duplicates_across_train_val_and_train_test(kind: str) -> None:
    train = random_rows(30, seed=3)
    val = random_rows(20, seed=4)
    test = random_rows(15, seed=5)
    val[5] = train[2]
    val[11] = train[17]
    test[0] = train[9]
    test[3] = val[8]  # val/test share a row too

    report = check_split(make(train, kind), make(val, kind), make(test, kind))

    assert sorted(report.kinds) == ["duplicates_across_splits"] * 3
    by_subject = {f.subject: f for f in report.findings}
    assert set(by_subject) == {"train/val", "train/test", "val/test"}
    for finding in report.findings:
        assert finding.severity == "error"

    train_val = by_subject["train/val"]
    assert train_val.evidence == {"shared_rows": 2, "val_rows": 20}
    assert train_val.examples == ((2, 5), (17, 11))  # (train index, val index)

    train_test = by_subject["train/test"]
    assert train_test.evidence == {"shared_rows": 1, "test_rows": 15}
    assert train_test.examples == ((9, 0),)

    assert by_subject["val/test"].examples == ((8, 3),)
    assert not report.ok


# --- entities and time -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_entity_in_two_splits(kind: str) -> None:
    train = random_rows(30, seed=6)
    val = random_rows(20, seed=7)
    train[:, 0] = np.arange(30)  # entity id in column 0
    val[:, 0] = np.arange(100, 120)
    val[4, 0] = 7  # entity 7 of train, twice in val (counted once)
    val[9, 0] = 7
    val[12, 0] = 20

    report = check_split(make(train, kind), make(val, kind), key=column(kind, 0))

    assert report.kinds == ["entity_overlap"]
    finding = report.findings[0]
    assert finding.severity == "error"
    assert finding.subject == "train/val"
    assert finding.evidence == {"shared_entities": 2}
    # (entity, first train index, first val index)
    assert finding.examples == ((7, 7, 4), (20, 20, 12))


def test_entity_in_two_splits_dict_rows_by_key_name() -> None:
    def rows(users: list[str], seed: int) -> list[dict[str, Any]]:
        rng = np.random.default_rng(seed)
        return [{"user": u, "x": rng.normal(size=3), "y": int(rng.integers(0, 2))} for u in users]

    train = rows([f"u{i}" for i in range(10)], seed=8)
    val = rows(["v0", "v1", "u3", "v2"], seed=9)
    test = rows(["w0", "u5", "w1"], seed=10)

    report = check_split(train, val, test, key="user")

    assert report.kinds == ["entity_overlap", "entity_overlap"]
    by_subject = {f.subject: f for f in report.findings}
    assert by_subject["train/val"].examples == (("u3", 3, 2),)
    assert by_subject["train/test"].examples == (("u5", 5, 1),)
    assert all(f.severity == "error" for f in report.findings)


@pytest.mark.parametrize("kind", KINDS)
def test_time_leak(kind: str) -> None:
    train = random_rows(30, seed=11)
    val = random_rows(20, seed=12)
    test = random_rows(10, seed=13)
    train[:, 1] = np.arange(30)  # time in column 1: train ends at 29
    val[:, 1] = np.arange(30, 50)
    test[:, 1] = np.arange(50, 60)
    val[0, 1] = 29.0  # at the end of training: not earlier, not a leak
    val[3, 1] = 5.0
    val[7, 1] = 12.0

    report = check_split(make(train, kind), make(val, kind), make(test, kind), time=column(kind, 1))

    assert report.kinds == ["time_leak"]
    finding = report.findings[0]
    assert finding.severity == "error"
    assert finding.subject == "val"
    assert finding.evidence == {"rows_before_train_end": 2, "train_end": 29.0, "val_start": 5.0}
    assert finding.examples == (3, 7)


# --- missing values ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_nans_name_their_column(kind: str) -> None:
    train = random_rows(30, seed=14)
    val = random_rows(10, seed=15)
    train[4, 2] = np.nan
    train[6, 2] = np.nan
    val[1, 0] = np.nan

    report = check_split(make(train, kind), make(val, kind))

    assert sorted(report.kinds) == ["missing_values", "missing_values"]
    by_subject = {f.subject: f for f in report.findings}
    on_train = by_subject["train"]
    assert on_train.severity == "warning"
    assert on_train.evidence == {"nan_values": 2, "columns": 1, "by_column": "col 2: 2"}
    assert on_train.examples == (2,)
    assert by_subject["val"].evidence["by_column"] == "col 0: 1"
    assert not report.ok


@pytest.mark.parametrize("kind", ["tuples", "dataset"])
def test_nan_in_the_target_field_of_tuple_rows_is_counted_after_the_features(kind: str) -> None:
    train = random_rows(10, seed=16)
    train[2, -1] = np.nan  # the target: column FEATURES once the features are counted

    report = check_split(make(train, kind), make(random_rows(5, seed=17), kind))

    finding = only(report, "missing_values")
    assert finding.evidence["by_column"] == f"col {FEATURES}: 1"


# --- target shift ------------------------------------------------------------------------


def classes(counts: dict[int, int], seed: int) -> np.ndarray:
    labels = np.concatenate([np.full(n, c, dtype=float) for c, n in counts.items()])
    return np.random.default_rng(seed).permutation(labels)


@pytest.mark.parametrize("kind", KINDS)
def test_prevalence_shift(kind: str) -> None:
    train = random_rows(40, seed=18, target=classes({0: 20, 1: 10, 2: 10}, seed=0))
    val = random_rows(20, seed=19, target=classes({0: 4, 1: 6, 2: 10}, seed=1))

    report = check_split(make(train, kind), make(val, kind), target=column(kind, -1))

    assert report.kinds == ["target_shift"]
    finding = report.findings[0]
    assert finding.severity == "warning"
    assert finding.subject == "val"
    assert float(finding.evidence["class"]) == 0.0  # 50% of train, 20% of val
    assert finding.evidence["train_share"] == pytest.approx(0.5)
    assert finding.evidence["val_share"] == pytest.approx(0.2)
    assert finding.evidence["max_shift"] == pytest.approx(0.3)
    shares = report.summary["target"]
    assert sorted(shares["train"].values()) == pytest.approx([0.25, 0.25, 0.5])
    assert sorted(shares["val"].values()) == pytest.approx([0.2, 0.3, 0.5])


@pytest.mark.parametrize("kind", KINDS)
def test_small_prevalence_change_is_not_a_shift(kind: str) -> None:
    train = random_rows(40, seed=20, target=classes({0: 20, 1: 20}, seed=2))
    val = random_rows(20, seed=21, target=classes({0: 11, 1: 9}, seed=3))  # 55% vs 50%

    report = check_split(make(train, kind), make(val, kind), target=column(kind, -1))

    assert report.findings == []
    assert report.ok


@pytest.mark.parametrize("kind", KINDS)
def test_continuous_target_mean_shift(kind: str) -> None:
    rng = np.random.default_rng(22)
    train = random_rows(200, seed=23, target=rng.normal(0.0, 1.0, 200))
    val = random_rows(100, seed=24, target=rng.normal(1.5, 1.0, 100))

    report = check_split(make(train, kind), make(val, kind), target=column(kind, -1))

    finding = only(report, "target_shift")
    assert finding.severity == "warning"
    assert finding.subject == "val"
    train_y = train[:, -1].astype(np.float32).astype(np.float64)
    val_y = val[:, -1].astype(np.float32).astype(np.float64)
    expected_shift = abs(val_y.mean() - train_y.mean()) / train_y.std()
    assert expected_shift > data_checks.MEAN_SHIFT_STDS
    assert finding.evidence["train_mean"] == pytest.approx(train_y.mean(), rel=1e-4)
    assert finding.evidence["val_mean"] == pytest.approx(val_y.mean(), rel=1e-4)
    assert finding.evidence["stds_apart"] == pytest.approx(expected_shift, rel=1e-4)


# --- clean data --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_clean_data_yields_no_finding(kind: str) -> None:
    train = random_rows(40, seed=25, target=classes({0: 20, 1: 20}, seed=4))
    val = random_rows(20, seed=26, target=classes({0: 10, 1: 10}, seed=5))
    test = random_rows(20, seed=27, target=classes({0: 10, 1: 10}, seed=6))
    for split, start in ((train, 0), (val, 40), (test, 60)):
        split[:, 0] = np.arange(start, start + len(split))  # distinct entities
        split[:, 1] = np.arange(start, start + len(split))  # time moves forward

    report = check_split(
        make(train, kind),
        make(val, kind),
        make(test, kind),
        target=column(kind, -1),
        key=column(kind, 0),
        time=column(kind, 1),
    )

    assert report.findings == []
    assert report.ok
    assert report.summary["rows"] == {"train": 40, "val": 20, "test": 20}
    assert str(report).startswith("check_split: ok")


# --- chunks and bad input ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_straddling_a_chunk_boundary(kind: str) -> None:
    boundary = split_rows.CHUNK_ROWS
    rows = 10_000
    assert rows > 2 * boundary  # three chunks at least
    train = random_rows(rows, seed=28)
    train[boundary] = train[boundary - 1]
    val = random_rows(50, seed=29)
    val[4] = train[rows - 3]  # a cross-split duplicate in the last chunk

    report = check_split(make(train, kind), make(val, kind))

    assert report.summary["rows"] == {"train": rows, "val": 50}
    within = only(report, "duplicate_rows")
    assert within.evidence == {"duplicates": 1, "rows": rows}
    assert within.examples == ((boundary - 1, boundary),)
    across = only(report, "duplicates_across_splits")
    assert across.examples == ((rows - 3, 4),)


def test_a_split_that_is_not_a_collection_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="a split must be"):
        check_split(5, torch.zeros(3, 2))
    with pytest.raises(TypeError, match="a split must be"):
        check_split(torch.zeros(3, 2), torch.zeros(3, 2), 7)


# --- preprocessing -----------------------------------------------------------------------


def test_lesson_leakage_example_exact_numbers() -> None:
    train = torch.tensor([0.0, 2.0])
    test = torch.tensor([10.0])

    report = check_preprocessing({"mean": 4.0}, train, torch.cat([train, test]))

    assert len(report.findings) == 1
    finding = report.findings[0]
    assert finding.kind == "leakage"
    assert finding.severity == "error"
    assert finding.subject == "mean"
    assert finding.evidence == {"used": 4.0, "train": 1.0, "all_rows": 4.0}
    assert not report.ok
    text = str(report)
    assert "train (1.0)" in text
    assert "4.0" in text


def test_lesson_example_fitted_on_train_is_ok() -> None:
    train = torch.tensor([0.0, 2.0])
    test = torch.tensor([10.0])

    report = check_preprocessing({"mean": 1.0}, train, torch.cat([train, test]))

    assert report.ok
    assert report.findings == []
    assert report.summary["mean"] == {"used": 1.0, "train": 1.0}


def per_column_data() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    train = torch.randn(50, 3) * torch.tensor([1.0, 2.0, 3.0]) + torch.tensor([5.0, -3.0, 8.0])
    test = torch.randn(20, 3) * 2.0 + 20.0
    return train, torch.cat([train, test])


def test_per_column_statistics_fitted_on_train_are_ok() -> None:
    train, every = per_column_data()

    report = check_preprocessing({"mean": train.mean(dim=0), "std": train.std(dim=0)}, train, every)

    assert report.findings == []
    assert report.ok


def test_per_column_statistics_fitted_on_all_rows_are_leakage() -> None:
    train, every = per_column_data()

    report = check_preprocessing({"mean": every.mean(dim=0), "std": every.std(dim=0)}, train, every)

    assert report.kinds == ["leakage", "leakage"]
    assert [f.subject for f in report.findings] == ["mean", "std"]
    assert all(f.severity == "error" for f in report.findings)
    mean = report.findings[0]
    assert mean.evidence["all_rows"] == pytest.approx(every.mean(dim=0).tolist(), rel=1e-5)
    assert mean.evidence["train"] == pytest.approx(train.mean(dim=0).tolist(), rel=1e-5)


def test_statistic_matching_neither_is_a_mismatch() -> None:
    train, every = per_column_data()

    report = check_preprocessing({"mean": [0.0, 0.0, 0.0]}, train, every)

    assert report.kinds == ["preprocessing_mismatch"]
    assert report.findings[0].severity == "warning"
    assert report.findings[0].subject == "mean"
    assert not report.ok


def test_unknown_statistic_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="median"):
        check_preprocessing({"median": 1.0}, torch.tensor([0.0, 2.0]))


# --- with a probe ------------------------------------------------------------------------


def test_check_split_reports_to_the_monitor(collector: FrameCollector) -> None:
    train = random_rows(30, seed=30)
    val = random_rows(10, seed=31)
    train[7] = train[3]
    val[2] = train[5]
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with probes.watch(model, optimizer, address=collector.address) as probe:
        report = check_split(make(train, "tensor"), make(val, "tensor"), probe=probe)

    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    assert sorted(report.kinds) == ["duplicate_rows", "duplicates_across_splits"]
    events = [f for f in collector.kinds("event") if f["name"] == "check_report"]
    assert len(events) == 1
    event = events[0]
    assert event["check"] == "check_split"
    assert event["ok"] is False
    assert event["findings"] == [f.line() for f in report.findings]
    alerts = collector.kinds("alert")
    assert [a["alert"]["kind"] for a in alerts] == report.kinds
    assert [a["alert"]["severity"] for a in alerts] == [f.severity for f in report.findings]


def test_a_population_std_fitted_on_train_is_not_a_mismatch() -> None:
    train = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]])
    every = torch.cat([train, torch.tensor([[10.0, -5.0]])])
    scaler_std = train.std(dim=0, correction=0)  # NumPy / scikit-learn's convention
    assert probes.check_preprocessing({"std": scaler_std}, train, every).findings == []
    leaked = every.std(dim=0, correction=0)
    [finding] = probes.check_preprocessing({"std": leaked}, train, every).findings
    assert finding.kind == "leakage" and finding.severity == "error"


# --- reading without NumPy -----------------------------------------------------------------
#
# Tensor and array splits are read a chunk at a time (one tensor), Dataset rows of like
# fields are stacked a chunk at a time, other rows are read one by one; a row's digest,
# NaN columns and selected values must not depend on which.


def like_rows() -> list[list[Any]]:
    """Chunks of rows that stack, each with a NaN and a repeated row."""
    torch.manual_seed(1)
    x = torch.randn(6, 3)
    x[4, 1] = float("nan")
    x[5] = x[0]
    labels = [0.5, 1.5, float("nan"), 2.5, 3.5, 0.5]
    return [
        list(x),  # tensor rows
        [(x[i], torch.tensor(labels[i])) for i in range(6)],  # (x, y) of tensors
        [(x[i], labels[i]) for i in range(6)],  # (x, a Python float)
        [[x[i], i % 5, i % 5 < 2] for i in range(6)],  # lists with an int and a bool
        [{"b": x[i], "a": torch.tensor([labels[i], 1.0])} for i in range(6)],  # dicts
        [(x[i].double().requires_grad_(),) for i in range(6)],  # one field, needs grad
    ]


@pytest.mark.parametrize("case", range(len(like_rows())))
def test_stacked_rows_read_as_row_by_row(case: int) -> None:
    rows = like_rows()[case]

    stacked = split_rows.read_chunk(rows)
    by_row = split_rows.Chunk(rows, fields=[split_rows.row_fields(r) for r in rows])

    assert stacked.blocks is not None, "these rows should stack"
    digests = stacked.digests()
    assert digests == by_row.digests()
    assert digests[5] == digests[0] and len(set(digests)) == 5
    nans_stacked: Counter[int] = Counter()
    nans_by_row: Counter[int] = Counter()
    stacked.count_nans(nans_stacked)
    by_row.count_nans(nans_by_row)
    assert nans_stacked == nans_by_row
    x_column = 3 if case == 4 else 1  # a dict's fields in the order of its keys: a, b
    assert nans_stacked[x_column] == 1  # x[4, 1]
    for selector in (0, 1, -1):
        try:
            expected = [split_rows.select(row, selector) for row in rows]
        except (IndexError, RuntimeError):
            continue
        got = stacked.select(selector)
        assert got is not None
        assert [repr(v) for v in got] == [repr(v) for v in expected]  # NaN == NaN here


def test_a_row_is_the_same_duplicate_however_its_split_is_read() -> None:
    torch.manual_seed(2)
    x, y = torch.randn(20, 4), torch.randn(20)
    odd = (torch.randn(3), torch.tensor(0.0))  # another shape: the list is read by row

    as_tensor = check_split(torch.cat([x, y[:, None]], 1), [torch.cat([x[7], y[7:8]])])
    as_rows = check_split(TensorDataset(x, y), [(x[7], y[7]), odd, (x[2], y[2])])
    assert split_rows.read_chunk([(x[7], y[7]), odd]).blocks is None

    assert only(as_tensor, "duplicates_across_splits").examples == ((7, 0),)
    assert only(as_rows, "duplicates_across_splits").examples == ((7, 0), (2, 2))


def test_python_numbers_are_read_as_float64_like_numpy() -> None:
    base = [1.0, 2.0, 3.0]
    close = [1.0 + 1e-9, 2.0, 3.0]  # the same row in float32, not in float64
    assert torch.tensor(base).equal(torch.tensor(close))

    report = check_split([base, close, base], [[4.0, float("nan"), 6.0]])

    within = only(report, "duplicate_rows")
    assert within.evidence == {"duplicates": 1, "rows": 3}
    assert within.examples == ((0, 2),)
    assert only(report, "missing_values").evidence["by_column"] == "col 1: 1"


def test_string_fields_and_numpy_string_arrays_are_hashed_by_content() -> None:
    train = [
        {"user": "u1", "x": [1.0, 2.0]},
        {"user": "u2", "x": [1.0, 2.0]},
        {"user": "u1", "x": [1.0, 2.0]},
    ]
    names = np.array([["a", "b"], ["c", "d"], ["a", "b"]])  # torch cannot hold strings

    report = check_split(train, names)

    assert sorted(report.kinds) == ["duplicate_rows", "duplicate_rows"]
    assert {f.subject: f.examples for f in report.findings} == {
        "train": ((0, 2),),
        "val": ((0, 2),),
    }


def test_a_read_only_array_is_read_without_torch_warning_about_writes() -> None:
    # torch warns once a process; nothing else in the suite converts a read-only array
    train = random_rows(10, seed=40)
    train.flags.writeable = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check_split(train, random_rows(5, seed=41))
    assert report.ok
    assert [str(w.message) for w in caught] == []


# Splits of every kind and both checks, built with torch and Python only.
CHECKS = """
import torch
from torch.utils.data import TensorDataset
import probes

def finding(f):
    return [f.kind, f.severity, f.subject, f.evidence, [list(e) if isinstance(e, tuple)
            else e for e in f.examples]]

torch.manual_seed(0)
train, val = torch.randn(40, 5), torch.randn(20, 5)
train[:, 0], val[:, 0] = torch.arange(40.0), torch.arange(100.0, 120.0)  # entity
train[:, 1], val[:, 1] = torch.arange(40.0), torch.arange(40.0, 60.0)  # time
train[:, 4], val[:, 4] = torch.arange(40.0) % 2, (torch.arange(20.0) % 5 == 0).float()
train[7] = train[3]
val[2] = train[5]  # a shared row: entity 5, time 5, class 1
train[4, 2] = float("nan")
tensors = probes.check_split(train, val, target=-1, key=0, time=1)

dataset = probes.check_split(TensorDataset(train[:, :4], train[:, 4]),
                             TensorDataset(val[:, :4], val[:, 4]), target=1)
rows = probes.check_split([([1.0, 2.0], 0), ([3.0, float("nan")], 1), ([1.0, 2.0], 0)],
                          [([5.0, 6.0], 1), ([3.0, float("nan")], 1)])
users = probes.check_split([{"user": f"u{i}", "x": [float(i)]} for i in range(5)],
                           [{"user": "u3", "x": [9.0]}], key="user")
leak = probes.check_preprocessing({"mean": 4.0}, [0.0, 2.0], [0.0, 2.0, 10.0])
per_column = probes.check_preprocessing({"mean": [1.0, 5.0], "std": train[:, 2:4].std(0)},
                                        [[0.0, 4.0], [2.0, 6.0]], train[:, 2:4])
RESULT = {name: [finding(f) for f in report.findings] for name, report in
          [("tensors", tensors), ("dataset", dataset), ("rows", rows), ("users", users),
           ("leak", leak), ("per_column", per_column)]}
"""
NO_NUMPY = f"""
import json, sys, warnings
sys.modules["numpy"] = None  # from here on, import numpy fails
import torch
warnings.simplefilter("error")  # torch reaching for NumPy lazily would warn
{CHECKS}
print(json.dumps(RESULT))
assert sys.modules["numpy"] is None
"""


def test_checks_run_without_numpy() -> None:
    with_numpy: dict[str, Any] = {}
    exec(CHECKS, with_numpy)  # here, where NumPy is loaded: the same findings

    out = subprocess.run(
        [sys.executable, "-c", NO_NUMPY], capture_output=True, text=True, timeout=120
    )

    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.splitlines()[-1])
    assert found == json.loads(json.dumps(with_numpy["RESULT"]))
    kinds = {name: sorted(f[0] for f in findings) for name, findings in found.items()}
    assert kinds == {
        "tensors": [
            "duplicate_rows",
            "duplicates_across_splits",
            "entity_overlap",
            "missing_values",
            "target_shift",
            "time_leak",
        ],
        "dataset": ["duplicate_rows", "duplicates_across_splits", "missing_values", "target_shift"],
        "rows": ["duplicate_rows", "duplicates_across_splits", "missing_values", "missing_values"],
        "users": ["entity_overlap"],
        "leak": ["leakage"],
        "per_column": ["preprocessing_mismatch"],
    }
    tensors = {f[0]: f for f in found["tensors"]}
    assert tensors["duplicate_rows"][4] == [[3, 7]]
    assert tensors["duplicates_across_splits"][4] == [[5, 2]]
    assert tensors["entity_overlap"][4] == [[5.0, 5, 2]]
    assert tensors["time_leak"][4] == [2]
    assert tensors["missing_values"][3]["by_column"] == "col 2: 1"
    shift = tensors["target_shift"][3]  # 15 of 20 in class 0 (50% of train), 5 in class 1
    assert (shift["class"], shift["val_share"]) == ("0.0", pytest.approx(0.75))
    rows = {(f[0], f[2]): f for f in found["rows"]}
    assert rows["duplicate_rows", "train"][4] == [[0, 2]]
    assert rows["duplicates_across_splits", "train/val"][4] == [[1, 1]]
    assert rows["missing_values", "train"][3]["by_column"] == "col 1: 1"
    assert found["users"][0][4] == [["u3", 3, 0]]
    assert found["leak"][0][3] == {"used": 4.0, "train": 1.0, "all_rows": 4.0}
