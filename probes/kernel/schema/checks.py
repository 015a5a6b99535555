"""The field checks the monitor runs on every frame, before any of it reaches its state.

A frame that decoded may still carry a string where a step number belongs, an
``Infinity`` step, a hello with two layers of one name. ``check_frame`` raises
``ValueError`` with one line naming the field, so the frame is rejected whole and the
state (and every view drawn from it) only ever holds what a probe sends. Which fields
are checked, and as what, is the record spec's (``probes.kernel.schema.spec``): one
check per type here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from probes.kernel.schema.floats import Float32List
from probes.kernel.schema.spec import FRAMES, FrameSpec, Type

Frame = dict[str, Any]
PROBE_KINDS = frozenset(FRAMES)


def check_frame(frame: Frame) -> None:
    """Raise ``ValueError`` if a field the monitor reads has the wrong shape, or if the
    frame is of a kind only a monitor sends."""
    kind = frame["kind"]
    if kind not in PROBE_KINDS:
        raise ValueError(f"a {kind} frame comes from a monitor, not from a probe")
    _PLANS[kind](frame)


def _integer(frame: Frame, name: str, *, required: bool = False) -> None:
    value = frame.get(name)
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r:.40}")
    if abs(value) > 2**63:
        raise ValueError(f"{name} out of range: {value:.3g}")


def _required_integer(frame: Frame, name: str) -> None:
    _integer(frame, name, required=True)


def _number(frame: Frame, name: str) -> None:
    value = frame.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"{name} must be a number, got {value!r:.40}")


NUMBER_TYPES = frozenset({int, float})
NULLABLE_NUMBER_TYPES = frozenset({int, float, type(None)})
NULLABLE_INT_TYPES = frozenset({int, type(None)})


def _numbers(frame: Frame, name: str, *, nullable: bool = False) -> None:
    values = frame.get(name)
    if values is None or type(values) is Float32List:  # (read from floats: floats)
        return
    if not isinstance(values, list):
        raise ValueError(f"{name} must be a list, got {type(values).__name__}")
    # The types of a few hundred values, gathered in C (bool is its own type, not int).
    if set(map(type, values)) <= (NULLABLE_NUMBER_TYPES if nullable else NUMBER_TYPES):
        return
    for value in values:
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} holds {value!r:.40}, not a number")


def _nullable_numbers(frame: Frame, name: str) -> None:
    _numbers(frame, name, nullable=True)


def _counts(frame: Frame, name: str) -> None:
    values = frame.get(name)
    if values is None:
        return
    if not isinstance(values, list) or not set(map(type, values)) <= NULLABLE_INT_TYPES:
        raise ValueError(f"{name} must be a list of integers or null")


def _indices(frame: Frame, name: str) -> None:
    indices = frame.get(name) or []
    if not isinstance(indices, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in indices
    ):
        raise ValueError(f"{name} must be a list of indices")


def _mapping(frame: Frame, name: str) -> None:
    value = frame.get(name)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{name} must be an object, got {type(value).__name__}")


def _scalars(frame: Frame, name: str) -> None:
    _mapping(frame, name)
    for key, value in (frame.get(name) or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} {key!r:.40} is {value!r:.40}, not a number")


def _span(frame: Frame, name: str) -> None:
    span = frame.get(name)
    if span is None:
        return
    if not (
        isinstance(span, list)
        and len(span) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) for s in span)
    ):
        raise ValueError(f"{name} must be [first step, last step], got {span!r:.40}")


def _names(frame: Frame, name: str) -> None:
    names = frame.get(name, [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{name} must be a list of names")
    if len(set(names)) != len(names):
        raise ValueError(f"{name} holds the same name twice")


def _activations(frame: Frame, name: str) -> None:
    for entry in frame.get(name) or []:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and (entry[2] is None or (isinstance(entry[2], int) and not isinstance(entry[2], bool)))
        ):
            raise ValueError(f"{name} holds {entry!r:.60}, not [name, family, layer]")


def _module(frame: Frame, name: str) -> None:
    value = frame.get(name)
    if value is not None and not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        raise ValueError(f"{name} must be an object with a module name")


def _alert(frame: Frame, name: str) -> None:
    _mapping(frame, name)
    _integer(frame.get(name) or {}, "step")


def _unchecked(frame: Frame, name: str) -> None:
    return


Check = Callable[[Frame, str], None]

#: The check of each type of the spec.
CHECKS: dict[Type, Check] = {
    Type.INT: _integer,
    Type.NUMBER: _number,
    Type.TEXT: _unchecked,
    Type.FLAG: _unchecked,
    Type.NUMBERS: _numbers,
    Type.NULLABLE_NUMBERS: _nullable_numbers,
    Type.COUNTS: _counts,
    Type.INDICES: _indices,
    Type.SCALARS: _scalars,
    Type.SPAN: _span,
    Type.OBJECT: _mapping,
    Type.NAMES: _names,
    Type.ACTIVATIONS: _activations,
    Type.MODULE: _module,
    Type.ALERT: _alert,
    Type.ANY: _unchecked,
}


#: Each type's test of a value that passes its check, as an expression over ``value``:
#: the common case answered inline, the check itself run only when it fails (to raise,
#: or to accept what the test does not, such as a dict subclass). The monitor checks
#: some twenty fields a record: a call per field was a sixth of its time per record.
FAST_PASS: dict[Type, str] = {
    Type.INT: "type(value) is int and -BOUND <= value <= BOUND",
    Type.NUMBER: "type(value) is float or type(value) is int",
    Type.NUMBERS: "type(value) is list and set(map(type, value)) <= NUMBER_TYPES",
    Type.NULLABLE_NUMBERS: (  # (a list read packed holds floats only: nothing to scan)
        "type(value) is Float32List or "
        "(type(value) is list and set(map(type, value)) <= NULLABLE_NUMBER_TYPES)"
    ),
    Type.COUNTS: "type(value) is list and set(map(type, value)) <= NULLABLE_INT_TYPES",
    Type.SCALARS: "type(value) is dict and set(map(type, value.values())) <= NUMBER_TYPES",
}


def _plan(spec: FrameSpec) -> Callable[[Frame], None]:
    """The check of a kind of frame: its fields' checks in the spec's order (its key
    field's first), made one function, as ``views`` makes its readers."""
    lines = ["def check(frame):", "    get = frame.get"]
    namespace: dict[str, Any] = {
        "BOUND": 2**63,
        "NUMBER_TYPES": NUMBER_TYPES,
        "NULLABLE_NUMBER_TYPES": NULLABLE_NUMBER_TYPES,
        "NULLABLE_INT_TYPES": NULLABLE_INT_TYPES,
        "Float32List": Float32List,
    }
    for index, field in enumerate(spec):
        check = _required_integer if field.name == spec.key else CHECKS[field.type]
        if not field.checked or check is _unchecked:
            continue
        namespace[f"check_{index}"] = check
        name = repr(field.name)
        call = f"check_{index}(frame, {name})"
        fast = FAST_PASS.get(field.type)
        if fast is None:
            lines.append(f"    {call}")
            continue
        absent = "" if check is _required_integer else "value is not None and "
        lines += [f"    value = get({name})", f"    if {absent}not ({fast}):", f"        {call}"]
    exec("\n".join(lines), namespace)  # the spec's own names and this module's checks
    return cast("Callable[[Frame], None]", namespace["check"])


_PLANS = {kind: _plan(spec) for kind, spec in FRAMES.items()}
