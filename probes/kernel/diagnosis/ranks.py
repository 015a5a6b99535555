"""Checks across the ranks of one job, from the records each rank sends anyway.

The ranks of a data-parallel job train one model on different shards. What must agree
across them at the same step, and what that shows when it does not:

- ``grads_not_synced``: under DistributedDataParallel the per-layer gradient norms after
  the all-reduce (what the probe reads) are the same on every rank;
- ``replicas_diverged``: the parameter norms of the sampled steps are the same on every
  rank (DDP: the same update on the same weights);
- ``rank_outlier``: one rank's loss far above the others' at the same step (or
  non-finite while theirs is finite): its shard or its host; or one rank's inputs (their
  RMS, which every rank measures on its sampled steps, before anything is all-reduced)
  standing apart from the others' (``subject=inputs``, ``rank=R``): a bad shard whose
  loss looks normal (a saturating layer keeps it near the others') while the all-reduced
  gradients explode on every rank. With two ranks the one apart is the one whose scale
  left its own first; with more, the one farthest from the others' median;
- ``rank_stalled``: a rank stopped sending (its connection ended without a clean end, or
  it went quiet while another rank went on past it).

Sharded setups (FSDP) hold different parts of the model on each rank: their gradient
and parameter norms are not comparable, so only the losses and the stalls are checked
(``sync == "fsdp"``); ranks whose synchronisation is unknown are treated the same way.

A record stands for the steps of its ``span`` and shows its last step's own values
(``probes.kernel.thinning``): two ranks' records compare when their shown steps are equal;
sampled steps are always shown, and a step whose loss jumps is sent on its own.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import StepView
from probes.kernel.diagnosis.vocabulary import AlertKind, RankSubject
from probes.kernel.schema.floats import Float32List

# Shown steps remembered per job for comparison: the ranks' records of one step arrive
# within a flush or two of each other (64 steps at rank 0's 60 records a second is a
# second), and each kept step holds every rank's per-layer norms.
KEPT_STEPS = 64
# Jobs whose ranks read shards of one dataset (a pipeline's stages, under "unknown",
# feed each other activations of their own scales).
DATA_PARALLEL = frozenset({"ddp", "fsdp"})


@dataclass(slots=True)
class Shown:
    """What one rank's record shows of its last step (and of its span). Only the step's
    first rank keeps its per-layer norms once compared (``JobChecks.observe``)."""

    rank: int
    first: int  # the first step of its span
    loss: float | None  # the step's own loss
    non_finite_loss: bool
    grads: Sequence[float | None]
    params: Sequence[float | None] | None
    stepped: bool
    input_rms: float | None = None  # the scale of its inputs (sampled steps)
    local_grad: float | None = None  # its own gradient norm, before the all-reduce (sampled)


@dataclass
class RankScales:
    """Each rank's first value of a scale that ranks compare (their inputs' RMS, their
    own gradients' norm), and its value at the latest step where the ranks agreed."""

    first: dict[int, float] = field(default_factory=dict)
    agreed: dict[int, float] = field(default_factory=dict)


@dataclass
class JobChecks:
    """Cross-rank comparisons for one job; ``observe`` each rank's step records.

    Args:
        layers: the model's layer names (the same on every rank).
        sync: how gradients are shared: ``"ddp"`` (all-reduced, replicated weights),
            ``"fsdp"`` (sharded) or ``"unknown"``.
        thresholds: ``rank_*`` thresholds and the spike rule's minimal jump.
    """

    layers: tuple[str, ...]
    sync: str = "unknown"
    thresholds: Thresholds = field(default_factory=Thresholds)
    found: dict[str, Alert] = field(default_factory=dict)  # one incident per kind
    _shown: dict[int, dict[int, Shown]] = field(default_factory=dict)  # step -> rank ->
    _order: deque[int] = field(default_factory=lambda: deque())
    # step -> the lowest and highest finite loss of its ranks, and whether one was not
    _range: dict[int, tuple[float, float, bool]] = field(default_factory=dict)
    _start_loss: float | None = None  # the job's first finite loss: its scale
    _input_scales: RankScales = field(default_factory=RankScales)  # their input RMS
    _local_scales: RankScales = field(default_factory=RankScales)  # their own gradients

    def observe(self, rank: int, view: StepView) -> list[Alert]:
        """Take rank ``rank``'s step record; the job incidents it newly shows."""
        # Keyed by the step whose values it shows: a thinned record's span may be shown by
        # its first non-finite step, and another rank's record ending at the same step
        # shows another step (compared, a climb read as one rank far above the others).
        step = view.shown
        loss = view.loss
        if self._start_loss is None and loss is not None and math.isfinite(loss):
            self._start_loss = abs(loss)
        non_finite = loss is not None and not math.isfinite(loss)
        layered = self.sync == "ddp"  # per-layer norms compare only between replicas
        shown = Shown(
            rank,
            view.first,
            loss,
            non_finite,
            view.grad_norms if layered else (),
            view.param_norms if layered else None,
            view.optimizer_stepped,
            _positive(view.input_rms),
            _positive(view.local_grad_norm),
        )
        if shown.input_rms is not None:
            self._input_scales.first.setdefault(rank, shown.input_rms)
        if shown.local_grad is not None:
            self._local_scales.first.setdefault(rank, shown.local_grad)
        peers = self._shown.get(step)
        if peers is None:
            peers = self._shown[step] = {}
            self._order.append(step)
            while len(self._order) > KEPT_STEPS:
                gone = self._order.popleft()
                self._shown.pop(gone, None)
                self._range.pop(gone, None)
        peers[rank] = shown
        low, high, bad = self._range.get(step, (math.inf, -math.inf, False))
        if loss is not None:
            if non_finite:
                bad = True
            else:
                low, high = min(low, loss), max(high, loss)
            self._range[step] = (low, high, bad)
        if len(peers) < 2:
            return []
        # Each newcomer is compared with the step's first rank (one pass over the layers),
        # and the loss with the others': the cost of a record does not grow with ranks.
        reference = next(iter(peers.values()))
        # The highest loss at most factor x the lowest, or above it by less than the jump
        # an outlier must make: no outlier (the common case, O(1); a converged job's
        # losses, 0.001 to 0.01 across ranks, had every record scan every rank's:
        # 133 us a record became 327 at 1,024 ranks).
        suspicious = bad or (
            high > self.thresholds.rank_loss_factor * low and high - low > self._min_jump()
        )
        found = [
            alert
            for alert in (
                self._outlier(step, peers) if suspicious else None,
                self._inputs(step, peers) if shown.input_rms is not None else None,
                self._local_grads(step, peers) if shown.local_grad is not None else None,
                self._grads(step, reference, shown),
                self._params(step, reference, shown),
            )
            if alert is not None
        ]
        if shown is not reference:  # compared: its norms are never read again (a job of
            shown.grads, shown.params = (), None  # 1,024 ranks kept 200 MB of them)
        return found

    # --- the checks ----------------------------------------------------------------------

    def _outlier(self, step: int, peers: Mapping[int, Shown]) -> Alert | None:
        """The rank with the highest loss (or a non-finite one) far above the median of
        the others, by a jump that is a visible part of the job's starting loss."""
        if AlertKind.RANK_OUTLIER in self.found:
            return None
        suspect = next((p for p in peers.values() if p.non_finite_loss), None)
        if suspect is None:
            finite = [p for p in peers.values() if p.loss is not None]
            if len(finite) < 2:
                return None
            suspect = max(finite, key=lambda p: p.loss or 0.0)
        others = [p.loss for r, p in peers.items() if r != suspect.rank and p.loss is not None]
        if len(others) < len(peers) - 1 or not all(math.isfinite(o) for o in others):
            return None  # another rank is not fine either: not one rank's
        loss = suspect.loss
        factor = self.thresholds.rank_loss_factor
        if not suspect.non_finite_loss and (loss is None or loss <= factor * min(others)):
            return None  # (at most factor x the least: at most factor x the median)
        median = statistics.median(others)
        evidence: dict[str, Any] = {
            "rank": suspect.rank,
            "loss": loss,
            "other_ranks_median": median,
        }
        if not suspect.non_finite_loss:
            assert loss is not None
            if median <= 0 or loss <= factor * median or loss - median <= self._min_jump():
                return None
            evidence["times"] = loss / median
        evidence.update(other_ranks=len(others), others="fine")
        return self._raise(AlertKind.RANK_OUTLIER, step, "loss", evidence)

    def _min_jump(self) -> float:
        """How far above the others an outlier's loss must be: a visible part of the
        job's starting loss."""
        return self.thresholds.spike_min_jump * (self._start_loss or 0.0)

    def _inputs(self, step: int, peers: Mapping[int, Shown]) -> Alert | None:
        """The rank whose inputs' scale stands ``rank_input_factor`` apart from the
        others' at this step (a sampled step every rank shows)."""
        scales = {r: p.input_rms for r, p in peers.items() if p.input_rms is not None}
        return self._apart(step, scales, self._input_scales, RankSubject.INPUTS, "input_rms")

    def _local_grads(self, step: int, peers: Mapping[int, Shown]) -> Alert | None:
        """The rank whose own gradients (before the all-reduce averages them) stand
        ``rank_input_factor`` apart from the others' at this step: a bad batch whose
        inputs look normal (labels of another task, a loss term only one rank adds)."""
        norms = {r: p.local_grad for r, p in peers.items() if p.local_grad is not None}
        subject = RankSubject.LOCAL_GRADIENTS
        return self._apart(step, norms, self._local_scales, subject, "local_grad_norm")

    def _apart(
        self,
        step: int,
        scales: Mapping[int, float],
        marks: RankScales,
        subject: str,
        name: str,
    ) -> Alert | None:
        """One rank's ``scales`` value ``rank_input_factor`` apart from the others':
        with two ranks the one that moved farther from its own scale when the ranks last
        agreed, with more the one farthest from the others' median."""
        if AlertKind.RANK_OUTLIER in self.found or self.sync not in DATA_PARALLEL:
            return None  # one incident: a rank already stands apart (or not data parallel)
        factor = self.thresholds.rank_input_factor
        if len(scales) < 2:
            return None
        if max(scales.values()) <= factor * min(scales.values()):
            marks.agreed.update(scales)  # (the common case: they agree)
            return None
        if len(scales) == 2:  # which one moved: the one farther from where they agreed
            # (not from its first scale: once a job has converged, its gradients are a
            # thousandth of the start's, and the healthy rank looked the one that moved)
            drift = {r: abs(math.log(v / marks.agreed.get(r, v))) for r, v in scales.items()}
            suspect = max(drift, key=drift.__getitem__)
            if drift[suspect] <= math.log(factor):
                return None  # apart since they began: which one is the odd one is not known
        else:
            suspect = max(
                scales, key=lambda r: abs(math.log(scales[r] / _median_of_others(scales, r)))
            )
        median = _median_of_others(scales, suspect)
        times = scales[suspect] / median
        if max(times, 1 / times) <= factor:
            return None
        # Apart by a visible part of where the job began, as a loss outlier must be: a
        # converged model's gradients are tiny and one batch's differ from the next's
        # several times over (Lightning DDP, a CNN at loss 3e-5: 0.0006 against 0.0033,
        # from 0.46 at the start), which is the noise of small values, not a shard.
        start = statistics.median(marks.first.values()) if marks.first else 0.0
        if abs(scales[suspect] - median) <= self.thresholds.spike_min_jump * start:
            return None
        evidence: dict[str, Any] = {
            "rank": suspect,
            name: scales[suspect],
            "other_ranks_median": median,
            "times": times,
            f"its_first_{name}": marks.first.get(suspect),
            "other_ranks": len(scales) - 1,
        }
        return self._raise(AlertKind.RANK_OUTLIER, step, subject, evidence)

    def _grads(self, step: int, reference: Shown, shown: Shown) -> Alert | None:
        """Under DDP, each layer's gradient norm agrees across ranks at a step."""
        if self.sync != "ddp" or AlertKind.GRADS_NOT_SYNCED in self.found or shown is reference:
            return None
        if not (reference.stepped and shown.stepped and reference.grads and shown.grads):
            return None
        pair = [reference.grads, shown.grads]
        found = _first_disagreement(pair, self.thresholds.rank_grad_tolerance)
        if found is None:
            return None
        layer, low, high = found
        return self._raise(
            AlertKind.GRADS_NOT_SYNCED,
            step,
            self._layer(layer),
            {
                "ranks": sorted((reference.rank, shown.rank)),
                "grad_norm_low": low,
                "grad_norm_high": high,
                "relative_difference": (high - low) / high,
            },
            layers=self._layers_apart(pair, self.thresholds.rank_grad_tolerance),
        )

    def _params(self, step: int, reference: Shown, shown: Shown) -> Alert | None:
        """Under DDP, each layer's parameter norm agrees across ranks at a sampled step."""
        if self.sync != "ddp" or AlertKind.REPLICAS_DIVERGED in self.found or shown is reference:
            return None
        if reference.params is None or shown.params is None:
            return None
        pair = [reference.params, shown.params]
        found = _first_disagreement(pair, self.thresholds.rank_param_tolerance)
        if found is None:
            return None
        layer, low, high = found
        return self._raise(
            AlertKind.REPLICAS_DIVERGED,
            step,
            self._layer(layer),
            {
                "ranks": sorted((reference.rank, shown.rank)),
                "param_norm_low": low,
                "param_norm_high": high,
                "relative_difference": (high - low) / high,
            },
            layers=self._layers_apart(pair, self.thresholds.rank_param_tolerance),
        )

    def stalled(
        self, rank: int, *, last_step: int, reason: str, others: Mapping[int, int]
    ) -> Alert | None:
        """Rank ``rank`` stopped (``reason``) at ``last_step`` while ``others`` (rank ->
        last step) are still there; the incident, once per job."""
        if AlertKind.RANK_STALLED in self.found or not others:
            return None
        return self._raise(
            AlertKind.RANK_STALLED,
            last_step,
            f"rank {rank}",
            {
                "rank": rank,
                "last_step": last_step,
                "reason": reason,
                "other_ranks_at": max(others.values()),
            },
            severity=Severity.ERROR,
        )

    # --- helpers -------------------------------------------------------------------------

    def _raise(
        self,
        kind: str,
        step: int,
        subject: str,
        evidence: dict[str, Any],
        *,
        layers: tuple[str, ...] = (),
        severity: Severity | None = None,
    ) -> Alert | None:
        partner = _ONE_CAUSE.get(kind)
        if partner in self.found:  # the same root cause, seen the other way first
            self.found[partner] = self.found[partner].with_folded(f"{kind}@{step}")
            self.found[kind] = self.found[partner]
            return None
        described = entry(kind)
        alert = Alert(
            kind,
            severity or _SEVERITY[kind],
            step,
            subject,
            evidence,
            described.said,
            described.experiments,
            layers=layers,
        )
        self.found[kind] = alert
        return alert

    def _layer(self, index: int) -> str:
        return self.layers[index] if 0 <= index < len(self.layers) else f"layer {index}"

    def _layers_apart(
        self, norms: list[Sequence[float | None]], tolerance: float
    ) -> tuple[str, ...]:
        count = min((len(n) for n in norms), default=0)
        return tuple(
            self._layer(i)
            for i in range(count)
            if _apart([n[i] for n in norms], tolerance) is not None
        )


# Unsynchronised gradients and diverged replicas are one root cause seen two ways:
# whichever is found first is the incident, the other folds under it.
_ONE_CAUSE: dict[str, str] = {
    AlertKind.GRADS_NOT_SYNCED: AlertKind.REPLICAS_DIVERGED,
    AlertKind.REPLICAS_DIVERGED: AlertKind.GRADS_NOT_SYNCED,
}

_SEVERITY: dict[str, Severity] = {
    AlertKind.RANK_OUTLIER: Severity.ERROR,
    AlertKind.GRADS_NOT_SYNCED: Severity.ERROR,
    AlertKind.REPLICAS_DIVERGED: Severity.ERROR,
    AlertKind.RANK_STALLED: Severity.ERROR,
}


def _first_disagreement(
    norms: list[Sequence[float | None]], tolerance: float
) -> tuple[int, float, float] | None:
    """The first layer (model order) whose norms disagree across the lists, with the
    lowest and highest value; None when they agree (or fewer than two lists)."""
    if len(norms) < 2 or all(_equal(n, norms[0]) for n in norms[1:]):  # the usual case
        return None
    for index in range(min(len(n) for n in norms)):
        apart = _apart([n[index] for n in norms], tolerance)
        if apart is not None:
            return index, apart[0], apart[1]
    return None


def _equal(one: Sequence[float | None], other: Sequence[float | None]) -> bool:
    """The lists surely agree (False: the layers' scan decides). Two lists read packed
    compare as their bytes first, one C compare: comparing 200 floats took 5.4 us (2.0
    now), some 4% of a replica's record. Equal bytes are equal values, or NaNs with the
    same bits at the same place, which the layers' scan skips anyway (it compares
    finite values only); bytes apart compare as values then (-0.0 and 0.0 are equal)."""
    if type(one) is Float32List and type(other) is Float32List:
        return one.packed.tobytes() == other.packed.tobytes() or one == other
    return one == other


def _apart(values: list[float | None], tolerance: float) -> tuple[float, float] | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return None
    low, high = min(finite), max(finite)
    if high <= 0 or (high - low) <= tolerance * high:
        return None
    return low, high


def _positive(value: float | None) -> float | None:
    """A scale to compare: finite and above zero, else None."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _median_of_others(scales: Mapping[int, float], rank: int) -> float:
    return statistics.median(v for r, v in scales.items() if r != rank)


def _log_distance(scales: Mapping[int, float], rank: int) -> float:
    return abs(math.log(scales[rank] / _median_of_others(scales, rank)))
