"""Evaluation, exactly (issue 18 item 6): ``eval_in_train_mode`` only where
``model.eval()`` would change what ran, and dropout called as a function with
``training=True`` during an evaluation (it survives ``model.eval()``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probes.kernel.diagnosis import Diagnoser, RunInfo
from probes.runtime.evaluation.evaluation import EvalScope, count_mode_sensitive, is_mode_sensitive

LAYERS = ["lstm", "head"]


@pytest.mark.parametrize(
    ("module", "sensitive"),
    [
        (nn.Dropout(0.1), True),
        (nn.BatchNorm1d(4), True),
        (nn.BatchNorm1d(4, track_running_stats=False), False),
        (nn.InstanceNorm1d(4), False),  # no running statistics by default
        (nn.InstanceNorm1d(4, track_running_stats=True), True),
        (nn.LSTM(4, 4, num_layers=2, dropout=0.2), True),
        (nn.LSTM(4, 4), False),
        (nn.GRU(4, 4, num_layers=2, dropout=0.1), True),
        (nn.MultiheadAttention(4, 2, dropout=0.1), True),
        (nn.MultiheadAttention(4, 2), False),
        (nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.1), True),
        (nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0), False),
        (nn.LayerNorm(4), False),
        (nn.Linear(4, 4), False),
    ],
)
def test_mode_sensitive_modules_are_those_eval_changes(module: nn.Module, sensitive: bool) -> None:
    assert is_mode_sensitive(module) is sensitive


def test_a_dropout_lstm_counts_as_mode_sensitive_in_the_hello_count() -> None:
    model = nn.Sequential(nn.LSTM(4, 4, num_layers=2, dropout=0.2))
    assert count_mode_sensitive(model) == 1
    assert count_mode_sensitive(nn.Sequential(nn.LSTM(4, 4), nn.Linear(4, 1))) == 0


class LstmModel(nn.Module):
    def __init__(self, dropout: float = 0.0, functional_p: float = 0.0) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 8, num_layers=2, dropout=dropout, batch_first=True)
        self.head = nn.Linear(8, 1)
        self.functional_p = functional_p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        out = out[:, -1]
        if self.functional_p:
            out = F.dropout(out, self.functional_p)  # training defaults to True
        return self.head(out)


def evaluate(model: nn.Module, *, train_mode: bool) -> dict[str, Any]:
    """One evaluation's record, as the probe makes it (the model and its layers hooked)."""
    scope = EvalScope([model, model.lstm, model.head], 0)
    model.train(train_mode)
    try:
        with torch.no_grad():
            model(torch.randn(2, 5, 3))
    finally:
        scope.remove_hooks()
    record: dict[str, Any] = dict(scope.record())
    record["scalars"] = {"val_loss": 0.5}
    return record


def diagnose(model: nn.Module, record: dict[str, Any]) -> list[Any]:
    info = RunInfo.from_hello(
        {"layers": LAYERS, "mode_sensitive_modules": count_mode_sensitive(model)}
    )
    diagnoser = Diagnoser(info)
    changes = diagnoser.observe({"kind": "step", "step": 0, "scalars": {"loss": 1.0}})
    changes += diagnoser.observe(record)
    return [c.alert for c in changes if c.raised and c.alert.kind == "eval_in_train_mode"]


def test_an_lstm_without_dropout_left_in_train_mode_raises_nothing() -> None:
    """The near miss: eval() would change nothing that ran (the LBFGS LSTM of issue 18)."""
    model = LstmModel()
    record = evaluate(model, train_mode=True)
    assert record["train_mode_forwards"] == 1  # it did run in training mode ...
    assert record["sensitive_train_forwards"] == 0  # ... where it makes no difference
    assert record["dropout_train_calls"] == 0
    assert diagnose(model, record) == []


def test_an_lstm_with_dropout_left_in_train_mode_is_an_error() -> None:
    model = LstmModel(dropout=0.2)
    record = evaluate(model, train_mode=True)
    assert record["sensitive_train_forwards"] == 1
    [alert] = diagnose(model, record)
    assert alert.severity == "error"
    assert alert.evidence["sensitive_forwards_in_train_mode"] == 1
    assert alert.evidence["dropout_or_batchnorm_modules"] == 1
    assert "functional_dropout_calls" not in alert.evidence


def test_an_lstm_with_dropout_in_eval_mode_raises_nothing() -> None:
    model = LstmModel(dropout=0.2)
    record = evaluate(model, train_mode=False)
    assert record["train_mode_forwards"] == record["sensitive_train_forwards"] == 0
    assert diagnose(model, record) == []


def test_functional_dropout_survives_eval_and_is_raised() -> None:
    model = LstmModel(functional_p=0.3)
    record = evaluate(model, train_mode=False)  # model.eval() was called
    assert record["train_mode_forwards"] == 0
    assert record["dropout_train_calls"] == 1
    [alert] = diagnose(model, record)
    assert alert.severity == "error"
    assert alert.evidence["functional_dropout_calls"] == 1
    assert "training=self.training" in alert.evidence["fix"]


class PoliteDropout(LstmModel):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(F.dropout(out[:, -1], 0.3, training=self.training))


def test_functional_dropout_that_follows_the_mode_is_not_raised() -> None:
    model = PoliteDropout()
    record = evaluate(model, train_mode=False)
    assert record["dropout_train_calls"] == 0
    assert diagnose(model, record) == []


def test_dropout_functions_are_restored_after_the_evaluation() -> None:
    original = F.dropout
    scope = EvalScope([nn.Linear(2, 2)], 0)
    assert F.dropout is not original  # wrapped while it is open
    wrapper = F.dropout
    scope.remove_hooks()
    scope.remove_hooks()  # idempotent
    assert F.dropout is original
    again = EvalScope([nn.Linear(2, 2)], 0)
    assert F.dropout is wrapper  # the same wrapper each time: a compiled eval is not rebuilt
    again.remove_hooks()
    assert F.dropout is original


def test_dropout_outside_an_evaluation_is_not_counted() -> None:
    scope = EvalScope([nn.Linear(2, 2)], 0)
    scope.remove_hooks()
    F.dropout(torch.ones(4), 0.5)
    assert scope.record()["dropout_train_calls"] == 0


def test_an_older_probes_record_is_judged_as_before() -> None:
    """Run logs of older probes carry no sensitive counts: their rule is unchanged."""
    model = LstmModel()
    record = {
        "kind": "eval",
        "step": 0,
        "scalars": {"val_loss": 0.5},
        "forwards": 1,
        "train_mode_forwards": 1,
        "grad_forwards": 0,
    }
    [alert] = diagnose(model, record)
    assert alert.severity == "warning"
