"""Per-layer gradient norms over the whole run, in bounded memory (pure, no widgets).

``GradHeatmap`` keeps, for every layer, at most ``capacity`` columns of equal step
width, each holding the largest gradient norm seen in its steps (an explosion must not
vanish into an average). When the run outgrows the columns, neighbouring columns are
merged pairwise and the width in steps doubles (``probes.kernel.fold``, as
``tui.series.BucketedSeries`` does), so the whole run stays at an even resolution.
Values are float32 (``array('f')``): one layer costs 4 bytes a column, 2 KiB at the
default 512 columns, whatever the run's length; 64 ranks x 200 layers fit in about 26 MB.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from probes.kernel.fold import fold_pairs
from probes.kernel.schema.floats import Float32List

MISSING = -1.0  # no gradient in this column (no record yet, or .grad was None)
NON_FINITE = math.inf  # NaN or Inf: larger than any norm, so max() keeps it
FLOAT32_MAX = 3.4028234e38  # a finite norm above this would read back as inf


@dataclass
class GradHeatmap:
    """Largest gradient norm per layer and column of ``stride`` steps.

    Stored by column (one ``array('f')`` of every layer's value per column), so a step
    record costs a few list operations at C speed rather than a Python loop over the
    layers; the newest column stays a plain list while its records come in.

    Args:
        layers: how many layers (rows).
        capacity: columns kept at most (even; between half and all of them are used).

    Example:
        >>> heat = GradHeatmap(layers=2, capacity=4)
        >>> for step in range(10):
        ...     heat.add(step, [1.0, float(step)])
        >>> heat.stride, heat.columns, heat.row(1)
        (4, 3, [3.0, 7.0, 9.0])
    """

    layers: int
    capacity: int = 512
    stride: int = 1  # steps per column
    origin: int | None = None  # the step of column 0 (the run's first record)
    sealed: list[array] = field(default_factory=list)  # every column but the newest
    newest: list[float] | None = None  # the newest column, still taking records

    def __post_init__(self) -> None:
        if self.capacity < 2 or self.capacity % 2:
            raise ValueError("capacity must be even and at least 2")
        self._missing = array("f", [MISSING] * self.layers)  # shared, never changed

    @property
    def columns(self) -> int:
        """Columns in use."""
        return len(self.sealed) + (self.newest is not None)

    @property
    def nbytes(self) -> int:
        """Bytes held by the values (what grows with layers and, up to the capacity,
        with the run); the newest column counted as float32 too."""
        return 4 * self.layers * self.columns

    def column_of(self, step: int) -> int:
        """The column holding ``step`` (once the first step is known)."""
        return (step - (self.origin or 0)) // self.stride

    def column_steps(self, column: int) -> tuple[int, int]:
        """The first and last step a column stands for."""
        first = (self.origin or 0) + column * self.stride
        return first, first + self.stride - 1

    def add(self, step: int, norms: Sequence[float | None], first_step: int | None = None) -> None:
        """Take one record's per-layer norms (``None``: no gradient).

        A thinned record stands for steps ``first_step..step``: it fills every column
        of its span, so a fast run shows no holes.
        """
        if len(norms) != self.layers or not self.layers:
            return
        if self.origin is None:
            self.origin = step if first_step is None else min(first_step, step)
        last = self.column_of(step)
        while last >= self.capacity:
            self._fold()
            last = self.column_of(step)
        first = last if first_step is None else min(max(self.column_of(first_step), 0), last)
        values = _stored(norms)
        newest = len(self.sealed)  # the index of the newest column, open or not yet
        if self.newest is not None and last > newest:  # a new column begins: seal
            self.sealed.append(_column(self.newest))
            self.newest = None
            newest += 1
        for column in range(first, min(last, newest)):  # a span over older columns
            self.sealed[column] = array("f", map(max, self.sealed[column], values))
        while len(self.sealed) < last:  # columns the record skipped, or spans
            self.sealed.append(array("f", values) if len(self.sealed) >= first else self._missing)
        if self.newest is None:
            self.newest = values
        else:
            self.newest = [a if a >= b else b for a, b in zip(self.newest, values, strict=True)]

    def row(self, layer: int) -> list[float]:
        """One layer's columns (``MISSING``, ``NON_FINITE`` or a norm)."""
        out = [column[layer] for column in self.sealed]
        if self.newest is not None:
            out.append(_as_float32(self.newest[layer]))
        return out

    def peak(self, layer: int) -> float | None:
        """The largest norm a layer had over the whole run (inf if ever non-finite)."""
        best = max(self.row(layer), default=MISSING)
        return None if best == MISSING else best

    def resample(self, width: int) -> list[list[float]]:
        """Rows of exactly ``width`` cells spread evenly over the whole run: each cell
        the max of the columns it covers (as many as the screen allows, their count
        differing by at most one between cells), a short run's columns widened."""
        columns = self._all_columns()
        count = len(columns)
        if width <= 0 or not count:
            return [[] for _ in range(self.layers)]
        bounds = [i * count // width for i in range(width + 1)]
        cells = []
        for start, end in itertools.pairwise(bounds):
            group = columns[start : max(end, start + 1)]
            cells.append(list(map(max, *group)) if len(group) > 1 else list(group[0]))
        return [list(row) for row in zip(*cells, strict=True)]

    def _all_columns(self) -> list[Sequence[float]]:
        if self.newest is None:
            return list(self.sealed)
        return [*self.sealed, array("f", self.newest)]

    def _fold(self) -> None:
        """Merge neighbouring columns pairwise (max); the stride doubles."""
        columns = self._all_columns()
        self.newest = None
        self.stride *= 2
        self.sealed = fold_pairs(cast("list[array]", columns), _larger)  # (arrays, all)


def _larger(older: array, newer: array) -> array:
    return array("f", map(max, older, newer))


def _column(values: list[float]) -> array:
    """The newest column, sealed: float32 (a list read packed holds its array already,
    never changed: shared, not copied)."""
    return values.packed if type(values) is Float32List else array("f", values)


def _stored(norms: Sequence[float | None]) -> list[float]:
    """Norms as kept: None as ``MISSING``, non-finite as ``NON_FINITE``, finite ones
    within float32 (``array('f')`` would turn 1e39 into inf: a false non-finite). A list
    read packed is float32 already, with no None: kept as it is when all are finite."""
    if type(norms) is Float32List:
        if math.isfinite(sum(norms)):
            return norms
        values: list[float] = list(norms)
    elif None in norms:
        values = [MISSING if v is None else v for v in norms]
    else:
        values = list(cast("Sequence[float]", norms))
    total = sum(values)  # NaN and inf show in the sum: the common case checks nothing else
    if math.isfinite(total) and max(values) <= FLOAT32_MAX:
        return values
    return [NON_FINITE if not math.isfinite(v) else min(v, FLOAT32_MAX) for v in values]


def _as_float32(value: float) -> float:
    return array("f", [value])[0]
