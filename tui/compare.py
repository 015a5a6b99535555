"""Runs side by side: per-layer gradient-norm ratios against a reference run (pure).

Layers are matched by name (a scenario and its fixed version share them). For each
layer and each other run: the latest gradient norm over the reference's latest, and
the largest finite norm of the whole run over the reference's (from the heatmap's
buckets, so a peak long past still counts); ``went_non_finite`` says whether the layer
ever had a NaN or Inf gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tui.heatmap import MISSING, NON_FINITE
from tui.run import RunState


@dataclass(frozen=True)
class LayerRatio:
    """One layer of the comparison."""

    layer: str
    reference: float | None  # the reference run's latest grad norm
    latest: tuple[float | None, ...]  # each other run's latest grad norm
    ratios: tuple[float | None, ...]  # latest / reference latest
    peak_ratios: tuple[float | None, ...]  # largest finite norm / the reference's
    went_non_finite: tuple[bool, ...]


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``: None when either is unknown or both are zero; inf over a
    zero reference; NaN when either is NaN."""
    if value is None or reference is None:
        return None
    if math.isnan(value) or math.isnan(reference):
        return math.nan
    if reference == 0:
        return None if value == 0 else math.inf
    if math.isinf(value) and math.isinf(reference):
        return math.nan
    return value / reference


def finite_peak(run: RunState, layer: int) -> float | None:
    """The largest finite grad norm a layer had over the run (None if never any)."""
    if layer >= run.heatmap.layers:
        return None
    best = MISSING
    for value in run.heatmap.row(layer):
        if value != NON_FINITE and value > best:
            best = value
    return None if best == MISSING else best


def went_non_finite(run: RunState, layer: int) -> bool:
    """Whether a layer's gradient was ever NaN or Inf (as far as the buckets saw)."""
    return layer < run.heatmap.layers and NON_FINITE in run.heatmap.row(layer)


def layer_ratios(reference: RunState, others: list[RunState]) -> list[LayerRatio]:
    """One row per layer: the reference's layers in order, then any other run's layers
    the reference lacks."""
    names = list(reference.layers)
    for run in others:
        names += [name for name in run.layers if name not in names]
    index = [{name: i for i, name in enumerate(run.layers)} for run in [reference, *others]]
    rows = []
    for name in names:
        ref_i = index[0].get(name)
        ref_latest = _latest(reference, ref_i)
        ref_peak = None if ref_i is None else finite_peak(reference, ref_i)
        latest, ratios, peaks, bad = [], [], [], []
        for run, positions in zip(others, index[1:], strict=True):
            i = positions.get(name)
            value = _latest(run, i)
            latest.append(value)
            ratios.append(ratio(value, ref_latest))
            peaks.append(ratio(None if i is None else finite_peak(run, i), ref_peak))
            bad.append(i is not None and went_non_finite(run, i))
        rows.append(
            LayerRatio(name, ref_latest, tuple(latest), tuple(ratios), tuple(peaks), tuple(bad))
        )
    return rows


def _latest(run: RunState, layer: int | None) -> float | None:
    if layer is None or layer >= len(run.grad_norms):
        return None
    return run.grad_norms[layer]
