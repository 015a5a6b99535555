"""The record spec (``probes.kernel.schema.spec``) is the one list of every frame's fields:
the typed records agree with it, and what is derived from it (checks, views, merges,
the sender's float32 fields) covers every field it declares."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from probes.kernel.merge import Peaks, apply
from probes.kernel.schema import checks, records, spec, views
from probes.kernel.schema.spec import STEP, Merge, Shape, Type
from probes.kernel.thinning import RECORDS

TYPED = {
    "hello": records.HelloRecord,
    "step": records.StepRecord,
    "eval": records.EvalRecord,
    "anomaly": records.AnomalyReport,
    "ack": records.AckRecord,
}
ENVELOPE = {f.name for f in spec.ENVELOPE_FIELDS}

#: The Python types a field of each spec type may be annotated with (or with ``| None``).
ANNOTATIONS: dict[Type, set[Any]] = {
    Type.INT: {int},
    Type.NUMBER: {float, int},
    Type.TEXT: {str},
    Type.FLAG: {bool},
    Type.NUMBERS: {list[float], list[int]},
    Type.NULLABLE_NUMBERS: {list[float | None]},
    Type.COUNTS: {list[int | None]},
    Type.INDICES: {list[int]},
    Type.SCALARS: {dict[str, float]},
    Type.SPAN: {list[int]},
    Type.OBJECT: {records.ClipFields, records.ControlStateFields, dict[str, Any]},
    Type.NAMES: {list[str]},
    Type.ACTIVATIONS: {list[list[Any]]},
    Type.MODULE: {dict[str, Any]},
    Type.ALERT: {dict[str, Any]},
}


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
    return annotation


@pytest.mark.parametrize("kind", list(TYPED))
def test_each_typed_record_declares_exactly_the_fields_of_the_spec(kind: str) -> None:
    typed, frame = TYPED[kind], spec.FRAMES[kind]
    declared = set(typed.__required_keys__ | typed.__optional_keys__) - ENVELOPE
    assert declared == set(frame.names) - ENVELOPE
    required = {f.name for f in frame if f.required} - ENVELOPE
    assert set(typed.__required_keys__) - ENVELOPE == required


@pytest.mark.parametrize("kind", list(TYPED))
def test_each_typed_field_has_its_spec_type(kind: str) -> None:
    hints = get_type_hints(TYPED[kind])
    for field in spec.FRAMES[kind]:
        if field.name not in hints or field.type is Type.ANY:
            continue
        annotation = _without_none(hints[field.name])
        if field.type is Type.TEXT and get_origin(annotation) is Literal:
            continue
        assert annotation in ANNOTATIONS[field.type], (kind, field.name, annotation)


def test_every_type_has_a_check_and_every_viewed_field_a_parser() -> None:
    assert set(checks.CHECKS) == set(Type)
    for frame in (spec.STEP, spec.EVAL):
        for field in frame:
            if field.attribute is not None or field.shape is Shape.PER_LAYER:
                views._expression(field)  # raises for a type no view reads


def test_the_views_read_every_field_the_spec_gives_them() -> None:
    """Each step field with a view attribute is a ``StepView`` field, or (a per-layer
    field the view does not name) in ``StepView.per_layer``; and every ``StepView``
    field but those the view derives itself comes from the spec."""
    own = {f.name for f in dataclasses.fields(views.StepView)}
    derived = {"step", "loss", "first_step", "more_layers", "step_losses", "shown_step"}
    from_spec = {f.attribute for f in STEP if f.attribute is not None}
    assert own - derived == from_spec & own
    for field in STEP:
        assert (
            field.attribute in own or field.attribute is None or (field.shape is Shape.PER_LAYER)
        ), field.name
    eval_own = {f.name for f in dataclasses.fields(views.EvalView)}
    assert eval_own - {"loss"} == {f.attribute for f in spec.EVAL if f.attribute}


def test_peak_siblings_are_derived_for_every_field_with_peaks() -> None:
    names = STEP.names
    for field in STEP:
        for merge in field.peaks:
            sibling = STEP[field.peak_name(merge)]
            assert sibling.merge is merge and sibling.type is field.type
            assert names.index(sibling.name) > names.index(field.name)
    assert {"grad_norms_max", "grad_norm_total_max", "scalars_max", "scalars_min"} <= set(names)


def test_the_sender_shortens_exactly_the_float32_lists() -> None:
    assert set(spec.FLOAT32_FIELDS) == {
        "grad_norms",
        "grad_norms_max",
        "grad_max",
        "param_norms",
        "update_ratios",
        "activations",
    }
    assert {"grad_norms", "grad_norms_max", "param_norms", "update_ratios"} <= set(
        spec.PER_LAYER_FIELDS
    )


def test_a_per_layer_field_declared_in_the_spec_is_checked_viewed_and_merged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What adding one line to the spec gives: the monitor checks the field, the view
    reads it into ``per_layer``, and a thinned record merges it as declared."""
    field = spec.Field("probe_counts", Type.COUNTS, "a test field", Shape.PER_LAYER, Merge.MAX)
    frame = spec.FrameSpec("step", (*STEP.fields, field), key="step")
    monkeypatch.setitem(spec.FRAMES, "step", frame)
    monkeypatch.setitem(checks._PLANS, "step", checks._plan(frame))
    monkeypatch.setattr(
        views, "_read_step", views._reader(frame, views.StepView, views.STEP_DERIVED)
    )
    record = {"kind": "step", "step": 3, "scalars": {"loss": 1.0}, "grad_norms": [1.0, 2.0]}
    checks.check_frame({**record, "probe_counts": [1, 2]})
    with pytest.raises(ValueError, match="probe_counts"):
        checks.check_frame({**record, "probe_counts": ["x"]})
    view = views.StepView.from_record({**record, "probe_counts": [1, None]})
    assert view.per_layer["probe_counts"] == [1, None]
    assert view.per_layer["grad_norms"] is view.grad_norms
    assert views.StepView.from_record(record).more_layers["probe_counts"] is None
    peaks = Peaks(frame)
    for n, counts in enumerate(([1, 3], [4, None], [2, 2])):
        peaks.add({**record, "step": n, "probe_counts": counts}, step=n, non_finite=False)
    merged = apply({**record, "probe_counts": [2, 2]}, peaks.fields())
    assert merged["probe_counts"] == [4, 3]


def test_a_merged_record_is_made_as_each_field_declares() -> None:
    steps = [
        {
            "kind": "step",
            "step": n,
            "scalars": {"loss": loss},
            "grad_norms": [g],
            "grad_norm_total": g,
            "duration": 0.5,
            "lr": [0.1],
            **extra,
        }
        for n, (loss, g, extra) in enumerate(
            [
                (2.0, 1.0, {"not_stepped": [0, 1], "grads_not_cleared": True}),
                (math.nan, 5.0, {"optimizer_step": False}),
                (1.0, 3.0, {"not_stepped": [1], "grads_not_cleared": True}),
            ]
        )
    ]
    merged = RECORDS.collapse(steps)
    assert merged["step"] == 1  # the first non-finite one shows (LAST: its own values)
    assert merged["span"] == [0, 2]  # SPAN
    assert merged["duration"] == 1.5  # SUM
    assert merged["grad_norms_max"] == [5.0] and merged["grad_norm_total_max"] == 5.0  # MAX
    assert (merged["scalars_max"], merged["scalars_min"]) == ({"loss": 2.0}, {"loss": 1.0})
    assert merged["first_non_finite_step"] == 1  # FIRST_NON_FINITE
    assert "optimizer_step" not in merged  # ANY: some step updated
    assert merged["grads_not_cleared"] is True  # EVERY_UPDATE (step 1 did not update)
    assert merged["not_stepped"] == [1]  # COMMON_TO_UPDATES
