"""Quantities as people read them: ``human_bytes`` (1.9 GiB). Standard library only, so
the training side's reports and the monitor's rules write bytes the same way."""

from __future__ import annotations

import math

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: float, *, compact: bool = False) -> str:
    """``n`` bytes in binary units: ``512 B``, ``502 KiB``, ``1.9 GiB`` (one decimal under
    10 of a unit, none above); ``compact``, as the monitor's status line has room for:
    ``512B``, ``502K``, ``1.9G``. ``?`` for what is not a finite number. Never raises."""
    try:
        value = float(n)
    except (TypeError, ValueError, OverflowError):
        return "?"
    if not math.isfinite(value):
        return "?"
    sign = "-" if value < 0 else ""
    value = abs(value)
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if round(value) >= 1024 and unit < len(_UNITS) - 1:  # (1023.7 KiB: 1.0 MiB)
        value /= 1024
        unit += 1
    name, space = (_UNITS[unit][0], "") if compact else (_UNITS[unit], " ")
    if unit == 0:
        return f"{sign}{value:.0f}{space}B"
    if round(value, 1) < 10:
        return f"{sign}{value:.1f}{space}{name}"
    return f"{sign}{value:.0f}{space}{name}"
