"""How a thinned record's fields are made from its steps' (pure Python, no torch).

Each field of a step record merges as the record spec says (``probes.kernel.schema.spec``,
its ``merge`` and ``peaks``): the shown step's own value, the span's largest or
smallest, a sum, the first non-finite step, a flag true at every update, the layers no
update touched. ``Peaks`` accumulates them step by step, for the sender (over pending
measurements) and the replay history (over records) alike; ``apply`` writes them over
the representative's own fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from probes.kernel.schema.spec import STEP, Field, FrameSpec, Merge, Shape

Record = dict[str, Any]


def peak_or_own(values: Mapping[str, Any], name: str, peak_name: str) -> Any:
    """A field's peak (``peak_name``: ``grad_norms_max``, ...) where ``values`` (a step,
    or a merged record) carries one, else its own value."""
    peak = values.get(peak_name)
    if peak is None or peak == [] or peak == {}:
        return values.get(name)
    return peak


class _Op:
    """How one field of a merged record is made from its steps' values (one subclass
    per kind of merge, so a step costs one call per field, no dispatch)."""

    def __init__(self, field: Field, out: str, merge: Merge) -> None:
        self.name, self.out, self.merge = field.name, out, merge
        self.acc: Any = None

    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        raise NotImplementedError

    def result(self) -> Any:
        """The merged value; None: the field is absent from the merged record."""
        return self.acc


class _Extreme(_Op):
    """MAX / MIN of a number, or per layer; of its peak sibling where a merged record
    has one (``out``: ``grad_norms_max``), else of its own value."""

    def __init__(self, field: Field, out: str, merge: Merge) -> None:
        super().__init__(field, out, merge)
        self.pick = max if merge is Merge.MAX else min
        self.per_layer = field.shape is Shape.PER_LAYER

    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        value = values.get(self.out)
        if value is None or value == []:
            value = values.get(self.name)
        if self.per_layer:
            self.acc = _pick_each(self.acc, value or (), self.pick, non_finite)
        else:
            self.acc = _pick(self.acc, value, self.pick)

    def result(self) -> Any:
        return None if self.acc is None else (list(self.acc) if self.per_layer else self.acc)


class _Sum(_Op):
    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        value = values.get(self.name)
        if value is not None and math.isfinite(value):
            self.acc = value if self.acc is None else self.acc + value


class _FirstNonFinite(_Op):
    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        if self.acc is None:
            value = values.get(self.name)
            self.acc = value if value is not None else (step if non_finite else None)


class _EveryUpdate(_Op):
    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        value = bool(values.get(self.name))
        self.acc = value if self.acc is None else (self.acc and value)

    def result(self) -> Any:
        return True if self.acc else None


class _CommonToUpdates(_Op):
    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        if self.acc is None:
            self.acc = set(values.get(self.name) or ())
        elif self.acc:
            self.acc &= set(values.get(self.name) or ())

    def result(self) -> Any:
        return sorted(self.acc) if self.acc else None


#: A thinned record carries each of its steps' loss up to this many steps (the sender's
#: spans at its 60 records a second: a run of up to 15,000 steps a second); past it the
#: field is dropped, and the rules read the span's peaks instead.
MAX_STEP_LOSSES = 256


class _EachLoss(_Op):
    """Every step's training loss, as ``[step, loss]`` pairs in step order: what the
    rules that follow the loss step by step (a spike against its recent median, the
    smoothed loss) read, so a thinned run tells them what an unthinned one does."""

    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        if self.acc is False:
            return  # past the bound: dropped
        pairs = values.get(self.name)
        if pairs is None:
            scalars = values.get("scalars") or {}
            loss = scalars.get("loss", next(iter(scalars.values()), None))
            pairs = [] if loss is None else [[step, loss]]
        self.acc = list(pairs) if self.acc is None else self.acc + list(pairs)
        if len(self.acc) > MAX_STEP_LOSSES:
            self.acc = False

    def result(self) -> Any:
        return self.acc or None


_KINDS: dict[Merge, type[_Op]] = {
    Merge.MAX: _Extreme,
    Merge.MIN: _Extreme,
    Merge.SUM: _Sum,
    Merge.FIRST_NON_FINITE: _FirstNonFinite,
    Merge.EVERY_UPDATE: _EveryUpdate,
    Merge.COMMON_TO_UPDATES: _CommonToUpdates,
    Merge.EACH: _EachLoss,
}


class _NamedRange(_Op):
    """The largest and smallest of each named value (a scalar mapping's peaks), in one
    pass: the common case (a plain step's finite floats) without checks."""

    def __init__(self, field: Field) -> None:
        super().__init__(field, field.name, Merge.MAX)
        self.high_name, self.low_name = field.peak_name(Merge.MAX), field.peak_name(Merge.MIN)
        self.highs: dict[str, float] = {}
        self.lows: dict[str, float] = {}

    def add(self, values: Mapping[str, Any], step: int, non_finite: bool) -> None:
        high, low = values.get(self.high_name), values.get(self.low_name)
        own = values.get(self.name) or {}
        highs, lows = self.highs, self.lows
        if non_finite or high or low:
            _fold_scalars(highs, high or own, max)
            _fold_scalars(lows, low or own, min)
            return
        for name, value in own.items():  # finite floats
            if name not in highs:
                highs[name] = lows[name] = value
            elif value > highs[name]:
                highs[name] = value
            elif value < lows[name]:
                lows[name] = value

    def results(self) -> Record:
        return {self.high_name: dict(self.highs), self.low_name: dict(self.lows)}


Plan = tuple[list[Callable[[], _Op]], list[Callable[[], _Op]], Field | None]
_PLANS: dict[int, tuple[FrameSpec, Plan]] = {}


def _ops(spec: FrameSpec) -> tuple[list[_Op], list[_Op], Field | None]:
    """Fresh ops of a kind of record (its plan made once per spec)."""
    known = _PLANS.get(id(spec))
    if known is None or known[0] is not spec:
        known = _PLANS[id(spec)] = (spec, _plan(spec))
    ops, gated, updated = known[1]
    return [make() for make in ops], [make() for make in gated], updated


def _plan(spec: FrameSpec) -> Plan:
    """How to make the ops of a kind of record: those every step feeds, those only the
    steps that updated feed, and the field that says whether a step updated
    (``Merge.ANY``)."""
    ops: list[Callable[[], _Op]] = []
    gated: list[Callable[[], _Op]] = []
    updated: Field | None = None
    siblings = {field.peak_name(merge) for field in spec for merge in field.peaks}
    for field in spec:
        if field.name in siblings:
            continue  # a peak: made by its field's ops
        if field.peaks == (Merge.MAX, Merge.MIN) and field.shape is Shape.NAMED:
            ops.append(partial(_NamedRange, field))
        elif field.peaks:
            ops.extend(partial(_Extreme, field, field.peak_name(m), m) for m in field.peaks)
        if field.merge is Merge.ANY:
            updated = field
        elif field.merge in (Merge.EVERY_UPDATE, Merge.COMMON_TO_UPDATES):
            gated.append(partial(_KINDS[field.merge], field, field.name, field.merge))
        elif field.merge in (Merge.MAX, Merge.MIN, Merge.SUM, Merge.FIRST_NON_FINITE, Merge.EACH):
            ops.append(partial(_KINDS[field.merge], field, field.name, field.merge))
    return ops, gated, updated


class Peaks:
    """The fields of a merged record, accumulated step by step, each as the record
    spec says it merges (``spec``: the kind of record)."""

    def __init__(self, spec: FrameSpec = STEP) -> None:
        self._ops, self._gated, self._updated_field = _ops(spec)
        self.updated = False  # some step of the span ran optimizer.step()

    def add(self, values: Mapping[str, Any], *, step: int, non_finite: bool) -> None:
        """One step's fields (or a merged record's: its peaks are read where given)."""
        for op in self._ops:
            op.add(values, step, non_finite)
        field = self._updated_field
        if field is None:
            return
        stepped = values.get(field.name, field.default)
        if stepped is not False:  # True, or None (no optimizer watched)
            self.updated = self.updated or stepped is True
            for op in self._gated:
                op.add(values, step, non_finite)

    def fields(self) -> Record:
        """The merged record's fields, to write over the representative's own with
        ``apply`` (a None: the field is removed)."""
        fields: Record = {}
        for op in [*self._ops, *self._gated]:
            if isinstance(op, _NamedRange):
                fields.update(op.results())
            else:
                fields[op.out] = op.result()  # None: absent (false, empty, unknown)
        if self._updated_field is not None and self.updated:
            fields[self._updated_field.name] = None  # absent: it updated
        return fields


def apply(record: Record, fields: Mapping[str, Any]) -> Record:
    """Write merged ``fields`` into a representative's record (a None removes one)."""
    for name, value in fields.items():
        if value is None:
            record.pop(name, None)
        else:
            record[name] = value
    return record


def has_non_finite(value: Any) -> bool:
    """True if any float inside ``value`` (nested lists and dicts too) is NaN or Inf."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v) for v in value)
    return False


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _pick(a: Any, b: Any, pick: Callable[[Any, Any], Any]) -> Any:
    if b is None or not math.isfinite(b):
        return a
    return b if a is None else pick(a, b)


def _pick_each(
    acc: list[Any] | None, values: Sequence[Any], pick: Callable[[Any, Any], Any], bad: bool
) -> list[Any]:
    if acc is None:
        return [v if v is not None and math.isfinite(v) else None for v in values]
    if len(acc) != len(values):
        return acc  # another layout (a model changed mid-run): keep the first
    if not bad and None not in values and None not in acc:
        return list(map(pick, acc, values))  # finite: in C
    return [_pick(a, b, pick) for a, b in zip(acc, values, strict=True)]


def _fold_scalars(into: dict[str, float], scalars: Mapping[str, Any], pick: Any) -> None:
    for name, value in scalars.items():
        number = finite_number(value)
        if number is None:
            continue
        into[name] = number if name not in into else pick(into[name], number)
