"""One kind of alert as the catalog describes it (its own module: the catalog's parts
import it).

An entry says what an alert of its kind means, as data a manual page is written from
(``probes.kernel.diagnosis.manual``, ``docs/alerts.md``): its rung, what it is a signal
of (``signal``, the words its alerts carry), what it does not prove (``not_proved``),
the next controlled experiments, the evidence keys its alerts show and what each one
means, and an example alert's evidence, from which the page renders an example line
through ``Alert.line()`` (so the example has the real format). Kinds no rule of the
monitor raises (the training side's checks) also say which check raises them and with
what severity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from probes.kernel.diagnosis.vocabulary import Rung, Severity

#: The keys of ``Entry.example`` that are not evidence: the example alert's step,
#: subject and (optional) severity, when it is not the entry's usual one.
EXAMPLE_FIELDS = ("step", "subject", "severity")


@dataclass(frozen=True)
class Traits:
    """How the monitor keeps alerts of one kind as incidents
    (``probes.kernel.diagnosis.incidents`` reads them; every flag is off by default)."""

    # a cause that leaves the run damaged: its consequences fold under it for the rest
    # of the run, even once it has cleared ...
    sticky: bool = False
    # ... unless the run recovers: cleared, and the smoothed loss back below where it
    # stood when raised (structural faults do not heal by training: not recoverable)
    recoverable: bool = False
    # its numbers hover about their bound while the cause persists: held
    # ``hold_steps`` once healthy (not ``clear_after``), so one cause is one incident
    held: bool = False
    # its rule says when a new incident begins (a burst of spikes is one): a finding
    # first seen at another step is another incident, even while one is held
    event: bool = False
    # one a run: a contract broken, seen by two checks, is one incident
    said_once: bool = False
    # a consequence that may be found a few steps before its cause: it waits for it
    waits_for_cause: bool = False


@dataclass(frozen=True)
class Entry:
    """One kind of alert, as the catalog describes it."""

    rung: Rung
    signal: str = ""  # what it is a signal of
    experiments: tuple[str, ...] = ()  # the next controlled experiments, one change each
    not_proved: str = ""  # what it does not prove
    # the evidence keys its alerts show, in the order they show them, and what each
    # means; a key written ``<split>_rows`` stands for one built from a name (val_rows)
    evidence: tuple[tuple[str, str], ...] = ()
    # an example alert: its evidence (realistic values), plus "step", "subject" and,
    # where the example is raised with another severity than the usual, "severity"
    example: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # kinds no rule class raises: the training-side check(s) that do ...
    raised_by: str = ""
    # ... and the severity they raise it with (None: the rule class's says it)
    severity: Severity | None = None
    # when its severity varies: with which, when
    severity_note: str = ""
    # how its alerts are kept as incidents (sticky, held, ...)
    traits: Traits = field(default_factory=Traits)

    @property
    def said(self) -> str:
        """What it signals and what it does not prove, as one text (an alert's words)."""
        return f"{self.signal} {self.not_proved}".strip()
