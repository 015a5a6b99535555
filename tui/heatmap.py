"""Per-layer gradient norms over the whole run, in bounded memory (pure, no widgets).

``GradHeatmap`` keeps, for every layer, at most ``capacity`` columns of equal step
width, each holding the largest gradient norm seen in its steps (an explosion must not
vanish into an average). When the run outgrows the columns, neighbouring columns are
merged pairwise and the width in steps doubles, as ``tui.series.BucketedSeries`` does,
so the whole run stays at an even resolution. Values are float32 (``array('f')``): one
layer costs 4 bytes a column, 2 KiB at the default 512 columns, whatever the run's
length; 64 ranks x 200 layers fit in about 26 MB.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

MISSING = -1.0  # no gradient in this column (no record yet, or .grad was None)
NON_FINITE = math.inf  # NaN or Inf: larger than any norm, so max() keeps it
FLOAT32_MAX = 3.4028234e38  # a finite norm above this would read back as inf


@dataclass
class GradHeatmap:
    """Largest gradient norm per layer and column of ``stride`` steps.

    Args:
        layers: how many layers (rows).
        capacity: columns kept at most (even; between half and all of them are used).

    Example:
        >>> heat = GradHeatmap(layers=2, capacity=4)
        >>> for step in range(10):
        ...     heat.add(step, [1.0, float(step)])
        >>> heat.stride, heat.columns, list(heat.row(1))
        (4, 3, [3.0, 7.0, 9.0])
    """

    layers: int
    capacity: int = 512
    stride: int = 1  # steps per column
    origin: int | None = None  # the step of column 0 (the run's first record)
    rows: list[array] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.capacity < 2 or self.capacity % 2:
            raise ValueError("capacity must be even and at least 2")
        if not self.rows:
            self.rows = [array("f") for _ in range(self.layers)]

    @property
    def columns(self) -> int:
        """Columns in use."""
        return len(self.rows[0]) if self.rows else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the values (what grows with layers and, up to the capacity,
        with the run)."""
        return sum(row.itemsize * row.buffer_info()[1] for row in self.rows)

    def column_of(self, step: int) -> int:
        """The column holding ``step`` (once the first step is known)."""
        return (step - (self.origin or 0)) // self.stride

    def column_steps(self, column: int) -> tuple[int, int]:
        """The first and last step a column stands for."""
        first = (self.origin or 0) + column * self.stride
        return first, first + self.stride - 1

    def add(self, step: int, norms: Sequence[float | None],
            first_step: int | None = None) -> None:
        """Take one record's per-layer norms (``None``: no gradient).

        A thinned record stands for steps ``first_step..step``: it fills every column
        of its span, so a fast run shows no holes.
        """
        if len(norms) != self.layers:
            return
        if self.origin is None:
            self.origin = step if first_step is None else min(first_step, step)
        last = self.column_of(step)
        while last >= self.capacity:
            self._fold()
            last = self.column_of(step)
        first = last if first_step is None else max(self.column_of(first_step), 0)
        first = min(first, last)
        grow = last + 1 - self.columns
        for row, norm in zip(self.rows, norms, strict=True):
            if grow > 0:
                row.extend([MISSING] * grow)
            if norm is None:
                continue
            value = _stored(norm)
            for column in range(first, last + 1):
                if value > row[column]:
                    row[column] = value

    def row(self, layer: int) -> array:
        """One layer's columns (``MISSING``, ``NON_FINITE`` or a norm)."""
        return self.rows[layer]

    def peak(self, layer: int) -> float | None:
        """The largest norm a layer had over the whole run (inf if ever non-finite)."""
        row = self.rows[layer]
        best = max(row, default=MISSING)
        return None if best == MISSING else best

    def resample(self, width: int) -> tuple[list[list[float]], int]:
        """The columns regrouped to at most ``width`` (each the max of its group, so the
        groups are of equal step width); returns (rows, columns per group)."""
        columns = self.columns
        if width <= 0 or columns == 0:
            return [[] for _ in self.rows], 1
        group = max(1, math.ceil(columns / width))
        out = []
        for row in self.rows:
            if group == 1:
                out.append(list(row))
            else:
                out.append([max(row[i:i + group]) for i in range(0, columns, group)])
        return out, group

    def _fold(self) -> None:
        """Merge neighbouring columns pairwise (max); the stride doubles."""
        self.stride *= 2
        for index, row in enumerate(self.rows):
            merged = array("f", (max(row[i:i + 2]) for i in range(0, len(row), 2)))
            self.rows[index] = merged


def _stored(norm: float) -> float:
    """A norm as kept: non-finite as ``NON_FINITE``, finite ones within float32."""
    if not math.isfinite(norm):
        return NON_FINITE
    return min(max(norm, 0.0), FLOAT32_MAX)
