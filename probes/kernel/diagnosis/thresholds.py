"""Every threshold the rules use, named, with the reason for its default.

Windows and streaks count steps, never records: a fast run sends one record for many
steps (its peaks inside), and a rule must say the same of it as of a slow one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

# Names these thresholds had when they counted records (still accepted as overrides).
RENAMED = {
    "vanishing_records": "vanishing_steps",
    "none_grad_records": "none_grad_steps",
    "not_cleared_records": "not_cleared_steps",
    "spike_min_records": "spike_min_steps",
}


@dataclass(frozen=True)
class Thresholds:
    """Every threshold the rules use, with the reason for its default."""

    # exploding_gradient: growth against the run's own recent level, a layer's norm at
    # least exploding_growth times its median over the last exploding_window steps
    # (judged once the run has half that many steps behind it: its first update moves
    # it off its initialisation, no level to grow from), above exploding_growth_floor (a norm
    # of 1e-4 growing to 1e-2 is no instability); and, for a run whose loss's scale
    # does not explain its norms, the seed's bound of 100 on the total norm.
    exploding_norm: float = 100.0
    exploding_growth: float = 50.0  # x over the recent median
    exploding_growth_floor: float = 10.0  # growth counts only for norms above this
    exploding_window: int = 10  # steps (under a clip, growth alone must hold half of it)
    # ... or that many times its lowest level (window median) of the last
    # exploding_long_window steps: a steady climb, 6% a step, is an explosion too
    exploding_long_window: int = 100  # steps
    # vanishing_gradient: a layer's gradient this much smaller than the largest layer's,
    # or than its own weights (while also well below the largest layer's: a model that
    # has converged everywhere is not vanishing), for this many steps in a row.
    vanishing_to_largest: float = 1e-4
    vanishing_to_weight: float = 1e-8
    vanishing_to_largest_with_weight: float = 1e-2
    vanishing_steps: int = 20
    # overfitting_signal: validation above its best by this fraction while the smoothed
    # training loss fell by this fraction since that best. A fraction of the loss's own
    # scale (``views.loss_scale``): the loss itself while the run's losses stay above
    # zero (a ratio, as before); once they reached zero or below (a density's NLL, a
    # flow, a Gaussian NLL with a learned variance: no floor at zero) the distance the
    # run travelled from its first loss, or |loss| where larger, so that a change reads
    # the same on either side of zero.
    overfit_val_rise: float = 0.10
    overfit_rising_evals: int = 2  # ... on this many evals in a row,
    overfit_val_jump: float = 0.50  # ... or this far above its best at once
    overfit_train_drop: float = 0.10
    overfit_min_evals: int = 3
    # The train loss is smoothed over this many steps (at least 3 records: on a fast,
    # thinned run one record stands for many steps).
    smoothing_steps: int = 20
    # flat_loss: after this many steps, the smoothed loss is not this fraction below
    # where it started.
    flat_after_steps: int = 200
    flat_min_drop: float = 0.10
    # none_gradients: the same parameters without a gradient for this many steps.
    none_grad_steps: int = 3
    # grad_not_cleared: the first backward after an update added to the gradient that
    # update used, for this many updates in a row (the probe checks every update).
    not_cleared_steps: int = 2
    # skipped_updates: optimizer.step() skipped with non-finite gradients for this many
    # steps in a row (GradScaler skips a few at the start while it finds its scale).
    skipped_steps: int = 10
    # no_updates: optimizer.step() not run, gradients finite, for this many steps in a
    # row (gradient accumulation steps the optimizer every few steps, not every 100).
    no_update_steps: int = 100
    # updates_not_applied: non-zero gradients, weights unchanged across optimizer.step()
    # for this many steps in a row (a warmup from lr 0 takes one step at 0).
    not_applied_steps: int = 3
    # update_ratio: |dw|/|w| per layer outside [low, high] (the usual band is ~1e-3) on
    # sampled steps in a row (at least update_samples) spanning update_steps steps.
    update_high: float = 0.1
    update_low: float = 1e-5
    # ... low only when most layers are, at a rate above this fraction of the run's
    # highest (a warmup's start and a decay's end are low by design)
    update_low_lr_fraction: float = 0.2
    # ... and never once the fit is done (tiny updates are right then): the smoothed
    # training loss below this fraction of where it started, or below this floor while
    # the total gradient norm is below its own
    update_converged_fraction: float = 1e-5
    update_converged_loss: float = 1e-6
    update_converged_grad: float = 1e-3
    update_samples: int = 2
    update_steps: int = 40
    # dead / saturated activations, on sampled steps in a row (at least
    # activation_samples) spanning activation_steps steps.
    dead_fraction: float = 0.95
    saturated_fraction: float = 0.90
    activation_samples: int = 2
    activation_steps: int = 20
    # loss_spike: measured against the run's recent baseline (the last spike_window
    # steps), never against where it began: the loss at least spike_factor times the
    # baseline's median, and spike_deviations standard deviations of its noise above it
    # in log space (a loss's batch noise is multiplicative: the same rule sees an LLM at
    # 3 jumping to 5, and passes a converged loss ranging 0 to 0.1 that reaches 0.27).
    # The noise is that of consecutive steps (a falling curve's trend is not noise); 8
    # standard deviations is what the 12 median absolute deviations were for Gaussian
    # noise.
    spike_factor: float = 1.5
    spike_deviations: float = 8.0
    # ... and taking back at least this share of the run's progress (its first loss
    # down to the baseline): an LLM at 3 (from 10.8) jumping to 5 takes back a quarter; a
    # converged loss at 0.018 (from 0.95) doubling takes back 2%
    spike_undone: float = 0.1
    # The ranks' comparison (``ranks``): a rank's loss scale apart from the others' by
    # at least this fraction of the run's start loss.
    spike_min_jump: float = 0.5
    spike_window: int = 50  # steps
    spike_min_steps: int = 20
    # probe_overhead: the probe's own time above this fraction of the step time, over
    # this many steps, and at least overhead_min_ms a step (the demo's small models
    # spend 10% of a 1 ms step in the probe: 0.1 ms is not what makes a run slow).
    overhead_fraction: float = 0.05
    overhead_steps: int = 100
    overhead_min_ms: float = 0.5
    # Across the ranks of a job, at the same step: gradients after DDP's all-reduce agree
    # to float rounding; replicas' parameter norms agree exactly (the same update on the
    # same weights); one rank's loss this many times the others' median is an outlier;
    # a rank quiet this many seconds while another went on has stalled.
    rank_grad_tolerance: float = 1e-4
    rank_param_tolerance: float = 1e-6
    rank_loss_factor: float = 4.0
    rank_stall_s: float = 20.0
    # Consequences (a spike, a flat loss, low update ratios ...) wait this many steps for
    # a cause to fold under before they are raised on their own.
    consequence_grace_steps: int = 5
    # hysteresis: an alert clears after its condition has been absent this many steps.
    clear_after: int = 3
    # lr_too_low_to_update: on most layers with a gradient, |dw|/|w| below float32's
    # resolution (2^-23 ~ 1.2e-7: the update rounds away) on this many sampled steps in
    # a row spanning at least precision_steps steps (a cosine decay to 0 spends a step
    # or two there at its very end).
    update_precision: float = 1e-7
    precision_samples: int = 2
    precision_steps: int = 20
    # low_precision_stall: an update is lost when |dw| is under half an ulp of w in its
    # dtype (round to nearest gives w back; bfloat16 keeps 8 significant bits: a weight
    # of 1.0 ignores any step under 2^-8 ~ 0.004). On sampled steps, per bfloat16/float16
    # parameter tensor, the share of its elements with a non-zero gradient that
    # optimizer.step() left bit-identical: at least stall_unchanged on stall_samples
    # sampled steps in a row. A healthy bf16 run loses some elements' updates each step,
    # those whose gradients average out (AdamW at lr 1e-3 on a small MLP: 17% to 42% of
    # a tensor, once 60% of a 10-element bias); at lr 5e-5 it loses 87% to 100%.
    stall_unchanged: float = 0.75
    stall_samples: int = 3
    # ... but an incident whose numbers cross its bound back and forth while the cause
    # persists (gradients about the explosion's bound, update ratios about the band's
    # edge, activations about their fraction: ``incidents.HELD``) clears only after this
    # many steps without it: a held-out run's one explosion came as four ALERT lines in
    # 130 steps, each a few dozen steps after the last cleared.
    hold_steps: int = 100
    # One rank's inputs (their RMS on sampled steps) this many times above (or below) the
    # median of the other ranks': that rank's shard stands apart (DDP ranks read shards
    # of one dataset: their input scales agree within noise).
    rank_input_factor: float = 4.0
    # straggler (``straggler``): in a data-parallel step every rank's cycle is the same
    # (the gradients' collective waits for the slowest rank), so the straggler shows as
    # a longer time before the collective (its data wait and forward, a step) while the
    # others wait in their backward. Judged per rank over its last straggler_window_steps
    # steps (and at least straggler_min_records records: one thinned record is one
    # moment), past its first straggler_warmup_steps (loading, compiling, caches: the
    # ranks' first steps differ by more than their later ones). A rank's time before the
    # collective above the other ranks' median by straggler_gap_share of the step or
    # more: ranks sharing a host differ by a few percent (scheduling, caches, shard
    # sizes), a gap of a sixth of every step is one rank the job waits for; in records
    # making straggler_held_share of its window's steps (a lasting gap, not one slow
    # step: a hiccup of seconds moves a window's mean by as much). Held until the gap is
    # under straggler_clear_share of the step or shows in under straggler_clear_held of
    # the window (hysteresis: a gap about the bound is one incident, not a flicker). The
    # phase named (data, forward) explains straggler_phase_share of the gap; else
    # "compute" (neither alone explains it).
    straggler_window_steps: int = 50
    straggler_min_records: int = 5
    straggler_warmup_steps: int = 10
    straggler_gap_share: float = 0.15
    straggler_held_share: float = 0.75
    straggler_clear_share: float = 0.075
    straggler_clear_held: float = 0.5
    straggler_phase_share: float = 0.8
    # update_ratio, the learning rate far too high: on one sampled step, most measured
    # layers' |dw|/|w| at or above this (updates as large as the weights: 0.93 to 0.99
    # at 600x the usual rate) is an error at once, with no streak to wait for. Adaptive
    # optimizers (the Adam family, Adadelta, Adagrad, RMSprop) make larger updates in
    # healthy runs (Adadelta at its usual lr 1.0: 0.14; Adam's first steps move every
    # weight by the rate itself): their band's top and far-too-high bound are higher.
    update_far_too_high: float = 0.3
    # ... for a quasi-Newton step (LBFGS: a line search over many iterations, sized by
    # the curvature, not a rate): an update that replaces the weights, |dw| at least
    # 0.8 of |w| after the step on most layers (the weights after it are mostly the
    # update; the time-sequence example's healthy first step: 0.2 to 0.8, one layer high)
    update_far_too_high_quasi_newton: float = 0.8
    update_high_adaptive: float = 0.3
    update_far_too_high_adaptive: float = 0.5
    # ... but an adaptive optimizer's first update moves every weight by the rate itself,
    # whatever its gradient (Adam's bias-corrected m/sqrt(v) is +-1): on the run's first
    # sampled step it is far too high only when that update replaced the weights, twice
    # their size or more (|dw| and |w_before| near orthogonal at an initialisation:
    # |dw|/|w_after| >= 2/sqrt(5) ~ 0.9); an update about the weights' own size is a
    # usual rate on a wide layer (forward-forward's Adam at lr 0.03: 0.6 to 0.8) and
    # falls by itself.
    update_far_too_high_adaptive_first: float = 0.89
    # update_ratio's high side counts only while the run does not learn: a streak
    # above the band while the smoothed loss is at least this fraction below where the
    # run began is the rate's working size (the run's own history; the bar is
    # flat_loss's, ``flat_min_drop``: a loss that fell this far is learning).
    update_high_learning_drop: float = 0.10
    # ... and a layer's ratio this fraction or more below its last sample falls by itself
    # (a transient: Adam's first steps, a fresh head, a warm start settling): its
    # streak starts over there; a rate too high keeps the ratio where it is.
    update_high_falling: float = 0.25
    # exploding_gradient at the run's own scale: a run whose first record is already
    # above exploding_norm, its loss at least its total norm (a loss summed over
    # pixels), is judged by growth alone once its smoothed loss has fallen
    # exploding_start_drop below where it began within exploding_start_steps (it trains
    # at that scale: a VAE's summed loss halves in its first tens of steps); if not,
    # the absolute bound holds again (raw-unit data, unscaled: an LSTM's mean loss of
    # 1e5 under a clip fell 25% in 70 steps).
    exploding_start_steps: int = 40
    exploding_start_drop: float = 0.5
    # loss_diverged: the loss at least this many times the run's first loss (before any
    # update) on every step of diverged_steps in a row (a spike that returns is a spike).
    diverged_factor: float = 4.0
    diverged_steps: int = 3
    # clip_always_active: over the last clip_window steps (once the run has clipped for
    # that long, and at least clip_min_steps of them measured), the unclipped total
    # above max_norm on this fraction of the clipped steps, *and* the instability the
    # clip hides shows (the lesson: a clip keeps a run finite; investigate persistent
    # instability): the unclipped norm's median over the window's last quarter at least
    # clip_norm_growth times its first quarter's (it keeps growing under the clip; in
    # the run's first clip_window steps, its move off the initialisation, only with the
    # loss no better: minGPT's norm grows x5 as its loss falls x4, then holds), or
    # the loss's last-quarter median above its first quarter's by more than
    # clip_loss_spread times that quarter's own median absolute deviation (worse while
    # clipped, beyond its noise). A bound below the run's gradient scale is not this:
    # a GPT at clip 1.0 above 1 on every step while its loss falls, a regression clipped
    # at its noise floor. The window outlasts a healthy start (a tiny GPT-2 at the HF
    # Trainer's defaults is above 1 on each of its first 50 steps).
    clip_window: int = 200
    clip_min_steps: int = 20
    clip_active_fraction: float = 0.95
    clip_norm_growth: float = 2.0
    clip_loss_spread: float = 3.0
    # loss_reduction_mismatch: the smoothed training loss this many times the validation
    # loss on reduction_evals evaluations in a row, steady within reduction_steadiness
    # (max over min of their ratios, less 1): a sum where the other is a mean, a loss not
    # divided by the accumulation steps (dropout or augmentation: train ~1.1 to 1.5x).
    reduction_factor: float = 2.0
    # ... or, without a validation loss, an accumulation of k >= 2 backward passes each
    # on a mean loss as returned, from one loop, on this many updates in a row (a loop's
    # pattern, not one odd step: the same evidence a validation's three evaluations give)
    reduction_undivided_updates: int = 3
    reduction_evals: int = 3
    reduction_steadiness: float = 0.25
    # ... with the evidence for a whole number N >= 2: the records' backward passes into
    # each gradient (the accumulation, N of them; the ratio within reduction_steadiness
    # of N: the healthy train/val gap, 4.3 for 4 on the nanoGPT bench case), or a ratio
    # within its own spread of N, at least reduction_whole (the smoothed train loss
    # trails a falling curve: 7% there), that held while the losses moved: its spread at
    # most reduction_held of the validation loss's and of train - val's (a sum scales
    # with the loss; label smoothing's floor, 0.5 nats with ten classes at 0.1, adds to
    # it: train - val holds instead, and the ratio moves 0.5 to 0.8 as much as the
    # validation loss). Then the alert holds while the ratio stays steady near N.
    reduction_whole: float = 0.1
    reduction_held: float = 0.5
    # input_bound: the data wait's share of the steps' time (their cycle, the wait
    # included), over the last input_window_steps steps (at least input_min_records
    # records). A quarter: hidden behind the compute, the loop would run a third
    # faster; half: it waits for data longer than it computes. The records whose wait
    # is the largest input_event_fraction of the window are left out: a wait that comes
    # on fewer than one step in ten is an event (a checkpoint saved, an epoch's first
    # batch), not the loop's input path; one step in four waiting still counts.
    input_warning_share: float = 0.25
    input_error_share: float = 0.5
    input_window_steps: int = 100
    input_min_records: int = 10
    input_event_fraction: float = 0.1
    # ... and at least input_min_ms a step: below a millisecond, what the experiments
    # change (a worker's hand-over of a batch, a pinned copy) costs about as much as it
    # would win back.
    input_min_ms: float = 1.0
    # memory_creep: over the latest half of the run (at least creep_min_steps steps
    # past creep_warmup_steps, where optimizer state and caches are first allocated),
    # split in creep_parts parts, each part's floor (its lowest memory: the level freed
    # memory returns to) above the last one's, and the rise at least creep_growth of
    # the memory held: a level that keeps rising is a creep, a step up that stays is not.
    creep_min_steps: int = 200
    creep_warmup_steps: int = 50
    creep_parts: int = 4
    creep_growth: float = 0.05
    # retained_graph: this many sampled steps' losses still alive two steps or more
    # after their update: more than the one or two a loop keeps on purpose (its best
    # loss, its last epoch's).
    retained_graphs: int = 3
    # recompiles: at least recompile_new compilations within the last
    # recompile_window_steps steps, past the first recompile_warmup_steps (the first
    # compilations, a smaller last batch and a first evaluation compile once each).
    recompile_new: int = 4
    recompile_window_steps: int = 200
    recompile_warmup_steps: int = 20

    def with_overrides(self, **overrides: float) -> Thresholds:
        """A copy with some thresholds changed (unknown names raise ``TypeError``)."""
        defaults = {f.name: getattr(self, f.name) for f in fields(self)}
        overrides = {RENAMED.get(name, name): value for name, value in overrides.items()}
        unknown = set(overrides) - set(defaults)
        if unknown:
            raise TypeError(f"unknown thresholds: {', '.join(sorted(unknown))}")
        typed: dict[str, Any] = {}
        for name, value in overrides.items():
            if isinstance(defaults[name], int) and float(value) != int(value):
                raise ValueError(f"threshold {name} counts steps: a whole number, got {value}")
            typed[name] = type(defaults[name])(value)  # counts stay ints (window sizes)
        return replace(self, **typed)
