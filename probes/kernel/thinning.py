"""How a fast run's step records are thinned: one policy for the sender (over pending
measurements) and the history (over records). Pure Python, no torch.

A run faster than the sender's budget (60 step records a second) sends one record for
a group of consecutive steps. Time stays counted in steps, and no peak is lost:

- a group is cut into sub-spans, each sent as the record of its last step (the
  *representative*), with ``span: [first, last]`` and the peaks of the steps it stands
  for: per layer the largest finite gradient norm (``grad_norms_max``), the largest
  total (``grad_norm_total_max``), the largest and smallest finite value of each scalar
  (``scalars_max``, ``scalars_min``), the first step with a non-finite number
  (``first_non_finite_step``), and ``duration`` and ``probe_time`` summed;
- a sub-span ends at the group's last sampled step (only sampled steps carry parameter
  norms, activation health and update ratios), and at every *escalation*: a step whose
  loss, total gradient norm or any layer's gradient norm is at least ``ESCALATION``
  times the largest seen before it (in this group and what was sent before) is sent
  alone, after the step before it, so an explosion or a spike is seen at the step it
  happens and against what came before, not at the end of its group;
- the ranks of a job also show their *anchor* steps (sampled steps at a fixed period,
  the same on every rank), whatever their timing, so the cross-rank checks always find
  steps to compare;
- the first step with a non-finite number ends the finite part (the step before it
  shows the peak of a climb) and is the representative of the rest of the group.

A merged record updated the weights if any of its steps did; it holds uncleared
gradients if every step that updated did (a streak), and names the layers no update of
its span touched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Record = dict[str, Any]

ESCALATION = 2.0  # a step this many times above everything before it is sent as its own
MAX_ESCALATIONS = 8  # ... at most this many per group (an explosion needs only its start)


Ceiling = tuple[float, ...]  # the largest loss, total norm and each layer's norm so far


@dataclass(frozen=True)
class Member:
    """What the plan needs to know of one step (or already merged record) of a group."""

    non_finite: bool
    keep: bool  # a sampled step (or one carrying an update measurement)
    watched: Ceiling  # its (largest) loss, total gradient norm and each layer's norm
    anchor: bool = False  # always shown: a step every rank of a job shows (cross-rank checks)

    @classmethod
    def of(
        cls,
        *,
        non_finite: bool,
        keep: bool,
        total: float | None,
        scalars: Mapping[str, Any],
        grads: Sequence[float | None] = (),
        anchor: bool = False,
    ) -> Member:
        """A member from its scalars (the loss, else the first), total norm and
        per-layer norms; what is missing or not finite counts as 0."""
        loss = scalars.get("loss", next(iter(scalars.values()), None)) if scalars else None
        values = (loss, total, *grads)
        if non_finite or None in values:
            values = tuple(finite_number(v) or 0.0 for v in values)  # the rare, slow way
        return cls(non_finite, keep, values, anchor)  # type: ignore[arg-type]


def plan(members: Sequence[Member], reference: Ceiling = ()) -> list[tuple[int, int, int]]:
    """How to cut a group: ``(start, end, representative)`` indices, in order.

    ``reference`` is the ``ceiling`` of what was sent before (empty: nothing)."""
    bad = next((i for i, m in enumerate(members) if m.non_finite), None)
    finite = members if bad is None else members[:bad]
    cuts = _finite_cuts(finite, reference)
    spans: list[tuple[int, int, int]] = []
    start = 0
    for cut in cuts:
        spans.append((start, cut, cut))
        start = cut + 1
    if bad is not None:
        spans.append((bad, len(members) - 1, bad))
    return spans


def _finite_cuts(members: Sequence[Member], reference: Ceiling) -> list[int]:
    if not members:
        return []
    cuts = {len(members) - 1}
    kept = next((i for i in range(len(members) - 1, -1, -1) if members[i].keep), None)
    if kept is not None:
        cuts.add(kept)
    cuts.update(i for i, member in enumerate(members) if member.anchor)
    tops = reference
    escalations = 0
    for i, member in enumerate(members):
        watched = member.watched
        if len(watched) == len(tops):
            grown = max(map(_growth, watched, tops))
            tops = tuple(map(max, tops, watched))
        else:  # the first step, or another layout
            grown = max(map(_growth, watched, tops), default=0.0)
            tops = _top(tops, watched)
        if grown >= ESCALATION and escalations < MAX_ESCALATIONS:
            cuts.update((i - 1, i) if i else (i,))  # alone: the step before shows the low
            escalations += 1
    return sorted(cuts)


def _growth(value: float, top: float) -> float:
    return value / top if top > 0 else 0.0


def _top(a: Ceiling, b: Ceiling) -> Ceiling:
    if len(a) == len(b):
        return tuple(map(max, a, b))
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return tuple(max(x, y) for x, y in zip(longer, shorter, strict=False)) + longer[len(shorter) :]


def ceiling(members: Iterable[Member]) -> Ceiling:
    """The largest loss, total and per-layer norm of a group: the next one's reference."""
    tops: Ceiling = ()
    for member in members:
        tops = _top(tops, member.watched)
    return tops


class Peaks:
    """The peaks of the steps a merged record stands for, accumulated step by step."""

    def __init__(self) -> None:
        self.grads: list[float | None] | None = None
        self.total: float | None = None
        self.scalars_max: dict[str, float] = {}
        self.scalars_min: dict[str, float] = {}
        self.first_bad: int | None = None
        self.duration = 0.0
        self.probe_time: float | None = None
        self.updated = False  # some step of the span ran optimizer.step()
        self.not_cleared: bool | None = None  # every updating step held old gradients
        self.not_stepped: set[int] | None = None  # layers no update of the span touched

    def add(
        self,
        *,
        step: int,
        grads: Sequence[float | None],
        total: float | None,
        scalars: Mapping[str, float],
        non_finite: bool,
        duration: float | None,
        probe_time: float | None,
        optimizer_step: bool | None,
        not_cleared: bool,
        not_stepped: Iterable[int] | None,
        scalars_min: Mapping[str, float] | None = None,
        first_bad: int | None = None,
    ) -> None:
        """One step (or a merged record: pass its own peaks as ``grads``, ``total``,
        ``scalars`` and ``scalars_min``, and its ``first_bad``)."""
        acc = self.grads
        if (
            not non_finite
            and acc is not None
            and len(acc) == len(grads)
            and None not in grads
            and None not in acc
        ):
            self.grads = list(map(max, acc, grads))  # type: ignore[arg-type]  # in C
        else:
            self.grads = _max_each(acc, grads)
        self.total = _max(self.total, total)
        if non_finite or scalars_min is not None:
            _fold_scalars(self.scalars_max, scalars, max)
            _fold_scalars(self.scalars_min, scalars if scalars_min is None else scalars_min, min)
        else:  # finite floats: the common case, without the checks
            highs, lows = self.scalars_max, self.scalars_min
            for name, value in scalars.items():
                if name not in highs:
                    highs[name] = lows[name] = value
                elif value > highs[name]:
                    highs[name] = value
                elif value < lows[name]:
                    lows[name] = value
        if self.first_bad is None:
            self.first_bad = first_bad if first_bad is not None else (step if non_finite else None)
        if duration is not None and math.isfinite(duration):
            self.duration += duration
        if probe_time is not None and math.isfinite(probe_time):
            self.probe_time = (self.probe_time or 0.0) + probe_time
        if optimizer_step is not False:  # True, or None (no optimizer watched)
            self.updated = self.updated or optimizer_step is True
            self.not_cleared = (
                not_cleared if self.not_cleared is None else (self.not_cleared and not_cleared)
            )
            if self.not_stepped is None:
                self.not_stepped = set(not_stepped or ())
            elif self.not_stepped:
                self.not_stepped &= set(not_stepped or ())

    def add_record(self, record: Mapping[str, Any]) -> None:
        """A step record, plain or merged."""
        scalars = record.get("scalars") or {}
        self.add(
            step=int(record.get("step", 0)),
            grads=record.get("grad_norms_max") or record.get("grad_norms") or (),
            total=_first_number(record.get("grad_norm_total_max"), record.get("grad_norm_total")),
            scalars=record.get("scalars_max") or scalars,
            scalars_min=record.get("scalars_min") or scalars,
            non_finite=_has_non_finite(record),
            first_bad=record.get("first_non_finite_step"),
            duration=record.get("duration"),
            probe_time=record.get("probe_time"),
            optimizer_step=record.get("optimizer_step", True),
            not_cleared=bool(record.get("grads_not_cleared")),
            not_stepped=record.get("not_stepped"),
        )

    def fields(self) -> Record:
        """The merged record's fields (they replace the representative's own)."""
        fields: Record = {
            "grad_norms_max": list(self.grads or ()),
            "grad_norm_total_max": self.total,
            "scalars_max": dict(self.scalars_max),
            "scalars_min": dict(self.scalars_min),
            "duration": self.duration,
            "grads_not_cleared": bool(self.not_cleared),
            "not_stepped": sorted(self.not_stepped or ()),
        }
        if self.probe_time is not None:
            fields["probe_time"] = self.probe_time
        if self.first_bad is not None:
            fields["first_non_finite_step"] = self.first_bad
        return fields


def apply(record: Record, fields: Mapping[str, Any], updated: bool) -> Record:
    """Write merged ``fields`` into a representative's record; tidy the flags."""
    record.update(fields)
    for flag in ("grads_not_cleared", "not_stepped", "grad_norm_total_max"):
        if not record.get(flag):
            record.pop(flag, None)
    if updated:
        record.pop("optimizer_step", None)  # some step of the span did update
    return record


def merge_records(records: list[Record]) -> Record:
    """Collapse consecutive step (or eval) records into one that stands for all of them
    (its representative: the first non-finite one, else the last; a step record with
    the peaks of them all)."""
    if len(records) == 1:
        return records[0]
    kept = next((r for r in records if _has_non_finite(r)), records[-1])
    return _merged(records, kept)


def thin_records(records: list[Record], group: int, *, keep_first: bool = True) -> list[Record]:
    """Step records as a run ``group`` times faster than the budget would send them
    (other records pass, in order): the same policy as the sender's, over records. As
    the sender does, the first step is sent alone (``keep_first``)."""
    out: list[Record] = []
    run: list[Record] = []
    reference: Ceiling = ()
    if keep_first:
        first = next((i for i, r in enumerate(records) if r.get("kind") == "step"), None)
        if first is not None:
            out += records[: first + 1]
            reference = ceiling([member_of(records[first])])
            records = records[first + 1 :]
    for record in [*records, None]:
        if record is not None and record.get("kind") == "step" and len(run) < group:
            run.append(record)
            continue
        if run:
            members = [member_of(r) for r in run]
            for start, end, rep in plan(members, reference):
                out.append(_merged(run[start : end + 1], run[rep]))
            reference = ceiling(members)
            run = []
        if record is None:
            break
        if record.get("kind") == "step":
            run.append(record)
        else:
            out.append(record)
    return out


def member_of(record: Mapping[str, Any]) -> Member:
    return Member.of(
        non_finite=_has_non_finite(record),
        keep=any(
            record.get(name) is not None for name in ("param_norms", "update_ratios", "activations")
        ),
        total=_first_number(record.get("grad_norm_total_max"), record.get("grad_norm_total")),
        scalars=record.get("scalars_max") or record.get("scalars") or {},
        grads=record.get("grad_norms_max") or record.get("grad_norms") or (),
    )


def _merged(records: list[Record], kept: Record) -> Record:
    if len(records) == 1:
        return records[0]
    merged = dict(kept)
    if kept.get("kind") == "step":
        peaks = Peaks()
        for record in records:
            peaks.add_record(record)
        apply(merged, peaks.fields(), peaks.updated)
    elif any(r.get("optimizer_step", True) for r in records):
        merged.pop("optimizer_step", None)
    merged["span"] = [_span(records[0])[0], _span(records[-1])[1]]
    return merged


def _span(record: Mapping[str, Any]) -> tuple[int, int]:
    span = record.get("span")
    if span:
        return int(span[0]), int(span[1])
    step = int(record["step"])
    return step, step


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _first_number(*values: Any) -> float | None:
    return next((float(v) for v in values if isinstance(v, int | float)), None)


def _max(a: float | None, b: float | None) -> float | None:
    if b is None or not math.isfinite(b):
        return a
    return b if a is None else max(a, b)


def _max_each(acc: list[float | None] | None, values: Sequence[float | None]) -> list[float | None]:
    if acc is None:
        return [v if v is not None and math.isfinite(v) else None for v in values]
    if len(acc) != len(values):
        return acc  # another layout (a model changed mid-run): keep the first
    return [_max(a, b) for a, b in zip(acc, values, strict=True)]


def _fold_scalars(into: dict[str, float], scalars: Mapping[str, Any], pick: Any) -> None:
    for name, value in scalars.items():
        number = finite_number(value)
        if number is None:
            continue
        into[name] = number if name not in into else pick(into[name], number)
