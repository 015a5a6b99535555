"""The catalog's entries for rung 5, the update, by its size: updates out of proportion
to the weights, too small to change them, loss spikes and divergence, and the monitor's
learning-rate experiment."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

_LAYERS_AFFECTED = ("layers_affected", "with several layers: how many")
_RANGE = ("range", "with several layers: the first and the last, in model order (`a..b`)")

RATE_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.UPDATE_RATIO: Entry(
        rung=Rung.UPDATE,
        signal=(
            "Updates are far out of proportion to the weights: too large suggests the learning "
            "rate is too high, too small that it is too low or that the layer is frozen. High "
            "counts when it stays high while the loss does not fall (a first update's "
            "transient falls by itself), or at once when one update replaces most layers' "
            "weights."
        ),
        not_proved=(
            "It does not prove the learning rate is wrong: the band is a rule of thumb, not a "
            "law, and some layers differ."
        ),
        experiments=(
            "Change the learning rate alone toward the band (x0.1 if too high, x10 if too low).",
            "Check that this layer's parameters are in the optimizer's param groups.",
            "Compare with a per-layer learning rate for this layer only.",
        ),
        evidence=(
            ("update_ratio", "the first layer's |dw|/|w| on the latest sampled step"),
            ("side", "`high` or `low`: which side of the band"),
            ("samples", "how many sampled steps in a row showed it"),
            ("band", "the usual band for this optimizer (`low..high`)"),
            (
                "far_too_high",
                "when one update is as large as the weights on most layers: "
                "`>=<bound> on <n> of <m> layers` (raised at once, as an error)",
            ),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 40,
            "subject": "fc1",
            "update_ratio": 0.183,
            "side": "high",
            "samples": 2,
            "band": "1e-05..0.1",
            "layers_affected": 3,
            "range": "fc1..fc3",
        },
        severity_note=(
            "`error` when one update is far too high on most layers (`far_too_high` in the "
            "evidence): raised at once, from one sampled step."
        ),
        traits=Traits(held=True, waits_for_cause=True),
    ),
    AlertKind.LR_TOO_LOW_TO_UPDATE: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The gradients are non-zero, yet on most layers the update is below float32's "
            "resolution of the weights (|dw|/|w| under ~1e-7, often exactly 0): the weights "
            "no longer change, whatever the schedule meant. Typically a scheduler stepped "
            "per batch where it was meant per epoch."
        ),
        not_proved="It does not say which rate was intended.",
        experiments=(
            "Print the learning rate at every step for a few hundred steps: the schedule as "
            "it runs, not as written.",
            "Check where scheduler.step() is called: once per epoch for StepLR/MultiStepLR "
            "counted in epochs, once per batch for schedules counted in steps.",
            "Restart from the last checkpoint at the schedule's intended rate, nothing else "
            "changed, and compare a weight before and after one optimizer.step().",
        ),
        evidence=(
            ("update_ratio", "the largest |dw|/|w| among the layers below the resolution"),
            ("layers_below", "how many layers with a gradient are below it"),
            ("layers_judged", "how many layers with a gradient were judged"),
            ("lr", "the learning rate now (the largest of the param groups')"),
            ("top_lr", "the run's highest learning rate so far"),
            ("updates", "instead of the rates, for updates by hand (no optimizer): `by_hand`"),
            ("last_moved_step", "... and the last sampled step whose updates moved the weights"),
            ("since_step", "the first sampled step of the streak"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 3020,
            "subject": "fc1",
            "update_ratio": 3.2e-09,
            "layers_below": 4,
            "layers_judged": 4,
            "lr": 1e-08,
            "top_lr": 0.1,
            "since_step": 3000,
            "layers_affected": 4,
            "range": "fc1..fc4",
        },
        traits=Traits(waits_for_cause=True),
    ),
    AlertKind.LOW_PRECISION_STALL: Entry(
        rung=Rung.UPDATE,
        signal=(
            "These bfloat16/float16 weights have gradients, yet optimizer.step() leaves most "
            "of their elements bit-identical: the update is under half a unit in the last "
            "place of the weight in its dtype and rounds away (a bfloat16 weight of 1.0 "
            "ignores any step under 0.004: a LayerNorm gain never moves). Judged per tensor: "
            "a bias that moves does not hide a weight that does not."
        ),
        not_proved="It does not say the rate is wrong for float32 weights.",
        experiments=(
            "Keep float32 master weights: train the float32 model under "
            "torch.autocast(dtype=torch.bfloat16), not model.to(torch.bfloat16); nothing else.",
            "Raise the learning rate alone and check that the named tensors move.",
            "Use an optimizer that keeps what rounding drops (Kahan summation or stochastic "
            "rounding of the bfloat16 update).",
        ),
        evidence=(
            ("dtype", "the named tensors' dtype(s)"),
            (
                "unchanged",
                "the share of their elements with a gradient that the update left "
                "bit-identical (the least of the named tensors')",
            ),
            ("params", "how many tensors are named"),
            ("names", "the first six of them"),
            ("since_step", "the first sampled step of the streak"),
            ("lr", "the highest learning rate of their param groups"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 60,
            "subject": "h.0.ln_1",
            "dtype": "bfloat16",
            "unchanged": 0.98,
            "params": 2,
            "names": "h.0.ln_1.weight, ln_f.weight",
            "since_step": 20,
            "lr": 0.0003,
            "layers_affected": 2,
            "range": "h.0.ln_1..ln_f",
        },
        raised_by=(
            "`probes.watch`, checking low-precision weights on sampled steps, once a run "
            "(`probes/runtime/dtype_stall.py`, judged by `LowPrecisionStall`)"
        ),
        severity=Severity.WARNING,
    ),
    AlertKind.LOSS_SPIKE: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The loss jumped far above its recent level (and by a visible part of where it "
            "started): a bad batch, an outlier or the start of instability."
        ),
        not_proved="It does not say which of the three it is; one spike is not divergence.",
        experiments=(
            "Inspect the batch of that step: inputs, labels, any extreme values.",
            "Rerun the same steps with a lower learning rate alone.",
            "Rerun with a different data order (seed) alone: does the spike follow the batch?",
        ),
        evidence=(
            ("loss", "the loss at the spike"),
            ("baseline", "the median loss over the steps before it (a window of 50)"),
            ("times", "the first over the second"),
        ),
        example={
            "step": 833,
            "subject": "loss",
            "loss": 7.93,
            "baseline": 2.108,
            "times": 3.762,
        },
        traits=Traits(event=True, waits_for_cause=True),
    ),
    AlertKind.LOSS_DIVERGED: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The loss jumped far above where the run began and stayed there: the "
            "optimisation diverged (typically a learning rate far too high). Vanishing or "
            "exploding gradients that follow are its consequences."
        ),
        not_proved=(
            "It does not say whether the rate, the initialisation or the data scale is at fault."
        ),
        experiments=(
            "Lower the learning rate alone by 10x and rerun from the start.",
            "Rerun with a short warmup from a small rate, nothing else changed.",
            "Check the inputs and targets of the first batches for their scale.",
        ),
        evidence=(
            ("loss", "the loss now"),
            ("first_loss", "the run's first loss (its first record's least)"),
            ("times", "the latest record's least loss over the first loss"),
            ("since_step", "the first step of the run of high losses"),
        ),
        example={
            "step": 7,
            "subject": "loss",
            "loss": 41.3,
            "first_loss": 2.31,
            "times": 17.2,
            "since_step": 5,
        },
        traits=Traits(waits_for_cause=True),
    ),
    AlertKind.LR_EXPERIMENT_UNDONE: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The learning rate went back to about where it was before the change: the loop "
            "may set it each step (a scheduler recomputing it), so the experiment may not "
            "have lasted; a decay that happens to land there looks the same."
        ),
        not_proved="The marker on the chart shows when it began, not that it held.",
        experiments=(
            "Change the scheduler's base learning rate (max_lr, base_lrs) and restart.",
            "Or step the scheduler less often while experimenting; nothing else changes.",
            "Compare a few hundred steps before and after, on the same data order.",
        ),
        evidence=(
            ("factor", "the monitor's change: the factor every group's rate was scaled by"),
            ("lr_before", "the first group's rate before the change"),
            ("lr_set", "... as the change set it"),
            ("lr_now", "... now"),
            ("lasted_steps", "how many steps the change lasted"),
        ),
        example={
            "step": 1250,
            "subject": "",
            "factor": 0.5,
            "lr_before": 0.001,
            "lr_set": 0.0005,
            "lr_now": 0.001,
            "lasted_steps": 1,
        },
        raised_by=(
            "`probes.watch`, after the monitor's learning-rate experiment (the `-` and `+` "
            "keys), when the rate goes back (`probes/runtime/lr_experiment.py`)"
        ),
        severity=Severity.INFO,
    ),
}
