"""The catalog's entries for rung 6, evaluation, and rung 7, the probe's own cost."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

EVALUATION_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.EVAL_IN_TRAIN_MODE: Entry(
        rung=Rung.EVALUATION,
        signal=(
            "Validation ran with dropout or batch norm in training mode (model.training "
            "True, or F.dropout called without training=self.training, which model.eval() "
            "does not switch off), so the validation numbers are not the model's."
        ),
        not_proved="It does not say the training itself is wrong.",
        experiments=(
            "Call model.eval() before validation and model.train() after; nothing else.",
            "Pass training=self.training to every functional dropout (F.dropout(x, p)).",
            "Re-run the same validation both ways and compare the loss.",
            "Check every forward in the eval loop, helpers included, for mode.",
        ),
        evidence=(
            ("forwards_in_train_mode", "the evaluation's forward passes in training mode"),
            ("forwards", "its forward passes"),
            (
                "dropout_or_batchnorm_modules",
                "how many modules of the model eval() changes (dropout, batch norm)",
            ),
            (
                "sensitive_forwards_in_train_mode",
                "forwards of those modules in training mode",
            ),
            (
                "functional_dropout_calls",
                "when the dropout came from functions instead: F.dropout calls with "
                "training=True and p > 0",
            ),
            ("fix", "... and the call that fixes them: `F.dropout(x, p, training=self.training)`"),
        ),
        example={
            "step": 500,
            "subject": "",
            "severity": Severity.ERROR,
            "forwards_in_train_mode": 20,
            "forwards": 20,
            "dropout_or_batchnorm_modules": 3,
            "sensitive_forwards_in_train_mode": 60,
        },
        severity_note=(
            "`error` whenever a module eval() changes, or a functional dropout, ran in "
            "training mode during the evaluation (every alert from a current probe); "
            "`warning` only for an older probe's record, with no such module in the model."
        ),
    ),
    AlertKind.EVAL_WITH_GRAD: Entry(
        rung=Rung.EVALUATION,
        signal=(
            "Validation recorded gradients (no torch.inference_mode / no_grad): it costs memory "
            "and time and can leak graph references."
        ),
        not_proved="It does not change the numbers; eval mode is a separate switch.",
        experiments=(
            "Wrap validation in torch.inference_mode(); nothing else.",
            "Compare peak memory of one validation pass with and without it.",
            "Check that no validation tensor is kept across steps (a growing graph).",
        ),
        evidence=(
            ("forwards_with_grad", "the evaluation's forward passes with gradient recording on"),
            ("forwards", "its forward passes"),
        ),
        example={"step": 500, "subject": "", "forwards_with_grad": 20, "forwards": 20},
    ),
    AlertKind.OVERFITTING_SIGNAL: Entry(
        rung=Rung.EVALUATION,
        signal=(
            "Training loss falls while validation loss rises: a signal of overfitting. A "
            "loss that goes below zero (a density's NLL) is read against how far the run "
            "brought it, not its sign."
        ),
        not_proved=(
            "It does not prove its cause: leakage, a shifted validation set or a changed "
            "learning rate look the same, and a small validation set is noisy."
        ),
        experiments=(
            "Add one regulariser (weight decay or dropout) and rerun; nothing else changes.",
            "Train on more (or augmented) data with the same model and schedule.",
            "Check the validation split for shift or leakage against training (check_split).",
        ),
        evidence=(
            ("val_loss", "the latest validation loss"),
            ("best_val_loss", "the best (lowest) so far"),
            ("best_at_step", "the step of the best"),
            ("train_loss_then", "the smoothed training loss at that step"),
            ("train_loss_now", "the smoothed training loss now"),
        ),
        example={
            "step": 3000,
            "subject": "",
            "val_loss": 0.912,
            "best_val_loss": 0.641,
            "best_at_step": 1500,
            "train_loss_then": 0.58,
            "train_loss_now": 0.214,
        },
        traits=Traits(waits_for_cause=True),
    ),
    AlertKind.LOSS_REDUCTION_MISMATCH: Entry(
        rung=Rung.EVALUATION,
        signal=(
            "The training loss is a steady whole multiple of the validation loss on every "
            "evaluation, with the evidence for it (the accumulation steps in the records, or "
            "a ratio that held while the losses moved), or, with no validation, each update "
            "summed k micro-batches' mean losses from one loop without dividing them (its "
            "gradient is k times the mean's): the two are not computed like for like (a sum "
            "against a mean, a loss not divided by the accumulation steps)."
        ),
        not_proved=(
            "It does not prove which one is off; label smoothing (a floor added, not a "
            "multiple) is not it."
        ),
        experiments=(
            "Compare the reductions: compute the validation loss with the training code's "
            "loss on one batch (sum vs mean).",
            "Under gradient accumulation, divide each micro-batch's loss by the "
            "accumulation steps, nothing else.",
            "Check that both losses are averaged over the same unit (tokens, examples, batches).",
        ),
        evidence=(
            ("train_over_val", "the smoothed training loss over the validation loss (steady)"),
            ("nearest_whole", "the whole number N it stands for"),
            (
                "backward_passes",
                "when the records show it: the backward passes into each update's gradients",
            ),
            ("cause", "... then `accumulation not divided`"),
            ("summed_over", "otherwise: N, from a ratio that held while the losses moved"),
            ("val_moved", "... and how far the validation loss moved meanwhile (its spread)"),
            ("train_loss", "the smoothed training loss"),
            ("val_loss", "the validation loss"),
            ("evals", "how many evaluations in a row showed it"),
            (
                "each_on",
                "with no validation (the training side's evidence): what each backward ran "
                "on, `a mean loss as returned (not divided by the passes)`",
            ),
            ("since_step", "... and the first update of the streak"),
        ),
        example={
            "step": 600,
            "subject": "loss",
            "train_over_val": 3.98,
            "nearest_whole": 4,
            "backward_passes": 4,
            "cause": "accumulation not divided",
            "train_loss": 8.93,
            "val_loss": 2.244,
            "evals": 3,
        },
    ),
    # --- 7. the probe ---------------------------------------------------------------------
    AlertKind.PROBE_OVERHEAD: Entry(
        rung=Rung.PROBE,
        signal="The probe's own work takes a visible share of each step's time.",
        not_proved="It does not change the numbers it reports, only how fast the run goes.",
        experiments=(
            "Measure one step in N: probes.watch(..., every=N).",
            "Take the costlier statistics less often: probes.watch(..., sample_every=N).",
            "Compare the steps/s with and without the probe on the same loop.",
        ),
        evidence=(
            ("probe_share", "the probe's share of the step time over the window"),
            ("steps", "the window, in steps"),
            ("probe_ms_per_step", "the probe's milliseconds a step over it"),
            (
                "setting",
                "the watch() setting that would bring it under the threshold (5% by default)",
            ),
        ),
        example={
            "step": 400,
            "subject": "",
            "probe_share": 0.083,
            "steps": 100,
            "probe_ms_per_step": 2.41,
            "setting": "watch(sample_every=40)",
        },
    ),
}
