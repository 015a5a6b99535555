"""The frames a probe sends, typed, and what their fields mean (stdlib only).

The probe writes these records (``probes.runtime.measure.stats``, ``probes.runtime.link.hello``,
``probes.runtime.link.control``, ``probes.runtime.anomaly.anomaly``) and the monitor reads them
(``probes.kernel.schema.views``). Each field is declared once in the record spec
(``probes.kernel.schema.spec``: its type, shape and merge); these typed dictionaries are
the types mypy checks every use of, and ``tests/kernel/test_spec.py`` holds them to the spec. A
choice such as "which eval scalar is the validation loss" is made here once too.

Every frame also carries ``v`` (the protocol version) and ``kind``, set by
``probes.kernel.wire.make_frame``, and ``run`` (the run's id), ``seq`` and, on a step,
``dropped``, added by the sender (``probes.runtime.link.sender``). The fields of a ``...Fields``
base are always there; those of the class built on it (``total=False``) may be absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict


class ControlStateFields(TypedDict):
    """The run's control state, as hellos, acks, events and reports carry it."""

    paused: bool
    anomaly_armed: int  # steps still to run under anomaly detection
    guard: bool


class _HelloRecordRequired(TypedDict):
    """The fields every hello has."""

    run: str  # the run's id (unique per probe)
    name: str  # the run's name in the monitor
    pid: int
    job: str | None  # the id shared by the ranks of one job (None: a process on its own)
    rank: int
    local_rank: int
    world_size: int
    host: str
    sync: str | None  # how ranks share gradients: "ddp", "fsdp", "unknown" (None: alone)
    torch: str
    started: float  # wall time
    argv: list[str]
    model: str  # the watched module's class
    optimizer: str | None
    layers: list[str]  # layer names, in the order of every per-layer array
    param_counts: list[int]
    trainable_params: int
    params: list[str]  # parameter names (``none_grad_params`` indexes these)
    activations: list[list[Any]]  # [name, family, feeding layer index] per activation
    mode_sensitive_modules: int  # dropout and batch norm modules
    config: dict[str, Any]  # every, sample_every, grad_accumulation, update_check


class HelloRecord(_HelloRecordRequired, total=False):
    """The first frame of a connection: the run, its place in its job, its model."""

    state: ControlStateFields  # the control state when it (re)connects
    memory_source: str  # "cuda" (allocator bytes) or "rss" (resident bytes): a step's memory
    # tied weights: a layer's name -> the other modules (names) sharing one of its
    # parameters, which have no row of their own for it (absent: none)
    tied: dict[str, Any]


class ClipFields(TypedDict):
    """A clip in a step: its max norm and type, torch's total norm before and after."""

    max_norm: float
    norm_type: float
    total_before: float | None
    total_after: float | None


class _StepRecordRequired(TypedDict):
    """The fields every step record has."""

    kind: Literal["step"]
    step: int
    time: float  # wall time at the step's start
    duration: float  # the step's seconds (summed over a span)
    probe_time: float  # the probe's own seconds: training thread and sender (summed too)
    scalars: dict[str, float]  # the loss first
    lr: list[float]  # per param group
    grad_norms: list[float | None]  # per layer (None: no gradient)
    grad_norm_total: float | None
    none_grads: int  # parameters without a gradient


class StepRecord(_StepRecordRequired, total=False):
    """One step (or, with ``span``, the steps of a thinned record, shown by its last)."""

    dropped: int  # records the probe's queue dropped so far (added by the sender)
    none_grad_params: list[int]
    grad_max: list[float | None]  # per layer, its largest |gradient element|, sampled
    param_norms: list[float | None]  # sampled steps
    update_ratios: list[float | None]  # per layer |dw|/|w|, sampled updates
    activations: list[float | None]  # dead / saturated fractions, sampled
    grads_not_cleared: bool
    clip: ClipFields
    optimizer_step: bool  # False: optimizer.step() never ran in the step
    not_stepped: list[int]  # layers an update left untouched
    backward_passes: list[int | None]  # per layer, into its gradient since it was cleared
    step_losses: list[list[float]]  # a thinned record: [step, loss] of each of its steps
    input_rms: float  # RMS of the model's input, on sampled steps (compared across ranks)
    local_grad_norm: float  # a rank's own gradient norm before the all-reduce, sampled steps
    undivided_passes: int  # an update's k accumulated passes, each on a mean loss undivided
    discarded_grads: bool  # an optimizer's gradient cleared unused after passes: a game
    loss_reduction: str  # "sum" / "mean": the loss's, read off its autograd node (first steps)
    optimizer_state: list[str]  # names the optimizer keeps per parameter (sampled steps)
    clip_steps: int  # steps that clipped (1 for a step record; summed over a span)
    clip_active_steps: int  # ... whose unclipped total norm was above max_norm
    grads_scaled: float  # a GradScaler's loss scale still in the gradients clipped or read
    # where the step's time went (seconds, summed over a span) and its memory (bytes)
    cycle: float  # from the last record's end to this one's, the data wait included
    data_time: float  # waiting for the batch (the last update to the first forward)
    forward_time: float  # forwards and the loss, up to backward
    backward_time: float
    optimizer_time: float
    samples: int  # the forwards' inputs' leading dimension, summed
    memory: float  # CUDA allocated, else resident bytes, at the step's end
    memory_reserved: float  # CUDA: the allocator's reserved bytes
    memory_peak: float  # CUDA: the allocator's peak so far
    retained_graphs: int  # earlier steps' loss or output still in a live graph (sampled)
    retained_origin: str  # ... the oldest of them
    compiles: int  # torch.compile's graphs so far
    # a thinned record (``probes.kernel.thinning``): the steps it stands for, and their peaks
    span: list[int]  # [first, last]
    grad_norms_max: list[float | None]
    grad_norm_total_max: float | None
    scalars_max: dict[str, float]
    scalars_min: dict[str, float]
    memory_max: float
    memory_min: float
    memory_reserved_max: float
    first_non_finite_step: int


class _EvalRecordRequired(TypedDict):
    """The fields every eval record has."""

    kind: Literal["eval"]
    step: int
    time: float
    scalars: dict[str, float]  # the validation loss among them (``validation_loss``)
    forwards: int  # forward passes seen, and of those:
    train_mode_forwards: int  # ... with the model in training mode
    grad_forwards: int  # ... with gradient recording on


class EvalRecord(_EvalRecordRequired, total=False):
    """One evaluation, tied to the training step it follows."""

    span: list[int]  # in the replay history, evaluations merged: [first, last] step
    sensitive_train_forwards: int  # forwards in training mode of modules eval() changes
    dropout_train_calls: int  # F.dropout calls with training=True (p > 0)


class _AnomalyReportRequired(TypedDict):
    """The fields every anomaly report has."""

    kind: Literal["anomaly"]
    step: int
    time: float
    outcome: str  # "clean", "non_finite_backward", "non_finite_forward" or "error"
    duration: float
    backward_op: str | None  # the backward function anomaly mode blamed
    message: str
    forward_traceback: list[dict[str, Any]]  # file, line, function, code (user code)
    first_non_finite: dict[str, Any] | None  # the first module with a non-finite output
    module_of_backward_op: str | None
    update_skipped: bool
    paused: bool
    raised: bool


class AnomalyReport(_AnomalyReportRequired, total=False):
    """What one step under anomaly detection found."""

    state: ControlStateFields  # added by the probe, after the step
    batch: int
    auto: dict[str, Any]  # a check armed by a non-finite read: armed_by (step), cost


class _AckRecordRequired(TypedDict):
    """The fields every ack has."""

    kind: Literal["ack"]
    id: int | None
    command: str | None
    ok: bool
    result: str
    step: int  # the boundary it was applied at
    state: ControlStateFields


#: Names that are the validation loss, whatever else an eval record holds.
VALIDATION_LOSS_NAMES = ("val_loss", "eval_loss", "valid_loss", "validation_loss")


def validation_loss_name(names: object) -> str | None:
    """The name of the validation loss among an eval record's scalar names.

    An exact name first (``val_loss``, ``eval_loss``, ``valid_loss``,
    ``validation_loss``); else the one name ending in ``loss`` that is not a training
    loss (``train_loss``, ``train/loss``); None when there is none, or several and no
    exact one (a guess between them could show the wrong curve).

    Example::

        >>> validation_loss_name(["loss", "val_loss"])
        'val_loss'
        >>> validation_loss_name(["eval_accuracy", "eval_ce_loss"])
        'eval_ce_loss'
    """
    names = [str(name) for name in names]  # type: ignore[attr-defined]
    for exact in VALIDATION_LOSS_NAMES:
        if exact in names:
            return exact
    candidates = [n for n in names if n.endswith("loss") and not _is_training_name(n)]
    return candidates[0] if len(candidates) == 1 else None


def validation_loss(scalars: Mapping[str, float]) -> float | None:
    """The validation loss of an eval record's scalars (see ``validation_loss_name``)."""
    name = validation_loss_name(scalars)
    return None if name is None else scalars[name]


def _is_training_name(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("train", "tr_")) or "/train" in lowered


#: The suffix of an activation entry that counts a layer's input (``fc2(input)``): the
#: exact zeros reaching that layer, wherever the ReLU before it was written.
INPUT_SUFFIX = "(input)"


class AckRecord(_AckRecordRequired, total=False):
    """A command's acknowledgement, with its result and the state after it."""

    at_step: int  # a job's command: the step it was for
    late: bool  # ... which this rank had passed already
