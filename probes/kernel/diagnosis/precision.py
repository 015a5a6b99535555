"""Rung 5, the update: updates too small to change the weights.

``LowPrecisionStall`` (judged in the training process, from what
``probes.runtime.measure.dtype_stall`` counts on sampled steps): bfloat16/float16 weights the
optimizer's updates no longer move. An update under half an ulp of the weight in its
dtype rounds away; per tensor, the share of its elements with a gradient left
bit-identical says so (``thresholds.stall_unchanged``), whatever the rate.

``LrTooLowToUpdate``: a learning rate so low that updates no longer change the weights.

``update_ratio`` reads a low ratio as a schedule's tail when the rate is far below the
run's highest (a warmup's start, a decay's end are low by design). Below float32's
resolution the tail is no design: ``w + dw`` rounds back to ``w`` and the weights stand
still. A per-batch ``StepLR`` meant per epoch takes the rate there in a few hundred
steps; the version counters still say every weight was written, so
``updates_not_applied`` does not see it either.

A loop that updates by hand (no optimizer) has no rate to read. There the sign is the
weights' own: updates that changed them on an earlier sample change nothing now, on
most layers. (A layer never changed from the start is ``updates_not_applied``'s.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from probes.kernel.diagnosis.alert import Alert, Severity
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.rule import Findings, Rule, ordered_range, spread
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.kernel.diagnosis.views import RecentPast, StepView
from probes.kernel.diagnosis.vocabulary import AlertKind


class LrTooLowToUpdate(Rule):
    """On sampled steps, most layers with a non-zero gradient have |dw|/|w| below
    ``update_precision``: for ``precision_samples`` samples in a row spanning
    ``precision_steps`` steps, while the rate is in what ``update_ratio`` takes for a
    schedule's tail (below ``update_low_lr_fraction`` of the run's highest). A rate low
    from the start, no schedule, is ``update_ratio``'s (low: "the learning rate is too
    low"); between them a rate too low is raised, schedule or not. A rate of exactly 0
    is ``updates_not_applied``'s (its evidence says ``lr=0``). Without a rate (updates
    by hand), the ratios must have been above ``update_precision`` on an earlier
    sample: the weights moved, and have stopped moving."""

    kind: str = AlertKind.LR_TOO_LOW_TO_UPDATE
    replicated = True  # it reads what every replica holds alike

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self._samples = 0
        self._since: int | None = None
        self._top_lr = 0.0  # the highest learning rate of the run so far
        self._moved_at: int | None = None  # (no rate) the last sample whose updates counted

    def on_step(self, history: RecentPast, view: StepView) -> Findings:
        lr = max((x for x in view.lrs if math.isfinite(x)), default=None)
        if lr is not None:
            self._top_lr = max(self._top_lr, lr)
        ratios = view.update_ratios
        if ratios is None:
            return None  # not a sampled step: no news
        by_hand = not view.lrs  # no optimizer: no rate to read, the weights say it
        if not by_hand and (
            lr is None or lr == 0 or lr >= self.t.update_low_lr_fraction * self._top_lr
        ):
            return self._reset()  # no rate, a rate of 0, or not a tail: not this rule's
        grads = view.peak_grads
        judged = [
            (i, r)
            for i, r in enumerate(ratios)
            if r is not None
            and math.isfinite(r)
            and i < len(grads)
            and grads[i] is not None
            and math.isfinite(grads[i])  # type: ignore[arg-type]
            and grads[i] > 0  # type: ignore[operator]
        ]
        below = [(i, r) for i, r in judged if r < self.t.update_precision]
        if not judged or 2 * len(below) <= len(judged):
            if by_hand and judged:
                self._moved_at = view.step
            return self._reset()
        if by_hand and self._moved_at is None:
            return self._reset()  # never moved: not a rate that decayed
        self._samples += 1
        if self._since is None:
            self._since = view.step
        if self._samples < self.t.precision_samples or (
            view.step - self._since < self.t.precision_steps
        ):
            return []
        names = [history.info.layer(i) for i, _ in below]
        return [
            self.alert(
                self._since + self.t.precision_steps,
                names[0],
                {
                    "update_ratio": max(r for _, r in below),
                    "layers_below": len(below),
                    "layers_judged": len(judged),
                    **(
                        {"updates": "by_hand", "last_moved_step": self._moved_at}
                        if by_hand
                        else {"lr": lr, "top_lr": self._top_lr}
                    ),
                    "since_step": self._since,
                    **spread(ordered_range(names, history.info.layers)),
                },
                layers=names,
            )
        ]

    def _reset(self) -> Findings:
        self._samples = 0
        self._since = None
        return []


NAMES_SHOWN = 6


class LowPrecisionStall:
    """Low-precision parameter tensors whose elements with a gradient ``optimizer.step()``
    leaves bit-identical: a tensor whose share unchanged is at least ``stall_unchanged``
    on ``stall_samples`` sampled steps in a row is named. One alert a run, naming every
    tensor named at that step (their streaks began together, at the cause).

    Args:
        names: each measured tensor's parameter name (``fc.weight``).
        layers: each one's layer (``fc``).
        order: the model's layers, in order (the alert's first layer is the first named).
        dtypes: each one's dtype, as named (``bfloat16``).
        thresholds: the run's thresholds (the defaults otherwise).
    """

    kind = AlertKind.LOW_PRECISION_STALL

    def __init__(
        self,
        names: Sequence[str],
        layers: Sequence[str],
        order: Sequence[str],
        dtypes: Sequence[str],
        thresholds: Thresholds | None = None,
    ) -> None:
        self.t = thresholds or Thresholds()
        self._names, self._layers, self._dtypes = list(names), list(layers), list(dtypes)
        self._position = {name: i for i, name in enumerate(order)}
        self._streaks: dict[int, tuple[int, int, float]] = {}  # tensor -> since, samples, share
        self.said = False  # (then nothing more to count)

    def observe(
        self, step: int, counts: Sequence[tuple[int, float, float]], **context: Any
    ) -> list[Alert]:
        """One sampled step's counts: (tensor, elements with a gradient, of them left
        unchanged) for each tensor the step measured; ``context`` joins the evidence
        (the rate). The alert, the first time tensors are named."""
        for index, with_grad, unchanged in counts:
            share = unchanged / with_grad if with_grad >= 1 else math.nan
            if not math.isfinite(share) or share < self.t.stall_unchanged:
                self._streaks.pop(index, None)
                continue
            since, samples, _ = self._streaks.get(index, (step, 0, share))
            self._streaks[index] = (since, samples + 1, share)
        named = sorted(
            (i for i, (_, n, _) in self._streaks.items() if n >= self.t.stall_samples),
            key=lambda i: (self._position.get(self._layers[i], len(self._position)), i),
        )
        if not named or self.said:
            return []
        self.said = True
        return [self._alert(step, named, context)]

    def _alert(self, step: int, named: list[int], context: dict[str, Any]) -> Alert:
        layers = list(dict.fromkeys(self._layers[i] for i in named))
        names = [self._names[i] for i in named]
        evidence: dict[str, Any] = {
            "dtype": ",".join(dict.fromkeys(self._dtypes[i] for i in named)),
            "unchanged": min(self._streaks[i][2] for i in named),  # every named one's at least
            "params": len(names),
            "names": ", ".join(names[:NAMES_SHOWN]),
            "since_step": min(self._streaks[i][0] for i in named),
            **context,
            **spread(layers),
        }
        described = entry(self.kind)
        return Alert(
            self.kind,
            Severity.WARNING,
            step,
            layers[0],
            evidence,
            described.said,
            described.experiments,
            layers=tuple(layers),
        )
