"""The one parser of records: a hello, a step and an eval record as their readers see
them (the monitor's state, its diagnosis, headless mode).

A step record may stand for several steps (``span``: a fast run's sender thins its
records); it then carries the peaks of its span beside the values of the step it shows:
per layer the largest gradient norm (``grad_norms_max``), the largest total
(``grad_norm_total_max``), the largest and smallest of each scalar (``scalars_max``,
``scalars_min``) and the first step with a non-finite number
(``first_non_finite_step``). ``StepView`` reads a record of either shape the same way:
the peaks of a plain record are its own values. Records are checked first
(``probes.kernel.schema.checks``): the parser trusts their types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from probes.kernel.schema.records import validation_loss

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
    # (all-reduced; the cross-rank checks say when not), so the per-layer rules run on
    # rank 0 alone; the loss rules run on every rank.
    layer_rules: bool = True
    name: str | None = None  # the run's name (None: the hello names none)
    host: str | None = None
    pid: int | None = None
    job: str | None = None  # the job its ranks share (None: alone, or a job of one rank)
    rank: int = 0
    world_size: int = 1
    sync: str = "unknown"  # how a job's ranks share gradients: ddp, fsdp, unknown
    param_counts: tuple[int, ...] = ()  # per layer
    control: Mapping[str, Any] = field(default_factory=dict)  # paused, guard, ... now

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
            layer_rules=not (hello.get("sync") == "ddp" and hello.get("rank", 0) != 0),
            name=str(hello["name"]) if "name" in hello else None,
            host=None if host is None else str(host),
            pid=_opt_int(hello.get("pid")),
            job=str(job) if job and world > 1 else None,
            rank=_int(hello.get("rank"), 0),
            world_size=world,
            sync=str(hello.get("sync") or "unknown"),
            param_counts=tuple(int(c) for c in hello.get("param_counts", [])),
            control=dict(hello.get("state") or {}),
        )

    def layer(self, index: int) -> str:
        return self.layers[index] if 0 <= index < len(self.layers) else f"layer {index}"

    def feeding_layer(self, activation: int) -> str | None:
        """The name of the layer feeding activation ``activation`` (None if unknown)."""
        if activation >= len(self.activation_layers):
            return None
        index = self.activation_layers[activation]
        return None if index is None else self.layer(index)


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

    @property
    def first(self) -> int:
        """The first step this record stands for."""
        return self.step if self.first_step is None else self.first_step

    @property
    def steps(self) -> int:
        """How many steps this record stands for."""
        return self.step - self.first + 1

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
        """The loss to average this record as: its own for one step, the middle of its
        span's range for several (None when not finite)."""
        low, high = self.loss_min, self.loss_max
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
        scalars = {str(k): as_number(v) for k, v in (record.get("scalars") or {}).items()}
        loss = scalars.get("loss", next(iter(scalars.values()), None))
        span = record.get("span")
        step = int(record.get("step", 0))
        first = int(span[0]) if span else None
        return cls(
            step=int(span[1]) if span else step,
            loss=loss,
            scalars=scalars,
            grad_norm_total=_opt_num(record.get("grad_norm_total")),
            grad_norms=_floats(record.get("grad_norms") or ()),
            param_norms=_opt_list(record.get("param_norms")),
            update_ratios=_opt_list(record.get("update_ratios")),
            activations=_opt_list(record.get("activations")),
            none_grad_params=[int(i) for i in record.get("none_grad_params") or ()],
            grads_not_cleared=bool(record.get("grads_not_cleared")),
            optimizer_stepped=record.get("optimizer_step", True) is not False,
            first_step=first,
            grad_norms_max=_opt_list(record.get("grad_norms_max")),
            grad_norm_total_max=_opt_num(record.get("grad_norm_total_max")),
            scalars_max=_opt_dict(record.get("scalars_max")),
            scalars_min=_opt_dict(record.get("scalars_min")),
            first_non_finite_step=_opt_int(record.get("first_non_finite_step")),
            duration=_opt_num(record.get("duration")),
            probe_time=_opt_num(record.get("probe_time")),
            not_stepped=[int(i) for i in record.get("not_stepped") or ()],
            lrs=[as_number(x) for x in record.get("lr") or ()],
            time=as_number(record.get("time", 0.0)),
            dropped=int(record.get("dropped", 0) or 0),
            none_grads=int(record.get("none_grads", 0) or 0),
        )


@dataclass(frozen=True)
class EvalView:
    """The numbers of one eval record that the rules read."""

    step: int
    loss: float | None
    scalars: Mapping[str, float]
    forwards: int
    train_mode_forwards: int
    grad_forwards: int

    @classmethod
    def from_record(cls, record: Record) -> EvalView:
        scalars = {str(k): as_number(v) for k, v in (record.get("scalars") or {}).items()}
        loss = validation_loss(scalars)
        return cls(
            step=int(record.get("step", 0)),
            loss=loss,
            scalars=scalars,
            forwards=int(record.get("forwards", 0) or 0),
            train_mode_forwards=int(record.get("train_mode_forwards", 0) or 0),
            grad_forwards=int(record.get("grad_forwards", 0) or 0),
        )


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


def _opt_list(values: Any) -> list[float | None] | None:
    return None if values is None else _floats(values)


_FLOATS_OR_NONE = frozenset({float, type(None)})


def _floats(values: Any) -> list[float | None]:
    """A record's list of numbers (or None) as floats: the monitor reads a few hundred per
    record, so a list of floats, as nearly all are, is taken as it is (its types
    gathered in C; the record is not changed after)."""
    if isinstance(values, list) and set(map(type, values)) <= _FLOATS_OR_NONE:
        return values
    return [v if type(v) is float else _opt_num(v) for v in values]


def _opt_dict(values: Any) -> dict[str, float] | None:
    if not isinstance(values, Mapping):
        return None
    return {str(k): as_number(v) for k, v in values.items()}
