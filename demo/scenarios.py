"""The scenarios: each builds a model, an optimizer and data that show one failure mode.

Each builder's docstring says the bug, the evidence to look for on screen, and the fix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import probes
from demo.catalog import JOB_SCENARIOS, SCENARIOS
from demo.data import Split, shuffled, teacher_classification, teacher_regression
from demo.scenarios_resources import RESOURCE_BUILDERS
from demo.setups import Setup, mlp


def healthy(fixed: bool = False) -> Setup:
    """A small MLP learns a smooth synthetic function with Adam at a sane learning rate.

    Evidence: train and validation loss fall together to the noise floor; gradient
    norms settle; no alert. This is the baseline every other scenario departs from.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    return Setup(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(), train, val, steps=1500
    )


def exploding(fixed: bool = False) -> Setup:
    """Plain SGD with a learning rate far too high (0.7 where 0.05 learns).

    Evidence: per-layer gradient norms climb step after step, past 100, until they
    and the loss are non-finite. Fix (``--fixed``): lr 0.05.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    lr = 0.05 if fixed else 0.7
    return Setup(
        model,
        torch.optim.SGD(model.parameters(), lr=lr),
        nn.MSELoss(),
        train,
        val,
        steps=200,
        watch_delay=0.1,
    )


class LogComplement(nn.Module):
    """-log(1 - p): softplus written the textbook way. In float32, p = sigmoid(z)
    rounds to exactly 1 once z passes about 17, and log(0) = -inf."""

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        return -torch.log(1 - p)


def nan_forward(fixed: bool = False) -> Setup:
    """The model predicts softplus(z) as -log(1 - sigmoid(z)); the targets (16 to 20)
    push the score z up until sigmoid(z) rounds to 1 and the log is of 0.

    Evidence: after about 50 steps the loss turns inf and the guard (on in this demo)
    skips the update and pauses. Press a: the anomaly step's report names
    ``log_complement`` as the first module whose output is non-finite while its input
    was finite (anomaly mode alone blames a backward op, SigmoidBackward0). Fix
    (``--fixed``): ``nn.Softplus()``, which is computed stably.
    """
    train, val = teacher_regression(2048, 512)
    head: list[tuple[str, nn.Module]] = (
        [("softplus", nn.Softplus())]
        if fixed
        else [("prob", nn.Sigmoid()), ("log_complement", LogComplement())]
    )
    model = nn.Sequential(
        OrderedDict(
            [("encoder", nn.Linear(16, 32)), ("act", nn.Tanh()), ("score", nn.Linear(32, 1)), *head]
        )
    )
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-2),
        nn.MSELoss(),
        train,
        val,
        steps=400,
        watch_delay=0.05,
        guard=True,
        target_scale=2.0,
        target_shift=18.0,
    )


class Magnitude(nn.Module):
    """||h|| written by hand. Its forward at h = 0 is a fine 0, but the gradient of
    sqrt at 0 is inf, and inf times the 0 from d(h**2)/dh is NaN."""

    def __init__(self, stable: bool = False) -> None:
        super().__init__()
        self.stable = stable

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.stable:
            return torch.linalg.vector_norm(h, dim=1, keepdim=True)  # gradient 0 at 0
        return torch.sqrt((h**2).sum(dim=1, keepdim=True))


def nan_backward(fixed: bool = False) -> Setup:
    """A feature is the norm of a bias-free tanh layer's output, written as
    sqrt(sum(h**2)); two input rows are all zeros (missing features), so h = 0.

    Evidence: the forward stays finite, yet the gradients turn NaN at the first batch
    that holds a zero row; the guard (on in this demo) skips the update and pauses.
    Press a (or 10a): the report names the backward op PowBackward0 and, from its
    forward traceback, the module ``magnitude``; the forward outputs are all finite.
    Fix (``--fixed``): ``torch.linalg.vector_norm``, whose gradient at 0 is 0.
    """
    train, val = teacher_regression(2048, 512)
    gen = torch.Generator().manual_seed(1)
    zero_rows = torch.randperm(len(train), generator=gen)[:2]
    train.x[zero_rows] = 0.0
    model = nn.Sequential(
        OrderedDict(
            [
                ("encoder", nn.Linear(16, 32, bias=False)),
                ("act", nn.Tanh()),
                ("magnitude", Magnitude(stable=fixed)),
                ("head", nn.Linear(1, 1)),
            ]
        )
    )
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=400,
        watch_delay=0.05,
        guard=True,
    )


def vanishing(fixed: bool = False) -> Setup:
    """Ten Linear+Sigmoid layers: each sigmoid passes back at most a quarter of the
    gradient, so the first layers get 1e-4 to 1e-8 of what the last gets.

    Evidence: the layer table's first rows turn yellow (vanishing) while the last ones
    learn; the loss crawls. Fix (``--fixed``): ReLU instead of Sigmoid, same depth.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 32, 10, activation=nn.ReLU if fixed else nn.Sigmoid)
    return Setup(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(), train, val, steps=600
    )


def overfit(fixed: bool = False) -> Setup:
    """A 256-wide MLP trained on 48 noisy examples, validated on 512.

    Evidence: the training loss keeps falling while the validation loss turns up:
    the two curves diverge on the loss chart; overfitting_signal says it is a signal,
    not proof of its cause. Fix (``--fixed``): 2048 training examples, nothing else.
    """
    train, val = teacher_regression(2048 if fixed else 48, 512, noise=0.3)
    model = mlp(16, 256, 3)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=300,
        batch_size=48 if not fixed else 64,
        eval_every=20,
    )


def flat_loss(fixed: bool = False) -> Setup:
    """A classifier trained on shuffled labels: there is nothing to learn.

    Evidence: after 200 steps the training loss is still where it started (about
    ln 4); flat_loss lists the lesson's next experiments (tiny-batch overfit, gradients
    and a learning-rate change, labels and the loss contract). Fix (``--fixed``): the
    real labels.
    """
    train, val = teacher_classification(2048, 512)
    if not fixed:
        train, val = shuffled(train), shuffled(val, seed=1)
    model = nn.Sequential(nn.Linear(16, 4))
    with torch.no_grad():  # start from uniform predictions: the loss starts at ln 4
        model[0].weight.zero_()
        model[0].bias.zero_()
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-2),
        nn.CrossEntropyLoss(),
        train,
        val,
        steps=500,
    )


def dead_relu(fixed: bool = False) -> Setup:
    """The first hidden layer's bias is initialised to -10: every pre-activation is
    negative, so the ReLU after it outputs exactly zero and passes no gradient.

    Evidence: dead_activations names ``act1`` (zero fraction 1.0) on sampled steps, and
    the layer ``hidden1`` before it shows no gradient. Fix (``--fixed``): bias 0.
    """
    train, val = teacher_regression(2048, 512)
    model = nn.Sequential(
        OrderedDict(
            [
                ("hidden1", nn.Linear(16, 64)),
                ("act1", nn.ReLU()),
                ("hidden2", nn.Linear(64, 64)),
                ("act2", nn.ReLU()),
                ("out", nn.Linear(64, 1)),
            ]
        )
    )
    if not fixed:
        with torch.no_grad():
            model.hidden1.bias.fill_(-10.0)
    return Setup(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(), train, val, steps=300
    )


def no_zero_grad(fixed: bool = False) -> Setup:
    """The loop never calls optimizer.zero_grad(): every backward adds to the last.

    Evidence: grad_not_cleared (the gradient after one optimizer.step() is the same
    tensor, one backward larger, at the next); gradient norms grow step after step.
    Fix (``--fixed``): zero_grad(set_to_none=True) each step.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    return Setup(
        model,
        torch.optim.SGD(model.parameters(), lr=1e-2),
        nn.MSELoss(),
        train,
        val,
        steps=300,
        zero_grad=fixed,
    )


def eval_mode(fixed: bool = False) -> Setup:
    """Validation runs with dropout on (no model.eval()) and with gradient recording
    on (no torch.inference_mode()): two separate mistakes.

    Evidence: eval_in_train_mode (error: the model has dropout, so validation numbers
    are not the model's) and eval_with_grad (memory and time). Fix (``--fixed``):
    model.eval() and torch.inference_mode() around validation.
    """
    train, val = teacher_regression(2048, 512)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Dropout(0.3), nn.Linear(64, 1))
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=200,
        eval_mode=fixed,
        eval_no_grad=fixed,
    )


class Branches(nn.Module):
    """A main path and an auxiliary one whose output is detached: the bug."""

    def __init__(self, detach_aux: bool) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
        self.aux = nn.Linear(16, 1)
        self.detach_aux = detach_aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aux = self.aux(x)
        return self.main(x) + (aux.detach() if self.detach_aux else aux)


def none_grad(fixed: bool = False) -> Setup:
    """An auxiliary branch's output is .detach()-ed before it joins the main path.

    Evidence: none_gradients names ``aux.weight`` and ``aux.bias``: trainable, but their
    .grad stays None; the layer table's ``aux`` row is magenta. Fix (``--fixed``): no
    detach.
    """
    train, val = teacher_regression(2048, 512)
    model = Branches(detach_aux=not fixed)
    return Setup(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(), train, val, steps=200
    )


def leakage(fixed: bool = False) -> Setup:
    """The inputs are standardised with a mean and std computed on train, validation
    and test together, before the split is used.

    Evidence: check_preprocessing (run before training) raises leakage naming the
    statistics: they match all rows, not train. Fix (``--fixed``): statistics from
    train only.
    """
    train, val = teacher_regression(2048, 512)
    gen = torch.Generator().manual_seed(2)
    test_x = torch.randn(512, 16, generator=gen) * 2 + 3  # a test set from elsewhere
    every = torch.cat([train.x, val.x, test_x])
    fitted_on = train.x if fixed else every
    mean, std = fitted_on.mean(dim=0), fitted_on.std(dim=0)

    def standardise(split: Split) -> Split:
        return Split((split.x - mean) / std, split.y)

    def check(setup: Setup, probe: Any) -> None:
        probes.check_preprocessing({"mean": mean, "std": std}, train.x, every, probe=probe)

    model = mlp(16, 64, 2)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        standardise(train),
        standardise(val),
        steps=200,
        before_training=check,
    )


def shape_bug(fixed: bool = False) -> Setup:
    """The model outputs [B, 1]; the targets are [B]. MSELoss broadcasts them to
    [B, B] and compares every output with every target: training 'works', badly.

    Evidence: check_batch (run before training) raises broadcast_in_loss with the
    shapes; the loss stalls near the targets' variance. Fix (``--fixed``): targets of
    shape [B, 1].
    """
    train, val = teacher_regression(2048, 512)
    if not fixed:
        train, val = Split(train.x, train.y.squeeze(1)), Split(val.x, val.y.squeeze(1))

    def check(setup: Setup, probe: Any) -> None:
        batch = (setup.train.x[:64], setup.train.y[:64])
        probes.check_batch(setup.model, batch, setup.loss_fn, probe=probe)

    model = mlp(16, 64, 2)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.MSELoss(),
        train,
        val,
        steps=300,
        before_training=check,
    )


def lr_too_low(fixed: bool = False) -> Setup:
    """Adam at lr 1e-7: every update is about a millionth of the weights.

    Evidence: update_ratio (side low) names the layers: |dw|/|w| near 1e-7, far below
    the usual ~1e-3; the loss barely moves. Fix (``--fixed``): lr 1e-3.
    """
    train, val = teacher_regression(2048, 512)
    model = mlp(16, 64, 2)
    return Setup(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3 if fixed else 1e-7),
        nn.MSELoss(),
        train,
        val,
        steps=300,
    )


BUILDERS: dict[str, Callable[[bool], Setup]] = {
    "healthy": healthy,
    "exploding": exploding,
    "vanishing": vanishing,
    "nan-forward": nan_forward,
    "nan-backward": nan_backward,
    "overfit": overfit,
    "flat-loss": flat_loss,
    "dead-relu": dead_relu,
    "no-zero-grad": no_zero_grad,
    "eval-mode": eval_mode,
    "none-grad": none_grad,
    "leakage": leakage,
    "shape-bug": shape_bug,
    "lr-too-low": lr_too_low,
    **RESOURCE_BUILDERS,
}

assert set(BUILDERS) | JOB_SCENARIOS == set(SCENARIOS), "demo.catalog and demo.scenarios disagree"
