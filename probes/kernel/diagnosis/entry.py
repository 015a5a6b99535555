"""One kind of alert as the catalog describes it (its own module: the catalog's parts
import it)."""

from __future__ import annotations

from dataclasses import dataclass

from probes.kernel.diagnosis.vocabulary import Rung


@dataclass(frozen=True)
class Entry:
    """One kind of alert, as the catalog describes it."""

    rung: Rung
    signal: str = ""
    experiments: tuple[str, ...] = ()
