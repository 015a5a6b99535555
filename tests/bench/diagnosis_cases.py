"""The diagnosis benchmark's cases: documented real-world bugs, each with a healthy twin.

Each case is an ordinary training loop (``run(twin, watch, steps)``) on a model that is
not the demo's. ``twin=True`` runs the same loop with the one fix. ``watch`` is
``probes.watch`` bound to the benchmark's monitor. The expected alert kind and the
first failing layer come from how the bug is built (which layer was left out, which
layer's input is dead, ...), not from what traintop says.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import probes
from tests.bench import diagnosis_models as m

Watch = Callable[..., Any]  # probes.watch(model, optimizer, **options) -> Probe
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Case:
    """One documented bug, the alert it must raise, and where."""

    name: str
    model: str  # which model family
    bug: str  # what breaks, in one line
    source: str  # the documented real-world report it is modelled on
    expect: str  # the alert kind
    subject: str  # the first failing layer it must name ("" for the run)
    steps: int
    run: Callable[[bool, Watch, int], None]
    shape: str = "plain"  # the loop's shape (tests/bench/loop_shapes.py)


def train(
    probe: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Iterator[Batch],
    loss_fn: Callable[..., torch.Tensor],
    steps: int,
    *,
    zero_grad: str = "before",
    step_optimizer: bool = True,
    clip: float | None = None,
    val: Batch | None = None,
    eval_every: int = 25,
    eval_mode: bool = True,
    eval_no_grad: bool = True,
) -> None:
    """A plain loop; each keyword is one way to get it wrong."""
    for step in range(steps):
        x, y = next(data)
        with probe.step():
            if zero_grad == "before":
                optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if zero_grad == "after_backward":
                optimizer.zero_grad(set_to_none=True)
            if clip is not None:
                probes.clip_grad_norm_(model.parameters(), clip)
            if step_optimizer:
                optimizer.step()
            probe.log(loss=loss)
        if val is not None and (step % eval_every == 0 or step == steps - 1):
            validate(probe, model, val, loss_fn, eval_mode=eval_mode, no_grad=eval_no_grad)


def validate(
    probe: Any,
    model: nn.Module,
    val: Batch,
    loss_fn: Callable[..., torch.Tensor],
    *,
    eval_mode: bool = True,
    no_grad: bool = True,
) -> None:
    with probe.evaluate():
        if eval_mode:
            model.eval()
        with torch.inference_mode() if no_grad else contextlib.nullcontext():
            loss = loss_fn(model(val[0]), val[1])
        model.train()
        probe.log(val_loss=loss.detach())


def image_data(count: int = 1024) -> tuple[Iterator[Batch], Batch]:
    x, y = m.images(count + 256)
    return m.batches(x[:count], y[:count], 32), (x[count:], y[count:])


def text_data() -> tuple[Iterator[Batch], Batch]:
    tokens = m.markov_text(1280)
    return m.sequences(tokens[:1024], 16), m.lm_batch(tokens[1024:])


# --- data and split ----------------------------------------------------------------------


def duplicate_test_rows(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.images(1280, seed=3)
    train_x, train_y, test_x = x[:1024], y[:1024], x[1024:].clone()
    if not twin:
        test_x[:40] = train_x[:40]  # near-duplicates that hashing would call the same
    model = m.SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        probes.check_split(train_x, test_x, probe=probe)
        train(probe, model, optimizer, m.batches(train_x, train_y, 32), F.cross_entropy, steps)


def shuffled_labels(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.images(4096, classes=10, seed=4)
    if not twin:  # inputs and labels shuffled with two different permutations
        gen = torch.Generator().manual_seed(9)
        x = x[torch.randperm(len(x), generator=gen)]
        y = y[torch.randperm(len(y), generator=gen)]
    model = m.SmallCNN(classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, m.batches(x, y, 32), F.cross_entropy, steps)


# --- shapes, values and the loss contract -------------------------------------------------


def softmax_into_cross_entropy(twin: bool, watch: Watch, steps: int) -> None:
    data, val = image_data()
    model = m.SmallCNN(softmax=not twin)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    with watch(model, optimizer) as probe:
        probes.check_batch(model, next(data), loss_fn, probe=probe)
        train(probe, model, optimizer, data, loss_fn, steps, val=val)


def mse_broadcast(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.regression(2048, seed=5)
    if not twin:
        y = y.squeeze(1)  # [B] targets against [B, 1] outputs
    model = m.deep_mlp(4, nn.ReLU)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    with watch(model, optimizer) as probe:
        data = m.batches(x, y, 64)
        probes.check_batch(model, next(data), loss_fn, probe=probe)
        train(probe, model, optimizer, data, loss_fn, steps)


def nan_from_log_zero(twin: bool, watch: Watch, steps: int) -> None:
    x, labels = m.vectors(2048, seed=6)
    y = labels.float().unsqueeze(1)
    model = m.deep_mlp(3, nn.ReLU, width=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.BCEWithLogitsLoss() if twin else m.textbook_bce
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, m.batches(x * 4, y, 64), loss_fn, steps)


# --- gradient path ------------------------------------------------------------------------


def vanishing_sigmoid_stack(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.regression(2048, seed=7)
    model = m.kaiming_(m.deep_mlp(20, nn.ReLU)) if twin else m.deep_mlp(20, nn.Sigmoid)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, m.batches(x, y, 64), F.mse_loss, steps)


def dead_functional_relu(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.regression(2048, seed=8)
    model = m.FunctionalReluMLP(dead_bias=None if twin else -10.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, m.batches(x, y, 64), F.mse_loss, steps)


def unscaled_inputs_tanh(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.regression(2048, seed=10)
    if not twin:
        x = x * 40 + 100  # features in raw units (a sensor reading around 100), not scaled
    model = m.deep_mlp(6, nn.Tanh, width=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, m.batches(x, y, 64), F.mse_loss, steps)


def detached_positions(twin: bool, watch: Watch, steps: int) -> None:
    data, val = text_data()
    model = m.TinyTransformer(detach_positions=not twin)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, m.lm_loss, steps, val=val)


def zero_grad_before_step(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = image_data()
    model = m.SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with watch(model, optimizer) as probe:
        train(
            probe,
            model,
            optimizer,
            data,
            F.cross_entropy,
            steps,
            zero_grad="before" if twin else "after_backward",
        )


def explosion_under_clipping(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.series(2048, raw_units=not twin)
    model = m.Forecaster()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, m.batches(x, y, 32), F.mse_loss, steps, clip=1.0)


def lr_far_too_high(twin: bool, watch: Watch, steps: int) -> None:
    data, val = image_data()
    model = m.SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 if twin else 30.0)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, F.cross_entropy, steps, val=val)


# --- update --------------------------------------------------------------------------------


def missing_zero_grad(twin: bool, watch: Watch, steps: int) -> None:
    data, val = image_data()
    model = m.SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(
            probe,
            model,
            optimizer,
            data,
            F.cross_entropy,
            steps,
            val=val,
            zero_grad="before" if twin else "never",
        )


def frozen_but_batch_norm(twin: bool, watch: Watch, steps: int) -> None:
    data, val = image_data()
    model = m.SmallCNN()
    if not twin:
        for name, param in model.named_parameters():
            if "bn" not in name:
                param.requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, F.cross_entropy, steps, val=val)


def layer_not_in_optimizer(twin: bool, watch: Watch, steps: int) -> None:
    data, val = text_data()
    model = m.RecurrentLM(cell="gru")
    params = (
        list(model.parameters()) if twin else [*model.embed.parameters(), *model.rnn.parameters()]
    )
    optimizer = torch.optim.Adam(params, lr=3e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, m.lm_loss, steps, val=val)


def stale_optimizer(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text_data()
    model = m.TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if not twin:
        model = copy.deepcopy(model)  # e.g. a restored copy; the optimizer still holds the old
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, m.lm_loss, steps)


def lr_far_too_low(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text_data()
    model = m.TinyTransformer()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 if twin else 1e-7)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, m.lm_loss, steps)


def warmup_never_stepped(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text_data()
    model = m.RecurrentLM(cell="lstm")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    warmup = 50
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / warmup))
    with watch(model, optimizer) as probe:
        for _ in range(steps):
            x, y = next(data)
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                loss = m.lm_loss(model(x), y)
                loss.backward()
                optimizer.step()
                if twin:
                    scheduler.step()  # the bug: never called, so the lr stays lambda(0) = 0
                probe.log(loss=loss)


def no_optimizer_step(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text_data()
    model = m.RecurrentLM(cell="lstm")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, m.lm_loss, steps, step_optimizer=twin)


# --- evaluation ---------------------------------------------------------------------------


def eval_in_train_mode(twin: bool, watch: Watch, steps: int) -> None:
    data, val = image_data()
    model = m.SmallCNN(dropout=0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, F.cross_entropy, steps, val=val, eval_mode=twin)


def eval_with_grad(twin: bool, watch: Watch, steps: int) -> None:
    data, val = text_data()
    model = m.RecurrentLM(cell="gru")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with watch(model, optimizer) as probe:
        train(probe, model, optimizer, data, m.lm_loss, steps, val=val, eval_no_grad=twin)


KARPATHY = (
    "A. Karpathy, 'most common neural net mistakes' (2018) and 'A Recipe for Training "
    "Neural Networks' (2019)"
)

CASES: list[Case] = [
    Case(
        "duplicate-test-rows",
        "CNN+BN",
        "40 test images are copies of training images",
        "Barz & Denzler, 'Do We Train on Test Data? Purging CIFAR of Near-Duplicates' (2020)",
        "duplicates_across_splits",
        "train/val",
        120,
        duplicate_test_rows,
    ),
    Case(
        "shuffled-labels",
        "CNN+BN",
        "images and labels shuffled with two permutations",
        "'Trying to classify MNIST where pixels are shuffled' (cs.stackexchange 78123): "
        "inputs decoupled from labels leave nothing to learn",
        "flat_loss",
        "",
        240,
        shuffled_labels,
    ),
    Case(
        "softmax-into-ce",
        "CNN+BN",
        "the model ends in softmax, the loss is CrossEntropyLoss",
        KARPATHY + " #4: softmaxed outputs to a loss that expects logits",
        "probabilities_into_logit_loss",
        "outputs",
        120,
        softmax_into_cross_entropy,
    ),
    Case(
        "mse-broadcast",
        "MLP 4xReLU",
        "MSELoss on outputs [B, 1] and targets [B]",
        "torch's UserWarning 'Using a target size that is different to the input size', "
        "a frequent forum thread",
        "broadcast_in_loss",
        "targets",
        120,
        mse_broadcast,
    ),
    Case(
        "nan-log-zero",
        "MLP 3xReLU",
        "textbook BCE: log(1 - sigmoid(z)) reaches log(0)",
        "tensorflow/models#181 (hand-written cross-entropy turns NaN), "
        "summerlvsong/Aggregation-Cross-Entropy#2 (torch.log of a 0 probability)",
        "non_finite",
        "loss",
        300,
        nan_from_log_zero,
    ),
    Case(
        "vanishing-sigmoid-20",
        "MLP 20xSigmoid",
        "20 Linear+Sigmoid layers",
        "Glorot & Bengio (2010); the 20-layer run of a traintop bug report "
        "(33 ALERT lines before this diagnosis)",
        "vanishing_gradient",
        "0",
        200,
        vanishing_sigmoid_stack,
    ),
    Case(
        "dead-functional-relu",
        "MLP F.relu",
        "fc1's bias at -10 before F.relu: all dead",
        "Lu et al., 'Dying ReLU and Initialization' (2019); F.relu is invisible to module hooks",
        "dead_activations",
        "fc2(input)",
        160,
        dead_functional_relu,
    ),
    Case(
        "unscaled-inputs-tanh",
        "MLP 6xTanh",
        "features around 100 +- 40 fed unscaled",
        "LeCun et al., 'Efficient BackProp' (1998): unnormalised inputs saturate the first "
        "sigmoid/tanh layer",
        "saturated_activations",
        "1",
        160,
        unscaled_inputs_tanh,
    ),
    Case(
        "detached-positions",
        "transformer",
        "positional embedding .detach()-ed in forward",
        "'.detach()/.data in forward cuts the graph' (PyTorch autograd mechanics notes)",
        "none_gradients",
        "pos",
        120,
        detached_positions,
    ),
    Case(
        "zero-grad-after-backward",
        "CNN+BN",
        "zero_grad() between backward() and step()",
        "Tony-Y/pytorch_warmup#12: 'does not optimize model parameters at all because "
        "optimizer.zero_grad() is called after loss.backward()'",
        "none_gradients",
        "conv1",
        120,
        zero_grad_before_step,
    ),
    Case(
        "explode-under-clipping",
        "LSTM forecaster",
        "series in raw units (~300), MSE, clip_grad_norm_(1.0) keeps it finite",
        "the lesson: clipping can keep one run finite, log the unclipped norm; the many "
        "'LSTM loss huge, forgot to scale the data' threads",
        "exploding_gradient",
        "rnn",
        160,
        explosion_under_clipping,
    ),
    Case(
        "lr-far-too-high",
        "CNN+BN",
        "SGD at lr 30",
        "a traintop bug report's CNN diverging under SGD at lr 30 (also raised "
        "overfitting_signal); the rate is seen at step 0 (updates as large as the "
        "weights), the explosion folds under it",
        "update_ratio",
        "conv1",
        150,
        lr_far_too_high,
    ),
    Case(
        "missing-zero-grad",
        "CNN+BN",
        "optimizer.zero_grad() never called (Adam)",
        KARPATHY + " #3: forgot .zero_grad() before .backward()",
        "grad_not_cleared",
        "",
        120,
        missing_zero_grad,
    ),
    Case(
        "frozen-but-batch-norm",
        "CNN+BN",
        "requires_grad off for all but batch-norm params",
        "discuss.pytorch.org/t/why-if-bn-not-in-name-param-requires-grad-false/114098; "
        "the forum report: the model 'does not learn'",
        "mostly_frozen",
        "",
        260,
        frozen_but_batch_norm,
    ),
    Case(
        "layer-not-in-optimizer",
        "GRU LM",
        "the decoder's parameters left out of Adam",
        "zjunlp/HVPNeT#5 (crf and fc never added to the optimizer), ACEsuit/mace#525",
        "params_not_in_optimizer",
        "head",
        120,
        layer_not_in_optimizer,
    ),
    Case(
        "stale-optimizer",
        "transformer",
        "model deep-copied after the optimizer was built",
        "skorch-dev/skorch#317 (weights don't update after copy.deepcopy), "
        "pytorch/pytorch#14467 (warn when the optimizer's params are not the model's)",
        "optimizer_not_for_model",
        "",
        120,
        stale_optimizer,
    ),
    Case(
        "lr-far-too-low",
        "transformer",
        "Adam at lr 1e-7",
        "the lesson: 'lower (or raise) the learning rate as a controlled experiment'",
        "update_ratio",
        "embed",
        160,
        lr_far_too_low,
    ),
    Case(
        "warmup-never-stepped",
        "LSTM LM",
        "LambdaLR warmup from 0, scheduler.step() missing",
        "huggingface/transformers#1144: the warmup lambda only advances with scheduler.step()",
        "updates_not_applied",
        "embed",
        120,
        warmup_never_stepped,
    ),
    Case(
        "no-optimizer-step",
        "LSTM LM",
        "optimizer.step() missing from the loop",
        "pytorch/text#671 and many forum threads: the loss never moves",
        "no_updates",
        "",
        160,
        no_optimizer_step,
    ),
    Case(
        "eval-in-train-mode",
        "CNN+BN+dropout",
        "validation without model.eval()",
        KARPATHY + " #2: forgot to toggle train/eval mode",
        "eval_in_train_mode",
        "",
        120,
        eval_in_train_mode,
    ),
    Case(
        "eval-with-grad",
        "GRU LM",
        "validation without torch.inference_mode()",
        "the lesson's common mistake: eval() and disabled gradient recording are orthogonal",
        "eval_with_grad",
        "",
        120,
        eval_with_grad,
    ),
]


# --- the matrix's expectations ------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What a matrix case must raise: its kind and first layer (or subject; "" for the
    run). ``kind`` "" means the bug run must raise nothing (a near miss)."""

    kind: str
    subject: str


# Kinds main does not have yet: other helpers of issue 18 add them; the names here are
# the bench's guesses, for the lead to set once they are merged.
PLACEHOLDER_KINDS: dict[str, str] = {}  # every expected kind exists now

# case (bug/shape) -> expectation, from how each bug is built. A subject written as a
# layer ("fc1") also matches a field on that layer ("grad_norm[fc1]").
EXPECTED: dict[str, Expect] = {
    # a forgotten zero_grad, on every shape: the gradients of earlier updates add up
    "missing-zero-grad/plain": Expect("grad_not_cleared", ""),
    "missing-zero-grad/accum": Expect("grad_not_cleared", ""),
    "missing-zero-grad/closure": Expect("grad_not_cleared", ""),
    "missing-zero-grad/by-hand": Expect("grad_not_cleared", ""),
    "missing-zero-grad/amp": Expect("grad_not_cleared", ""),
    "missing-zero-grad/compile": Expect("grad_not_cleared", ""),
    # lr 600x: update/weight ratios near 1 on most layers from step 0; the first layer in
    # model order is named
    "lr-600x/plain": Expect("update_ratio", "transformer.wte"),
    "lr-600x/accum": Expect("update_ratio", "transformer.wte"),
    "lr-600x/closure": Expect("update_ratio", "lstm1"),
    "lr-600x/by-hand": Expect("update_ratio", "encoder"),
    "lr-600x/amp": Expect("update_ratio", "transformer.wte"),
    # AdamW at lr 20 on the LSTM: the loss jumps and stays high (loss_diverged), but the
    # cause shows a step earlier: updates as large as the weights at step 0 (the rate far
    # too high, first layer in model order); the divergence folds under it
    "diverged-adamw-lr20/plain": Expect("update_ratio", "encoder"),
    "diverged-adamw-lr20/accum": Expect("update_ratio", "encoder"),
    # clip_grad_norm_ before scaler.unscale_: the clip sees scaled gradients
    "clip-before-unscale/amp": Expect("grads_still_scaled", ""),
    # accumulation without dividing the loss: train k x val, the clip always active
    "accum-loss-not-divided/accum": Expect("loss_reduction_mismatch", "loss"),
    # ... with no validation: the accumulated passes themselves, each on a mean loss as
    # returned (the clip active on every step is its consequence: the norm holds, the
    # loss falls)
    "accum-loss-not-divided-no-val/accum": Expect("loss_reduction_mismatch", "loss"),
    # NaN born in backward (masked sqrt): the layer nearest the producer, first in
    # backward order (the masked op sits on that layer's output)
    "nan-in-backward/plain": Expect("non_finite", "fc1"),
    "nan-in-backward/accum": Expect("non_finite", "transformer.h.1.mlp.c_fc"),
    "nan-in-backward/by-hand": Expect("non_finite", "rnn"),
    # fp16 forward overflow in the middle of a residual stack: the producer named
    "forward-overflow/amp": Expect("non_finite", "blocks.4"),
    # evaluation without model.eval() on a model with dropout
    "eval-without-eval/plain": Expect("eval_in_train_mode", ""),
    "eval-without-eval/by-hand": Expect("eval_in_train_mode", ""),
    "eval-without-eval/closure": Expect("eval_in_train_mode", ""),
    "eval-without-eval-lstm-dropout/plain": Expect("eval_in_train_mode", ""),
    # ... and on one where model.eval() changes nothing (the example's own loop): silent
    "eval-without-eval-no-dropout/closure": Expect("", ""),
    # F.dropout(h, p) in forward: on in evaluation after model.eval()
    "functional-dropout-in-eval/plain": Expect("eval_in_train_mode", ""),
    # a backbone frozen at the start, unfrozen later, never added to the optimizer
    "unfrozen-not-in-optimizer/plain": Expect("params_not_in_optimizer", "embed"),
    "unfrozen-not-in-optimizer/accum": Expect("params_not_in_optimizer", "embed"),
    # a per-epoch schedule stepped per batch: the LR reaches 1e-13
    # (the first layer in model order whose updates round away)
    "per-batch-steplr/plain": Expect("lr_too_low_to_update", "conv1"),
    "per-batch-steplr/by-hand": Expect("lr_too_low_to_update", "encoder"),
    # mse_loss of [B, 1] outputs against [B] targets (torch warns), no pre-check
    "mse-broadcast-unchecked/plain": Expect("broadcast_in_loss", "loss"),
    "mse-broadcast-unchecked/closure": Expect("broadcast_in_loss", "loss"),
}
