"""The first rung of the checklist: the data and its splits, before any training.

``check_split`` looks for rows repeated inside or across splits, an entity (``key``)
in two splits, validation or test rows from before the end of training (``time``),
missing values, and a shift of the target's prevalence. ``check_preprocessing`` tells
whether normalisation statistics were fitted on the training split alone.

Splits may be tensors, NumPy arrays, lists of rows or map-style ``Dataset``s; they are
read in chunks, so a large split never has to fit in memory twice.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from probes.reports import CheckReport, Finding

if TYPE_CHECKING:
    from probes.probe import Probe

Selector = int | str | Callable[[Any], Any] | None
CHUNK_ROWS = 4096
EXAMPLES = 5
PREVALENCE_SHIFT = 0.10  # absolute change of a class's share between splits
MEAN_SHIFT_STDS = 0.5  # change of a continuous target's mean, in training stds
MAX_CLASSES = 50  # more distinct target values than this: treated as continuous


# --- reading rows -----------------------------------------------------------------------


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def iter_chunks(data: Any) -> Iterator[tuple[int, list[Any]]]:
    """(first index, rows) chunks of a tensor, array, list or Dataset."""
    if isinstance(data, torch.Tensor | np.ndarray):
        for start in range(0, len(data), CHUNK_ROWS):
            yield start, list(_to_numpy(data[start : start + CHUNK_ROWS]))
        return
    if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
        raise TypeError(
            f"a split must be a tensor, an array, a list of rows or a Dataset "
            f"with len() and [i], got {type(data).__name__}"
        )
    for start in range(0, len(data), CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, len(data))
        yield start, [data[i] for i in range(start, stop)]


def row_fields(row: Any) -> list[np.ndarray]:
    """A row as a list of arrays (a tuple row (x, y) gives two)."""
    if isinstance(row, Mapping):
        return [_to_numpy(row[k]) for k in sorted(row)]
    if (
        isinstance(row, tuple | list)
        and row
        and any(
            isinstance(item, torch.Tensor | np.ndarray | Sequence) and not isinstance(item, str)
            for item in row
        )
    ):
        return [_to_numpy(item) for item in row]
    return [_to_numpy(row)]


def row_hash(fields: list[np.ndarray]) -> bytes:
    """A 128-bit digest of a row's content (dtype and shape included)."""
    digest = hashlib.blake2b(digest_size=16)
    for array in fields:
        contiguous = np.ascontiguousarray(array)
        digest.update(f"{contiguous.dtype}{contiguous.shape}".encode())
        digest.update(contiguous.tobytes())
    return digest.digest()


def select(row: Any, selector: Selector) -> Any:
    """The value ``selector`` picks from a row: a column/field index, a key, or f(row)."""
    if selector is None:
        return None
    if callable(selector):
        value = selector(row)
    elif isinstance(selector, str):
        value = row[selector] if isinstance(row, Mapping) else getattr(row, selector)
    elif isinstance(row, tuple | list) and len(row_fields(row)) > 1:
        value = row[selector]
    else:
        value = _to_numpy(row).reshape(-1)[selector]
    value = _to_numpy(value) if isinstance(value, torch.Tensor) else value
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tobytes()
    if isinstance(value, np.generic):  # a NumPy scalar (a float32 column): a Python number
        return value.item()
    return value


# --- one pass over a split ----------------------------------------------------------------


@dataclass
class SplitScan:
    """What one pass over a split collects."""

    name: str
    rows: int = 0
    first_seen: dict[bytes, int] = field(default_factory=dict)  # hash -> first index
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    duplicate_count: int = 0
    keys: dict[Any, int] = field(default_factory=dict)  # key -> first index
    times: list[tuple[Any, int]] = field(default_factory=list)  # (time, index), bounded
    time_min: Any = None
    time_max: Any = None
    nan_by_column: Counter[int] = field(default_factory=Counter)
    targets: Counter[Any] = field(default_factory=Counter)
    target_values: list[float] = field(default_factory=list)


def scan_split(
    name: str, data: Any, *, target: Selector, key: Selector, time: Selector
) -> SplitScan:
    """Hash every row, collect keys, times, NaNs per column and target values."""
    scan = SplitScan(name)
    for start, rows in iter_chunks(data):
        for offset, row in enumerate(rows):
            index = start + offset
            fields = row_fields(row)
            digest = row_hash(fields)
            if digest in scan.first_seen:
                scan.duplicate_count += 1
                if len(scan.duplicates) < EXAMPLES:
                    scan.duplicates.append((scan.first_seen[digest], index))
            else:
                scan.first_seen[digest] = index
            _count_nans(scan, fields)
            _collect(scan, row, index, target=target, key=key, time=time)
        scan.rows = start + len(rows)
    return scan


def _count_nans(scan: SplitScan, fields: list[np.ndarray]) -> None:
    column = 0
    for array in fields:
        flat = array.reshape(-1)
        if flat.dtype.kind == "f":
            for position in np.flatnonzero(np.isnan(flat)):
                scan.nan_by_column[column + int(position)] += 1
        column += flat.size


def _collect(
    scan: SplitScan, row: Any, index: int, *, target: Selector, key: Selector, time: Selector
) -> None:
    if key is not None:
        scan.keys.setdefault(select(row, key), index)
    if time is not None:
        moment = select(row, time)
        scan.time_min = moment if scan.time_min is None else min(scan.time_min, moment)
        scan.time_max = moment if scan.time_max is None else max(scan.time_max, moment)
        scan.times.append((moment, index))
    if target is not None:
        value = select(row, target)
        scan.targets[value] += 1
        if isinstance(value, int | float) and len(scan.target_values) < 1_000_000:
            scan.target_values.append(float(value))


# --- the check ----------------------------------------------------------------------------


def check_split(
    train: Any,
    val: Any,
    test: Any = None,
    *,
    target: Selector = None,
    key: Selector = None,
    time: Selector = None,
    probe: Probe | None = None,
) -> CheckReport:
    """Check the splits of a dataset for duplicates, leaks, missing values and shift.

    Args:
        train, val, test: the splits (tensors, arrays, lists of rows, or Datasets).
        target: which value of a row is the target: a column index (array rows), a
            field index (tuple rows such as ``(x, y)``), a key (dict rows) or a function.
        key: the entity of a row (user id, patient id, ...), chosen the same way.
        time: the timestamp of a row, chosen the same way (any comparable value).
        probe: send the report and its findings to the monitor through this probe.

    Returns:
        A ``CheckReport``; ``print(report)`` shows it. Findings: ``duplicate_rows``,
        ``duplicates_across_splits``, ``entity_overlap``, ``time_leak``,
        ``missing_values``, ``target_shift``.

    Example::

        report = probes.check_split(train_x, val_x, target=-1)
        assert report.ok, report
    """
    scans = [
        scan_split("train", train, target=target, key=key, time=time),
        scan_split("val", val, target=target, key=key, time=time),
    ]
    if test is not None:
        scans.append(scan_split("test", test, target=target, key=key, time=time))
    report = CheckReport(
        "check_split",
        summary={"rows": {s.name: s.rows for s in scans}},
        signal="A clean split is necessary, not sufficient: it cannot see leakage through "
        "features computed from other rows.",
    )
    for scan in scans:
        report.findings += _duplicates_within(scan)
        report.findings += _missing_values(scan)
    for earlier, later in _pairs(scans):
        report.findings += _duplicates_across(earlier, later)
        if key is not None:
            report.findings += _entity_overlap(earlier, later)
    if time is not None:
        report.findings += _time_leaks(scans)
    if target is not None:
        prevalence, findings = _target_shift(scans)
        report.summary["target"] = prevalence
        report.findings += findings
    return report.send(probe)


def _pairs(scans: list[SplitScan]) -> list[tuple[SplitScan, SplitScan]]:
    return [(scans[i], scans[j]) for i in range(len(scans)) for j in range(i + 1, len(scans))]


def _duplicates_within(scan: SplitScan) -> list[Finding]:
    if not scan.duplicate_count:
        return []
    return [
        Finding(
            "duplicate_rows",
            "warning",
            scan.name,
            f"{scan.duplicate_count} of {scan.rows} rows of {scan.name} repeat an earlier row",
            "Drop exact duplicates (or weight them on purpose); they inflate what the model "
            "sees most and blur metrics.",
            {"duplicates": scan.duplicate_count, "rows": scan.rows},
            tuple(scan.duplicates),
        )
    ]


def _duplicates_across(earlier: SplitScan, later: SplitScan) -> list[Finding]:
    shared = [
        (earlier.first_seen[h], i) for h, i in later.first_seen.items() if h in earlier.first_seen
    ]
    if not shared:
        return []
    shared.sort(key=lambda pair: pair[1])
    return [
        Finding(
            "duplicates_across_splits",
            "error",
            f"{earlier.name}/{later.name}",
            f"{len(shared)} rows of {later.name} also appear in {earlier.name}: evaluation on "
            "them measures memory, not generalisation",
            f"Deduplicate before splitting, then split; remove these rows from {later.name}.",
            {"shared_rows": len(shared), f"{later.name}_rows": later.rows},
            tuple(shared[:EXAMPLES]),
        )
    ]


def _entity_overlap(earlier: SplitScan, later: SplitScan) -> list[Finding]:
    shared = [k for k in later.keys if k in earlier.keys]
    if not shared:
        return []
    return [
        Finding(
            "entity_overlap",
            "error",
            f"{earlier.name}/{later.name}",
            f"{len(shared)} entities have rows in both {earlier.name} and {later.name}",
            "Split by entity (group split), so that each entity is in one split only.",
            {"shared_entities": len(shared)},
            tuple((k, earlier.keys[k], later.keys[k]) for k in shared[:EXAMPLES]),
        )
    ]


def _time_leaks(scans: list[SplitScan]) -> list[Finding]:
    train = scans[0]
    if train.time_max is None:
        return []
    findings = []
    for scan in scans[1:]:
        early = [(t, i) for t, i in scan.times if t < train.time_max]
        if early:
            findings.append(
                Finding(
                    "time_leak",
                    "error",
                    scan.name,
                    f"{len(early)} rows of {scan.name} are earlier than the end of training "
                    f"({train.time_max}): the model is evaluated on the past it trained after",
                    f"Split by time: every {scan.name} row after the last training row.",
                    {
                        "rows_before_train_end": len(early),
                        "train_end": train.time_max,
                        f"{scan.name}_start": scan.time_min,
                    },
                    tuple(i for _, i in early[:EXAMPLES]),
                )
            )
    return findings


def _missing_values(scan: SplitScan) -> list[Finding]:
    if not scan.nan_by_column:
        return []
    columns = sorted(scan.nan_by_column.items())
    total = sum(scan.nan_by_column.values())
    return [
        Finding(
            "missing_values",
            "warning",
            scan.name,
            f"{total} NaN values in {len(columns)} column(s) of {scan.name}",
            "Impute with statistics fitted on train only (or drop the rows), and add a "
            "missing-indicator if missingness carries signal.",
            {
                "nan_values": total,
                "columns": len(columns),
                "by_column": ", ".join(f"col {c}: {n}" for c, n in columns[:8]),
            },
            tuple(c for c, _ in columns[:EXAMPLES]),
        )
    ]


def _target_shift(scans: list[SplitScan]) -> tuple[dict[str, Any], list[Finding]]:
    train = scans[0]
    if len(train.targets) <= MAX_CLASSES:
        return _prevalence_shift(scans)
    return _mean_shift(scans)


def _prevalence_shift(scans: list[SplitScan]) -> tuple[dict[str, Any], list[Finding]]:
    classes = sorted({c for s in scans for c in s.targets}, key=str)
    prevalence = {s.name: {str(c): s.targets[c] / max(s.rows, 1) for c in classes} for s in scans}
    findings = []
    train = prevalence["train"]
    for scan in scans[1:]:
        shift = max(abs(prevalence[scan.name][str(c)] - train[str(c)]) for c in classes)
        if shift > PREVALENCE_SHIFT:
            worst = max(classes, key=lambda c: abs(prevalence[scan.name][str(c)] - train[str(c)]))
            findings.append(
                Finding(
                    "target_shift",
                    "warning",
                    scan.name,
                    f"class {worst} is {prevalence[scan.name][str(worst)]:.1%} of {scan.name} "
                    f"but {train[str(worst)]:.1%} of train",
                    "Stratify the split by the target, or make sure the shift is the one "
                    "deployment will see (then weigh the metric accordingly).",
                    {
                        "class": str(worst),
                        "train_share": train[str(worst)],
                        f"{scan.name}_share": prevalence[scan.name][str(worst)],
                        "max_shift": shift,
                    },
                )
            )
    return prevalence, findings


def _mean_shift(scans: list[SplitScan]) -> tuple[dict[str, Any], list[Finding]]:
    stats = {
        s.name: (float(np.mean(s.target_values)), float(np.std(s.target_values)))
        for s in scans
        if s.target_values
    }
    findings = []
    train_mean, train_std = stats.get("train", (math.nan, math.nan))
    for scan in scans[1:]:
        if scan.name not in stats or not train_std:
            continue
        mean = stats[scan.name][0]
        shift = abs(mean - train_mean) / train_std
        if shift > MEAN_SHIFT_STDS:
            findings.append(
                Finding(
                    "target_shift",
                    "warning",
                    scan.name,
                    f"the target's mean is {mean:.4g} in {scan.name} but {train_mean:.4g} in "
                    f"train ({shift:.2f} training stds apart)",
                    "Check how the split was made (by time? by source?) and whether deployment "
                    "looks like train or like this split.",
                    {"train_mean": train_mean, f"{scan.name}_mean": mean, "stds_apart": shift},
                )
            )
    return {name: {"mean": m, "std": s} for name, (m, s) in stats.items()}, findings


# --- preprocessing ------------------------------------------------------------------------

STATISTICS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mean": lambda x: x.mean(dim=0),
    "std": lambda x: x.std(dim=0),  # torch's default: unbiased (n - 1)
    "min": lambda x: x.min(dim=0).values,
    "max": lambda x: x.max(dim=0).values,
}
# Other conventions a statistic may have been computed with: the population std (n) of
# NumPy and scikit-learn's StandardScaler.
ALTERNATIVES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "std": lambda x: x.std(dim=0, correction=0),
}


def _matches(name: str, used: torch.Tensor, rows: torch.Tensor, rtol: float) -> bool:
    candidates = [STATISTICS[name]] + ([ALTERNATIVES[name]] if name in ALTERNATIVES else [])
    return any(torch.allclose(used, fit(rows), rtol=rtol, atol=1e-12) for fit in candidates)


def check_preprocessing(
    stats: Mapping[str, Any],
    train: Any,
    all_rows: Any = None,
    *,
    rtol: float = 1e-4,
    probe: Probe | None = None,
) -> CheckReport:
    """Were normalisation statistics fitted on the training split alone?

    Args:
        stats: the statistics your preprocessing uses, by name: ``mean``, ``std``,
            ``min``, ``max`` (numbers, or one per column).
        train: the training split (rows x columns).
        all_rows: every row the statistics might have seen (train, val and test
            together): when a statistic matches these and not train, that is leakage.
        rtol: relative tolerance of "matches".
        probe: send the report to the monitor through this probe.

    Example (the lesson's)::

        train, test = torch.tensor([0.0, 2.0]), torch.tensor([10.0])
        check_preprocessing({"mean": 4.0}, train, torch.cat([train, test]))
        # leakage: mean 4.0 matches all rows (4.0), not train (1.0)
    """
    unknown = set(stats) - set(STATISTICS)
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)}; known: {sorted(STATISTICS)}")
    train_t = torch.as_tensor(_to_numpy(train), dtype=torch.float64)
    every_t = (
        None if all_rows is None else torch.as_tensor(_to_numpy(all_rows), dtype=torch.float64)
    )
    report = CheckReport(
        "check_preprocessing",
        signal="Statistics must come from train alone; matching train does not prove the "
        "pipeline applies them to val and test the same way.",
    )
    for name, given in stats.items():
        used = torch.as_tensor(_to_numpy(given), dtype=torch.float64)
        on_train = STATISTICS[name](train_t)
        report.summary[name] = {"used": _short(used), "train": _short(on_train)}
        if _matches(name, used, train_t, rtol):
            continue
        report.findings.append(_statistic_finding(name, used, on_train, every_t, rtol))
    return report.send(probe)


def _statistic_finding(
    name: str, used: torch.Tensor, on_train: torch.Tensor, every: torch.Tensor | None, rtol: float
) -> Finding:
    on_all = None if every is None else STATISTICS[name](every)
    evidence = {"used": _short(used), "train": _short(on_train)}
    if on_all is not None:
        evidence["all_rows"] = _short(on_all)
    if on_all is not None and every is not None and _matches(name, used, every, rtol):
        return Finding(
            "leakage",
            "error",
            name,
            f"{name} {_short(used)} matches all rows ({_short(on_all)}), not train "
            f"({_short(on_train)}): the preprocessing was fitted on the evaluation rows too",
            f"Fit the {name} on the training split only, then apply it unchanged to "
            "validation and test.",
            evidence,
        )
    return Finding(
        "preprocessing_mismatch",
        "warning",
        name,
        f"{name} {_short(used)} is not the training split's ({_short(on_train)})",
        f"Recompute the {name} on the training split and check where the used value came from.",
        evidence,
    )


def _short(tensor: torch.Tensor) -> float | list[float]:
    values = tensor.reshape(-1).tolist()
    rounded = [round(v, 6) for v in values]
    return rounded[0] if len(rounded) == 1 else rounded[:8]
