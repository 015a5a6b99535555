"""How a fast run's step records are thinned: one policy, for the sender (over pending
measurements) and the replay history (over records). Pure Python, no torch.

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
  shows the peak of a climb) and is the representative of the rest of the group; the
  rest is cut where steps whose update was skipped (AMP's GradScaler skips a step
  whose gradients overflowed, by design) meet steps whose update ran, so a skipped
  non-finite step never reads as an applied one.

How each field of a merged record is made from its steps' (the peaks above, sums,
flags: a merged record updated the weights if any of its steps did, it holds uncleared
gradients if every step that updated did, and names the layers no update of its span
touched) is the record spec's (``probes.kernel.schema.spec``, each field's ``merge``),
applied by ``probes.kernel.merge.Peaks``. ``Thinner`` is the policy over a stream
(groups within a budget, cut as above, judged against what was sent before);
``RecordSteps`` and the sender's measurements are the two kinds of steps it thins.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from probes.kernel.merge import Peaks, apply, finite_number, has_non_finite, peak_or_own
from probes.kernel.schema.spec import EVAL, STEP, FrameKind

Record = dict[str, Any]
T = TypeVar("T")

ESCALATION = 2.0  # a step this many times above everything before it is sent as its own
MAX_ESCALATIONS = 8  # ... at most this many per group (an explosion needs only its start)


Ceiling = tuple[float, ...]  # the largest loss, total norm and each layer's norm so far


class Member(NamedTuple):
    """What the plan needs to know of one step (or already merged record) of a group.

    (A named tuple: the sender makes one for every step of a fast run, and a frozen
    dataclass cost several times more to make.)"""

    non_finite: bool
    keep: bool  # a sampled step (or one carrying an update measurement)
    watched: Ceiling  # its (largest) loss, total gradient norm and each layer's norm
    anchor: bool = False  # always shown: a step every rank of a job shows (cross-rank checks)
    skipped: bool = False  # its optimizer.step() was skipped (GradScaler on an overflow)

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
        skipped: bool = False,
    ) -> Member:
        """A member from its scalars (the loss, else the first), total norm and
        per-layer norms; what is missing or not finite counts as 0."""
        loss = scalars.get("loss", next(iter(scalars.values()), None)) if scalars else None
        values = (loss, total, *grads)
        if non_finite or None in values:
            values = tuple(finite_number(v) or 0.0 for v in values)  # the rare, slow way
        return cls(non_finite, keep, values, anchor, skipped)  # type: ignore[arg-type]

    @classmethod
    def of_values(
        cls,
        values: Mapping[str, Any],
        *,
        non_finite: bool,
        keep: bool,
        anchor: bool = False,
        skipped: bool = False,
    ) -> Member:
        """A member from a step's fields (a merged one's peaks where it has them)."""
        return cls.of(
            non_finite=non_finite,
            keep=keep,
            total=_number_or_none(peak_or_own(values, "grad_norm_total", "grad_norm_total_max")),
            scalars=peak_or_own(values, "scalars", "scalars_max") or {},
            grads=peak_or_own(values, "grad_norms", "grad_norms_max") or (),
            anchor=anchor,
            skipped=skipped,
        )


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
        spans += _runs_of_skipping(members, bad)
    return spans


def _runs_of_skipping(members: Sequence[Member], start: int) -> list[tuple[int, int, int]]:
    """``members[start:]`` (from the first non-finite one) cut into runs of steps whose
    update was all skipped or all not: each shown by its first non-finite step, else
    its last. (A run that skips every step, or none, stays one span; past
    ``MAX_ESCALATIONS`` runs, the rest is one: an accumulation loop's micro-steps skip
    by design, and a run gone non-finite must not lose its thinning.)"""
    spans: list[tuple[int, int, int]] = []
    while start < len(members):
        end = start
        if len(spans) == MAX_ESCALATIONS:
            end = len(members) - 1
        while end + 1 < len(members) and members[end + 1].skipped == members[start].skipped:
            end += 1
        shown = next((i for i in range(start, end + 1) if members[i].non_finite), end)
        spans.append((start, end, shown))
        start = end + 1
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
            # In C: a top of 0 or less never escalates (``_growth``): it divides as
            # infinity; most steps grow nowhere near ESCALATION, which one pass against
            # tops a little under ESCALATION times tells, before dividing out exactly.
            safe = tops if min(tops, default=1.0) > 0 else _positive(tops)
            grown = 0.0
            if any(map(operator.ge, watched, map(operator.mul, safe, repeat(_NEAR)))):
                grown = max(map(operator.truediv, watched, safe))
            tops = tuple(map(max, tops, watched))
        else:  # the first step, or another layout
            grown = max(map(_growth, watched, tops), default=0.0)
            tops = _top(tops, watched)
        if grown >= ESCALATION and escalations < MAX_ESCALATIONS:
            cuts.update((i - 1, i) if i else (i,))  # alone: the step before shows the low
            escalations += 1
    return sorted(cuts)


_NEAR = ESCALATION * (1 - 1e-9)  # below ESCALATION by more than a division's rounding


def _positive(tops: Ceiling) -> Ceiling:
    return tuple(top if top > 0 else math.inf for top in tops)


def _growth(value: float, top: float) -> float:
    return value / top if top > 0 else 0.0


def _top(a: Ceiling, b: Ceiling) -> Ceiling:
    if len(a) == len(b):
        return tuple(map(max, a, b))
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return tuple(max(x, y) for x, y in zip(longer, shorter, strict=False)) + longer[len(shorter) :]


def ceiling(members: Iterable[Member]) -> Ceiling:
    """The largest loss, total and per-layer norm of a group: the next one's reference."""
    watched = [member.watched for member in members]
    if watched and all(len(w) == len(watched[0]) for w in watched):
        return tuple(map(max, *watched)) if len(watched) > 1 else watched[0]  # (in C)
    tops: Ceiling = ()
    for values in watched:
        tops = _top(tops, values)
    return tops


class Steps(Protocol[T]):
    """How the policy reads one kind of step item: a pending measurement, or a record."""

    def is_step(self, item: Any) -> bool: ...

    def step(self, item: T) -> int: ...

    def values(self, item: T) -> Mapping[str, Any]:
        """Its fields as the spec names them (a merged one's peaks among them)."""
        ...

    def non_finite(self, item: T) -> bool: ...

    def keep(self, item: T) -> bool:
        """A sampled step, or one measuring an update: a group is cut after it."""
        ...

    def sampled(self, item: T) -> bool: ...

    def skipped(self, item: T) -> bool:
        """Its optimizer.step() was skipped (every step of a merged one's)."""
        ...

    def stand_for(self, group: Sequence[T], representative: int, peaks: Peaks) -> T:
        """What stands for ``group``: its representative, with the span and the
        merged fields (``peaks``) of them all."""
        ...


class Thinner(Generic[T]):
    """The thinning policy over a stream of items (steps, and other records that pass):
    about ``budget`` step items per call, each group cut as ``plan`` says and judged
    against what was sent before (``reference``).

    Args:
        steps: how to read the stream's steps.
        anchor_every: for a rank of a job, the period of the sampled steps always sent
            on their own (every rank sends the same ones); 0 for none.
        first_alone: the stream's first step is sent alone (the sender's way: the
            first group is then judged against it).
    """

    def __init__(self, steps: Steps[T], anchor_every: int = 0, *, first_alone: bool = True):
        self.steps = steps
        self.anchor_every = anchor_every
        self._reference: Ceiling = ()
        # The steps sent last, whose ceiling the reference is: taken only when a group
        # is thinned (a run within its budget never needs it, and it costs a pass over
        # every record sent).
        self._sent: Sequence[T] = ()
        self._first_pending = first_alone

    def thin(self, items: list[Any], budget: int) -> list[Any]:
        """``items`` with their steps thinned to about ``budget`` (plus the first step
        when it is sent alone), in order; other items pass through untouched and end a
        group. Within the budget, ``items`` itself."""
        is_step = self.steps.is_step
        if self._first_pending:
            first = next((item for item in items if is_step(item)), None)
            self.note_sent([] if first is None else [first])
        kept = group_within(
            items, budget, is_step=is_step, merge=self.merge, keep_first=self._first_pending
        )
        sent = [item for item in kept if is_step(item)]
        self.note_sent(sent)
        if sent:
            self._first_pending = False
        return kept

    @property
    def reference(self) -> Ceiling:
        """The ceiling of the steps sent last: what the next group is judged against."""
        if self._sent:
            sent, self._sent = self._sent, ()
            self._reference = ceiling(
                Member.of_values(self.steps.values(item), non_finite=False, keep=False)
                for item in sent
            )
        return self._reference

    def merge(self, group: list[T]) -> list[T]:
        """What stands for ``group``: its last step (so the step count stays true),
        preceded by its last sampled one and by each escalation; or, when one is
        non-finite, the finite part so cut and the first non-finite one for the rest."""
        steps, every = self.steps, self.anchor_every
        values = [steps.values(item) for item in group]
        bad = [steps.non_finite(item) for item in group]
        members = [
            Member.of_values(
                fields,
                non_finite=non_finite,
                keep=steps.keep(item),
                anchor=bool(every) and steps.sampled(item) and steps.step(item) % every == 0,
                skipped=steps.skipped(item),
            )
            for item, fields, non_finite in zip(group, values, bad, strict=True)
        ]
        kept = []
        for start, end, rep in plan(members, self.reference):
            if end == start:
                kept.append(group[rep])
                continue
            peaks = Peaks()
            for i in range(start, end + 1):
                peaks.add(values[i], step=steps.step(group[i]), non_finite=bad[i])
            kept.append(steps.stand_for(group[start : end + 1], rep - start, peaks))
        self._sent, self._reference = (), ceiling(members)
        return kept

    def note_sent(self, items: Sequence[T]) -> None:
        """The steps just sent, thinned or not: the next group is judged against them
        (a run that speeds up, or its first step sent alone, must not start from 0)."""
        if items:
            self._sent = items  # (its ceiling is taken when a group needs it)


def group_within(
    items: list[Any],
    budget: int,
    *,
    is_step: Callable[[Any], bool],
    merge: Callable[[list[Any]], list[Any]],
    keep_first: bool = False,
) -> list[Any]:
    """About ``budget`` step items (plus the first step when ``keep_first``), in order:
    consecutive steps in groups of equal size, each replaced by what ``merge`` returns;
    other items pass through untouched and end a group."""
    steps = sum(1 for item in items if is_step(item))
    if steps <= budget or budget <= 0:
        return items
    out: list[Any] = []
    group_size = math.ceil(steps / budget)
    run: list[Any] = []
    first_pending = keep_first
    for item in items:
        if not is_step(item):
            if run:
                out.extend(merge(run))
                run = []
            out.append(item)
            continue
        if first_pending:
            first_pending = False
            out.append(item)
            continue
        run.append(item)
        if len(run) >= group_size:
            out.extend(merge(run))
            run = []
    if run:
        out.extend(merge(run))
    return out


class RecordSteps:
    """Step records (and, in the history, eval records) as the policy reads them."""

    def is_step(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("kind") == FrameKind.STEP

    def step(self, item: Record) -> int:
        return int(item.get("step", 0))

    def values(self, item: Record) -> Mapping[str, Any]:
        return item

    def non_finite(self, item: Record) -> bool:
        return has_non_finite(item)

    def keep(self, item: Record) -> bool:
        return any(item.get(name) is not None for name in _SAMPLED)

    sampled = keep

    def skipped(self, item: Record) -> bool:
        return item.get("optimizer_step") is False

    def stand_for(self, group: Sequence[Record], representative: int, peaks: Peaks) -> Record:
        merged = apply(dict(group[representative]), peaks.fields())
        merged["span"] = [span_of(group[0])[0], span_of(group[-1])[1]]
        return merged

    def collapse(self, group: Sequence[Record]) -> Record:
        """One record for all of ``group`` (the history's fold, where two must become
        one): the first non-finite one shows, else the last."""
        if len(group) == 1:
            return group[0]
        bad = [has_non_finite(record) for record in group]
        shown = bad.index(True) if True in bad else len(group) - 1
        peaks = Peaks(STEP if group[shown].get("kind") == FrameKind.STEP else EVAL)
        for record, non_finite in zip(group, bad, strict=True):
            peaks.add(record, step=self.step(record), non_finite=non_finite)
        return self.stand_for(group, shown, peaks)


#: The fields only sampled steps (or those measuring an update) carry.
_SAMPLED = ("param_norms", "update_ratios", "activations")

#: The policy's reading of records (the replay history's, and the tests').
RECORDS = RecordSteps()


def span_of(record: Mapping[str, Any]) -> tuple[int, int]:
    """The steps a (possibly merged) record stands for."""
    span = record.get("span")
    if span:
        return int(span[0]), int(span[1])
    step = int(record["step"])
    return step, step


def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
