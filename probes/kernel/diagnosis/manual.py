"""The alert manual, ``docs/alerts.md``, written from the alert catalog.

One section per alert kind (its anchor the kind itself: ``docs/alerts.md#exploding_gradient``),
in the order of the debugging checklist: its rung, who raises it and with what severity
(read from the rule class that raises it, where one does), what it is a signal of and
what it does not prove, the evidence keys its alerts show, the next experiments, and an
example line rendered through ``Alert.line()`` from the entry's example evidence, so the
example has the real format.

    python -m probes.kernel.diagnosis.manual > docs/alerts.md   # write the page
    python -m probes.kernel.diagnosis.manual --check docs/alerts.md   # 1 when stale

(``tests/repo/test_alerts_manual.py`` fails when the committed page is stale.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from probes.kernel.diagnosis.alert import Alert
from probes.kernel.diagnosis.catalog import ENTRIES, Entry
from probes.kernel.diagnosis.diagnoser import RULES
from probes.kernel.diagnosis.entry import EXAMPLE_FIELDS
from probes.kernel.diagnosis.incidents import (
    CONSEQUENCES,
    JOB_CONSEQUENCES,
    JOB_RANK_CONSEQUENCES,
)
from probes.kernel.diagnosis.ranks import _SEVERITY as CROSS_RANK_SEVERITY  # the checks' own
from probes.kernel.diagnosis.ranks import JobChecks
from probes.kernel.diagnosis.rule import Rule
from probes.kernel.diagnosis.straggler import SEVERITY as STRAGGLER_SEVERITY
from probes.kernel.diagnosis.straggler import Stragglers
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

PAGE = "docs/alerts.md"
REGENERATE = f"python -m probes.kernel.diagnosis.manual > {PAGE}"
#: The kinds a job's checks raise (``job.JobDiagnoser`` runs them): the check, and the
#: severity it raises them with.
JOB_CHECKS: dict[str, tuple[type, Severity]] = {
    **{kind: (JobChecks, severity) for kind, severity in CROSS_RANK_SEVERITY.items()},
    AlertKind.STRAGGLER: (Stragglers, STRAGGLER_SEVERITY),
}
JOB_SEVERITY: dict[str, Severity] = {kind: found[1] for kind, found in JOB_CHECKS.items()}


def kinds_in_order() -> list[AlertKind]:
    """Every kind, along the checklist: by rung, then as the vocabulary lists them."""
    order = {kind: i for i, kind in enumerate(AlertKind)}
    return sorted(AlertKind, key=lambda kind: (ENTRIES[kind].rung, order[kind]))


def raising_rule(kind: AlertKind) -> type[Rule] | None:
    """The monitor's rule class that raises ``kind`` (None: no rule does)."""
    return next((rule for rule in RULES if kind in rule.raises()), None)


def source_path(module: str) -> str:
    """A module's source file, as a path from the repository's root."""
    return module.replace(".", "/") + ".py"


def raised_by(kind: AlertKind) -> str:
    """Who raises ``kind``: a rule of the monitor, the job's cross-rank checks, or the
    training side's check its entry names."""
    rule = raising_rule(kind)
    if rule is not None:
        return f"the monitor's rule `{rule.__name__}` (`{source_path(rule.__module__)}`)"
    if kind in JOB_CHECKS:
        check = JOB_CHECKS[kind][0]
        return (
            f"the monitor's checks across a job's ranks (`{check.__name__}`, "
            f"`{source_path(check.__module__)}`)"
        )
    found = ENTRIES[kind]
    if not found.raised_by:
        raise ValueError(f"{kind}: no rule raises it and its entry names no check")
    return f"in the training process, by {found.raised_by}"


def severity_of(kind: AlertKind) -> Severity:
    """The severity ``kind`` is raised with: its rule class's, the cross-rank checks',
    or the one its entry gives (the training side's checks)."""
    rule = raising_rule(kind)
    if rule is not None:
        return rule.severity
    if kind in JOB_SEVERITY:
        return JOB_SEVERITY[kind]
    found = ENTRIES[kind]
    if found.severity is None:
        raise ValueError(f"{kind}: no rule raises it and its entry gives no severity")
    return found.severity


def severity_text(kind: AlertKind) -> str:
    """The severity as the page says it: the level, whose it is, and when it varies."""
    severity = severity_of(kind)
    rule = raising_rule(kind)
    if rule is not None:
        whose = f"the default of `{rule.__name__}`"
    elif kind in JOB_SEVERITY:
        whose = "the cross-rank checks'"
    else:
        whose = "set by the check"
    note = ENTRIES[kind].severity_note
    return f"`{severity}` ({whose})" + (f"; {note}" if note else ".")


def example_alert(kind: AlertKind) -> Alert:
    """The entry's example as an alert: its evidence, step and subject, at the kind's
    severity (or the example's own)."""
    found = ENTRIES[kind]
    example = dict(found.example)
    step = int(example.pop("step", 0))
    subject = str(example.pop("subject", ""))
    severity = Severity(example.pop("severity", None) or severity_of(kind))
    return Alert(kind, severity, step, subject, example, found.signal, found.experiments)


def example_line(kind: AlertKind) -> str:
    """The example alert's line, as ``Alert.line()`` writes it."""
    return example_alert(kind).line()


def folds_under(kind: AlertKind) -> list[str]:
    """The causes ``kind`` folds under (``incidents``): a run's, then a job's."""
    causes = [fold.cause for fold in CONSEQUENCES.get(kind, ())]
    causes += [cause for cause, kinds in JOB_CONSEQUENCES.items() if kind in kinds]
    causes += [cause for cause, kinds in JOB_RANK_CONSEQUENCES.items() if kind in kinds]
    return list(dict.fromkeys(causes))


def link(kind: str) -> str:
    """A link to a kind's section."""
    return f"[`{kind}`](#{kind})"


def cell(text: str) -> str:
    """Text for a cell of a markdown table (a pipe would end the cell)."""
    return text.replace("|", "\\|")


INTRO = f"""\
# Alerts

<!-- Generated from the alert catalog (probes/kernel/diagnosis/catalog*.py) by
`{REGENERATE}`; do not edit it by hand:
tests/repo/test_alerts_manual.py fails when this page and the catalog differ. -->

Every kind of alert traintop raises, one section each (its anchor is the kind:
`{PAGE}#exploding_gradient`), along the debugging checklist.

## What an alert says

An alert is one diagnosis: what is wrong (its kind), how bad (its severity), where (its
step, and its subject: the first failing layer, or the field, split, check or rank it
concerns), on what evidence (the numbers that triggered it), what it is a signal of and
what it does not prove, and the next controlled experiments, each changing one thing.
The monitor lists alerts in its alerts panel (Enter opens one in full, and names its
section here); `traintop --headless` prints one line per alert:

```text
ALERT <severity> <kind> step=<n> subject=<s> key=value ... [rank=R] [folded=kind@step,...]
```

The `key=value` words are the alert's evidence, listed for each kind below. In a job of
several ranks an alert also says which ranks raised it (`rank=R`, `ranks=R,S` or
`ranks=all`). The examples below are written by the alert's own `line()`, which writes a
space in a value as `_`; `traintop --headless` writes such a value in double quotes
instead (`names="head.weight, head.bias"`).

Most alerts are raised by the monitor's rules, from the records the probe sends (live, and
again on replay); the others by checks on the training side (`probes.check_split`,
`probes.check_batch`, `probes.overfit_batch`, and `probes.watch`'s own checks), which arrive
with their own message and fix. Each section says which.

## Severity

- `error`: the numbers or the wiring are wrong; what the run shows after it is not to be
  trusted until it is fixed.
- `warning`: likely a problem, or the sign of one; look before trusting the run.
- `info`: worth knowing (a cost, a setting, a choice that may be deliberate); not a fault by
  itself.

`traintop --headless --fail-on <severity>` exits with status 3 as soon as an alert that
severe, or worse, fires.

## One alert per root cause

An alert is an incident: one per root cause. It names the first failing layer (the first
to fail, then the first in the model) and lists the others. A consequence found while its
cause holds (or at any time after a cause that leaves the run damaged: an explosion, a
non-finite value, uncleared gradients, a structural fault) is not raised as an alert of its
own: it is folded under the cause, which lists it (`folded=kind@step`). Each section below
names the causes its kind folds under. An alert is held while its condition lasts and
cleared a few steps after it ends.

The monitor lists root causes along the checklist, rung by rung (active ones first; within
a rung, errors before warnings before infos), because a fault on an earlier rung explains
the ones after it: read the first rung's alerts first.
"""


def contents() -> Iterator[str]:
    """The table of contents: each rung's kinds."""
    yield "## Contents"
    yield ""
    kinds = kinds_in_order()
    for rung in Rung:
        here = [link(kind) for kind in kinds if ENTRIES[kind].rung == rung]
        if here:
            yield f"- **{rung.value}, {rung.label}:** " + ", ".join(here)
    yield ""


def section(kind: AlertKind) -> Iterator[str]:
    """One kind's section."""
    found: Entry = ENTRIES[kind]
    yield f"## {kind}"
    yield ""
    yield f"- **Rung:** {found.rung.value}, {found.rung.label}"
    yield f"- **Raised by:** {raised_by(kind)}"
    yield f"- **Severity:** {severity_text(kind)}"
    kept = kept_as(found)
    if kept:
        yield f"- **Kept as an incident:** {kept}"
    causes = folds_under(kind)
    if causes:
        yield (
            "- **Folds under** (while one holds; the conditions are in "
            "`probes/kernel/diagnosis/incidents.py`): " + ", ".join(map(link, causes))
        )
    yield ""
    yield f"**What it is a signal of.** {found.signal}"
    yield ""
    yield f"**What it does not prove.** {found.not_proved}"
    yield ""
    yield from evidence_table(found)
    yield "**Next experiments** (one change each):"
    yield ""
    for i, experiment in enumerate(found.experiments, start=1):
        yield f"{i}. {experiment}"
    yield ""
    yield "**Example:**"
    yield ""
    yield "```text"
    yield example_line(kind)
    yield "```"
    yield ""


#: What each of an entry's traits means on the page (``Entry.traits``).
TRAIT_WORDS = {
    "sticky": "sticky (what follows from it folds under it for the rest of the run)",
    "recoverable": "until the run recovers (cleared, and the loss back below where it was)",
    "held": "held a while once healthy (its numbers hover about the bound)",
    "event": "each burst its own incident",
    "said_once": "once a run",
    "waits_for_cause": "waits a few steps for a cause to fold under",
}


def kept_as(found: Entry) -> str:
    """The entry's traits in words ('' when it has none)."""
    return "; ".join(words for trait, words in TRAIT_WORDS.items() if getattr(found.traits, trait))


def evidence_table(found: Entry) -> Iterator[str]:
    """The evidence keys and what each means (or that there are none)."""
    if not found.evidence:
        yield "**Evidence:** none beyond its subject; the check's message says what it found."
        yield ""
        return
    yield "**Evidence:**"
    yield ""
    yield "| key | meaning |"
    yield "| --- | --- |"
    for key, meaning in found.evidence:
        yield f"| `{cell(key)}` | {cell(meaning)} |"
    yield ""


def render_alerts_page() -> str:
    """The whole page, as markdown (ending with one newline)."""
    lines = [INTRO, *contents()]
    for kind in kinds_in_order():
        lines += section(kind)
    return "\n".join(lines).rstrip("\n") + "\n"


def example_keys(found: Entry) -> list[str]:
    """The evidence keys of an entry's example (its step, subject and severity aside)."""
    return [key for key in found.example if key not in EXAMPLE_FIELDS]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the page, or (``--check PATH``) say whether PATH is the page as rendered."""
    parser = argparse.ArgumentParser(
        prog="python -m probes.kernel.diagnosis.manual",
        description="Print the alert manual (docs/alerts.md), or check a copy of it.",
    )
    parser.add_argument("--check", metavar="PATH", help="exit 1 if PATH differs from the page")
    args = parser.parse_args(argv)
    page = render_alerts_page()
    if args.check is None:
        sys.stdout.write(page)
        return 0
    path = Path(args.check)
    if not path.is_file() or path.read_text(encoding="utf-8") != page:
        print(f"{path} is stale: regenerate it with `{REGENERATE}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
