"""The catalog's entries for kinds the training side's checks raise: the data and its
splits (``probes.check_split``, ``probes.check_preprocessing``), the tiny-batch test
(``probes.overfit_batch``) and updates no probe step measured. Their alerts carry the
check's own message and fix; these entries say what the kind means in general (the
loss contract's are in ``catalog_contract``)."""

from __future__ import annotations

from probes.kernel.diagnosis.catalog_contract import CONTRACT_ENTRIES
from probes.kernel.diagnosis.entry import Entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

_SPLIT = "`probes.check_split`, before training (`probes/checks/data_checks.py`)"
_PREPROCESSING = "`probes.check_preprocessing`, before training (`probes/checks/data_checks.py`)"
_STATISTICS = (
    ("used", "the statistic the preprocessing uses (a number, or one per column)"),
    ("train", "the same statistic computed on the training split"),
    ("all_rows", "... and on every row given (train, validation and test), when given"),
)

_DATA_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.DUPLICATE_ROWS: Entry(
        rung=Rung.DATA,
        signal=(
            "Rows of one split repeat an earlier row of the same split exactly: the model "
            "sees them more often than the rest, and a metric on that split counts them "
            "more than once."
        ),
        not_proved=(
            "It does not prove a bug: repeats may be deliberate (oversampling); and it does "
            "not see near-duplicates (a resized image, a re-worded sentence)."
        ),
        experiments=(
            "Drop the exact duplicates alone and compare the validation metric.",
            "If they are deliberate, weight the rows instead of repeating them, nothing else.",
            "Look at a few repeated pairs (the examples) to find the step that copied them "
            "(a join, a concatenation run twice).",
        ),
        evidence=(
            ("duplicates", "how many rows repeat an earlier row of the split"),
            ("rows", "the split's rows"),
            ("examples", "a few of them, as (first index, repeat's index) pairs"),
        ),
        example={
            "step": 0,
            "subject": "train",
            "duplicates": 12,
            "rows": 5000,
            "examples": "(3, 4017), (15, 2210)",
        },
        raised_by=_SPLIT,
        severity=Severity.WARNING,
    ),
    AlertKind.DUPLICATES_ACROSS_SPLITS: Entry(
        rung=Rung.DATA,
        signal=(
            "Rows of a later split (validation or test) also appear, exactly, in an earlier "
            "one: evaluation on them measures memory, not generalisation."
        ),
        not_proved=(
            "It does not see near-duplicates or rows of one entity (pass key= for those), "
            "nor leakage through features computed from other rows."
        ),
        experiments=(
            "Deduplicate before splitting, then split again; nothing else.",
            "Remove the shared rows from the later split alone and compare the metric: the "
            "difference is what memory was worth.",
            "Look at a few shared pairs (the examples) to find the step that copied them.",
        ),
        evidence=(
            ("shared_rows", "how many rows of the later split are also in the earlier one"),
            ("<split>_rows", "the later split's rows (`val_rows`, `test_rows`)"),
            ("examples", "a few of them, as (index in the earlier, index in the later) pairs"),
        ),
        example={
            "step": 0,
            "subject": "train/val",
            "shared_rows": 37,
            "val_rows": 1000,
            "examples": "(18, 2), (402, 9)",
        },
        raised_by=_SPLIT,
        severity=Severity.ERROR,
    ),
    AlertKind.ENTITY_OVERLAP: Entry(
        rung=Rung.DATA,
        signal=(
            "One entity (the key= given: a user, a patient) has rows in two splits: the model "
            "can learn the entity rather than the task, and evaluation rewards it."
        ),
        not_proved=(
            "It does not prove the metric is inflated: that depends on how much one "
            "entity's rows tell about each other."
        ),
        experiments=(
            "Split by entity (a group split), so that each entity is in one split only; "
            "nothing else.",
            "Compare the metric on the entities seen in training with that on the others.",
        ),
        evidence=(
            ("shared_entities", "how many entities have rows in both splits"),
            ("examples", "a few, as (entity, index in the earlier, index in the later)"),
        ),
        example={
            "step": 0,
            "subject": "train/val",
            "shared_entities": 41,
            "examples": "(1007, 12, 3), (2210, 40, 17)",
        },
        raised_by=_SPLIT + ", with `key=`",
        severity=Severity.ERROR,
    ),
    AlertKind.TIME_LEAK: Entry(
        rung=Rung.DATA,
        signal=(
            "Rows of a later split are earlier than the end of training (the time= given): "
            "the model is evaluated on a past it trained after, which deployment never offers."
        ),
        not_proved=(
            "It does not prove those rows help the model: only that the split is not by time."
        ),
        experiments=(
            "Split by time: every validation and test row after the last training row; "
            "nothing else.",
            "Compare the metric on the rows after the end of training with that on the "
            "earlier ones.",
        ),
        evidence=(
            ("rows_before_train_end", "how many rows of the split are earlier"),
            ("train_end", "the last training row's time"),
            ("<split>_start", "the split's earliest time (`val_start`, `test_start`)"),
            ("examples", "the indices of a few of those rows"),
        ),
        example={
            "step": 0,
            "subject": "val",
            "rows_before_train_end": 130,
            "train_end": 20240630,
            "val_start": 20240415,
            "examples": "0, 1, 2, 5, 8",
        },
        raised_by=_SPLIT + ", with `time=`",
        severity=Severity.ERROR,
    ),
    AlertKind.MISSING_VALUES: Entry(
        rung=Rung.DATA,
        signal=(
            "Some values of this split are NaN: given to the model as they are, they make "
            "its outputs, the loss and every gradient NaN."
        ),
        not_proved=(
            "It does not say whether missingness carries signal, and it does not see "
            "values that stand for missing ones (a -1, a 0)."
        ),
        experiments=(
            "Impute with statistics fitted on train only (or drop the rows), nothing else.",
            "Add a missing-indicator column if missingness may carry signal, and compare.",
            "Trace where one column's NaNs come from (a join, a division, a parse).",
        ),
        evidence=(
            ("nan_values", "how many values are NaN"),
            ("columns", "in how many columns"),
            ("by_column", "`col <i>: <n>` for the first eight of them"),
            ("examples", "the first columns' indices"),
        ),
        example={
            "step": 0,
            "subject": "train",
            "nan_values": 214,
            "columns": 2,
            "by_column": "col 3: 200, col 7: 14",
            "examples": "3, 7",
        },
        raised_by=_SPLIT,
        severity=Severity.WARNING,
    ),
    AlertKind.TARGET_SHIFT: Entry(
        rung=Rung.DATA,
        signal=(
            "The target's distribution differs between training and this split (a class's "
            "share by more than 10 points, or a continuous target's mean by more than half a "
            "training standard deviation): the metric on it is not the one training "
            "optimises for."
        ),
        not_proved=(
            "It does not say which split looks like deployment: the shift may be the real one."
        ),
        experiments=(
            "Stratify the split by the target; nothing else.",
            "Check how the split was made (by time? by source?) and whether deployment looks "
            "like train or like this split.",
            "Compare the metric per class (or per target range) on both splits.",
        ),
        evidence=(
            ("class", "for a class target: the class whose share moved most"),
            ("train_share", "its share of train"),
            ("<split>_share", "its share of this split (`val_share`, `test_share`)"),
            ("max_shift", "the difference of the two"),
            ("train_mean", "for a continuous target instead: its mean in train"),
            ("<split>_mean", "its mean in this split (`val_mean`, `test_mean`)"),
            ("stds_apart", "the difference, in training standard deviations"),
        ),
        example={
            "step": 0,
            "subject": "val",
            "class": "1",
            "train_share": 0.5,
            "val_share": 0.31,
            "max_shift": 0.19,
        },
        raised_by=_SPLIT + ", with `target=`",
        severity=Severity.WARNING,
    ),
    AlertKind.LEAKAGE: Entry(
        rung=Rung.DATA,
        signal=(
            "A normalisation statistic matches every row (train, validation and test "
            "together), not train: the preprocessing was fitted on the evaluation rows too, "
            "so they leak into training."
        ),
        not_proved=(
            "It does not say how much the metric is inflated, nor that the pipeline applies "
            "the statistic to every split the same way."
        ),
        experiments=(
            "Fit the statistic on the training split only, then apply it unchanged to "
            "validation and test; nothing else.",
            "Compare the validation metric before and after.",
        ),
        evidence=_STATISTICS,
        example={
            "step": 0,
            "subject": "mean",
            "used": 4.0,
            "train": 1.0,
            "all_rows": 4.0,
        },
        raised_by=_PREPROCESSING,
        severity=Severity.ERROR,
    ),
    AlertKind.PREPROCESSING_MISMATCH: Entry(
        rung=Rung.DATA,
        signal=(
            "A normalisation statistic the preprocessing uses is not the training split's "
            "(nor every row's, when they were given): it came from somewhere else."
        ),
        not_proved=(
            "It does not say where it came from (another dataset, a stale file, another "
            "convention)."
        ),
        experiments=(
            "Recompute the statistic on the training split alone and use it; nothing else.",
            "Find where the used value was computed (a cached file, another dataset).",
        ),
        evidence=_STATISTICS,
        example={
            "step": 0,
            "subject": "std",
            "used": 0.5,
            "train": 0.2887,
        },
        raised_by=_PREPROCESSING,
        severity=Severity.WARNING,
    ),
    # --- 3. the tiny-batch test, run before training --------------------------------------
    AlertKind.CANNOT_OVERFIT: Entry(
        rung=Rung.TINY_BATCH,
        signal=(
            "A copy of the model, its stochastic regularisers off, could not drive the loss "
            "on a few examples down to the goal (by default 5% of its first value): the "
            "wiring or the optimisation is wrong."
        ),
        not_proved=(
            "Failure does not say which (a detached layer, a wrong loss, the learning rate, "
            "the initialisation); success would not prove the model generalises."
        ),
        experiments=(
            "Check that gradients reach every layer (no .detach(), no frozen parts); nothing else.",
            "Then check the loss contract on the same batch (probes.check_batch).",
            "Then change the learning rate alone (10x up and 10x down).",
        ),
        evidence=(
            ("first_loss", "the loss at the first step"),
            ("last_loss", "the loss at the last"),
            ("goal", "the loss it had to reach"),
        ),
        example={
            "step": 0,
            "subject": "loss",
            "first_loss": 2.303,
            "last_loss": 1.98,
            "goal": 0.1151,
        },
        raised_by="`probes.overfit_batch`, before training (`probes/checks/tiny_batch.py`)",
        severity=Severity.ERROR,
    ),
    # --- 7. the probe ---------------------------------------------------------------------
    AlertKind.STEPS_NOT_MEASURED: Entry(
        rung=Rung.PROBE,
        signal=(
            "optimizer.step() ran several times but no probe step has begun, so nothing is "
            "measured yet: the probe reads a step only inside `with probe.step():`."
        ),
        not_proved=(
            "It does not prove the loop is unmeasured: updates before it may be deliberate "
            "(an LR range test, a warm-up), and it clears at the first probe step."
        ),
        experiments=(
            "Wrap each training step (forward, backward, optimizer.step) in `with probe.step():`.",
            "With the Hugging Face Trainer or Lightning, add traintop's callback instead.",
            "Updates before the loop on purpose (an LR range test, a warm-up)? Nothing to "
            "do: this clears at the first probe step.",
        ),
        evidence=(
            ("optimizer_steps", "how many optimizer.step() calls it saw"),
            ("probe_steps", "how many probe steps had begun (0)"),
        ),
        example={"step": 0, "subject": "", "optimizer_steps": 3, "probe_steps": 0},
        raised_by=(
            "`probes.watch(..., infer_steps=False)`, for updates before any probe step "
            "(`probes/runtime/unbracketed.py`)"
        ),
        severity=Severity.WARNING,
    ),
}

#: Every kind the training side's checks raise, with its entry.
CHECK_ENTRIES: dict[AlertKind, Entry] = {**_DATA_ENTRIES, **CONTRACT_ENTRIES}
