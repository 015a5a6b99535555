"""The field checks the monitor runs on every frame, before any of it reaches its state.

A frame that decoded may still carry a string where a step number belongs, an
``Infinity`` step, a hello with two layers of one name. ``check_frame`` raises
``ValueError`` with one line naming the field, so the frame is rejected whole and the
state (and every view drawn from it) only ever holds what a probe sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Frame = dict[str, Any]
PROBE_KINDS = frozenset({"hello", "step", "eval", "event", "alert", "ack", "anomaly", "bye"})


def check_frame(frame: Frame) -> None:
    """Raise ``ValueError`` if a field the monitor reads has the wrong shape, or if the
    frame is of a kind only a monitor sends."""
    kind = frame["kind"]
    if kind not in PROBE_KINDS:
        raise ValueError(f"a {kind} frame comes from a monitor, not from a probe")
    checker = _CHECKERS.get(kind)
    if checker is not None:
        checker(frame)


def _integer(frame: Frame, name: str, *, required: bool = False) -> None:
    value = frame.get(name)
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r:.40}")
    if abs(value) > 2**63:
        raise ValueError(f"{name} out of range: {value:.3g}")


def _number(frame: Frame, name: str) -> None:
    value = frame.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"{name} must be a number, got {value!r:.40}")


NUMBER_TYPES = frozenset({int, float})
NULLABLE_NUMBER_TYPES = frozenset({int, float, type(None)})


def _numbers(frame: Frame, name: str, *, nullable: bool = False) -> None:
    values = frame.get(name)
    if values is None:
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


def _mapping(frame: Frame, name: str) -> None:
    value = frame.get(name)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{name} must be an object, got {type(value).__name__}")


def _scalars(frame: Frame) -> None:
    _mapping(frame, "scalars")
    for key, value in (frame.get("scalars") or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"scalar {key!r:.40} is {value!r:.40}, not a number")


def _hello(frame: Frame) -> None:
    _mapping(frame, "state")
    layers = frame.get("layers", [])
    if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
        raise ValueError("layers must be a list of names")
    if len(set(layers)) != len(layers):
        raise ValueError("layers holds the same name twice")
    _numbers(frame, "param_counts")
    for entry in frame.get("activations") or []:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and (entry[2] is None or (isinstance(entry[2], int) and not isinstance(entry[2], bool)))
        ):
            raise ValueError(f"activations holds {entry!r:.60}, not [name, family, layer]")


def _step(frame: Frame) -> None:
    _integer(frame, "step", required=True)
    _number(frame, "time")
    _number(frame, "duration")
    _number(frame, "probe_time")
    _span(frame)
    _integer(frame, "dropped")
    _integer(frame, "none_grads")
    _scalars(frame)
    _numbers(frame, "lr")
    for name in ("grad_norms", "param_norms", "update_ratios", "activations", "grad_norms_max"):
        _numbers(frame, name, nullable=True)
    for name in ("none_grad_params", "not_stepped"):
        _indices(frame, name)
    # a record standing for several steps: its span and the peaks of its steps
    span = frame.get("span")
    if span is not None and not (
        isinstance(span, list)
        and len(span) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) for s in span)
    ):
        raise ValueError(f"span must be [first, last], got {span!r:.40}")
    for name in ("grad_norm_total_max", "duration", "probe_time"):
        _number(frame, name)
    _integer(frame, "first_non_finite_step")
    for name in ("scalars_max", "scalars_min"):
        _mapping(frame, name)
        for key, value in (frame.get(name) or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} {key!r:.40} is {value!r:.40}, not a number")


def _indices(frame: Frame, name: str) -> None:
    indices = frame.get(name) or []
    if not isinstance(indices, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in indices
    ):
        raise ValueError(f"{name} must be a list of indices")


def _span(frame: Frame) -> None:
    span = frame.get("span")
    if span is None:
        return
    if not (
        isinstance(span, list)
        and len(span) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) for s in span)
    ):
        raise ValueError(f"span must be [first step, last step], got {span!r:.40}")


def _eval(frame: Frame) -> None:
    _integer(frame, "step")
    _scalars(frame)
    for name in ("forwards", "train_mode_forwards", "grad_forwards"):
        _integer(frame, name)


def _event(frame: Frame) -> None:
    _integer(frame, "step")
    _mapping(frame, "state")


def _anomaly(frame: Frame) -> None:
    _integer(frame, "step")
    _number(frame, "time")
    _number(frame, "duration")
    _mapping(frame, "state")
    first = frame.get("first_non_finite")
    if first is not None and not (isinstance(first, dict) and isinstance(first.get("name"), str)):
        raise ValueError("first_non_finite must be an object with a module name")


def _alert(frame: Frame) -> None:
    _mapping(frame, "alert")
    alert = frame.get("alert") or {}
    _integer(alert, "step")


def _ack(frame: Frame) -> None:
    _mapping(frame, "state")


_CHECKERS: dict[str, Callable[[Frame], None]] = {
    "hello": _hello,
    "step": _step,
    "eval": _eval,
    "event": _event,
    "anomaly": _anomaly,
    "alert": _alert,
    "ack": _ack,
}
