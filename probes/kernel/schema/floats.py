"""A step's float32 list as read from the packed form (stdlib only).

``probes.kernel.wire`` reads a packed list (base64 float32) into a ``Float32List``: a
plain ``list`` of floats to everything that reads it (equal to the same list read from
JSON numbers, encoded as a JSON list), that also says what the reader knows already:
every item is a float (a float32's value, NaN and Inf as they came) and none is None.
The monitor's readers skip their per-item type scans for it (``checks``, ``views``,
``tui.run``, ``tui.heatmap``), and keep its ``packed`` float32 array, 4 bytes a value,
instead of converting the list again: at a thousand ranks those scans and conversions
were a quarter of a record's cost.
"""

from __future__ import annotations

from array import array


class Float32List(list[float]):
    """Floats read from float32 values; ``packed``: the same values as ``array('f')``,
    never changed after (share it, do not modify it). Made by ``of``."""

    __slots__ = ("packed",)
    packed: array

    @classmethod
    def of(cls, packed: array) -> Float32List:
        """The list of ``packed``'s values (an ``array('f')``), holding it."""
        values = cls(packed.tolist())
        values.packed = packed
        return values
