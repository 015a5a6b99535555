"""The validation loss is chosen by name, once, for every reader of eval records."""

from __future__ import annotations

import pytest

from probes.kernel.diagnosis import EvalView
from probes.kernel.schema import validation_loss, validation_loss_name


@pytest.mark.parametrize(
    "names, expected",
    [
        (["loss", "val_loss"], "val_loss"),  # an eval that also logs a training loss
        (["val_loss", "loss"], "val_loss"),
        (["eval_loss", "eval_runtime"], "eval_loss"),
        (["valid_loss"], "valid_loss"),
        (["validation_loss", "val_acc"], "validation_loss"),
        (["loss"], "loss"),  # a plain loop logging its eval's loss as loss
        (["eval_ce_loss", "eval_accuracy"], "eval_ce_loss"),
        (["train_loss", "val_accuracy"], None),  # a training loss is never the validation one
        (["ce_loss", "kl_loss"], None),  # two candidates and no exact name: no guess
        (["accuracy"], None),
        ([], None),
    ],
)
def test_validation_loss_name(names: list[str], expected: str | None) -> None:
    assert validation_loss_name(names) == expected


def test_eval_record_of_issue_reads_val_loss() -> None:
    record = {"kind": "eval", "step": 25, "scalars": {"loss": 3.784, "val_loss": 3.721}}
    assert EvalView.from_record(record).loss == 3.721
    assert validation_loss(record["scalars"]) == 3.721
