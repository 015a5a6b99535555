"""The one bounded-series fold: neighbours joined pairwise, so a series that outgrows
its room keeps the whole run at half the resolution (stdlib only).

A series kept in bounded memory (the monitor's charts, its gradient heatmap, the
probe's replay history) folds its oldest part when full: each pair of neighbours
becomes one item standing for both, and the width of an item (its stride, in steps or
points) doubles. What "join" means is the series' own: the larger of two columns of
norms, the min / max / last of two buckets, the merge of two step records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def fold_pairs(items: Sequence[T], join: Callable[[T, T], T]) -> list[T]:
    """``items`` with each pair of neighbours joined, in order (``join(older, newer)``);
    an odd last item stays as it is. Half as many items, each standing for two.

    Example::

        >>> fold_pairs([1, 2, 3, 4, 5], max)
        [2, 4, 5]
    """
    out = [join(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
    if len(items) % 2:
        out.append(items[-1])
    return out
