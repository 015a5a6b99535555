"""The first rung of the checklist: the data and its splits, before any training.

``check_split`` looks for rows repeated inside or across splits, an entity (``key``)
in two splits, validation or test rows from before the end of training (``time``),
missing values, and a shift of the target's prevalence. ``check_preprocessing`` tells
whether normalisation statistics were fitted on the training split alone.

Splits may be tensors, NumPy arrays, lists of rows or map-style ``Dataset``s; they are
read in chunks (``probes.checks.split_rows``), so a large split never has to fit in memory
twice. Only torch is needed: NumPy arrays are taken when NumPy is there.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from probes.checks.reports import CheckReport, Finding
from probes.checks.split_rows import Selector, from_numpy, is_numpy, iter_chunks, read_chunk
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity

if TYPE_CHECKING:
    from probes.runtime.probe import Probe

EXAMPLES = 5
PREVALENCE_SHIFT = 0.10  # absolute change of a class's share between splits
MEAN_SHIFT_STDS = 0.5  # change of a continuous target's mean, in training stds
MAX_CLASSES = 50  # more distinct target values than this: treated as continuous


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
        chunk = read_chunk(rows)
        digests = chunk.digests()
        chunk.count_nans(scan.nan_by_column)
        keys, moments, targets = chunk.select(key), chunk.select(time), chunk.select(target)
        for offset, digest in enumerate(digests):
            index = start + offset
            if digest in scan.first_seen:
                scan.duplicate_count += 1
                if len(scan.duplicates) < EXAMPLES:
                    scan.duplicates.append((scan.first_seen[digest], index))
            else:
                scan.first_seen[digest] = index
            if keys is not None:
                scan.keys.setdefault(keys[offset], index)
            if moments is not None:
                _add_time(scan, moments[offset], index)
            if targets is not None:
                _add_target(scan, targets[offset])
        scan.rows = start + len(digests)
    return scan


def _add_time(scan: SplitScan, moment: Any, index: int) -> None:
    scan.time_min = moment if scan.time_min is None else min(scan.time_min, moment)
    scan.time_max = moment if scan.time_max is None else max(scan.time_max, moment)
    scan.times.append((moment, index))


def _add_target(scan: SplitScan, value: Any) -> None:
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
            field index (tuple rows such as ``(x, y)``), a key (dict rows) or a function
            of the row (as the split gives it: a tensor's rows are tensors).
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
            AlertKind.DUPLICATE_ROWS,
            Severity.WARNING,
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
            AlertKind.DUPLICATES_ACROSS_SPLITS,
            Severity.ERROR,
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
            AlertKind.ENTITY_OVERLAP,
            Severity.ERROR,
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
                    AlertKind.TIME_LEAK,
                    Severity.ERROR,
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
            AlertKind.MISSING_VALUES,
            Severity.WARNING,
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
                    AlertKind.TARGET_SHIFT,
                    Severity.WARNING,
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
    stats = {}
    for scan in scans:
        if scan.target_values:
            values = torch.tensor(scan.target_values, dtype=torch.float64)
            stats[scan.name] = (values.mean().item(), values.std(correction=0).item())
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
                    AlertKind.TARGET_SHIFT,
                    Severity.WARNING,
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
    train_t = _float64(train)
    every_t = None if all_rows is None else _float64(all_rows)
    report = CheckReport(
        "check_preprocessing",
        signal="Statistics must come from train alone; matching train does not prove the "
        "pipeline applies them to val and test the same way.",
    )
    for name, given in stats.items():
        used = _float64(given)
        on_train = STATISTICS[name](train_t)
        report.summary[name] = {"used": _short(used), "train": _short(on_train)}
        if _matches(name, used, train_t, rtol):
            continue
        report.findings.append(_statistic_finding(name, used, on_train, every_t, rtol))
    return report.send(probe)


def _float64(value: Any) -> torch.Tensor:
    """Numbers, lists, arrays or tensors as a float64 CPU tensor."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64)
    if is_numpy(value):
        return from_numpy(value).to(torch.float64)
    return torch.as_tensor(value, dtype=torch.float64)


def _statistic_finding(
    name: str, used: torch.Tensor, on_train: torch.Tensor, every: torch.Tensor | None, rtol: float
) -> Finding:
    on_all = None if every is None else STATISTICS[name](every)
    evidence = {"used": _short(used), "train": _short(on_train)}
    if on_all is not None:
        evidence["all_rows"] = _short(on_all)
    if on_all is not None and every is not None and _matches(name, used, every, rtol):
        return Finding(
            AlertKind.LEAKAGE,
            Severity.ERROR,
            name,
            f"{name} {_short(used)} matches all rows ({_short(on_all)}), not train "
            f"({_short(on_train)}): the preprocessing was fitted on the evaluation rows too",
            f"Fit the {name} on the training split only, then apply it unchanged to "
            "validation and test.",
            evidence,
        )
    return Finding(
        AlertKind.PREPROCESSING_MISMATCH,
        Severity.WARNING,
        name,
        f"{name} {_short(used)} is not the training split's ({_short(on_train)})",
        f"Recompute the {name} on the training split and check where the used value came from.",
        evidence,
    )


def _short(tensor: torch.Tensor) -> float | list[float]:
    values = tensor.reshape(-1).tolist()
    rounded = [round(v, 6) for v in values]
    return rounded[0] if len(rounded) == 1 else rounded[:8]
