"""Every alert kind: its rung on the lesson's checklist, what it signals and what it does
not prove, the next controlled experiments, one change each, and for the manual
(``docs/alerts.md``, written by ``probes.kernel.diagnosis.manual``) the evidence its
alerts show and an example.

The rungs are the lesson's layered checklist; root causes are shown in this order:

1. data and split, 2. shapes, values and the loss contract, 3. the tiny-batch test,
4. the gradient path, 5. the update, 6. evaluation; 7 is the probe itself and 8 the
step's time and memory.

``CATALOG`` holds the kinds the monitor's rules and the probe's own checks during
training raise with these words (an alert carries ``Entry.signal`` and
``Entry.experiments``; the monitor's detail view adds ``Entry.not_proved``). Kinds raised
by the training side's checks (``probes.check_split``, ``check_batch``, ...) carry their
own message and fix: ``CHECK_ENTRIES`` describes them for the manual, and gives their rung.
The entries themselves are in the ``catalog_*`` modules, by rung.
"""

from __future__ import annotations

from probes.kernel.diagnosis.catalog_checks import CHECK_ENTRIES
from probes.kernel.diagnosis.catalog_evaluation import EVALUATION_ENTRIES
from probes.kernel.diagnosis.catalog_gradients import GRADIENT_ENTRIES
from probes.kernel.diagnosis.catalog_ranks import JOB_ENTRIES
from probes.kernel.diagnosis.catalog_rates import RATE_ENTRIES
from probes.kernel.diagnosis.catalog_resources import RESOURCE_ENTRIES
from probes.kernel.diagnosis.catalog_update import WIRING_ENTRIES
from probes.kernel.diagnosis.catalog_values import VALUE_ENTRIES
from probes.kernel.diagnosis.entry import Entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung

__all__ = [
    "CATALOG",
    "CHECK_ENTRIES",
    "CHECK_RUNGS",
    "ENDED_BY_FIRST_STEP",
    "ENTRIES",
    "RUNGS",
    "Entry",
    "entry",
    "rung_of",
]

#: Each rung's name on the checklist, by number (``Rung`` carries it).
RUNGS: dict[int, str] = {rung.value: rung.label for rung in Rung}

CATALOG: dict[AlertKind, Entry] = {
    **VALUE_ENTRIES,  # 2 and 3 (catalog_values.py)
    **GRADIENT_ENTRIES,  # 4 (catalog_gradients.py)
    **WIRING_ENTRIES,  # 5: the optimizer's wiring and its steps (catalog_update.py)
    **RATE_ENTRIES,  # 5: the updates' size (catalog_rates.py)
    **EVALUATION_ENTRIES,  # 6 and 7 (catalog_evaluation.py)
    **JOB_ENTRIES,  # across the ranks of a job (catalog_ranks.py)
    **RESOURCE_ENTRIES,  # 8: the step's time and memory (catalog_resources.py)
}

#: Every kind's entry: the catalog's and the training side's checks'.
ENTRIES: dict[AlertKind, Entry] = {**CATALOG, **CHECK_ENTRIES}

# Probe alerts whose condition ends with the run's first measured step: the monitor
# clears them when a step record arrives (an LR range test or warm-up updates before
# the bracketed loop raise one, then the loop is measured after all).
ENDED_BY_FIRST_STEP: frozenset[str] = frozenset({AlertKind.STEPS_NOT_MEASURED})

# Kinds the training side's checks raise (their alerts carry their own message and fix).
CHECK_RUNGS: dict[AlertKind, Rung] = {kind: found.rung for kind, found in CHECK_ENTRIES.items()}

UNKNOWN_RUNG = Rung.UPDATE  # a kind from a newer probe: among the update checks


def rung_of(kind: str) -> Rung:
    """The checklist rung of an alert kind."""
    entry = CATALOG.get(kind)  # type: ignore[call-overload]
    if entry is not None:
        return entry.rung
    return CHECK_RUNGS.get(kind, UNKNOWN_RUNG)  # type: ignore[call-overload]


def entry(kind: str) -> Entry:
    """The catalog's entry for a kind (KeyError for a kind it does not describe)."""
    return CATALOG[kind]  # type: ignore[index]
