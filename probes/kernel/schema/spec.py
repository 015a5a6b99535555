"""The record spec: every field of every frame a probe sends, declared once (stdlib only).

A field says its name, its type, its shape (one value, one per layer, ...) and, for a
step record, how it merges when a fast run's steps are thinned into one record. What
used to repeat the field names is derived from here: the monitor's field checks
(``checks``), the views' parsing (``views``), the thinning merge and the replay
history's (``probes.kernel.thinning``), and the per-layer floats the sender shortens
(``probes.runtime.link.sender``). The typed dictionaries of ``records`` stay the types mypy
sees; a test holds them to this spec.

Adding a per-layer step field is one line in ``STEP_FIELDS`` (say how it merges), plus
the code that measures it and the rule that reads it (``StepView.per_layer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from enum import Enum, StrEnum, unique
from typing import Any


@unique
class FrameKind(StrEnum):
    """What a frame is, as its ``kind`` says on the wire."""

    # a probe's
    HELLO = "hello"
    STEP = "step"
    EVAL = "eval"
    EVENT = "event"
    ALERT = "alert"
    ACK = "ack"
    ANOMALY = "anomaly"
    BYE = "bye"
    ANSWER = "answer"  # its proof of the shared token, to a monitor's challenge
    # a monitor's
    COMMAND = "command"
    REFUSE = "refuse"
    CHALLENGE = "challenge"
    WELCOME = "welcome"


@unique
class EventName(StrEnum):
    """The names of the events traintop's probe sends (``probe.event`` sends others, any
    name a script gives): the monitor acts on these."""

    PAUSED = "paused"  # the run paused (its reason)
    LR_SCALE = "lr_scale"  # the monitor's LR experiment applied
    PROBE_ERROR = "probe_error"  # the probe switched itself off (its message)
    CHECK_REPORT = "check_report"  # a pre-training check's report (kept apart)
    OVERFIT_BATCH = "overfit_batch"  # the tiny-batch test's end


class Type(Enum):
    """What a field holds; ``checks`` has a check and ``views`` a parser for each."""

    INT = "an integer"
    NUMBER = "a number (int or float)"
    TEXT = "a string"
    FLAG = "a boolean (read as true or false, whatever it holds)"
    NUMBERS = "a list of numbers"
    NULLABLE_NUMBERS = "a list of float32 numbers or null (null: not measured)"
    COUNTS = "a list of integers or null (null: not measured)"
    INDICES = "a list of indices (of layers, or of parameters)"
    SCALARS = "an object of named numbers"
    SPAN = "[first step, last step]"
    OBJECT = "an object"
    NAMES = "a list of distinct names"
    ACTIVATIONS = "a list of [name, family, feeding layer index or null]"
    MODULE = "an object naming a module (name: ...)"
    ALERT = "an alert's fields (its step an integer)"
    ANY = "anything JSON carries"


class Shape(Enum):
    """How many values a field holds, and what indexes them."""

    ONE = "one value"
    PER_LAYER = "one per layer, in the hello's order of layers"
    PER_ACTIVATION = "one per activation module, in the hello's order"
    PER_GROUP = "one per optimizer parameter group"
    NAMED = "one per name"
    LIST = "a list of some other kind"


class Merge(Enum):
    """How a thinned step record (one standing for a span of steps) holds a field."""

    LAST = "the shown step's own (the representative of the span)"
    MAX = "the largest over the span (finite values; per layer for a per-layer field)"
    MIN = "the smallest over the span (finite values)"
    SUM = "summed over the span (finite values)"
    FIRST_NON_FINITE = "the first step of the span with a non-finite number"
    SPAN = "[first, last]: the steps the record stands for"
    ANY = "true if it was at any step of the span"
    EVERY_UPDATE = "true if it was at every step of the span that ran optimizer.step()"
    COMMON_TO_UPDATES = "the indices common to every step of the span that updated"
    SENDER = "set by the sender on what it sends (not merged)"
    EACH = "every step's own, in step order ([step, value] pairs; dropped past a bound)"


@dataclass(frozen=True)
class Field:
    """One field of a frame.

    ``peaks``: a thinned record also carries the span's ``MAX`` / ``MIN`` of this field,
    as sibling fields ``<name>_max`` / ``<name>_min`` (derived here, see ``frame_fields``).
    ``view``: the ``StepView`` / ``EvalView`` attribute it is read into ("" for its own
    name; None when the view does not read it). ``checked``: the monitor rejects a
    frame whose field is not of its type (False: it is read leniently, or not read).
    ``default``: what a reader takes when the field is absent.
    """

    name: str
    type: Type
    doc: str
    shape: Shape = Shape.ONE
    merge: Merge = Merge.LAST
    peaks: tuple[Merge, ...] = ()
    required: bool = False
    checked: bool = True
    view: str | None = ""
    default: Any = None

    @property
    def attribute(self) -> str | None:
        """The view's attribute this field is read into (None: not read)."""
        return self.name if self.view == "" else self.view

    def peak_name(self, merge: Merge) -> str:
        """The sibling field carrying this field's peak of kind ``merge``."""
        return f"{self.name}_{'max' if merge is Merge.MAX else 'min'}"


# Short names for the tables below.
_T, _F = Type, Field
LAYER, ACTIVATION, GROUP = Shape.PER_LAYER, Shape.PER_ACTIVATION, Shape.PER_GROUP
NAMED, LIST = Shape.NAMED, Shape.LIST
SUM, MAX_ONLY, MAX_MIN = Merge.SUM, (Merge.MAX,), (Merge.MAX, Merge.MIN)


#: The fields of every frame (added by ``probes.kernel.wire`` and the sender).
ENVELOPE_FIELDS = (
    _F("v", _T.INT, "the protocol version", required=True, checked=False, view=None),
    _F("kind", _T.TEXT, "the frame's kind", required=True, checked=False, view=None),
    _F("run", _T.TEXT, "the run's id (unique per probe)", checked=False, view=None),
    _F("seq", _T.INT, "the sender's count of records sent", checked=False, view=None),
    _F("replayed", _T.FLAG, "from the history sent on connect", checked=False, view=None),
)

#: A step record: one training step, or (``span``) the steps a thinned record stands for.
#: One line a field: name, type, what it is, its shape, how a thinned record merges it.
# fmt: off
STEP_FIELDS = (
    _F("step", _T.INT, "the step (a thinned record: its shown one)", required=True, view=None),
    _F("time", _T.NUMBER, "wall time at the step's start", required=True, default=0.0),
    _F("duration", _T.NUMBER, "the step's seconds", merge=SUM, required=True),
    _F("probe_time", _T.NUMBER, "the probe's own seconds", merge=SUM, required=True),
    _F("span", _T.SPAN, "the steps a thinned record stands for", merge=Merge.SPAN, view=None),
    _F("dropped", _T.INT, "records the probe's queue dropped", merge=Merge.SENDER, default=0),
    _F("none_grads", _T.INT, "parameters without a gradient", required=True, default=0),
    _F("scalars", _T.SCALARS, "the logged scalars", NAMED, peaks=MAX_MIN, required=True),
    _F("lr", _T.NUMBERS, "learning rates", GROUP, required=True, view="lrs"),
    _F("grad_norms", _T.NULLABLE_NUMBERS, "gradient norms", LAYER, peaks=MAX_ONLY, required=True),
    _F("grad_norm_total", _T.NUMBER, "total gradient norm", peaks=MAX_ONLY, required=True,
       checked=False),
    _F("grad_max", _T.NULLABLE_NUMBERS, "largest |gradient element| (sampled steps)", LAYER,
       Merge.MAX),
    _F("param_norms", _T.NULLABLE_NUMBERS, "weight norms (sampled steps)", LAYER),
    _F("update_ratios", _T.NULLABLE_NUMBERS, "|dw|/|w| (sampled updates)", LAYER),
    _F("activations", _T.NULLABLE_NUMBERS, "dead / saturated fractions (sampled)", ACTIVATION),
    _F("none_grad_params", _T.INDICES, "parameters without a gradient", LIST),
    _F("not_stepped", _T.INDICES, "layers no update touched", LIST, merge=Merge.COMMON_TO_UPDATES),
    _F("grads_not_cleared", _T.FLAG, "the last update's gradient still held",
       merge=Merge.EVERY_UPDATE, checked=False),
    _F("optimizer_step", _T.FLAG, "False: optimizer.step() never ran", merge=Merge.ANY,
       checked=False, view="optimizer_stepped", default=True),
    _F("clip", _T.OBJECT, "max_norm, norm_type, total_before, total_after", checked=False,
       view=None),
    _F("first_non_finite_step", _T.INT, "first step with a non-finite number",
       merge=Merge.FIRST_NON_FINITE),
    _F("backward_passes", _T.COUNTS, "passes into the grad since cleared", LAYER, Merge.MAX),
    _F("step_losses", _T.ANY, "a thinned record's [step, loss] of every step it stands for",
       merge=Merge.EACH, checked=False, view=None),
    _F("input_rms", _T.NUMBER, "RMS of the model's input (sampled steps)", checked=False),
    _F("local_grad_norm", _T.NUMBER, "a job's rank: its own gradient norm before the "
       "all-reduce (sampled steps)", checked=False),
    _F("undivided_passes", _T.INT, "an update's accumulated backward passes, each on a mean "
       "loss as returned (not divided), from one line", merge=Merge.MAX, default=0),
    _F("discarded_grads", _T.FLAG, "a gradient cleared unused after passes landed on it "
       "(another player's loss: a game), or this model's loss made one in another watched "
       "model (its partner)", merge=Merge.MAX, checked=False, default=False),
    _F("loss_reduction", _T.TEXT, "the loss's reduction, read from its autograd nodes "
       "(first steps)", merge=Merge.LAST, checked=False),
    _F("optimizer_state", _T.ANY, "names the optimizer keeps per parameter (sampled steps)",
       merge=Merge.LAST, checked=False),
    _F("clip_steps", _T.INT, "steps that clipped (clip_grad_norm_)", merge=SUM, default=0),
    _F("clip_active_steps", _T.INT, "... whose unclipped total was above max_norm", merge=SUM,
       default=0),
    _F("grads_scaled", _T.NUMBER, "a GradScaler's scale still in the grads when clipped or read",
       merge=Merge.MAX),
    # where the step's time went (``probes.runtime.measure.phases``): seconds, summed over a
    # thinned record's span; the phases and the probe's time add up to ``cycle`` at most
    _F("cycle", _T.NUMBER, "seconds from the last record's end to this one's: the step as "
       "the run pays for it, its wait for data included", merge=SUM),
    _F("data_time", _T.NUMBER, "... waiting for the batch: from the last update (or step) "
       "to the first forward", merge=SUM),
    _F("forward_time", _T.NUMBER, "... in the model's forwards and the loss, up to backward",
       merge=SUM),
    _F("backward_time", _T.NUMBER, "... in backward", merge=SUM),
    _F("optimizer_time", _T.NUMBER, "... in optimizer.step()", merge=SUM),
    _F("samples", _T.INT, "samples the step's forwards took (the input's leading dimension), "
       "when the model is called with a tensor", merge=SUM),
    # the memory of the step (``probes.runtime.measure.memory``): bytes
    _F("memory", _T.NUMBER, "bytes in use at the step's end: the CUDA allocator's, else the "
       "process's resident memory (the hello's memory_source says which)", peaks=MAX_MIN),
    _F("memory_reserved", _T.NUMBER, "bytes the CUDA allocator holds", peaks=MAX_ONLY),
    _F("memory_peak", _T.NUMBER, "the CUDA allocator's peak so far (never reset: it is the "
       "run's)", merge=Merge.MAX),
    _F("retained_graphs", _T.INT, "earlier steps whose loss or output is still part of a live "
       "autograd graph (sampled steps)", merge=Merge.MAX),
    _F("retained_origin", _T.TEXT, "what the oldest of them is (the loss of step N, the output "
       "of the model at step N)", checked=False),
    _F("compiles", _T.INT, "graphs torch.compile has compiled in this process so far",
       merge=Merge.MAX),
)
# fmt: on

#: The step fields a clock or a memory gauge measures: they differ from run to run of the
#: same loop, where every other field is the same (tests compare runs without them).
MEASURED_FIELDS = frozenset(
    {"time", "duration", "probe_time", "cycle", "data_time", "forward_time", "backward_time"}
    | {"optimizer_time", "memory", "memory_reserved", "memory_peak"}
)

#: An evaluation, tied to the training step it follows.
EVAL_FIELDS = (
    _F("step", _T.INT, "the training step it follows", required=True, default=0),
    _F("time", _T.NUMBER, "wall time", required=True, checked=False, view=None),
    _F(
        "scalars",
        _T.SCALARS,
        "the eval's scalars (the validation loss among them)",
        Shape.NAMED,
        required=True,
    ),
    _F("forwards", _T.INT, "forward passes seen", required=True, default=0),
    _F(
        "train_mode_forwards",
        _T.INT,
        "... with the model in training mode",
        required=True,
        default=0,
    ),
    _F("grad_forwards", _T.INT, "... with gradient recording on", required=True, default=0),
    _F(
        "sensitive_train_forwards",
        _T.INT,
        "forwards in training mode of modules eval() changes (null: not counted)",
    ),
    _F("dropout_train_calls", _T.INT, "F.dropout calls with training=True and p > 0"),
    _F(
        "span",
        _T.SPAN,
        "the evals a thinned record stands for (history)",
        checked=False,
        merge=Merge.SPAN,
        view=None,
    ),
)

_STATE = _F("state", _T.OBJECT, "the control state: paused, anomaly_armed, guard", view=None)

#: The first frame of a connection. Only ``views.RunInfo`` reads it.
HELLO_FIELDS = (
    *(
        _F(name, kind, doc, required=True, checked=False, view=None)
        for name, kind, doc in (
            ("name", _T.TEXT, "the run's name in the monitor"),
            ("pid", _T.INT, "the training process"),
            ("job", _T.TEXT, "the id shared by the ranks of one job (null: alone)"),
            ("rank", _T.INT, "its rank"),
            ("local_rank", _T.INT, "its rank on its host"),
            ("world_size", _T.INT, "ranks in the job"),
            ("host", _T.TEXT, "the host's name"),
            ("sync", _T.TEXT, "how ranks share gradients: ddp, fsdp, unknown (null: alone)"),
            ("torch", _T.TEXT, "torch's version"),
            ("started", _T.NUMBER, "wall time"),
            ("argv", _T.ANY, "the command line"),
            ("model", _T.TEXT, "the watched module's class"),
            ("optimizer", _T.TEXT, "the optimizer's class (null: none)"),
            ("trainable_params", _T.INT, "trainable parameters"),
            ("params", _T.ANY, "parameter names (none_grad_params indexes these)"),
            ("mode_sensitive_modules", _T.INT, "modules eval() changes: dropout, batch norm"),
            ("config", _T.ANY, "every, sample_every, grad_accumulation, update_check"),
        )
    ),
    _F(
        "layers",
        _T.NAMES,
        "layer names, in the order of every per-layer list",
        Shape.LIST,
        required=True,
        view=None,
    ),
    _F("param_counts", _T.NUMBERS, "parameters per layer", LAYER, required=True, view=None),
    _F(
        "memory_source",
        _T.TEXT,
        "what a step's memory is: cuda (the allocator's bytes) or "
        "rss (the process's resident bytes)",
        checked=False,
        view=None,
    ),
    _F(
        "activations",
        _T.ACTIVATIONS,
        "the activation modules",
        Shape.PER_ACTIVATION,
        required=True,
        view=None,
    ),
    _F(
        "tied",
        _T.OBJECT,
        "tied weights: a layer's name -> the other modules sharing one of its parameters",
        NAMED,
        checked=False,
        view=None,
    ),
    _STATE,
)

#: A named event (an LR change, a pause, a check report, ...); it may carry more fields.
EVENT_FIELDS = (
    _F("name", _T.TEXT, "what happened", checked=False, view=None),
    _F("step", _T.INT, "the step it is tied to", view=None),
    _F("time", _T.NUMBER, "wall time", checked=False, view=None),
    _STATE,
)

#: An alert a probe raised itself (a guard trip, a check report's finding).
ALERT_FIELDS = (
    _F("step", _T.INT, "the step it was raised at", checked=False, view=None),
    _F("alert", _T.ALERT, "the alert's fields (probes.kernel.diagnosis.Alert)", view=None),
)

#: A command's acknowledgement.
ACK_FIELDS = (
    *(
        _F(name, kind, doc, required=True, checked=False, view=None)
        for name, kind, doc in (
            ("id", _T.INT, "the command's id"),
            ("command", _T.TEXT, "the command"),
            ("ok", _T.FLAG, "it was applied"),
            ("result", _T.TEXT, "what it did"),
            ("step", _T.INT, "the boundary it was applied at"),
        )
    ),
    replace(_STATE, required=True),
    _F("at_step", _T.INT, "a job's command: the step it was for", checked=False, view=None),
    _F("late", _T.FLAG, "... which this rank had passed already", checked=False, view=None),
)

#: What one step under anomaly detection found.
ANOMALY_FIELDS = (
    _F("step", _T.INT, "the step", required=True, view=None),
    _F("time", _T.NUMBER, "wall time", required=True, view=None),
    _F("duration", _T.NUMBER, "the step's seconds", required=True, view=None),
    *(
        _F(name, kind, doc, required=True, checked=False, view=None)
        for name, kind, doc in (
            ("outcome", _T.TEXT, "clean, non_finite_backward, non_finite_forward or error"),
            ("backward_op", _T.TEXT, "the backward function anomaly mode blamed"),
            ("message", _T.TEXT, "anomaly mode's message"),
            ("forward_traceback", _T.ANY, "file, line, function, code (user code)"),
            ("module_of_backward_op", _T.TEXT, "the module of that op"),
            ("update_skipped", _T.FLAG, "the update was skipped"),
            ("paused", _T.FLAG, "the run paused after it"),
            ("raised", _T.FLAG, "the error was raised into the loop"),
        )
    ),
    _F(
        "first_non_finite",
        _T.MODULE,
        "the first module with a non-finite output",
        required=True,
        view=None,
    ),
    _STATE,
    _F("batch", _T.INT, "the batch", checked=False, view=None),
    _F(
        "auto",
        _T.OBJECT,
        "armed by a non-finite read: armed_by (its step), cost",
        checked=False,
        view=None,
    ),
)

#: The last frame of a connection.
BYE_FIELDS = (
    _F("reason", _T.TEXT, "why the run ended", checked=False, view=None),
    _F("pid", _T.INT, "the training process", checked=False, view=None),
)


@dataclass(frozen=True)
class FrameSpec:
    """The fields of one kind of frame (``open``: it may carry others, as events do)."""

    kind: FrameKind
    fields: tuple[Field, ...]
    open: bool = False
    key: str | None = None  # a field no frame of this kind may lack

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __getitem__(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.fields)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


def frame_fields(fields: Iterable[Field]) -> tuple[Field, ...]:
    """``fields`` and, after each field with ``peaks``, its peak siblings (a thinned
    record's ``grad_norms_max``, ``scalars_min``, ...), merged by their kind."""
    out: list[Field] = []
    for field in fields:
        out.append(field)
        for merge in field.peaks:
            out.append(
                replace(
                    field,
                    name=field.peak_name(merge),
                    doc=f"the span's {merge.name.lower()} of {field.name}",
                    merge=merge,
                    peaks=(),
                    required=False,
                    checked=True,
                    view=field.peak_name(merge),
                    default=None,
                )
            )
    return tuple(out)


STEP = FrameSpec(FrameKind.STEP, frame_fields(STEP_FIELDS), key="step")
EVAL = FrameSpec(FrameKind.EVAL, EVAL_FIELDS)
HELLO = FrameSpec(FrameKind.HELLO, HELLO_FIELDS)
EVENT = FrameSpec(FrameKind.EVENT, EVENT_FIELDS, open=True)
ALERT = FrameSpec(FrameKind.ALERT, ALERT_FIELDS)
ACK = FrameSpec(FrameKind.ACK, ACK_FIELDS)
ANOMALY = FrameSpec(FrameKind.ANOMALY, ANOMALY_FIELDS)
BYE = FrameSpec(FrameKind.BYE, BYE_FIELDS)

#: Every kind of frame a probe sends, by kind.
FRAMES: dict[FrameKind, FrameSpec] = {
    spec.kind: spec for spec in (HELLO, STEP, EVAL, EVENT, ALERT, ACK, ANOMALY, BYE)
}

#: A step's per-layer fields (``StepView.per_layer`` holds each by name).
PER_LAYER_FIELDS = tuple(f.name for f in STEP if f.shape is Shape.PER_LAYER)

#: A step's float32 lists (per layer or per activation, peaks included): the sender
#: writes them with the 9 significant digits that carry a float32 exactly.
FLOAT32_FIELDS = tuple(f.name for f in STEP if f.type is Type.NULLABLE_NUMBERS)
