"""The catalog's entries for rung 5, the update: is the optimizer wired to the model,
are gradients cleared, does optimizer.step() run and change the weights."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

_LAYERS_AFFECTED = ("layers_affected", "with several layers: how many")
_RANGE = ("range", "with several layers: the first and the last, in model order (`a..b`)")
_STRUCTURE = (
    "`probes.watch`, checking the model against the optimizer's param groups when "
    "`watch()` is called and when the trainable set changes (`probes/runtime/structure.py`)"
)

WIRING_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.PARAMS_NOT_IN_OPTIMIZER: Entry(
        rung=Rung.UPDATE,
        signal=(
            "These trainable parameters are in no param group of the optimizer: backward gives "
            "them gradients but optimizer.step() never changes them."
        ),
        not_proved="It does not prove a bug if another optimizer trains them.",
        experiments=(
            "Build the optimizer from model.parameters() (or add the missing ones with "
            "optimizer.add_param_group) after every layer exists; nothing else.",
            "If a layer was replaced after the optimizer was built, build the optimizer again.",
            "If they are meant to stay fixed, freeze them (requires_grad=False).",
        ),
        evidence=(
            ("params", "how many trainable parameters no param group holds"),
            ("names", "the first six of them"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 0,
            "subject": "head",
            "params": 2,
            "names": "head.weight, head.bias",
        },
        raised_by=_STRUCTURE,
        severity=Severity.WARNING,
        traits=Traits(sticky=True),
    ),
    AlertKind.OPTIMIZER_NOT_FOR_MODEL: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The optimizer holds parameters that are not this model's (a copy made after the "
            "optimizer was built, or another model's): optimizer.step() updates them, and this "
            "model's weights never change."
        ),
        not_proved=(
            "It does not say where the copy was made (a deepcopy, a reload, a wrapper built "
            "after the optimizer)."
        ),
        experiments=(
            "Build the optimizer from the model you train, after any copy, load or wrap.",
            "Check that probes.watch gets the model the loop calls and the optimizer it steps.",
            "Compare a weight before and after one optimizer.step().",
        ),
        evidence=(
            ("foreign_params", "how many of the optimizer's parameters are not the model's"),
            ("model_params_held", "how many of the model's trainable parameters it holds"),
            ("model_params", "how many trainable parameters the model has"),
            (
                "same_shapes",
                "True when every parameter it misses has a foreign one of its shape (a copy "
                "of the model)",
            ),
        ),
        example={
            "step": 0,
            "subject": "",
            "foreign_params": 4,
            "model_params_held": 0,
            "model_params": 4,
            "same_shapes": True,
        },
        raised_by=_STRUCTURE,
        severity=Severity.ERROR,
        traits=Traits(sticky=True),
    ),
    AlertKind.MOSTLY_FROZEN: Entry(
        rung=Rung.UPDATE,
        signal=(
            "Most of the model is frozen (requires_grad=False): only the listed layers can learn."
        ),
        not_proved=(
            "It does not prove a bug: it is intended for linear probing or fine-tuning a "
            "head; it is one when only normalisation layers or biases are left to train."
        ),
        experiments=(
            "Unfreeze the layers that should learn (requires_grad_(True)) and rebuild the "
            "optimizer; nothing else.",
            "If freezing is intended, check the loss still falls with what trains.",
            "Print the parameters with requires_grad True before building the optimizer.",
        ),
        evidence=(
            ("frozen_fraction", "the share of the model's parameter elements frozen"),
            ("trainable_params", "how many parameter elements still train"),
            ("training", "the first six layers that train (`none` for none)"),
            ("training_layers", "how many layers train"),
            ("only_normalisation", "True when only normalisation layers or biases train"),
            (
                "frozen_since_step",
                "for the info note: the step the model became mostly frozen (the note waits "
                "until it has stayed so for 100 steps)",
            ),
        ),
        example={
            "step": 0,
            "subject": "",
            "severity": Severity.WARNING,
            "frozen_fraction": 0.9991,
            "trainable_params": 1536,
            "training": "blocks.0.norm, blocks.1.norm, norm",
            "training_layers": 3,
            "only_normalisation": True,
        },
        raised_by=_STRUCTURE,
        severity=Severity.INFO,
        severity_note=(
            "`warning` when only normalisation layers or biases are left to train "
            "(`only_normalisation=True`)."
        ),
        traits=Traits(sticky=True),
    ),
    AlertKind.UPDATES_NOT_APPLIED: Entry(
        rung=Rung.UPDATE,
        signal=(
            "These layers' gradients are non-zero, yet optimizer.step() leaves their weights "
            "unchanged (a learning rate of 0, a scheduler stuck at its first value, or "
            "parameters the optimizer does not hold)."
        ),
        not_proved=(
            "It does not say which of these it is: the evidence names only what showed the "
            "weights unchanged."
        ),
        experiments=(
            "Print the learning rates after a few steps: a warmup that starts at 0 needs "
            "scheduler.step().",
            "Check the param groups hold these layers' parameters (not a copy's).",
            "Compare a weight before and after one optimizer.step().",
        ),
        evidence=(
            ("grad_norm", "the first layer's gradient norm (non-zero)"),
            (
                "evidence",
                "what showed its weights unchanged: `lr=0` (every learning rate is 0), "
                "`not_stepped` (the step never touched the tensor: its version counter) or "
                "`update_ratio=0` (a sampled step's |dw|/|w|)",
            ),
            ("steps", "how many steps in a row it has held"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 3,
            "subject": "fc1",
            "grad_norm": 0.8412,
            "evidence": "lr=0",
            "steps": 3,
            "layers_affected": 3,
            "range": "fc1..fc3",
        },
        traits=Traits(waits_for_cause=True),
    ),
    AlertKind.GRAD_NOT_CLEARED: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The gradients an update used are still there when the next backward adds to "
            "them: every update uses a growing sum."
        ),
        not_proved=(
            "Accumulating micro-batches between updates is not this (only the first backward "
            "after an update is checked)."
        ),
        experiments=(
            "Call optimizer.zero_grad(set_to_none=True) once per update (in a closure: at "
            "its start), before backward.",
            "Updating by hand with no optimizer every few probe steps? Declare it: "
            "probes.watch(..., grad_accumulation=True).",
            "Compare the gradient norms of two consecutive steps on the same batch: they "
            "should match, not double.",
        ),
        evidence=(
            ("steps", "how many updates in a row found the gradient they used still there"),
            ("since_step", "the first of them"),
            ("grad_norm_total", "the total gradient norm now (the growing sum)"),
        ),
        example={
            "step": 2,
            "subject": "",
            "steps": 2,
            "since_step": 1,
            "grad_norm_total": 7.93,
        },
        traits=Traits(sticky=True, recoverable=True),
    ),
    AlertKind.SKIPPED_UPDATES: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The optimizer has not stepped for a while because every gradient is non-finite: a "
            "GradScaler skipping each update while its loss scale keeps falling. A few skips "
            "are normal under AMP; a streak means the gradients are non-finite at any scale."
        ),
        not_proved="It does not say which operation makes them non-finite.",
        experiments=(
            "Run one step under anomaly mode (a) to find the op that makes the gradient "
            "non-finite.",
            "Compute the loss in float32 (outside autocast) and check scaler.get_scale().",
            "Check the inputs and targets of these batches for NaN/Inf or extreme values.",
        ),
        evidence=(
            ("skipped_steps", "how many steps in a row optimizer.step() did not run"),
            ("since_step", "the first of them"),
            ("loss", "the loss at the latest"),
        ),
        example={
            "step": 57,
            "subject": "",
            "skipped_steps": 10,
            "since_step": 48,
            "loss": 2.71,
        },
    ),
    AlertKind.NO_UPDATES: Entry(
        rung=Rung.UPDATE,
        signal=(
            "optimizer.step() has not run for many steps while the gradients are finite: the "
            "weights are not changing, whatever the loss does."
        ),
        not_proved="It does not say whether the call is missing or skipped on purpose.",
        experiments=(
            "Check that optimizer.step() runs every step (not behind a condition or after the "
            "loop).",
            "If you accumulate gradients over more steps on purpose, raise no_update_steps.",
            "Check that the optimizer holds this model's parameters (not a copy's).",
        ),
        evidence=(
            ("steps_without_update", "how many steps in a row optimizer.step() did not run"),
            ("since_step", "the first of them"),
            ("loss", "the loss at the latest"),
        ),
        example={
            "step": 99,
            "subject": "",
            "steps_without_update": 100,
            "since_step": 0,
            "loss": 0.6931,
        },
    ),
}
