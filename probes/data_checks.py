"""The first rung of the checklist: the data and its splits, before any training.

``check_split`` looks for rows repeated inside or across splits, an entity (``key``)
in two splits, validation or test rows from before the end of training (``time``),
missing values, and a shift of the target's prevalence. ``check_preprocessing`` tells
whether normalisation statistics were fitted on the training split alone.

Splits may be tensors, NumPy arrays, lists of rows or map-style ``Dataset``s; they are
read in chunks, so a large split never has to fit in memory twice. Only torch is
needed: NumPy is a development dependency, so its arrays are recognised when the caller
has imported NumPy, and this module never imports it.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import struct
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

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
SMALL_FIELD = 64  # up to this many values, a field's NaNs are found in Python (no kernel)


# --- reading values without NumPy ---------------------------------------------------------


def _numpy_types() -> tuple[type, ...]:
    """NumPy's array and scalar types if the caller has imported NumPy, else ()."""
    numpy = sys.modules.get("numpy")
    return () if numpy is None else (numpy.ndarray, numpy.generic)


def _is_numpy(value: Any) -> bool:
    """A NumPy array or scalar (NumPy is loaded then: the caller made it)."""
    return isinstance(value, _numpy_types())


def _is_array(data: Any) -> bool:
    """A tensor or a NumPy array: read a chunk of rows at a time."""
    return isinstance(data, (torch.Tensor, *_numpy_types()[:1]))


def as_tensor(value: Any) -> torch.Tensor:
    """``value`` as a CPU tensor, read as NumPy would: Python floats become float64
    (not torch's float32 default, which would merge rows differing in the 8th digit),
    NumPy arrays keep their dtype. TypeError or RuntimeError when torch cannot hold it."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach() if value.requires_grad else value
    elif _is_numpy(value):
        tensor = _from_numpy(value)
    else:
        tensor = torch.as_tensor(value)
        if tensor.is_floating_point() and tensor.dtype != torch.float64:
            tensor = torch.as_tensor(value, dtype=torch.float64)
        elif tensor.is_complex() and tensor.dtype != torch.complex128:
            tensor = torch.as_tensor(value, dtype=torch.complex128)
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def _from_numpy(array: Any) -> torch.Tensor:
    """A NumPy array or scalar as a tensor sharing its memory (torch needs no NumPy
    import for that). Read-only arrays (memory maps) are only read here: torch's warning
    that writing to them is undefined does not apply."""
    if getattr(array, "ndim", 0) and not array.flags.writeable:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.as_tensor(array)
    return torch.as_tensor(array)


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor as plain row-major memory: strided, contiguous, no lazy conj/neg."""
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    return tensor.contiguous()


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A copy of the bytes of a CPU tensor's values, in row-major order.

    Read from the tensor's own memory: ``bytes(tensor.untyped_storage())`` would copy
    the whole storage a row is a view of, one Python int per byte (a second for a 600 KB
    image), and ``.numpy()`` needs NumPy."""
    tensor = _dense(tensor)
    if tensor.numel() == 0:
        return b""
    return ctypes.string_at(tensor.data_ptr(), tensor.nbytes)


def _memory(tensor: torch.Tensor) -> memoryview:
    """The bytes of a dense CPU tensor, in place: valid only while ``tensor`` lives."""
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())).cast("B")


_HEADERS: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}


def _header(dtype: torch.dtype, shape: tuple[int, ...]) -> bytes:
    """What a row's hash mixes in before a field's bytes: its dtype and shape."""
    header = _HEADERS.get((dtype, shape))
    if header is None:
        header = _HEADERS[(dtype, shape)] = f"{dtype}{tuple(shape)}".encode()
    return header


class RowField(NamedTuple):
    """One field of a row, read once: what its hash mixes in, and where its NaNs are."""

    header: bytes  # dtype and shape (or the type of a value torch cannot hold)
    content: bytes
    nans: tuple[int, ...]  # positions of NaN values in the flattened field
    width: int  # columns it spans


_FLOAT64, _INT64, _BOOL = (_header(d, ()) for d in (torch.float64, torch.int64, torch.bool))


def read_field(value: Any) -> RowField:
    """A field of a row: a tensor, an array, a number or a list of numbers; anything
    else (a string, an id) is hashed by its repr and spans one column."""
    kind = type(value)
    # Python scalars straight to bytes, as a 0-d float64/int64/bool tensor would give.
    if kind is float:
        return RowField(_FLOAT64, struct.pack("=d", value), (0,) if value != value else (), 1)
    if kind is bool:
        return RowField(_BOOL, b"\x01" if value else b"\x00", (), 1)
    if kind is int and -(2**63) <= value < 2**63:
        return RowField(_INT64, struct.pack("=q", value), (), 1)
    try:
        tensor = as_tensor(value)
    except (TypeError, RuntimeError, ValueError):
        if _is_numpy(value):  # strings, objects, dates: NumPy's own bytes
            return RowField(f"numpy.{value.dtype}{value.shape}".encode(), value.tobytes(),
                            (), int(value.size))
        return RowField(f"{kind.__module__}.{kind.__qualname__}".encode(),
                        repr(value).encode(), (), 1)
    return RowField(_header(tensor.dtype, tuple(tensor.shape)), tensor_bytes(tensor),
                    _nan_positions(tensor), tensor.numel())


def _nan_positions(tensor: torch.Tensor) -> tuple[int, ...]:
    if not tensor.is_floating_point():
        return ()
    flat = tensor.reshape(-1)
    if flat.numel() <= SMALL_FIELD:
        return tuple(i for i, v in enumerate(flat.tolist()) if v != v)
    missing = torch.isnan(flat)
    if not missing.any():
        return ()
    return tuple(missing.nonzero().reshape(-1).tolist())


def plain_value(value: Any) -> Any:
    """A selected value as a hashable Python value: a number, or the bytes of an array."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.item() if value.numel() == 1 else tensor_bytes(value.cpu())
    if _is_numpy(value):  # NumPy's own methods: no import needed
        return value.item() if value.size == 1 else value.tobytes()
    return value


# --- reading rows -----------------------------------------------------------------------


def iter_chunks(data: Any) -> Iterator[tuple[int, Any]]:
    """(first index, chunk) pairs: a chunk is a slice of a tensor or an array, or a list
    of a Dataset's (or a list's) rows."""
    if _is_array(data):
        for start in range(0, len(data), CHUNK_ROWS):
            yield start, data[start : start + CHUNK_ROWS]
        return
    if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
        raise TypeError(f"a split must be a tensor, an array, a list of rows or a Dataset "
                        f"with len() and [i], got {type(data).__name__}")
    for start in range(0, len(data), CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, len(data))
        yield start, [data[i] for i in range(start, stop)]


def row_fields(row: Any) -> list[RowField]:
    """A row as a list of fields (a tuple row (x, y) gives two, a dict one per key)."""
    if isinstance(row, Mapping):
        return [read_field(row[k]) for k in sorted(row)]
    if isinstance(row, tuple | list) and _splits(row):
        return [read_field(item) for item in row]
    return [read_field(row)]


def _splits(row: tuple[Any, ...] | list[Any]) -> bool:
    """Whether a tuple or list row is several fields (it holds a tensor, an array or a
    sequence) rather than one row of numbers."""
    return any(isinstance(item, (torch.Tensor, Sequence, *_numpy_types()[:1]))
               and not isinstance(item, str) for item in row)


def row_hash(fields: list[RowField]) -> bytes:
    """A 128-bit digest of a row's content (dtype and shape included)."""
    digest = hashlib.blake2b(digest_size=16)
    for item in fields:
        digest.update(item.header)
        digest.update(item.content)
    return digest.digest()


def select(row: Any, selector: Selector) -> Any:
    """The value ``selector`` picks from a row: a column/field index, a key, or f(row)."""
    if selector is None:
        return None
    if callable(selector):
        value = selector(row)
    elif isinstance(selector, str):
        value = row[selector] if isinstance(row, Mapping) else getattr(row, selector)
    elif isinstance(row, tuple | list) and len(row) > 1 and _splits(row):
        value = row[selector]
    else:  # the row is one field: the index counts its flattened values
        if isinstance(row, tuple | list) and len(row) == 1 and _splits(row):
            row = row[0]
        value = as_tensor(row).reshape(-1)[selector]
    return plain_value(value)


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


def scan_split(name: str, data: Any, *, target: Selector, key: Selector,
               time: Selector) -> SplitScan:
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


# --- a chunk of rows, read at once where the rows allow -----------------------------------


@dataclass
class Chunk:
    """A chunk of a split, read once. Where every row has the same fields (a tensor's
    rows, or a Dataset's ``(x, y)`` tuples of like tensors) each field is one tensor
    ``[rows, ...]`` in ``blocks``, hashed and searched for NaNs a chunk at a time;
    other rows are read one by one into ``fields``. Both give the same digests."""

    rows: Any  # the chunk as given: a slice of a tensor or array, or a list of rows
    blocks: list[torch.Tensor] | None = None
    container: type | None = None  # the rows' type when stacked: tuple, list, dict...
    fields: list[list[RowField]] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def digests(self) -> list[bytes]:
        """``row_hash`` of every row."""
        if self.fields is not None:
            return [row_hash(row) for row in self.fields]
        assert self.blocks is not None
        rows = len(self)
        views = []
        for block in self.blocks:  # the blocks are alive while their memory is read
            memory = _memory(block)
            views.append((_header(block.dtype, tuple(block.shape[1:])), memory,
                          len(memory) // rows))
        (first_header, first, first_size), rest = views[0], views[1:]
        start = hashlib.blake2b(first_header, digest_size=16)
        digests = []
        for row in range(rows):
            digest = start.copy()
            digest.update(first[row * first_size : (row + 1) * first_size])
            for header, memory, size in rest:
                digest.update(header)
                digest.update(memory[row * size : (row + 1) * size])
            digests.append(digest.digest())
        return digests

    def count_nans(self, by_column: Counter[int]) -> None:
        """Add the chunk's NaNs to ``by_column`` (columns counted across the fields)."""
        if self.fields is not None:
            for row in self.fields:
                column = 0
                for item in row:
                    for position in item.nans:
                        by_column[column + position] += 1
                    column += item.width
            return
        assert self.blocks is not None
        column = 0
        for block in self.blocks:
            flat = block.reshape(len(block), -1)
            if block.is_floating_point():
                _count_block_nans(flat, column, by_column)
            column += flat.shape[1]

    def select(self, selector: Selector) -> list[Any] | None:
        """The values ``selector`` picks from each row (``select``), None for no selector."""
        if selector is None:
            return None
        if self.blocks is not None and isinstance(selector, int):
            if len(self.blocks) == 1 and self.container is not dict:
                # the row is one field: the index counts its flattened values
                return self.blocks[0].reshape(len(self), -1)[:, selector].tolist()
            if self.container in (tuple, list):  # a field, one value a row: as ``select``
                block = self.blocks[selector]
                if block[0].numel() == 1:
                    return block.reshape(-1).tolist()
        rows = self.rows if isinstance(self.rows, list) else list(self.rows)
        return [select(row, selector) for row in rows]


def read_chunk(rows: Any) -> Chunk:
    """Read a chunk from ``iter_chunks``: as blocks where its rows allow, else by row."""
    if _is_array(rows):
        try:
            return Chunk(rows, [_dense(as_tensor(rows))])
        except (TypeError, RuntimeError, ValueError):  # strings, objects: row by row
            rows = list(rows)
    stacked = _stack(rows)
    if stacked is not None:
        return Chunk(rows, stacked, type(rows[0]))
    return Chunk(rows, fields=[row_fields(row) for row in rows])


def _items(row: Any) -> tuple[Any, ...] | None:
    """A row's fields as ``row_fields`` splits it, if it is a tensor or a tuple, list or
    dict that holds a tensor (None: a row read one by one)."""
    if isinstance(row, torch.Tensor):
        return (row,)
    if type(row) is dict:
        return tuple(row[k] for k in sorted(row))
    if type(row) in (tuple, list) and any(isinstance(item, torch.Tensor) for item in row):
        return tuple(row)
    return None


def _kind(item: Any) -> Any:
    """What must agree between rows for a field to stack: a tensor's dtype, shape and
    device, or a Python number's type (None: not stackable)."""
    if isinstance(item, torch.Tensor):
        return (item.dtype, item.shape, item.device, item.layout)
    kind = type(item)
    return kind if kind in (float, int, bool) else None


_SCALAR_DTYPES: dict[Any, torch.dtype] = {float: torch.float64, int: torch.int64,
                                          bool: torch.bool}


def _stack(rows: list[Any]) -> list[torch.Tensor] | None:
    """The rows' fields stacked, one tensor ``[rows, ...]`` each, when every row holds
    the same kinds of fields; else None."""
    if not rows:
        return None
    first = _items(rows[0])
    if not first:
        return None
    container, kinds = type(rows[0]), [_kind(item) for item in first]
    if None in kinds:
        return None
    columns: list[list[Any]] = [[] for _ in kinds]
    keys = sorted(rows[0]) if container is dict else None
    for row in rows:
        if type(row) is not container or (keys is not None and sorted(row) != keys):
            return None
        items = _items(row)
        if items is None or len(items) != len(kinds):
            return None
        for column, item, kind in zip(columns, items, kinds, strict=True):
            if _kind(item) != kind:
                return None
            column.append(item)
    try:
        with torch.no_grad():
            return [_dense(torch.stack(column).cpu()) if isinstance(kind, tuple)
                    else torch.tensor(column, dtype=_SCALAR_DTYPES[kind])
                    for column, kind in zip(columns, kinds, strict=True)]
    except (TypeError, RuntimeError, ValueError, OverflowError):
        return None


def _count_block_nans(flat: torch.Tensor, first_column: int, by_column: Counter[int]) -> None:
    step = max(1, 2**22 // max(flat.shape[1], 1))  # a bounded mask, for rows of images
    for low in range(0, len(flat), step):
        per_column = torch.isnan(flat[low : low + step]).sum(dim=0)
        columns = per_column.nonzero().reshape(-1)
        for column, count in zip(columns.tolist(), per_column[columns].tolist(),
                                 strict=True):
            by_column[first_column + column] += count


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
    scans = [scan_split("train", train, target=target, key=key, time=time),
             scan_split("val", val, target=target, key=key, time=time)]
    if test is not None:
        scans.append(scan_split("test", test, target=target, key=key, time=time))
    report = CheckReport(
        "check_split",
        summary={"rows": {s.name: s.rows for s in scans}},
        signal="A clean split is necessary, not sufficient: it cannot see leakage through "
               "features computed from other rows.")
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
    return [Finding(
        "duplicate_rows", "warning", scan.name,
        f"{scan.duplicate_count} of {scan.rows} rows of {scan.name} repeat an earlier row",
        "Drop exact duplicates (or weight them on purpose); they inflate what the model "
        "sees most and blur metrics.",
        {"duplicates": scan.duplicate_count, "rows": scan.rows},
        tuple(scan.duplicates))]


def _duplicates_across(earlier: SplitScan, later: SplitScan) -> list[Finding]:
    shared = [(earlier.first_seen[h], i) for h, i in later.first_seen.items()
              if h in earlier.first_seen]
    if not shared:
        return []
    shared.sort(key=lambda pair: pair[1])
    return [Finding(
        "duplicates_across_splits", "error", f"{earlier.name}/{later.name}",
        f"{len(shared)} rows of {later.name} also appear in {earlier.name}: evaluation on "
        "them measures memory, not generalisation",
        f"Deduplicate before splitting, then split; remove these rows from {later.name}.",
        {"shared_rows": len(shared), f"{later.name}_rows": later.rows},
        tuple(shared[:EXAMPLES]))]


def _entity_overlap(earlier: SplitScan, later: SplitScan) -> list[Finding]:
    shared = [k for k in later.keys if k in earlier.keys]
    if not shared:
        return []
    return [Finding(
        "entity_overlap", "error", f"{earlier.name}/{later.name}",
        f"{len(shared)} entities have rows in both {earlier.name} and {later.name}",
        "Split by entity (group split), so that each entity is in one split only.",
        {"shared_entities": len(shared)},
        tuple((k, earlier.keys[k], later.keys[k]) for k in shared[:EXAMPLES]))]


def _time_leaks(scans: list[SplitScan]) -> list[Finding]:
    train = scans[0]
    if train.time_max is None:
        return []
    findings = []
    for scan in scans[1:]:
        early = [(t, i) for t, i in scan.times if t < train.time_max]
        if early:
            findings.append(Finding(
                "time_leak", "error", scan.name,
                f"{len(early)} rows of {scan.name} are earlier than the end of training "
                f"({train.time_max}): the model is evaluated on the past it trained after",
                f"Split by time: every {scan.name} row after the last training row.",
                {"rows_before_train_end": len(early), "train_end": train.time_max,
                 f"{scan.name}_start": scan.time_min},
                tuple(i for _, i in early[:EXAMPLES])))
    return findings


def _missing_values(scan: SplitScan) -> list[Finding]:
    if not scan.nan_by_column:
        return []
    columns = sorted(scan.nan_by_column.items())
    total = sum(scan.nan_by_column.values())
    return [Finding(
        "missing_values", "warning", scan.name,
        f"{total} NaN values in {len(columns)} column(s) of {scan.name}",
        "Impute with statistics fitted on train only (or drop the rows), and add a "
        "missing-indicator if missingness carries signal.",
        {"nan_values": total, "columns": len(columns),
         "by_column": ", ".join(f"col {c}: {n}" for c, n in columns[:8])},
        tuple(c for c, _ in columns[:EXAMPLES]))]


def _target_shift(scans: list[SplitScan]) -> tuple[dict[str, Any], list[Finding]]:
    train = scans[0]
    if len(train.targets) <= MAX_CLASSES:
        return _prevalence_shift(scans)
    return _mean_shift(scans)


def _prevalence_shift(scans: list[SplitScan]) -> tuple[dict[str, Any], list[Finding]]:
    classes = sorted({c for s in scans for c in s.targets}, key=str)
    prevalence = {s.name: {str(c): s.targets[c] / max(s.rows, 1) for c in classes}
                  for s in scans}
    findings = []
    train = prevalence["train"]
    for scan in scans[1:]:
        shift = max(abs(prevalence[scan.name][str(c)] - train[str(c)]) for c in classes)
        if shift > PREVALENCE_SHIFT:
            worst = max(classes, key=lambda c: abs(prevalence[scan.name][str(c)]
                                                   - train[str(c)]))
            findings.append(Finding(
                "target_shift", "warning", scan.name,
                f"class {worst} is {prevalence[scan.name][str(worst)]:.1%} of {scan.name} "
                f"but {train[str(worst)]:.1%} of train",
                "Stratify the split by the target, or make sure the shift is the one "
                "deployment will see (then weigh the metric accordingly).",
                {"class": str(worst), "train_share": train[str(worst)],
                 f"{scan.name}_share": prevalence[scan.name][str(worst)],
                 "max_shift": shift}))
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
            findings.append(Finding(
                "target_shift", "warning", scan.name,
                f"the target's mean is {mean:.4g} in {scan.name} but {train_mean:.4g} in "
                f"train ({shift:.2f} training stds apart)",
                "Check how the split was made (by time? by source?) and whether deployment "
                "looks like train or like this split.",
                {"train_mean": train_mean, f"{scan.name}_mean": mean, "stds_apart": shift}))
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
               "pipeline applies them to val and test the same way.")
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
    if _is_numpy(value):
        return _from_numpy(value).to(torch.float64)
    return torch.as_tensor(value, dtype=torch.float64)


def _statistic_finding(name: str, used: torch.Tensor, on_train: torch.Tensor,
                       every: torch.Tensor | None, rtol: float) -> Finding:
    on_all = None if every is None else STATISTICS[name](every)
    evidence = {"used": _short(used), "train": _short(on_train)}
    if on_all is not None:
        evidence["all_rows"] = _short(on_all)
    if on_all is not None and every is not None and _matches(name, used, every, rtol):
        return Finding(
            "leakage", "error", name,
            f"{name} {_short(used)} matches all rows ({_short(on_all)}), not train "
            f"({_short(on_train)}): the preprocessing was fitted on the evaluation rows too",
            f"Fit the {name} on the training split only, then apply it unchanged to "
            "validation and test.", evidence)
    return Finding(
        "preprocessing_mismatch", "warning", name,
        f"{name} {_short(used)} is not the training split's ({_short(on_train)})",
        f"Recompute the {name} on the training split and check where the used value "
        "came from.", evidence)


def _short(tensor: torch.Tensor) -> float | list[float]:
    values = tensor.reshape(-1).tolist()
    rounded = [round(v, 6) for v in values]
    return rounded[0] if len(rounded) == 1 else rounded[:8]
