"""Every alert kind: its rung on the lesson's checklist, what it signals (and does not
prove), and the next controlled experiments, one change each.

The rungs are the lesson's layered checklist; root causes are shown in this order:

1. data and split, 2. shapes, values and the loss contract, 3. the tiny-batch test,
4. the gradient path, 5. the update, 6. evaluation; 7 is the probe itself.

Kinds raised by the training side's checks (``probe.check_split``, ``check_batch``, ...)
carry their own message and fix; they are listed here for their rung.
"""

from __future__ import annotations

from probes.kernel.diagnosis.catalog_ranks import JOB_ENTRIES
from probes.kernel.diagnosis.entry import Entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung

__all__ = ["CATALOG", "CHECK_RUNGS", "ENDED_BY_FIRST_STEP", "RUNGS", "Entry", "entry", "rung_of"]

#: Each rung's name on the checklist, by number (``Rung`` carries it).
RUNGS: dict[int, str] = {rung.value: rung.label for rung in Rung}


_DEAD = (
    "Lower the learning rate alone: large updates push units into the dead region.",
    "Swap ReLU for LeakyReLU/GELU in this layer only.",
    "Re-initialise this layer (Kaiming) or add normalisation before it, one at a time.",
)

CATALOG: dict[AlertKind, Entry] = {
    # --- 2. shapes, values and the loss contract ---------------------------------------
    AlertKind.NON_FINITE: Entry(
        Rung.VALUES,
        (
            "A NaN or Inf reached the run's numbers: from here on updates are garbage. It says "
            "where it was first seen, not which operation produced it."
        ),
        (
            "Run one step under anomaly mode (detect_anomaly) to find the op that made it.",
            "Lower the learning rate alone (e.g. 10x) and rerun from the last good checkpoint.",
            "Check the inputs and targets of the failing batch for NaN/Inf or extreme values.",
        ),
    ),
    # --- 3. the tiny-batch test ----------------------------------------------------------
    AlertKind.FLAT_LOSS: Entry(
        Rung.TINY_BATCH,
        (
            "The training loss has not come down from where it started: the model is not "
            "learning. It does not say whether the wiring, the optimisation or the data is "
            "at fault."
        ),
        (
            "Overfit a tiny batch (a few examples) with regularisers off (probes.overfit_batch).",
            "Check that gradients reach every layer, then change the learning rate alone (10x "
            "up and 10x down).",
            "Check labels, shapes and the loss contract on one batch (probes.check_batch).",
        ),
    ),
    # --- 4. the gradient path -------------------------------------------------------------
    AlertKind.EXPLODING_GRADIENT: Entry(
        Rung.GRADIENT_PATH,
        (
            "Gradient norms are blowing up: the update path is unstable. It does not say why: "
            "learning rate, initialisation, data scale or architecture."
        ),
        (
            "Lower the learning rate alone by 10x; nothing else changes.",
            "Keep the learning rate and clip at a norm near the healthy values (log the "
            "unclipped norm with probes.clip_grad_norm_).",
            "Check the scale of inputs and targets of the batches where it began.",
        ),
    ),
    AlertKind.VANISHING_GRADIENT: Entry(
        Rung.GRADIENT_PATH,
        (
            "These layers barely receive gradient, so they barely learn (typical of the early "
            "layers of a deep sigmoid or tanh stack). It does not prove they are useless or "
            "that the model cannot fit."
        ),
        (
            "Swap the saturating activation for ReLU/GELU alone, same depth and optimizer.",
            "Add normalisation (LayerNorm/BatchNorm) or residual connections, nothing else.",
            "Re-initialise with a variance-preserving scheme (Xavier for tanh, Kaiming for ReLU).",
        ),
    ),
    AlertKind.NONE_GRADIENTS: Entry(
        Rung.GRADIENT_PATH,
        (
            "These trainable parameters get no gradient: an unused module, a detached branch, "
            "or gradients cleared between backward() and step(). It does not prove a bug if "
            "the module is meant to be idle."
        ),
        (
            "Freeze the parameters (requires_grad=False) if they are meant to be idle; nothing "
            "else.",
            "Look for .detach(), .item() or torch.no_grad() on the path from these modules to "
            "the loss, and for zero_grad() between backward() and step().",
            "Check that the module is called in forward (a branch behind a condition?).",
        ),
    ),
    AlertKind.DEAD_ACTIVATIONS: Entry(
        Rung.GRADIENT_PATH,
        (
            "Most outputs of this ReLU (or most inputs of this layer) are exactly zero: those "
            "units pass no gradient and no longer learn. It does not prove the layer is "
            "useless: it may be sparse by design (a one-hot input looks the same)."
        ),
        _DEAD,
    ),
    AlertKind.SATURATED_ACTIVATIONS: Entry(
        Rung.GRADIENT_PATH,
        (
            "Most outputs of this activation sit at its flat ends, where the gradient is near "
            "zero. It does not prove the layer cannot learn, only that it learns slowly now."
        ),
        (
            "Normalise the inputs of this layer (scale, LayerNorm) alone.",
            "Swap the activation for ReLU/GELU in this layer only.",
            "Re-initialise with smaller weights (Xavier) and compare the fraction.",
        ),
    ),
    AlertKind.GUARD_SKIPPED_UPDATE: Entry(Rung.GRADIENT_PATH),
    # --- 5. the update ----------------------------------------------------------------------
    AlertKind.PARAMS_NOT_IN_OPTIMIZER: Entry(
        Rung.UPDATE,
        (
            "These trainable parameters are in no param group of the optimizer: backward gives "
            "them gradients but optimizer.step() never changes them. It does not prove a bug "
            "if another optimizer trains them."
        ),
        (
            "Build the optimizer from model.parameters() (or add the missing ones with "
            "optimizer.add_param_group) after every layer exists; nothing else.",
            "If a layer was replaced after the optimizer was built, build the optimizer again.",
            "If they are meant to stay fixed, freeze them (requires_grad=False).",
        ),
    ),
    AlertKind.OPTIMIZER_NOT_FOR_MODEL: Entry(
        Rung.UPDATE,
        (
            "The optimizer holds parameters that are not this model's (a copy made after the "
            "optimizer was built, or another model's): optimizer.step() updates them, and this "
            "model's weights never change."
        ),
        (
            "Build the optimizer from the model you train, after any copy, load or wrap.",
            "Check that probes.watch gets the model the loop calls and the optimizer it steps.",
            "Compare a weight before and after one optimizer.step().",
        ),
    ),
    AlertKind.MOSTLY_FROZEN: Entry(
        Rung.UPDATE,
        (
            "Most of the model is frozen (requires_grad=False): only the listed layers can "
            "learn. Intended for linear probing or fine-tuning a head; a bug when only "
            "normalisation layers or biases are left to train."
        ),
        (
            "Unfreeze the layers that should learn (requires_grad_(True)) and rebuild the "
            "optimizer; nothing else.",
            "If freezing is intended, check the loss still falls with what trains.",
            "Print the parameters with requires_grad True before building the optimizer.",
        ),
    ),
    AlertKind.UPDATES_NOT_APPLIED: Entry(
        Rung.UPDATE,
        (
            "These layers' gradients are non-zero, yet optimizer.step() leaves their weights "
            "unchanged (a learning rate of 0, a scheduler stuck at its first value, or "
            "parameters the optimizer does not hold)."
        ),
        (
            "Print the learning rates after a few steps: a warmup that starts at 0 needs "
            "scheduler.step().",
            "Check the param groups hold these layers' parameters (not a copy's).",
            "Compare a weight before and after one optimizer.step().",
        ),
    ),
    AlertKind.GRAD_NOT_CLEARED: Entry(
        Rung.UPDATE,
        (
            "The gradients an update used are still there when the next backward adds to "
            "them: every update uses a growing sum. Accumulating micro-batches between "
            "updates is not this (only the first backward after an update is checked)."
        ),
        (
            "Call optimizer.zero_grad(set_to_none=True) once per update (in a closure: at "
            "its start), before backward.",
            "Updating by hand with no optimizer every few probe steps? Declare it: "
            "probes.watch(..., grad_accumulation=True).",
            "Compare the gradient norms of two consecutive steps on the same batch: they "
            "should match, not double.",
        ),
    ),
    AlertKind.UPDATE_RATIO: Entry(
        Rung.UPDATE,
        (
            "Updates are far out of proportion to the weights: too large suggests the learning "
            "rate is too high, too small that it is too low or that the layer is frozen. A rule "
            "of thumb, not a law: some layers differ. High counts when it stays high while the "
            "loss does not fall (a first update's transient falls by itself), or at once when "
            "one update replaces most layers' weights."
        ),
        (
            "Change the learning rate alone toward the band (x0.1 if too high, x10 if too low).",
            "Check that this layer's parameters are in the optimizer's param groups.",
            "Compare with a per-layer learning rate for this layer only.",
        ),
    ),
    AlertKind.SKIPPED_UPDATES: Entry(
        Rung.UPDATE,
        (
            "The optimizer has not stepped for a while because every gradient is non-finite: a "
            "GradScaler skipping each update while its loss scale keeps falling. A few skips "
            "are normal under AMP; a streak means the gradients are non-finite at any scale."
        ),
        (
            "Run one step under anomaly mode (a) to find the op that makes the gradient "
            "non-finite.",
            "Compute the loss in float32 (outside autocast) and check scaler.get_scale().",
            "Check the inputs and targets of these batches for NaN/Inf or extreme values.",
        ),
    ),
    AlertKind.NO_UPDATES: Entry(
        Rung.UPDATE,
        (
            "optimizer.step() has not run for many steps while the gradients are finite: the "
            "weights are not changing, whatever the loss does. It does not say whether the "
            "call is missing or skipped on purpose."
        ),
        (
            "Check that optimizer.step() runs every step (not behind a condition or after the "
            "loop).",
            "If you accumulate gradients over more steps on purpose, raise no_update_steps.",
            "Check that the optimizer holds this model's parameters (not a copy's).",
        ),
    ),
    AlertKind.LOSS_SPIKE: Entry(
        Rung.UPDATE,
        (
            "The loss jumped far above its recent level (and by a visible part of where it "
            "started): a bad batch, an outlier or the start of instability. One spike is not "
            "divergence."
        ),
        (
            "Inspect the batch of that step: inputs, labels, any extreme values.",
            "Rerun the same steps with a lower learning rate alone.",
            "Rerun with a different data order (seed) alone: does the spike follow the batch?",
        ),
    ),
    AlertKind.LR_EXPERIMENT_UNDONE: Entry(Rung.UPDATE),
    # --- 6. evaluation ------------------------------------------------------------------------
    AlertKind.EVAL_IN_TRAIN_MODE: Entry(
        Rung.EVALUATION,
        (
            "Validation ran with dropout or batch norm in training mode (model.training "
            "True, or F.dropout called without training=self.training, which model.eval() "
            "does not switch off), so the validation numbers are not the model's. It does "
            "not say the training itself is wrong."
        ),
        (
            "Call model.eval() before validation and model.train() after; nothing else.",
            "Pass training=self.training to every functional dropout (F.dropout(x, p)).",
            "Re-run the same validation both ways and compare the loss.",
            "Check every forward in the eval loop, helpers included, for mode.",
        ),
    ),
    AlertKind.EVAL_WITH_GRAD: Entry(
        Rung.EVALUATION,
        (
            "Validation recorded gradients (no torch.inference_mode / no_grad): it costs memory "
            "and time and can leak graph references. It does not change the numbers; eval mode "
            "is a separate switch."
        ),
        (
            "Wrap validation in torch.inference_mode(); nothing else.",
            "Compare peak memory of one validation pass with and without it.",
            "Check that no validation tensor is kept across steps (a growing graph).",
        ),
    ),
    AlertKind.OVERFITTING_SIGNAL: Entry(
        Rung.EVALUATION,
        (
            "Training loss falls while validation loss rises: a signal of overfitting, not "
            "proof of its cause (leakage, a shifted validation set or a changed learning rate "
            "look the same, and a small validation set is noisy). A loss that goes below "
            "zero (a density's NLL) is read against how far the run brought it, not its sign."
        ),
        (
            "Add one regulariser (weight decay or dropout) and rerun; nothing else changes.",
            "Train on more (or augmented) data with the same model and schedule.",
            "Check the validation split for shift or leakage against training (check_split).",
        ),
    ),
    **JOB_ENTRIES,  # across the ranks of a job (catalog_ranks.py)
    # --- 7. the probe ---------------------------------------------------------------------------
    AlertKind.PROBE_OVERHEAD: Entry(
        Rung.PROBE,
        (
            "The probe's own work takes a visible share of each step's time. It does not "
            "change the numbers it reports, only how fast the run goes."
        ),
        (
            "Measure one step in N: probes.watch(..., every=N).",
            "Take the costlier statistics less often: probes.watch(..., sample_every=N).",
            "Compare the steps/s with and without the probe on the same loop.",
        ),
    ),
    # --- 5. the update (issue 18 item 7) ---------------------------------------------------------
    AlertKind.LR_TOO_LOW_TO_UPDATE: Entry(
        Rung.UPDATE,
        (
            "The gradients are non-zero, yet on most layers the update is below float32's "
            "resolution of the weights (|dw|/|w| under ~1e-7, often exactly 0): the weights "
            "no longer change, whatever the schedule meant. Typically a scheduler stepped "
            "per batch where it was meant per epoch. It does not say which rate was intended."
        ),
        (
            "Print the learning rate at every step for a few hundred steps: the schedule as "
            "it runs, not as written.",
            "Check where scheduler.step() is called: once per epoch for StepLR/MultiStepLR "
            "counted in epochs, once per batch for schedules counted in steps.",
            "Restart from the last checkpoint at the schedule's intended rate, nothing else "
            "changed, and compare a weight before and after one optimizer.step().",
        ),
    ),
    AlertKind.LOW_PRECISION_STALL: Entry(
        Rung.UPDATE,
        (
            "These bfloat16/float16 weights have gradients, yet optimizer.step() leaves most "
            "of their elements bit-identical: the update is under half a unit in the last "
            "place of the weight in its dtype and rounds away (a bfloat16 weight of 1.0 "
            "ignores any step under 0.004: a LayerNorm gain never moves). Judged per tensor: "
            "a bias that moves does not hide a weight that does not. It does not say the "
            "rate is wrong for float32 weights."
        ),
        (
            "Keep float32 master weights: train the float32 model under "
            "torch.autocast(dtype=torch.bfloat16), not model.to(torch.bfloat16); nothing else.",
            "Raise the learning rate alone and check that the named tensors move.",
            "Use an optimizer that keeps what rounding drops (Kahan summation or stochastic "
            "rounding of the bfloat16 update).",
        ),
    ),
    # --- 2. torch's own warnings during a step (raised in the training process) -----------
    AlertKind.TORCH_WARNING: Entry(
        Rung.VALUES,
        (
            "torch warned during a training step (its words are in the evidence): it saw "
            "something likely wrong that it will not refuse. It is torch's reading of one "
            "call, not proof that the numbers are wrong."
        ),
        (
            "Find the line that warns: python -W error::UserWarning on the same script.",
            "Fix what the message names, alone, and rerun the same steps.",
        ),
    ),
    # --- the first steps and the run's own scale ------------------------------------------
    AlertKind.LOSS_DIVERGED: Entry(
        Rung.UPDATE,
        (
            "The loss jumped far above where the run began and stayed there: the "
            "optimisation diverged (typically a learning rate far too high). Vanishing or "
            "exploding gradients that follow are its consequences. It does not say whether "
            "the rate, the initialisation or the data scale is at fault."
        ),
        (
            "Lower the learning rate alone by 10x and rerun from the start.",
            "Rerun with a short warmup from a small rate, nothing else changed.",
            "Check the inputs and targets of the first batches for their scale.",
        ),
    ),
    AlertKind.CLIP_ALWAYS_ACTIVE: Entry(
        Rung.GRADIENT_PATH,
        (
            "The gradient clip cuts almost every step and the instability shows under it: "
            "the unclipped norm keeps growing, or the loss got worse, while clipped. The "
            "clip keeps the run finite and hides a persistent instability rather than an "
            "occasional spike. It does not say where the instability comes from."
        ),
        (
            "Log the unclipped norms (probes.clip_grad_norm_) with the clip removed for a "
            "few hundred steps, nothing else changed.",
            "Check the loss's reduction: summed where a mean is meant, or not divided by "
            "the gradient accumulation steps.",
            "Lower the learning rate alone and compare how often the clip is active.",
        ),
    ),
    AlertKind.GRADS_STILL_SCALED: Entry(
        Rung.GRADIENT_PATH,
        (
            "The gradients were clipped (or read) while a GradScaler still held them "
            "multiplied by its loss scale: scaler.unscale_(optimizer) was not called first, "
            "so max_norm is compared with scaled norms and the clip cuts every step. The "
            "norms shown are the scale times the real ones, not an explosion."
        ),
        (
            "Call scaler.unscale_(optimizer) after backward and before clip_grad_norm_; "
            "nothing else.",
            "Compare the total norm divided by scaler.get_scale() with a run without AMP.",
            "Step through scaler.step(optimizer) and scaler.update(), not optimizer.step().",
        ),
    ),
    AlertKind.LOSS_REDUCTION_MISMATCH: Entry(
        Rung.EVALUATION,
        (
            "The training loss is a steady whole multiple of the validation loss on every "
            "evaluation, with the evidence for it (the accumulation steps in the records, or "
            "a ratio that held while the losses moved), or, with no validation, each update "
            "summed k micro-batches' mean losses from one loop without dividing them (its "
            "gradient is k times the mean's): the two are not computed like for like (a sum "
            "against a mean, a loss not divided by the accumulation steps). It does not "
            "prove which one is off; label smoothing (a floor added, not a multiple) is not it."
        ),
        (
            "Compare the reductions: compute the validation loss with the training code's "
            "loss on one batch (sum vs mean).",
            "Under gradient accumulation, divide each micro-batch's loss by the "
            "accumulation steps, nothing else.",
            "Check that both losses are averaged over the same unit (tokens, examples, batches).",
        ),
    ),
}

# Probe alerts whose condition ends with the run's first measured step: the monitor
# clears them when a step record arrives (an LR range test or warm-up updates before
# the bracketed loop raise one, then the loop is measured after all).
ENDED_BY_FIRST_STEP: frozenset[str] = frozenset({AlertKind.STEPS_NOT_MEASURED})

# Kinds the training side's checks raise (their alerts carry their own message and fix).
CHECK_RUNGS: dict[AlertKind, Rung] = {
    **dict.fromkeys(
        (
            AlertKind.DUPLICATE_ROWS,
            AlertKind.DUPLICATES_ACROSS_SPLITS,
            AlertKind.ENTITY_OVERLAP,
            AlertKind.TIME_LEAK,
            AlertKind.MISSING_VALUES,
            AlertKind.TARGET_SHIFT,
            AlertKind.LEAKAGE,
            AlertKind.PREPROCESSING_MISMATCH,
        ),
        Rung.DATA,
    ),
    **dict.fromkeys(
        (
            AlertKind.OUTPUT_NOT_TENSOR,
            AlertKind.DEVICE_MISMATCH,
            AlertKind.PROBABILITIES_INTO_LOGIT_LOSS,
            AlertKind.LOGITS_INTO_NLL_LOSS,
            AlertKind.FLOAT_TARGETS_FOR_CLASSIFICATION,
            AlertKind.TARGET_OUT_OF_RANGE,
            AlertKind.BCE_GIVEN_LOGITS,
            AlertKind.BCE_WITH_LOGITS_GIVEN_PROBABILITIES,
            AlertKind.BROADCAST_IN_LOSS,
            AlertKind.SHAPE_MISMATCH,
            AlertKind.LOSS_ERROR,
            AlertKind.NON_FINITE_LOSS,
            AlertKind.LOSS_NOT_SCALAR,
            AlertKind.SUM_REDUCTION,
        ),
        Rung.VALUES,
    ),
    AlertKind.CANNOT_OVERFIT: Rung.TINY_BATCH,
    AlertKind.STEPS_NOT_MEASURED: Rung.PROBE,
}

UNKNOWN_RUNG = Rung.UPDATE  # a kind from a newer probe: among the update checks


def rung_of(kind: str) -> Rung:
    """The checklist rung of an alert kind."""
    entry = CATALOG.get(kind)  # type: ignore[call-overload]
    if entry is not None:
        return entry.rung
    return CHECK_RUNGS.get(kind, UNKNOWN_RUNG)  # type: ignore[call-overload]


def entry(kind: str) -> Entry:
    """The catalog's entry for a kind (KeyError for a kind it does not describe)."""
    return CATALOG[kind]  # type: ignore[index]
