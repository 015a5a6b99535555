"""The one parser of records: a hello, a step and an eval record as their readers see
them (the monitor's state, its diagnosis, headless mode).

A step record may stand for several steps (``span``: a fast run's sender thins its
records); it then carries the peaks of its span beside the values of the step it shows:
per layer the largest gradient norm (``grad_norms_max``), the largest total
(``grad_norm_total_max``), the largest and smallest of each scalar (``scalars_max``,
``scalars_min``) and the first step with a non-finite number
(``first_non_finite_step``). ``StepView`` reads a record of either shape the same way:
the peaks of a plain record are its own values. Records are checked first
(``probes.kernel.schema.checks``): the parser trusts their types. Which field is read
into which attribute, and how, is the record spec's (``probes.kernel.schema.spec``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, cast

from probes.kernel.schema.floats import Float32List
from probes.kernel.schema.records import validation_loss
from probes.kernel.schema.spec import EVAL, STEP, Field, FrameSpec, Shape, Type

Record = Mapping[str, Any]


@dataclass(frozen=True)
class RunInfo:
    """What the hello says about the run: who it is (name, host, process, its job and
    rank), its layers and activations, and what its probe measures. The one reader of a
    hello: the monitor's state, its diagnosis and headless mode read this."""

    layers: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    activations: tuple[tuple[str, str], ...] = ()  # (module name, "relu" | "tanh" | ...)
    activation_layers: tuple[int | None, ...] = ()  # the layer feeding each activation
    mode_sensitive: int = 0  # dropout and batch-norm modules
    grad_accumulation: bool = False
    every: int = 1  # the probe measures one step in this many
    sample_every: int = 20  # ... and the costlier statistics one step in this many
    update_check: bool = False  # the probe says which layers optimizer.step() left alone
    # False for a rank other than 0 of a DDP job: its gradients and updates are rank 0's
    # (all-reduced; the cross-rank checks say when not), so the rules over them (the
    # diagnosis' ``REPLICA_RULES``) run on rank 0 alone; the loss rules on every rank.
    replica_rules: bool = True
    name: str | None = None  # the run's name (None: the hello names none)
    host: str | None = None
    pid: int | None = None
    started: float | None = None  # the wall time it began (None: the hello says none)
    job: str | None = None  # the job its ranks share (None: alone, or a job of one rank)
    rank: int = 0
    world_size: int = 1
    sync: str = "unknown"  # how a job's ranks share gradients: ddp, fsdp, unknown
    param_counts: tuple[int, ...] = ()  # per layer
    control: Mapping[str, Any] = field(default_factory=dict)  # paused, guard, ... now
    # tied weights: a layer's name -> the other modules sharing one of its parameters
    tied: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    optimizer: str | None = None  # the optimizer's class name (None: none, or not said)
    # what a step's memory is: "cuda" (the allocator's bytes), "rss" (resident bytes)
    memory_source: str | None = None

    @classmethod
    def from_hello(cls, hello: Record) -> RunInfo:
        raw = [a for a in hello.get("activations") or () if len(a) >= 2]
        config = hello.get("config") or {}
        world = max(_int(hello.get("world_size"), 1), 1)
        job = hello.get("job")
        host = hello.get("host")
        return cls(
            layers=tuple(str(n) for n in hello.get("layers") or ()),
            params=tuple(str(n) for n in hello.get("params") or ()),
            activations=tuple((str(a[0]), str(a[1])) for a in raw),
            activation_layers=tuple(_opt_int(a[2]) if len(a) > 2 else None for a in raw),
            mode_sensitive=int(hello.get("mode_sensitive_modules", 0) or 0),
            grad_accumulation=bool(config.get("grad_accumulation")),
            every=max(1, int(config.get("every", 1) or 1)),
            sample_every=max(1, int(config.get("sample_every", 20) or 20)),
            update_check=bool(config.get("update_check")),
            replica_rules=not (hello.get("sync") == "ddp" and hello.get("rank", 0) != 0),
            name=str(hello["name"]) if "name" in hello else None,
            host=None if host is None else str(host),
            pid=_opt_int(hello.get("pid")),
            started=_wall_time(hello.get("started")),
            job=str(job) if job and world > 1 else None,
            rank=_int(hello.get("rank"), 0),
            world_size=world,
            sync=str(hello.get("sync") or "unknown"),
            param_counts=tuple(int(c) for c in hello.get("param_counts", [])),
            control=dict(hello.get("state") or {}),
            tied=_tied(hello.get("tied")),
            optimizer=str(hello["optimizer"]) if hello.get("optimizer") else None,
            memory_source=str(hello["memory_source"]) if hello.get("memory_source") else None,
        )

    def layer(self, index: int) -> str:
        return self.layers[index] if 0 <= index < len(self.layers) else f"layer {index}"

    def layer_label(self, name: str) -> str:
        """A layer's name with every other name of its tied weights:
        ``transformer.wte (= lm_head)``; the name alone when none is tied to it."""
        others = self.tied.get(name)
        return f"{name} (= {', '.join(others)})" if others else name

    def feeding_layer(self, activation: int) -> str | None:
        """The name of the layer feeding activation ``activation`` (None if unknown)."""
        if activation >= len(self.activation_layers):
            return None
        index = self.activation_layers[activation]
        return None if index is None else self.layer(index)


def _tied(value: Any) -> dict[str, tuple[str, ...]]:
    """The hello's ``tied``, leniently: names to lists of names (others ignored)."""
    if not isinstance(value, Mapping):
        return {}
    return {
        str(name): tuple(str(other) for other in others)
        for name, others in value.items()
        if isinstance(others, list | tuple) and others
    }


NO_LAYERS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class StepView:
    """The numbers of one step record that the rules read."""

    step: int
    loss: float | None
    scalars: Mapping[str, float]
    grad_norm_total: float | None
    grad_norms: Sequence[float | None]
    param_norms: Sequence[float | None] | None
    update_ratios: Sequence[float | None] | None
    activations: Sequence[float | None] | None
    none_grad_params: Sequence[int]
    grads_not_cleared: bool
    optimizer_stepped: bool = True  # False: optimizer.step() never ran in this step
    first_step: int | None = None  # the first step it stands for (None: just ``step``)
    grad_norms_max: Sequence[float | None] | None = None
    grad_norm_total_max: float | None = None
    scalars_max: Mapping[str, float] | None = None
    scalars_min: Mapping[str, float] | None = None
    first_non_finite_step: int | None = None
    duration: float | None = None  # seconds, summed over the span
    probe_time: float | None = None  # the probe's own seconds, summed over the span
    not_stepped: Sequence[int] = ()  # layers optimizer.step() left untouched
    lrs: Sequence[float] = ()
    time: float = 0.0  # wall time at the step's start (the run's clock)
    dropped: int = 0  # records the probe's queue dropped so far
    none_grads: int = 0  # parameters without a gradient
    input_rms: float | None = None  # the model's input scale, on sampled steps
    local_grad_norm: float | None = None  # a rank's own, before the all-reduce (sampled)
    clip_steps: int = 0  # steps of the span that clipped (clip_grad_norm_)
    clip_active_steps: int = 0  # ... whose unclipped total norm was above max_norm
    grads_scaled: float | None = None  # a GradScaler's scale still in the gradients read
    undivided_passes: int = 0  # an update's k accumulated passes on mean losses, undivided
    discarded_grads: bool = False  # an optimizer's gradient cleared unused: a game (a GAN)
    optimizer_state: Any = None  # names the optimizer keeps per parameter (untrusted)
    loss_reduction: str | None = None  # "sum" / "mean": the loss's, on the first steps
    # where the step's time went (seconds, summed over the span; None: not measured)
    cycle: float | None = None  # the step as the run pays for it, its data wait included
    data_time: float | None = None
    forward_time: float | None = None
    backward_time: float | None = None
    optimizer_time: float | None = None
    samples: int | None = None  # the forwards' inputs' leading dimension, summed
    # its memory in bytes (None: not measured): at its end, and a span's peaks
    memory: float | None = None
    memory_max: float | None = None
    memory_min: float | None = None
    memory_reserved: float | None = None
    memory_reserved_max: float | None = None
    memory_peak: float | None = None
    retained_graphs: int | None = None  # earlier steps' losses still in a live graph
    retained_origin: str | None = None  # ... the oldest of them (untrusted text)
    compiles: int | None = None  # torch.compile's graphs so far
    # The spec's per-layer fields that have no attribute above, by name: a field added
    # to the spec is read here with no change to the view (see ``per_layer``).
    more_layers: Mapping[str, Sequence[float | None] | None] = field(default_factory=dict)
    # A thinned record's (step, loss) of each step it stands for (None: not carried)
    step_losses: Sequence[tuple[int, float]] | None = None
    # The step whose own values a thinned record shows (its ``step`` field): the last of
    # its span, or the first non-finite one of a span that has one (None: ``step``).
    shown_step: int | None = None

    @property
    def per_layer(self) -> Mapping[str, Sequence[float | None] | None]:
        """Every per-layer field of the record by name (``spec.PER_LAYER_FIELDS``), those
        with an attribute of their own included (None: not in the record)."""
        named = {name: getattr(self, attribute) for name, attribute in _NAMED_LAYERS}
        return {**named, **self.more_layers}

    @property
    def first(self) -> int:
        """The first step this record stands for."""
        return self.step if self.first_step is None else self.first_step

    @property
    def shown(self) -> int:
        """The step whose own values (loss, gradient norms) this record shows: what
        another rank's record of the same step is compared with."""
        return self.step if self.shown_step is None else self.shown_step

    @property
    def steps(self) -> int:
        """How many steps this record stands for."""
        return self.step - self.first + 1

    @property
    def losses_by_step(self) -> Sequence[tuple[int, float]] | None:
        """(step, training loss) of each step this record stands for, in order (None: a
        thinned record that does not carry them; then only its peaks are known)."""
        if self.step_losses is not None:
            return self.step_losses
        if self.first_step is not None and self.first_step != self.step:
            return None
        return () if self.loss is None else ((self.step, self.loss),)

    @property
    def sampled(self) -> bool:
        """A sampled step: parameter norms (and activation health) were taken."""
        return self.param_norms is not None

    @property
    def peak_grads(self) -> Sequence[float | None]:
        """Per layer, the largest gradient norm over the span."""
        return self.grad_norms if self.grad_norms_max is None else self.grad_norms_max

    @property
    def peak_total(self) -> float | None:
        return (
            self.grad_norm_total if self.grad_norm_total_max is None else (self.grad_norm_total_max)
        )

    @property
    def loss_max(self) -> float | None:
        """The largest finite training loss over the span (None if none)."""
        return self._scalar_peak(self.scalars_max, max)

    @property
    def loss_min(self) -> float | None:
        return self._scalar_peak(self.scalars_min, min)

    def _scalar_peak(self, peaks: Mapping[str, float] | None, pick: Any) -> float | None:
        own = self.loss if self.loss is not None and math.isfinite(self.loss) else None
        name = "loss" if "loss" in self.scalars else next(iter(self.scalars), None)
        peak = None if peaks is None or name is None else peaks.get(name)
        if peak is None or not math.isfinite(peak):
            return own
        return peak if own is None else pick(peak, own)

    @property
    def loss_estimate(self) -> float | None:
        """The loss to average this record as: its own for one step; for several, the
        mean of its steps' where it carries them, else the middle of its span's range
        (None when not finite)."""
        loss = self.loss
        if self.first_step is None or self.first_step == self.step:  # one step: its own
            return loss if loss is not None and math.isfinite(loss) else None
        low, high = self.loss_min, self.loss_max
        finite = [loss for _, loss in self.step_losses or () if math.isfinite(loss)]
        if self.steps > 1 and finite:
            return math.fsum(finite) / len(finite)  # every step's: what it stood for
        if self.steps > 1 and low is not None and high is not None:
            return (low + high) / 2
        return self.loss if self.loss is not None and math.isfinite(self.loss) else None

    @property
    def non_finite_grads(self) -> bool:
        """True if the step's gradient norms hold a NaN or Inf."""
        total = self.grad_norm_total
        if total is not None and not math.isfinite(total):
            return True
        return any(g is not None and not math.isfinite(g) for g in self.grad_norms)

    @classmethod
    def from_record(cls, record: Record) -> StepView:
        return _read_step(cls, record)


@dataclass(frozen=True)
class EvalView:
    """The numbers of one eval record that the rules read."""

    step: int
    loss: float | None
    scalars: Mapping[str, float]
    forwards: int
    train_mode_forwards: int
    grad_forwards: int
    sensitive_train_forwards: int | None = None  # None: an older probe did not count them
    dropout_train_calls: int | None = None

    @classmethod
    def from_record(cls, record: Record) -> EvalView:
        return _read_eval(cls, record)


def as_number(value: Any) -> float:
    """A record's number as a float; NaN for anything that is not one (inf for an
    integer too large for a float)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _opt_num(value: Any) -> float | None:
    return None if value is None else as_number(value)


def _int(value: Any, default: int) -> int:
    """``value`` if it is an integer (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _opt_int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _wall_time(value: Any) -> float | None:
    """``value`` if it is a finite number (a hello's ``started``, unchecked), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # (an integer past a float's range)
        return None
    return number if math.isfinite(number) else None


_FLOATS_OR_NONE = frozenset({float, type(None)})


def _floats(values: Any) -> list[float | None]:
    """A record's list of numbers (or None) as floats: the monitor reads a few hundred per
    record, so a list of floats, as nearly all are, is taken as it is (its types
    gathered in C; the record is not changed after)."""
    if type(values) is Float32List:  # read packed: floats only, nothing to gather
        return cast("list[float | None]", values)
    if isinstance(values, list) and set(map(type, values)) <= _FLOATS_OR_NONE:
        return values
    return [v if type(v) is float else _opt_num(v) for v in values]


def _opt_counts(values: Any) -> list[int | None] | None:
    return None if values is None else [None if v is None else int(v) for v in values]


def _opt_dict(values: Any) -> dict[str, float] | None:
    if not isinstance(values, Mapping):
        return None
    return {str(k): as_number(v) for k, v in values.items()}


def _step_losses(pairs: Any) -> list[tuple[int, float]] | None:
    """A thinned record's ``[step, loss]`` pairs, leniently (None: absent, or not pairs)."""
    if not isinstance(pairs, list) or not pairs:
        return None
    try:
        return [(int(step), as_number(loss)) for step, loss in pairs]
    except (TypeError, ValueError):
        return None


def _expression(spec_field: Field) -> str:
    """How a field of the spec is read, as a Python expression over ``get`` (the
    record's ``get``): its type's parser; a required list or mapping read as empty when
    absent, an optional one as None."""
    kind, name, default = spec_field.type, repr(spec_field.name), spec_field.default
    value = f"get({name})" if default is None else f"get({name}, {default!r})"
    optional = not spec_field.required
    # An int or a float, as nearly every one is, is taken as it is (no call), and so is
    # an absent field (no call to read None as None, for the dozen a record lacks).
    if kind is Type.INT:
        if default is None:
            return f"(_v if type(_v := {value}) is int or _v is None else _opt_int(_v))"
        return f"(_v if type(_v := {value}) is int else int(_v or 0))"
    if kind is Type.NUMBER:
        if default is None:
            return f"(_v if type(_v := {value}) is float or _v is None else as_number(_v))"
        return f"(_v if type(_v := {value}) is float else as_number(_v))"
    if kind is Type.FLAG:
        return f"{value} is not False" if default is True else f"bool({value})"
    if kind is Type.NUMBERS:
        return f"([as_number(x) for x in _v] if (_v := {value}) else [])"
    if kind is Type.NULLABLE_NUMBERS:
        if optional:
            return f"(None if (_v := {value}) is None else _floats(_v))"
        return f"_floats({value} or ())"
    if kind is Type.COUNTS:
        return f"(None if (_v := {value}) is None else _opt_counts(_v))"
    if kind is Type.INDICES:
        return f"([int(i) for i in _v] if (_v := {value}) else [])"
    if kind is Type.SCALARS:
        if optional:
            return f"(None if (_v := {value}) is None else _opt_dict(_v))"
        return f"{{str(k): as_number(v) for k, v in ({value} or {{}}).items()}}"
    if kind is Type.TEXT:
        return f"(_v if isinstance(_v := {value}, str) else None)"
    if kind is Type.ANY:
        return value  # (as sent: untrusted, the rule that reads it checks its shape)
    raise TypeError(f"a view does not read {spec_field.name} ({kind.name})")


def _reader(spec: FrameSpec, view: type, derived: str) -> Callable[[type, Record], Any]:
    """The parser of one kind of record into ``view``, made from the spec: one function
    whose body reads each field the view has an attribute for (and, into
    ``more_layers``, each other per-layer field), as a hand-written one would. (Generated, as
    ``dataclasses`` makes ``__init__``: a loop over the fields costs the monitor a
    third more per record.) ``derived``: the view's own lines, run last, that set the
    attributes not read from one field (each attribute is a local of its name)."""
    own = [f.name for f in fields(view)]
    lines = ["def read(cls, record):", "    get = record.get"]
    more = []
    for spec_field in spec:
        attribute = spec_field.attribute
        if attribute in own:
            lines.append(f"    {attribute} = {_expression(spec_field)}")
        elif spec_field.shape is Shape.PER_LAYER and "more_layers" in own:
            more.append(f"{spec_field.name!r}: {_expression(spec_field)}")
    if "more_layers" in own:
        lines.append(f"    more_layers = {{{', '.join(more)}}}" if more else "    more_layers = NO")
    lines += [f"    {line}" for line in derived.strip().splitlines()]
    # Every field is set here, so the dataclass's ``__init__`` (a frozen one's sets each
    # field through ``object.__setattr__``: 14 us of a step view's 40) is not needed.
    lines.append("    view = new(cls)")
    lines.append(f"    view.__dict__.update({', '.join(f'{name}={name}' for name in own)})")
    lines.append("    return view")
    namespace: dict[str, Any] = {
        "as_number": as_number,
        "validation_loss": validation_loss,
        "NO": NO_LAYERS,
        "new": object.__new__,
        **{name: globals()[name] for name in _PARSERS},
    }
    exec("\n".join(lines), namespace)  # the spec's own names and this module's parsers
    return namespace["read"]


_PARSERS = (
    "_opt_int",
    "_opt_num",
    "_opt_counts",
    "_opt_dict",
    "_floats",
    "_step_losses",
)

#: The attributes of a ``StepView`` not read from one field of the spec.
STEP_DERIVED = """
span = get("span")
shown_step = int(get("step", 0)) if span else None
step = int(span[1]) if span else int(get("step", 0))
first_step = int(span[0]) if span else None
loss = scalars.get("loss", next(iter(scalars.values()), None))
step_losses = _step_losses(get("step_losses"))
"""
_read_step = _reader(STEP, StepView, STEP_DERIVED)
#: (name, attribute) of each per-layer field with an attribute of its own.
_NAMED_LAYERS = tuple(
    (f.name, f.attribute)
    for f in STEP
    if f.shape is Shape.PER_LAYER and f.attribute in {a.name for a in fields(StepView)}
)
_read_eval = _reader(EVAL, EvalView, "loss = validation_loss(scalars)")
