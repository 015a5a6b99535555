"""The benchmark's matrix: the checklist's bugs on every loop shape where they occur.

Each case is one bug on one loop shape (``tests/bench/loop_shapes.py``) on a model in
the style of a public training script (``tests/bench/matrix_models.py``), beside its
healthy twin (the same loop with the one fix). Cases are named ``bug/shape``; what each
must raise is data, ``EXPECTED`` in ``diagnosis_cases.py``, so the kinds still to be
merged can be renamed there in one place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tests.bench import diagnosis_models as m
from tests.bench import loop_shapes as shapes
from tests.bench.diagnosis_cases import EXPECTED, Case, Watch
from tests.bench.matrix_models import (
    GPT,
    EncoderClassifier,
    MnistNet,
    ResidualStack,
    SequenceLSTM,
    WordLM,
)

Batch = tuple[torch.Tensor, torch.Tensor]
Data = tuple[Iterator[Batch], Batch]

GPT_LABEL = "nanoGPT"
WORD_LM = "word LM (LSTM)"
MNIST = "mnist CNN"
SEQUENCE = "LBFGS sequence"
ENCODER = "TransformerEncoder"
RESIDUAL = "residual MLP"

# --- data ------------------------------------------------------------------------------


def text() -> Data:
    tokens = m.markov_text(1280)
    return m.sequences(tokens[:1024], 16), m.lm_batch(tokens[1024:])


def images() -> Data:
    x, y = m.images(1280)
    return m.batches(x[:1024], y[:1024], 32), (x[1024:], y[1024:])


def sines(last_target: str | None = None) -> Data:
    """Standardised noisy sines [128, 20] and the next value at each step, the whole set
    every step (the example trains LBFGS on one full batch); with ``last_target`` only
    the last next value: "flat" [N] or "column" [N, 1]."""
    x, last = m.series(256, length=20, raw_units=False)
    x = x[..., 0]
    y = torch.cat([x[:, 1:], last], dim=1)
    if last_target is not None:
        y = last[:, 0] if last_target == "flat" else last
    return itertools.repeat((x[:128], y[:128])), (x[128:], y[128:])


def token_classes() -> Data:
    """Markov sequences labelled by their first token (mod 4)."""
    tokens = m.markov_text(1280)[:, :12]
    labels = tokens[:, 0] % 4
    return m.batches(tokens[:1024], labels[:1024], 16), (tokens[1024:], labels[1024:])


def last_value_mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out[:, -1:], target)  # [B, 1] against the target as given


def adamw(model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr)


def adadelta(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adadelta(model.parameters(), lr=1.0)  # the mnist example's


def lbfgs(model: nn.Module, lr: float = 0.8) -> torch.optim.Optimizer:
    return torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=5)  # the example: 20


# --- a forgotten zero_grad ------------------------------------------------------------


def missing_zero_grad_plain(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = images()
    model = MnistNet()
    optimizer = adadelta(model)
    with watch(model, optimizer) as probe:
        shapes.plain(probe, model, optimizer, data, F.nll_loss, steps, zero_grad=twin)


def missing_zero_grad_accum(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = GPT()
    optimizer = adamw(model)
    with watch(model, optimizer) as probe:
        shapes.accumulate(probe, model, optimizer, data, m.lm_loss, steps, zero_grad=twin)


def missing_zero_grad_closure(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = sines()
    model = SequenceLSTM()
    optimizer = lbfgs(model)
    with watch(model, optimizer) as probe:
        shapes.closure(probe, model, optimizer, data, F.mse_loss, steps, zero_grad=twin)


def missing_zero_grad_by_hand(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = WordLM()
    with watch(model, None) as probe:
        shapes.by_hand(probe, model, 20.0, data, m.lm_loss, steps, zero_grad=twin)


def missing_zero_grad_amp(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = GPT()
    optimizer = adamw(model)
    with watch(model, optimizer) as probe:
        shapes.amp(probe, model, optimizer, data, m.lm_loss, steps, zero_grad=twin)


def missing_zero_grad_compile(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = images()
    model = MnistNet()
    optimizer = adadelta(model)
    compiled = shapes.compiled(model)
    with watch(compiled, optimizer) as probe:
        shapes.plain(probe, compiled, optimizer, data, F.nll_loss, steps, zero_grad=twin)


# --- a learning rate 600 times too high -----------------------------------------------


def lr_600x(shape: str) -> Callable[[bool, Watch, int], None]:
    def run(twin: bool, watch: Watch, steps: int) -> None:
        scale = 1.0 if twin else 600.0
        if shape == "closure":
            data, _ = sines()
            seq = SequenceLSTM()
            optimizer = lbfgs(seq, 0.8 * scale)
            with watch(seq, optimizer) as probe:
                shapes.closure(probe, seq, optimizer, data, F.mse_loss, steps)
            return
        if shape == "by-hand":
            data, _ = text()
            word = WordLM()
            with watch(word, None) as probe:
                shapes.by_hand(probe, word, 20.0 * scale, data, m.lm_loss, steps)
            return
        data, _ = text()
        gpt = GPT()
        optimizer = adamw(gpt, 1e-3 * scale)
        loops: dict[str, Callable[..., None]] = {
            "plain": shapes.plain,
            "accum": shapes.accumulate,
            "amp": shapes.amp,
        }
        loop = loops[shape]
        with watch(gpt, optimizer) as probe:
            loop(probe, gpt, optimizer, data, m.lm_loss, steps)

    return run


def diverged(shape: str) -> Callable[[bool, Watch, int], None]:
    def run(twin: bool, watch: Watch, steps: int) -> None:
        data, _ = text()
        model = WordLM()
        optimizer = adamw(model, 1e-3 if twin else 20.0)
        loop = shapes.plain if shape == "plain" else shapes.accumulate
        with watch(model, optimizer) as probe:
            loop(probe, model, optimizer, data, m.lm_loss, steps)

    return run


# --- AMP and accumulation -------------------------------------------------------------


def clip_before_unscale(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = GPT()
    optimizer = adamw(model)
    with watch(model, optimizer) as probe:
        shapes.amp(
            probe, model, optimizer, data, m.lm_loss, steps, clip=1.0, unscale_before_clip=twin
        )


def accum_not_divided(with_val: bool) -> Callable[[bool, Watch, int], None]:
    def run(twin: bool, watch: Watch, steps: int) -> None:
        data, val = text()
        model = GPT()
        optimizer = adamw(model)
        with watch(model, optimizer) as probe:
            shapes.accumulate(
                probe,
                model,
                optimizer,
                data,
                m.lm_loss,
                steps,
                divide=twin,
                clip=1.0,
                val=val if with_val else None,
                eval_every=10,
            )

    return run


# --- non-finite values ------------------------------------------------------------------


def nan_in_backward_plain(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = images()
    model = MnistNet(masked=not twin)
    optimizer = adadelta(model)
    with watch(model, optimizer) as probe:
        shapes.plain(probe, model, optimizer, data, F.nll_loss, steps)


def nan_in_backward_accum(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = GPT(masked_block=1, nan_backward=not twin)
    optimizer = adamw(model)
    with watch(model, optimizer) as probe:
        shapes.accumulate(probe, model, optimizer, data, m.lm_loss, steps)


def nan_in_backward_by_hand(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = WordLM(masked=not twin)
    with watch(model, None) as probe:
        shapes.by_hand(probe, model, 20.0, data, m.lm_loss, steps)


def forward_overflow_amp(twin: bool, watch: Watch, steps: int) -> None:
    x, y = m.regression(1024, seed=11)
    model = ResidualStack(hot_block=None if twin else 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        shapes.amp(probe, model, optimizer, m.batches(x, y, 32), F.mse_loss, steps)


# --- evaluation -------------------------------------------------------------------------


def eval_without_eval(shape: str, variant: str = "") -> Callable[[bool, Watch, int], None]:
    def run(twin: bool, watch: Watch, steps: int) -> None:
        if shape == "closure":
            data, val = sines()
            seq = SequenceLSTM(dropout=0.0 if variant == "no-dropout" else 0.2)
            optimizer = lbfgs(seq)
            with watch(seq, optimizer) as probe:
                shapes.closure(
                    probe, seq, optimizer, data, F.mse_loss, steps, val=val, eval_mode=twin
                )
        elif shape == "by-hand":
            data, val = text()
            word = WordLM()
            with watch(word, None) as probe:
                shapes.by_hand(
                    probe, word, 20.0, data, m.lm_loss, steps, val=val, eval_every=10,
                    eval_mode=twin,
                )  # fmt: skip
        elif variant == "lstm-dropout":
            data, val = text()
            word = WordLM(rnn_dropout_only=True)
            optimizer = adamw(word)
            with watch(word, optimizer) as probe:
                shapes.plain(
                    probe, word, optimizer, data, m.lm_loss, steps, val=val, eval_every=10,
                    eval_mode=twin,
                )  # fmt: skip
        else:
            data, val = images()
            cnn = MnistNet()
            optimizer = adadelta(cnn)
            with watch(cnn, optimizer) as probe:
                shapes.plain(
                    probe, cnn, optimizer, data, F.nll_loss, steps, val=val, eval_every=10,
                    eval_mode=twin,
                )  # fmt: skip

    return run


def functional_dropout_in_eval(twin: bool, watch: Watch, steps: int) -> None:
    data, val = token_classes()
    model = EncoderClassifier(functional_dropout=not twin)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as probe:
        shapes.plain(probe, model, optimizer, data, F.cross_entropy, steps, val=val, eval_every=10)


# --- checks that follow the run ---------------------------------------------------------


def unfrozen_not_in_optimizer(shape: str) -> Callable[[bool, Watch, int], None]:
    def run(twin: bool, watch: Watch, steps: int) -> None:
        data, _ = token_classes()
        model = EncoderClassifier()
        for p in model.backbone():
            p.requires_grad_(False)
        optimizer = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()))

        def unfreeze(step: int) -> None:
            if step != steps // 3:
                return
            for p in model.backbone():
                p.requires_grad_(True)
            if twin:  # the fix: the unfrozen parameters join the optimizer
                optimizer.add_param_group({"params": model.backbone(), "lr": 1e-4})

        loop = shapes.plain if shape == "plain" else shapes.accumulate
        with watch(model, optimizer) as probe:
            loop(probe, model, optimizer, data, F.cross_entropy, steps, on_step=unfreeze)

    return run


def per_batch_steplr_plain(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = images()
    model = MnistNet()
    optimizer = adadelta(model)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    with watch(model, optimizer) as probe:
        shapes.plain(
            probe, model, optimizer, data, F.nll_loss, steps, scheduler=scheduler,
            scheduler_every=32 if twin else 1,  # an epoch is 32 batches
        )  # fmt: skip


def per_batch_steplr_by_hand(twin: bool, watch: Watch, steps: int) -> None:
    data, _ = text()
    model = WordLM()
    # lr 2, not the example's 20: on this toy the decoder's update at 20 is 0.5 to 1.0
    # of its weights and the loss stops falling after step 20, so update_ratio (high)
    # is rightly raised on the twin; at 2 its ratios stay in the band (loss 2.62 to 2.55)
    with watch(model, None) as probe:
        shapes.by_hand(probe, model, 2.0, data, m.lm_loss, steps, decay_every=64 if twin else 1)


def mse_broadcast_unchecked(shape: str) -> Callable[[bool, Watch, int], None]:
    def run(twin: bool, watch: Watch, steps: int) -> None:
        data, _ = sines(last_target="column" if twin else "flat")
        model = SequenceLSTM()
        if shape == "closure":
            optimizer = lbfgs(model)
            with watch(model, optimizer) as probe:
                shapes.closure(probe, model, optimizer, data, last_value_mse, steps)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
            with watch(model, optimizer) as probe:
                shapes.plain(probe, model, optimizer, data, last_value_mse, steps)

    return run


# --- the matrix -------------------------------------------------------------------------

KARPATHY = "A. Karpathy, 'A Recipe for Training Neural Networks' (2019)"
RUNS: list[tuple[str, str, str, str, int, Callable[[bool, Watch, int], None]]] = [
    # (bug/shape, model, what breaks, modelled on, steps, run)
    ("missing-zero-grad/plain", MNIST, "no zero_grad (Adadelta)", KARPATHY, 20,
     missing_zero_grad_plain),
    ("missing-zero-grad/accum", GPT_LABEL, "no zero_grad, 4 micro-batches per update",
     "issue 18: silent under accumulation", 20, missing_zero_grad_accum),
    ("missing-zero-grad/closure", SEQUENCE, "no zero_grad in the LBFGS closure",
     "issue 18: only exploding_gradient under LBFGS", 12, missing_zero_grad_closure),
    ("missing-zero-grad/by-hand", WORD_LM, "no model.zero_grad(), p.data.add_ updates",
     "issue 18: nothing raised without an optimizer", 20, missing_zero_grad_by_hand),
    ("missing-zero-grad/amp", GPT_LABEL, "no zero_grad under fp16 autocast + GradScaler",
     KARPATHY, 20, missing_zero_grad_amp),
    ("missing-zero-grad/compile", MNIST, "no zero_grad, torch.compile'd model",
     KARPATHY, 12, missing_zero_grad_compile),
    ("lr-600x/plain", GPT_LABEL, "AdamW lr 0.6 (600x)", "issue 18: seen at step 60 or never",
     40, lr_600x("plain")),
    ("lr-600x/accum", GPT_LABEL, "AdamW lr 0.6 (600x), 4 micro-batches", "issue 18", 30,
     lr_600x("accum")),
    ("lr-600x/closure", SEQUENCE, "LBFGS lr 480 (600x)", "issue 18", 12, lr_600x("closure")),
    ("lr-600x/by-hand", WORD_LM, "hand-written SGD lr 12000 (600x)", "issue 18", 40,
     lr_600x("by-hand")),
    ("lr-600x/amp", GPT_LABEL, "AdamW lr 0.6 (600x) under fp16 + GradScaler", "issue 18", 40,
     lr_600x("amp")),
    ("diverged-adamw-lr20/plain", WORD_LM, "AdamW lr 20: loss 3 -> hundreds, stays",
     "issue 18: 28 steps silent, then vanishing_gradient first", 40, diverged("plain")),
    ("diverged-adamw-lr20/accum", WORD_LM, "AdamW lr 20, 4 micro-batches", "issue 18", 30,
     diverged("accum")),
    ("clip-before-unscale/amp", GPT_LABEL, "clip_grad_norm_ before scaler.unscale_",
     "torch AMP examples: 'unscale_ before clipping'; issue 18", 30, clip_before_unscale),
    ("accum-loss-not-divided/accum", GPT_LABEL, "loss not divided by the 4 micro-batches",
     "nanoGPT's loss / gradient_accumulation_steps; issue 18 (train 4x val)", 60,
     accum_not_divided(True)),
    ("accum-loss-not-divided-no-val/accum", GPT_LABEL, "the same, clip 1.0, no validation",
     "issue 18: clip active 251 of 251 steps", 250, accum_not_divided(False)),
    ("nan-in-backward/plain", MNIST, "torch.where(x > 0, x.sqrt(), 0) after fc1",
     "pytorch/pytorch#68425 (NaN gradient through torch.where)", 12, nan_in_backward_plain),
    ("nan-in-backward/accum", GPT_LABEL, "masked sqrt in block 1's MLP", "pytorch#68425", 12,
     nan_in_backward_accum),
    ("nan-in-backward/by-hand", WORD_LM, "masked sqrt on the LSTM's output", "pytorch#68425",
     12, nan_in_backward_by_hand),
    ("forward-overflow/amp", RESIDUAL, "block 4 initialised 1e4 too large, fp16 autocast",
     "issue 18: the producer named only after pressing a", 12, forward_overflow_amp),
    ("eval-without-eval/plain", MNIST, "validation without model.eval() (dropout)",
     KARPATHY, 25, eval_without_eval("plain")),
    ("eval-without-eval/by-hand", WORD_LM, "validation without model.eval() (dropout)",
     KARPATHY, 25, eval_without_eval("by-hand")),
    ("eval-without-eval/closure", SEQUENCE, "validation without model.eval() (dropout)",
     KARPATHY, 10, eval_without_eval("closure")),
    ("eval-without-eval-lstm-dropout/plain", WORD_LM, "no model.eval(); nn.LSTM(dropout=0.2)",
     "issue 18: nn.LSTM's dropout not counted", 25, eval_without_eval("plain", "lstm-dropout")),
    ("eval-without-eval-no-dropout/closure", SEQUENCE, "no model.eval(), nothing mode-sensitive",
     "issue 18: raised on the example's own loop (a near miss)", 10,
     eval_without_eval("closure", "no-dropout")),
    ("functional-dropout-in-eval/plain", ENCODER, "F.dropout(h, 0.3) without training=",
     "issue 18: survives model.eval()", 25, functional_dropout_in_eval),
    ("unfrozen-not-in-optimizer/plain", ENCODER, "backbone unfrozen later, not in Adam",
     "issue 18: optimizer built from filter(requires_grad)", 30,
     unfrozen_not_in_optimizer("plain")),
    ("unfrozen-not-in-optimizer/accum", ENCODER, "the same, 4 micro-batches", "issue 18", 24,
     unfrozen_not_in_optimizer("accum")),
    ("per-batch-steplr/plain", MNIST, "StepLR(1, 0.7) per batch: lr 1e-13 by step 84",
     "issue 18 (the mnist example steps it per epoch)", 160, per_batch_steplr_plain),
    ("per-batch-steplr/by-hand", WORD_LM, "lr /= 4 per batch instead of per epoch",
     "issue 18 (the example anneals per epoch)", 80, per_batch_steplr_by_hand),
    ("mse-broadcast-unchecked/plain", SEQUENCE, "mse_loss([B, 1], [B]), no check_batch",
     "torch's 'Using a target size' UserWarning; issue 18", 40, mse_broadcast_unchecked("plain")),
    ("mse-broadcast-unchecked/closure", SEQUENCE, "the same under LBFGS", "issue 18", 10,
     mse_broadcast_unchecked("closure")),
]  # fmt: skip

MATRIX: list[Case] = [
    Case(
        name,
        model,
        bug,
        source,
        EXPECTED[name].kind,
        EXPECTED[name].subject,
        steps,
        run,
        shape=name.split("/")[1],
    )
    for name, model, bug, source, steps, run in RUNS
]
assert {case.name for case in MATRIX} == set(EXPECTED), "every expectation has its case"
