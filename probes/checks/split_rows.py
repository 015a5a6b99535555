"""A split's rows read with torch alone: chunks, fields, digests, NaN columns and the
values a selector picks, for ``probes.checks.data_checks``.

Tensor and array splits are read a chunk at a time as one tensor; Dataset rows whose
fields agree (``(x, y)`` tuples of like tensors) are stacked a chunk at a time; other
rows are read one by one. All three give the same digest for the same row. NumPy is a
development dependency only: its arrays are recognised when the caller has imported
NumPy, and this module never imports it.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

Selector = int | str | Callable[[Any], Any] | None
CHUNK_ROWS = 4096
SMALL_FIELD = 64  # up to this many values, a field's NaNs are found in Python (no kernel)


# --- reading values without NumPy ---------------------------------------------------------


def _numpy_types() -> tuple[type, ...]:
    """NumPy's array and scalar types if the caller has imported NumPy, else ()."""
    numpy = sys.modules.get("numpy")
    return () if numpy is None else (numpy.ndarray, numpy.generic)


def is_numpy(value: Any) -> bool:
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
    elif is_numpy(value):
        tensor = from_numpy(value)
    else:
        tensor = torch.as_tensor(value)
        if tensor.is_floating_point() and tensor.dtype != torch.float64:
            tensor = torch.as_tensor(value, dtype=torch.float64)
        elif tensor.is_complex() and tensor.dtype != torch.complex128:
            tensor = torch.as_tensor(value, dtype=torch.complex128)
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def from_numpy(array: Any) -> torch.Tensor:
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
        if is_numpy(value):  # strings, objects, dates: NumPy's own bytes
            return RowField(
                f"numpy.{value.dtype}{value.shape}".encode(), value.tobytes(), (), int(value.size)
            )
        return RowField(
            f"{kind.__module__}.{kind.__qualname__}".encode(), repr(value).encode(), (), 1
        )
    return RowField(
        _header(tensor.dtype, tuple(tensor.shape)),
        tensor_bytes(tensor),
        _nan_positions(tensor),
        tensor.numel(),
    )


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
    if is_numpy(value):  # NumPy's own methods: no import needed
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
        raise TypeError(
            f"a split must be a tensor, an array, a list of rows or a Dataset "
            f"with len() and [i], got {type(data).__name__}"
        )
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
    return any(
        isinstance(item, (torch.Tensor, Sequence, *_numpy_types()[:1]))
        and not isinstance(item, str)
        for item in row
    )


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
            views.append(
                (_header(block.dtype, tuple(block.shape[1:])), memory, len(memory) // rows)
            )
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
    """A row's fields as ``row_fields`` splits it, if it is a tensor, a dict, or a tuple
    or list that holds a tensor (None: a row read one by one)."""
    if isinstance(row, torch.Tensor):
        return (row,)
    if type(row) is dict:
        return tuple(row[k] for k in sorted(row))
    if type(row) in (tuple, list) and any(isinstance(item, torch.Tensor) for item in row):
        return tuple(row)
    return None


def _kind(item: Any) -> Any:
    """What must agree between rows for a field to stack: a tensor's dtype, shape,
    device and layout, or a Python number's type (None: not stackable)."""
    if isinstance(item, torch.Tensor):
        return (item.dtype, item.shape, item.device, item.layout)
    kind = type(item)
    return kind if kind in (float, int, bool) else None


_SCALAR_DTYPES: dict[Any, torch.dtype] = {float: torch.float64, int: torch.int64, bool: torch.bool}


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
            return [
                _dense(torch.stack(column).cpu())
                if isinstance(kind, tuple)
                else torch.tensor(column, dtype=_SCALAR_DTYPES[kind])
                for column, kind in zip(columns, kinds, strict=True)
            ]
    except (TypeError, RuntimeError, ValueError, OverflowError):
        return None


def _count_block_nans(flat: torch.Tensor, first_column: int, by_column: Counter[int]) -> None:
    step = max(1, 2**22 // max(flat.shape[1], 1))  # a bounded mask, for rows of images
    for low in range(0, len(flat), step):
        per_column = torch.isnan(flat[low : low + step]).sum(dim=0)
        columns = per_column.nonzero().reshape(-1)
        for column, count in zip(columns.tolist(), per_column[columns].tolist(), strict=True):
            by_column[first_column + column] += count
