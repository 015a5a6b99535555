"""The catalog's entries for rung 2's loss contract, raised by the training side:
``probes.check_batch`` on one batch, the live contract on a loss function's calls
during training, and torch's own warning of a broadcast in the loss."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

_BATCH = "`probes.check_batch`, on one batch (`probes/checks/batch_checks.py`)"
_LIVE = (
    "`probes.watch`'s live loss contract, on a call of a `torch.nn.functional` loss in the "
    "run's first steps and sampled steps (`probes/runtime/loss_contract_live.py`)"
)
_LIVE_EVIDENCE = (
    ("function", "live: the `torch.nn.functional` loss called"),
    ("reduction", "live: its reduction"),
    ("classes", "live, a class loss: the number of classes"),
    ("rows_read", "live, a class loss: the rows of the outputs read"),
    (
        "negative_loss",
        "live: the loss, when it is negative (this loss cannot be while its contract holds)",
    ),
)
_SHAPES = (
    ("outputs", "the outputs' shape"),
    ("targets", "the targets' shape"),
)

CONTRACT_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.OUTPUT_NOT_TENSOR: Entry(
        rung=Rung.VALUES,
        signal=(
            "The model returned something other than a tensor (a tuple, a dict, an output "
            "object): check_batch checks only a tensor output, so the loss contract was not "
            "checked."
        ),
        not_proved="It is not a bug in itself: many models return structures.",
        experiments=(
            "Give check_batch a model that returns the tensor the loss receives (a small "
            "wrapper returning outputs.logits); nothing else.",
        ),
        example={"step": 0, "subject": "outputs"},
        raised_by=_BATCH,
        severity=Severity.INFO,
    ),
    AlertKind.DEVICE_MISMATCH: Entry(
        rung=Rung.VALUES,
        signal=(
            "The outputs and the targets are on different devices: the loss cannot compare "
            "them where they are."
        ),
        not_proved=(
            "It does not say which of the two is on the wrong device (the message names both)."
        ),
        experiments=(
            "Move the targets to the model's device with the inputs (targets.to(device)); "
            "nothing else.",
        ),
        example={"step": 0, "subject": "targets"},
        raised_by=_BATCH,
        severity=Severity.ERROR,
    ),
    AlertKind.PROBABILITIES_INTO_LOGIT_LOSS: Entry(
        rung=Rung.VALUES,
        signal=(
            "The outputs are probabilities (in [0, 1], each row summing to 1), but the loss "
            "(CrossEntropyLoss, cross_entropy) applies log-softmax itself: softmax is "
            "applied twice and the gradients shrink."
        ),
        not_proved="It does not say which line of the model applies the softmax.",
        experiments=(
            "Remove the softmax at the end of the model and give the loss the raw logits; "
            "nothing else.",
            "Compare the gradient norms of the last layer before and after.",
        ),
        evidence=(
            *_LIVE_EVIDENCE,
            ("row_sum_off_1", "live: the farthest a row of the outputs sums from 1"),
        ),
        example={
            "step": 0,
            "subject": "outputs",
            "function": "cross_entropy",
            "reduction": "mean",
            "classes": 10,
            "rows_read": 16,
            "row_sum_off_1": 1.2e-07,
        },
        raised_by=f"{_BATCH}; {_LIVE}",
        severity=Severity.ERROR,
    ),
    AlertKind.LOGITS_INTO_NLL_LOSS: Entry(
        rung=Rung.VALUES,
        signal=(
            "The loss (NLLLoss, nll_loss) expects log-probabilities, but the outputs are raw "
            "logits or probabilities (a row's logsumexp is not 0): the loss is not the one "
            "meant, and it may go negative."
        ),
        not_proved="It does not say which line should have applied log_softmax.",
        experiments=(
            "End the model with log_softmax, or use CrossEntropyLoss on the logits; nothing else.",
        ),
        evidence=(
            *_LIVE_EVIDENCE,
            ("logsumexp_off_0", "live: the farthest a row's logsumexp is from 0"),
        ),
        example={
            "step": 0,
            "subject": "outputs",
            "function": "nll_loss",
            "reduction": "mean",
            "classes": 10,
            "rows_read": 16,
            "negative_loss": -2.914,
            "logsumexp_off_0": 3.02,
        },
        raised_by=f"{_BATCH}; {_LIVE}",
        severity=Severity.ERROR,
    ),
    AlertKind.FLOAT_TARGETS_FOR_CLASSIFICATION: Entry(
        rung=Rung.VALUES,
        signal=(
            "A classification loss (CrossEntropyLoss, NLLLoss) takes class indices (int64), "
            "but the targets are floats of another shape than the outputs."
        ),
        not_proved=(
            "Float targets of the outputs' own shape (class probabilities) are not this; it "
            "does not say whether the labels' values are right."
        ),
        experiments=(
            "Convert the labels with targets.long(); nothing else.",
            "Or pass class probabilities of the outputs' shape, on purpose.",
        ),
        example={"step": 0, "subject": "targets"},
        raised_by=_BATCH,
        severity=Severity.ERROR,
    ),
    AlertKind.TARGET_OUT_OF_RANGE: Entry(
        rung=Rung.VALUES,
        signal=(
            "The targets lie outside what the loss accepts: class indices outside [0, "
            "classes - 1], or float targets outside [0, 1] where they are probabilities."
        ),
        not_proved=(
            "It does not say whether the labels or the model's number of outputs is wrong."
        ),
        experiments=(
            "Check the label encoding (0-based? labels in {-1, 1} mapped to [0, 1]?); "
            "nothing else.",
            "Check the model's number of outputs against the number of classes.",
        ),
        evidence=(
            ("classes", "the number of classes (the outputs' size along dimension 1)"),
            ("min", "the targets' least value"),
            ("max", "the targets' largest value"),
            *_LIVE_EVIDENCE[:2],
            *_LIVE_EVIDENCE[3:],
        ),
        example={"step": 0, "subject": "targets", "classes": 10, "min": 1, "max": 10},
        raised_by=f"{_BATCH}; {_LIVE}",
        severity=Severity.ERROR,
    ),
    AlertKind.BCE_GIVEN_LOGITS: Entry(
        rung=Rung.VALUES,
        signal=(
            "BCELoss needs probabilities in [0, 1], but the outputs range outside it: they "
            "are logits."
        ),
        not_proved=(
            "It does not say whether a sigmoid is missing or the loss is the wrong one "
            "(BCEWithLogitsLoss on the logits fixes both)."
        ),
        experiments=(
            "Use BCEWithLogitsLoss on the logits (numerically safer) rather than adding a "
            "sigmoid; nothing else.",
        ),
        example={"step": 0, "subject": "outputs"},
        raised_by=_BATCH,
        severity=Severity.ERROR,
    ),
    AlertKind.BCE_WITH_LOGITS_GIVEN_PROBABILITIES: Entry(
        rung=Rung.VALUES,
        signal=(
            "BCEWithLogitsLoss applies a sigmoid itself, but the outputs all lie in [0, 1] "
            "as if a sigmoid were applied already (live: the operation that made them is a "
            "sigmoid)."
        ),
        not_proved=(
            "Read from one batch's values (check_batch), it does not prove a sigmoid: a "
            "young model's logits can lie in [0, 1] too."
        ),
        experiments=(
            "Remove the final sigmoid from the model; nothing else.",
            "Or use BCELoss on the probabilities (less stable).",
        ),
        evidence=(
            *_LIVE_EVIDENCE[:2],
            _LIVE_EVIDENCE[4],
            ("made_by", "live: the operation that made the outputs (`Sigmoid`)"),
            ("min", "live: the outputs' least value"),
            ("max", "live: the outputs' largest value"),
        ),
        example={
            "step": 0,
            "subject": "outputs",
            "function": "binary_cross_entropy_with_logits",
            "reduction": "mean",
            "made_by": "Sigmoid",
            "min": 0.0213,
            "max": 0.987,
        },
        raised_by=f"{_BATCH}; {_LIVE}",
        severity=Severity.WARNING,
    ),
    AlertKind.BROADCAST_IN_LOSS: Entry(
        rung=Rung.VALUES,
        signal=(
            "The targets' shape differs from the outputs' and the two broadcast (outputs "
            "[B, 1] against targets [B] make [B, B]): every output is compared with every "
            "target, and the loss is not the one meant."
        ),
        not_proved="It does not say which of the two has the wrong shape.",
        experiments=(
            "Make the shapes equal (outputs.squeeze(-1) or targets.unsqueeze(-1)) and "
            "rerun; nothing else.",
            "Run probes.check_batch on one batch to see both shapes.",
        ),
        evidence=(
            *_SHAPES,
            ("broadcast", "check_batch: the shape they broadcast to"),
            ("function", "live: the `torch.nn.functional` loss called"),
            ("torch_warning", "from torch's warning: its message"),
            ("category", "... and its category (`UserWarning`)"),
        ),
        example={
            "step": 0,
            "subject": "targets",
            "outputs": [32, 1],
            "targets": [32],
            "broadcast": [32, 32],
        },
        raised_by=(
            f"{_BATCH}; {_LIVE}; `probes.watch`, from torch's own warning during a step "
            "(`probes/runtime/torch_warnings.py`)"
        ),
        severity=Severity.ERROR,
        traits=Traits(said_once=True),
    ),
    AlertKind.SHAPE_MISMATCH: Entry(
        rung=Rung.VALUES,
        signal=(
            "The outputs' and targets' shapes differ (and do not broadcast to more "
            "elements): the loss raises, or compares elements that do not belong together."
        ),
        not_proved="It does not say which is wrong: the targets or the model's last layer.",
        experiments=(
            "Make the targets the outputs' shape, or fix the model's last layer; one of the two.",
        ),
        evidence=_SHAPES,
        example={"step": 0, "subject": "targets", "outputs": [32, 10], "targets": [32, 5]},
        raised_by=_BATCH,
        severity=Severity.ERROR,
    ),
    AlertKind.LOSS_ERROR: Entry(
        rung=Rung.VALUES,
        signal=(
            "The loss raised an exception on this batch (its type and first line are in the "
            "message): the contract is broken badly enough that torch refuses."
        ),
        not_proved="It does not say which argument is wrong; the message usually names one.",
        experiments=("Fix the shape or dtype the message names; nothing else.",),
        example={"step": 0, "subject": "loss"},
        raised_by=_BATCH,
        severity=Severity.ERROR,
    ),
    AlertKind.NON_FINITE_LOSS: Entry(
        rung=Rung.VALUES,
        signal=(
            "The loss of one batch (check_batch), or of a tiny batch after a few steps of "
            "training (overfit_batch), is NaN or Inf."
        ),
        not_proved="It does not say which value or operation made it.",
        experiments=(
            "Check the batch's inputs and targets for NaN/Inf or extreme values.",
            "Lower the learning rate alone (overfit_batch); if it persists, run one step "
            "under anomaly detection.",
        ),
        evidence=(("steps", "overfit_batch: the steps run before it became non-finite"),),
        example={"step": 0, "subject": "loss", "steps": 37},
        raised_by=f"{_BATCH}; `probes.overfit_batch` (`probes/checks/tiny_batch.py`)",
        severity=Severity.ERROR,
    ),
    AlertKind.LOSS_NOT_SCALAR: Entry(
        rung=Rung.VALUES,
        signal=(
            "The loss is not one number (reduction='none'?): backward needs one, and whether "
            "it is then averaged or summed changes the effective learning rate."
        ),
        not_proved="It does not prove a bug: a loop may reduce it deliberately before backward.",
        experiments=("Use reduction='mean' (or reduce it yourself, deliberately).",),
        example={"step": 0, "subject": "loss"},
        raised_by=_BATCH,
        severity=Severity.ERROR,
    ),
    AlertKind.SUM_REDUCTION: Entry(
        rung=Rung.VALUES,
        signal=(
            "The loss uses reduction='sum': it and its gradients grow with the batch size, so "
            "a different batch size changes the effective learning rate."
        ),
        not_proved="It does not prove a bug: a sum with a rate scaled to the batch is a choice.",
        experiments=(
            "Prefer reduction='mean'; nothing else.",
            "Or scale the learning rate with the batch size, on purpose.",
        ),
        example={"step": 0, "subject": "loss"},
        raised_by=_BATCH,
        severity=Severity.INFO,
    ),
}
