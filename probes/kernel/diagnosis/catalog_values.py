"""The catalog's entries for rungs 2 and 3: non-finite values, torch's own warnings
during a step, and a loss that does not come down."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

VALUE_ENTRIES: dict[AlertKind, Entry] = {
    # --- 2. shapes, values and the loss contract ---------------------------------------
    AlertKind.NON_FINITE: Entry(
        rung=Rung.VALUES,
        signal=("A NaN or Inf reached the run's numbers: from here on updates are garbage."),
        not_proved="It says where it was first seen, not which operation produced it.",
        experiments=(
            "Run one step under anomaly mode (detect_anomaly) to find the op that made it.",
            "Lower the learning rate alone (e.g. 10x) and rerun from the last good checkpoint.",
            "Check the inputs and targets of the failing batch for NaN/Inf or extreme values.",
        ),
        evidence=(
            ("value", "the first non-finite value found (nan, inf or -inf)"),
            ("first_step", "the step it was first seen at (in a record standing for several)"),
            (
                "order",
                "`backward` when the subject is a gradient: the first failing layer in "
                "backward order, the one nearest where the value was born",
            ),
            (
                "first_non_finite_output",
                "on a sampled step: the first module output (or layer input), in forward "
                "order, that held a non-finite value",
            ),
            ("fed_by", "the last layer before that output"),
            (
                "field",
                "when the first non-finite field is a scalar (the loss) fed by that layer: "
                "the field (the subject is then the layer)",
            ),
            (
                "producer",
                "after an anomaly check of a later step (the probe's automatic one, or the "
                "`a` key): the module that produced it (`-` when only the op was named)",
            ),
            ("producer_op", "the backward op that produced it"),
            ("producer_line", "the forward source line (`file:line`) of that op"),
            ("checked_step", "the step the anomaly check ran on"),
            ("check_cost", "`one step (automatic)` when the probe's automatic check found it"),
        ),
        example={
            "step": 412,
            "subject": "grad_norm[fc2]",
            "value": float("inf"),
            "first_step": 412,
            "order": "backward",
            "producer": "fc2",
            "producer_op": "MmBackward0",
            "producer_line": "train.py:57",
            "checked_step": 413,
            "check_cost": "one step (automatic)",
        },
        traits=Traits(sticky=True, recoverable=True),
    ),
    AlertKind.TORCH_WARNING: Entry(
        rung=Rung.VALUES,
        signal=(
            "torch warned during a training step (its words are in the evidence): it saw "
            "something likely wrong that it will not refuse."
        ),
        not_proved="It is torch's reading of one call, not proof that the numbers are wrong.",
        experiments=(
            "Find the line that warns: python -W error::UserWarning on the same script.",
            "Fix what the message names, alone, and rerun the same steps.",
        ),
        evidence=(
            ("torch_warning", "torch's message, on one line (at most 240 characters)"),
            ("category", "the warning's category (`UserWarning`)"),
        ),
        example={
            "step": 0,
            "subject": "",
            "torch_warning": "Using padding='same' with even kernel lengths and odd dilation "
            "may require a zero-padded copy of the input be created",
            "category": "UserWarning",
        },
        raised_by=(
            "`probes.watch`, from a `UserWarning` issued by torch's own code while a step is "
            "open, once per message (`probes/runtime/torch_warnings.py`)"
        ),
        severity=Severity.WARNING,
    ),
    # --- 3. the tiny-batch test ----------------------------------------------------------
    AlertKind.FLAT_LOSS: Entry(
        rung=Rung.TINY_BATCH,
        signal=(
            "The training loss has not come down from where it started: the model is not learning."
        ),
        not_proved=(
            "It does not say whether the wiring, the optimisation or the data is at fault."
        ),
        experiments=(
            "Overfit a tiny batch (a few examples) with regularisers off (probes.overfit_batch).",
            "Check that gradients reach every layer, then change the learning rate alone (10x "
            "up and 10x down).",
            "Check labels, shapes and the loss contract on one batch (probes.check_batch).",
        ),
        evidence=(
            ("loss_at_start", "the mean training loss of the run's first steps"),
            ("loss_now", "the training loss now, smoothed over the last steps"),
            ("steps", "the step it was judged at (a run is judged from step 200 on)"),
        ),
        example={
            "step": 200,
            "subject": "",
            "loss_at_start": 2.3026,
            "loss_now": 2.2981,
            "steps": 200,
        },
        traits=Traits(waits_for_cause=True),
    ),
}
