"""Pre-training batch checks: check_batch's loss contracts, overfit_batch on a tiny batch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

import probes
from probes.checks.batch_checks import check_batch
from probes.checks.reports import CheckReport, Finding
from probes.checks.tiny_batch import overfit_batch
from tests.collector import FrameCollector

B = 8  # batch size
C = 3  # classes


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread (and threads fight on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def only(report: CheckReport, kind: str) -> Finding:
    found = [f for f in report.findings if f.kind == kind]
    assert len(found) == 1, f"expected one {kind}, got:\n{report}"
    return found[0]


def inputs(seed: int = 0, size: int = B, features: int = 4) -> torch.Tensor:
    return torch.randn(size, features, generator=torch.Generator().manual_seed(seed))


def class_targets(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, C, (B,), generator=torch.Generator().manual_seed(seed))


def linear(out: int = 1, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(4, out)


# --- check_batch: regression ---------------------------------------------------------------


def test_mse_column_outputs_against_flat_targets_broadcast() -> None:
    report = check_batch(linear(1), (inputs(), torch.randn(B)), nn.MSELoss())

    assert report.kinds == ["broadcast_in_loss"]
    finding = report.findings[0]
    assert finding.severity == "error"
    assert finding.evidence == {"outputs": [B, 1], "targets": [B], "broadcast": [B, B]}
    assert not report.ok


def test_mse_with_matching_shapes_is_clean() -> None:
    report = check_batch(linear(1), (inputs(), torch.randn(B, 1)), nn.MSELoss())

    assert report.findings == []
    assert report.ok
    assert isinstance(report.summary["loss"], float)


def test_reduction_none_is_not_a_scalar_loss() -> None:
    report = check_batch(linear(1), (inputs(), torch.randn(B, 1)), nn.MSELoss(reduction="none"))

    assert report.kinds == ["loss_not_scalar"]
    assert report.findings[0].severity == "error"
    assert report.summary["loss"] == [B, 1]


def test_reduction_sum_is_info_only() -> None:
    report = check_batch(linear(1), (inputs(), torch.randn(B, 1)), nn.MSELoss(reduction="sum"))

    assert report.kinds == ["sum_reduction"]
    assert report.findings[0].severity == "info"
    assert report.ok


def test_nan_in_inputs() -> None:
    x = inputs()
    x[2, 1] = float("nan")

    report = check_batch(linear(1), (x, torch.randn(B, 1)), nn.MSELoss())

    finding = only(report, "non_finite_inputs")
    assert finding.severity == "error"
    assert finding.evidence == {"non_finite": 1, "elements": B * 4}
    assert report.kinds[0] == "non_finite_inputs"
    assert not report.ok


# --- check_batch: classification ---------------------------------------------------------


def test_softmax_outputs_into_cross_entropy() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, C), nn.Softmax(dim=1))

    report = check_batch(model, (inputs(), class_targets()), nn.CrossEntropyLoss())

    assert report.kinds == ["probabilities_into_logit_loss"]
    assert report.findings[0].severity == "error"


def test_float_targets_for_cross_entropy() -> None:
    targets = class_targets().float()  # [B] float: class indices in the wrong dtype

    report = check_batch(linear(C), (inputs(), targets), nn.CrossEntropyLoss())

    assert report.kinds == ["float_targets_for_classification"]
    assert report.findings[0].severity == "error"


def test_soft_float_targets_of_the_outputs_shape_are_accepted() -> None:
    probabilities = torch.softmax(inputs(seed=3, features=C), dim=1)

    report = check_batch(linear(C), (inputs(), probabilities), nn.CrossEntropyLoss())

    assert report.findings == []


def test_class_index_out_of_range() -> None:
    targets = class_targets()
    targets[5] = C  # one past the last class

    report = check_batch(linear(C), (inputs(), targets), nn.CrossEntropyLoss())

    finding = only(report, "target_out_of_range")
    assert finding.severity == "error"
    assert finding.evidence["classes"] == C
    assert finding.evidence["max"] == C
    assert report.kinds == ["target_out_of_range"]  # the loss's own error not doubled


def test_cross_entropy_on_logits_with_int64_targets_is_clean() -> None:
    report = check_batch(linear(C), (inputs(), class_targets()), nn.CrossEntropyLoss())

    assert report.findings == []
    assert report.ok


def test_nll_loss_on_raw_logits() -> None:
    report = check_batch(linear(C), (inputs(), class_targets()), nn.NLLLoss())

    assert report.kinds == ["logits_into_nll_loss"]
    assert report.findings[0].severity == "error"


def test_nll_loss_on_log_softmax_is_clean() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, C), nn.LogSoftmax(dim=1))

    report = check_batch(model, (inputs(), class_targets()), nn.NLLLoss())

    assert report.findings == []


# --- check_batch: binary -----------------------------------------------------------------


def binary_targets() -> torch.Tensor:
    return torch.randint(0, 2, (B, 1), generator=torch.Generator().manual_seed(2)).float()


def wide_logits_model() -> nn.Module:
    """Outputs well outside [0, 1]."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.mul_(10.0)
    return model


def test_bce_loss_on_logits() -> None:
    model = wide_logits_model()
    outputs = model(inputs())
    assert float(outputs.min()) < 0 or float(outputs.max()) > 1

    report = check_batch(model, (inputs(), binary_targets()), nn.BCELoss())

    assert report.kinds == ["bce_given_logits"]
    assert report.findings[0].severity == "error"


def test_bce_with_logits_on_sigmoid_outputs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())

    report = check_batch(model, (inputs(), binary_targets()), nn.BCEWithLogitsLoss())

    assert report.kinds == ["bce_with_logits_given_probabilities"]
    assert report.findings[0].severity == "warning"
    assert not report.ok


def test_bce_with_logits_on_logits_is_clean() -> None:
    report = check_batch(wide_logits_model(), (inputs(), binary_targets()), nn.BCEWithLogitsLoss())

    assert report.findings == []
    assert report.ok


# --- check_batch leaves the model as it was ----------------------------------------------


def bn_dropout_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 1)
    )


def set_mode(model: nn.Sequential, mode: str) -> None:
    if mode == "train":
        model.train()
    elif mode == "eval":
        model.eval()
    else:  # mixed: training, with batch norm frozen
        model.train()
        model[1].eval()


@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_check_batch_leaves_model_untouched(mode: str) -> None:
    model = bn_dropout_model()
    with torch.no_grad():  # move the running statistics off their initial values
        model.train()
        model(inputs(seed=9, size=32))
    set_mode(model, mode)
    model[0].weight.grad = torch.full_like(model[0].weight, 0.25)  # set before
    modes = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    assert int(model[1].num_batches_tracked) == 1

    report = check_batch(model, (inputs(), torch.randn(B, 1)), nn.MSELoss())

    assert report.findings == []
    assert [m.training for m in model.modules()] == modes
    after = model.state_dict()
    assert set(after) == set(state)
    for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
        assert torch.equal(after[name], state[name]), name
    for name, value in state.items():
        assert torch.equal(after[name], value), name
    for param, before in zip(model.parameters(), grads, strict=True):
        if before is None:
            assert param.grad is None
        else:
            assert param.grad is not None
            assert torch.equal(param.grad, before)


# --- overfit_batch -----------------------------------------------------------------------


def regression_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return torch.randn(B, 4, generator=generator), torch.randn(B, 1, generator=generator)


def small_mlp(dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(4, 32), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(32, 1))
    return nn.Sequential(*layers)


class HeadOnBody(nn.Module):
    """body: an MLP to one feature; head: an affine map of it. detach=True cuts the
    gradient path to the body, leaving an affine map of a fixed random feature."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
        self.head = nn.Linear(1, 1)
        self.detach = detach

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.body(x)
        return self.head(features.detach() if self.detach else features)


def test_overfit_small_mlp_succeeds() -> None:
    report = overfit_batch(small_mlp(), regression_batch(), nn.MSELoss())

    assert report.ok, report
    assert report.findings == []
    summary = report.summary
    assert summary["goal"] == pytest.approx(0.05 * summary["first_loss"])
    assert summary["last_loss"] <= summary["goal"]
    assert summary["steps"] == 300
    assert summary["curve"][0] == summary["first_loss"]


def test_overfit_with_dropout_succeeds_because_dropout_is_off_in_the_copy() -> None:
    model = small_mlp(dropout=0.5)
    model.train()

    report = overfit_batch(model, regression_batch(), nn.MSELoss())

    assert report.ok, report
    assert report.summary["last_loss"] <= report.summary["goal"]
    assert model[2].training  # the original's dropout is still on


def test_overfit_fails_when_the_gradient_path_is_broken() -> None:
    x, y = regression_batch()
    broken = HeadOnBody(detach=True)
    # The head alone (an affine map of the fixed feature) cannot fit the targets: its
    # least-squares optimum stays above the default goal.
    with torch.no_grad():
        feature = broken.body(x).numpy().astype(np.float64)
        first = float(nn.functional.mse_loss(broken(x), y))
    design = np.hstack([feature, np.ones_like(feature)])
    coef, *_ = np.linalg.lstsq(design, y.numpy().astype(np.float64), rcond=None)
    best_head_only = float(np.mean((design @ coef - y.numpy()) ** 2))
    assert best_head_only > 0.05 * first

    report = overfit_batch(broken, (x, y), nn.MSELoss())

    assert report.kinds == ["cannot_overfit"]
    finding = report.findings[0]
    assert finding.severity == "error"
    assert finding.evidence["last_loss"] > finding.evidence["goal"]
    assert finding.evidence["first_loss"] == pytest.approx(first, rel=1e-5)
    assert not report.ok

    # The same model with the gradient path intact does overfit.
    assert overfit_batch(HeadOnBody(detach=False), (x, y), nn.MSELoss()).ok


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_overfit_leaves_the_original_model_untouched(mode: str) -> None:
    model = small_mlp(dropout=0.5)
    model.train() if mode == "train" else model.eval()
    modes = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}

    report = overfit_batch(model, regression_batch(), nn.MSELoss())

    assert report.summary["last_loss"] < report.summary["first_loss"]  # the copy trained
    after = model.state_dict()
    assert set(after) == set(state)
    for name, value in state.items():
        assert torch.equal(after[name], value), name
    assert [m.training for m in model.modules()] == modes
    assert all(p.grad is None for p in model.parameters())


def test_overfit_honours_a_custom_optimizer() -> None:
    made: list[torch.optim.Optimizer] = []

    def frozen_sgd(params: object) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(params, lr=0.0)  # type: ignore[arg-type]
        made.append(optimizer)
        return optimizer

    report = overfit_batch(
        small_mlp(), regression_batch(), nn.MSELoss(), optimizer=frozen_sgd, steps=20
    )

    assert len(made) == 1
    assert report.kinds == ["cannot_overfit"]
    assert report.summary["last_loss"] == report.summary["first_loss"]
    assert report.summary["steps"] == 20


def test_overfit_explicit_target_is_the_goal() -> None:
    report = overfit_batch(small_mlp(), regression_batch(), nn.MSELoss(), steps=3, target=1e-12)

    assert report.summary["goal"] == 1e-12
    assert report.kinds == ["cannot_overfit"]


def test_overfit_zero_steps_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="steps"):
        overfit_batch(small_mlp(), regression_batch(), nn.MSELoss(), steps=0)


# --- with a probe ------------------------------------------------------------------------


def test_overfit_streams_its_curve_and_reports_to_the_monitor(collector: FrameCollector) -> None:
    model = small_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with probes.watch(model, optimizer, address=collector.address) as probe:
        report = overfit_batch(model, regression_batch(), nn.MSELoss(), steps=100, probe=probe)

    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    events = collector.kinds("event")
    curve = [f for f in events if f["name"] == "overfit_batch"]
    assert len(curve) == 50  # every other step of 100
    assert [f["at"] for f in curve] == list(range(0, 100, 2))
    assert all(isinstance(f["loss"], float) for f in curve)
    assert curve[0]["loss"] == pytest.approx(report.summary["first_loss"])
    assert curve[-1]["loss"] < curve[0]["loss"]
    reports = [f for f in events if f["name"] == "check_report"]
    assert len(reports) == 1
    assert reports[0]["check"] == "overfit_batch"
    assert reports[0]["ok"] is True
    assert report.ok, report
    assert collector.kinds("alert") == []
