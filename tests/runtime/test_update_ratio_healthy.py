"""Update ratios of healthy runs (issue 29): ``update_ratio`` judges what an optimizer
is (an adaptive optimizer's first update moves every weight by the rate) and a ratio
that stays out of the band, not one early step that falls by itself. Two healthy runs
of well-known scripts, shrunk, watched through a real probe for 1,000 updates or more,
raise nothing; a learning rate far too high for SGD and for
Adam, one whose ratios stay high, is still ``update_ratio``."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.collector import FrameCollector, diagnose, verdicts, wait_for_bye, watch_unthinned

Frame = dict[str, Any]


def frames_of(collector: FrameCollector) -> list[Frame]:
    wait_for_bye(collector)
    return [f for f in collector.frames if f["kind"] in ("hello", "step", "eval")]


def losses(frames: list[Frame]) -> list[float]:
    return [f["scalars"]["loss"] for f in frames if f["kind"] == "step"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def kinds(frames: list[Frame]) -> list[str]:
    alerts, _ = diagnose(frames)
    return [f"{a.kind}@{a.step}" for a in verdicts(alerts)]


# --- (a) time_sequence_prediction: LBFGS on a sine-predicting LSTM -------------------------


class SineLSTM(nn.Module):
    """time_sequence_prediction's Sequence (two LSTMCells, a linear head a time step),
    shrunk: 8 hidden units, float64 as the example."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)
        self.hidden = hidden

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        h1 = c1 = h2 = c2 = series.new_zeros(series.shape[0], self.hidden)
        outputs = []
        for x in series.split(1, dim=1):
            h1, c1 = self.lstm1(x, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


def sine_data(n: int = 8, length: int = 10, period: float = 4.0) -> torch.Tensor:
    """The example's sines: shifted by random phases, one full batch."""
    generator = torch.Generator().manual_seed(0)
    shift = torch.randint(-16, 16, (n, 1), generator=generator)
    return torch.sin((torch.arange(length) + shift).double() / period)


def lbfgs_run(collector: FrameCollector, steps: int, lr: float = 0.8) -> list[Frame]:
    torch.manual_seed(0)
    data = sine_data()
    x, y = data[:, :-1], data[:, 1:]
    model = SineLSTM().double()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=20)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with watch_unthinned(model, optimizer, collector) as probe:
        for _ in range(steps):
            with probe.step():
                loss = optimizer.step(closure)
                probe.log(loss=loss)
    return frames_of(collector)


# --- (b) mnist_forward_forward: Adam at lr 0.03, one per layer --------------------------------


def forward_forward_run(collector: FrameCollector, steps: int, lr: float = 0.03) -> list[Frame]:
    """Forward-forward's layer-local training: each Linear+ReLU layer has its own Adam
    and its own goodness loss (positive data's goodness above a threshold, negative
    data's below), its input detached from the layer before."""
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(512, 256), nn.Linear(256, 256)])
    optimizers = [torch.optim.Adam(layer.parameters(), lr=lr) for layer in layers]
    teacher = torch.randn(512, 4)
    x = torch.randn(2048, 512)
    label = (x @ teacher).argmax(1)
    wrong = (label + torch.randint(1, 4, label.shape)) % 4

    def with_label(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        marked = inputs.clone()
        marked[:, :4] = F.one_hot(labels, 4).float() * inputs.abs().max()
        return marked

    threshold = 2.0
    with watch_unthinned(layers, optimizers, collector) as probe:
        for i in range(steps):
            at = i * 64 % 2048
            pos = with_label(x[at : at + 64], label[at : at + 64])
            neg = with_label(x[at : at + 64], wrong[at : at + 64])
            with probe.step():
                total = torch.zeros(())
                for layer, optimizer in zip(layers, optimizers, strict=True):
                    pos = pos / (pos.norm(dim=1, keepdim=True) + 1e-4)
                    neg = neg / (neg.norm(dim=1, keepdim=True) + 1e-4)
                    g_pos = F.relu(layer(pos)).pow(2).mean(1)
                    g_neg = F.relu(layer(neg)).pow(2).mean(1)
                    loss = F.softplus(torch.cat([threshold - g_pos, g_neg - threshold])).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    total += loss.detach()
                    pos, neg = F.relu(layer(pos)).detach(), F.relu(layer(neg)).detach()
                probe.log(loss=total)
    return frames_of(collector)


@pytest.mark.slow  # 1,000 updates through a real probe (~6 s); the healthy bench runs it too
def test_forward_forward_adam_at_lr_0_03_raises_nothing(collector: FrameCollector) -> None:
    """mnist_forward_forward (Adam lr 0.03 a layer), shrunk. Before: an ``update_ratio``
    error at step 0 on both layers (Adam's first updates are the rate itself in every
    coordinate), the ratios below 0.09 from step 5."""
    frames = forward_forward_run(collector, 500)  # two optimizers: 1,000 updates
    loss = losses(frames)
    assert mean(loss[-50:]) < 0.8 * mean(loss[:10])
    assert kinds(frames) == []


# --- (c) word_language_model: an LSTM LM updated by hand at lr 20, clip 0.25 ---------------


class WordLSTM(nn.Module):
    """word_language_model's RNNModel (LSTM, two layers), shrunk."""

    def __init__(self, vocab: int = 16, dim: int = 32) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, 2, batch_first=True)
        self.decoder = nn.Linear(dim, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.encoder(tokens))
        return self.decoder(out)


def learnable_text(length: int = 20000, vocab: int = 16) -> torch.Tensor:
    """Tokens from a fixed random walk over the vocabulary (each token's successor
    drawn from a few): learnable, so the loss falls well below log(vocab)."""
    generator = torch.Generator().manual_seed(0)
    successors = torch.randint(0, vocab, (vocab, 2), generator=generator)
    picks = torch.randint(0, 2, (length,), generator=generator)
    tokens = [0]
    for pick in picks[1:].tolist():
        tokens.append(int(successors[tokens[-1], pick]))
    return torch.tensor(tokens)


def by_hand_run(collector: FrameCollector, steps: int, lr: float = 20.0) -> list[Frame]:
    torch.manual_seed(0)
    text = learnable_text()
    model = WordLSTM()
    batch, bptt = 16, 20
    with watch_unthinned(model, None, collector) as probe:
        for _ in range(steps):
            starts = torch.randint(0, len(text) - bptt - 1, (batch,))
            window = torch.stack([text[s : s + bptt + 1] for s in starts.tolist()])
            with probe.step():
                model.zero_grad()
                logits = model(window[:, :-1])
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1)
                )
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                for p in model.parameters():
                    if p.grad is not None:
                        p.data.add_(p.grad, alpha=-lr)
                probe.log(loss=loss)
    return frames_of(collector)


@pytest.mark.slow  # 1,000 updates through a real probe (~6 s); the healthy bench runs it too
def test_an_lstm_lm_updated_by_hand_at_lr_20_raises_nothing(collector: FrameCollector) -> None:
    """word_language_model (SGD by hand at lr 20, clip 0.25), shrunk. Before: an
    ``update_ratio`` warning on the decoder while the loss falls."""
    frames = by_hand_run(collector, 1000)
    loss = losses(frames)
    assert mean(loss[-50:]) < 0.7 * math.log(16)
    assert kinds(frames) == []


# --- the bug the rule is for: a rate far too high, whose ratios stay high ------------------


def mlp_run(collector: FrameCollector, optimizer_name: str, lr: float, steps: int) -> list[Frame]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)
    )
    teacher = torch.randn(20, 4)
    x = torch.randn(2048, 20)
    y = (x @ teacher).argmax(1)
    optimizer: torch.optim.Optimizer = getattr(torch.optim, optimizer_name)(
        model.parameters(), lr=lr
    )
    with watch_unthinned(model, optimizer, collector) as probe:
        for i in range(steps):
            at = i * 64 % 2048
            with probe.step():
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x[at : at + 64]), y[at : at + 64])
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
    return frames_of(collector)


def test_sgd_at_a_rate_far_too_high_is_still_named(collector: FrameCollector) -> None:
    frames = mlp_run(collector, "SGD", 30.0, 60)
    alerts, _ = diagnose(frames)
    assert alerts and alerts[0].kind == "update_ratio"
    assert (alerts[0].step, alerts[0].severity) == (0, "error")


def test_adam_at_a_rate_far_too_high_is_still_named(collector: FrameCollector) -> None:
    """Adam at lr 3 on a small MLP: its first update replaces the weights (0.9 and up)."""
    frames = mlp_run(collector, "Adam", 3.0, 60)
    alerts, _ = diagnose(frames)
    assert alerts and alerts[0].kind == "update_ratio"
    assert (alerts[0].step, alerts[0].severity) == (0, "error")


def test_near_miss_sgd_ratios_that_stay_high_while_the_loss_stays_are_named() -> None:
    """The band's high side, when the ratio stays (a rate too high keeps it there) and
    the loss does not fall: a warning after its streak (fed as records)."""
    from tests.kernel.test_first_steps import Run, gpt_run, info

    _, alert = Run(gpt_run(100, [0.14] * 4, [4.9] * 100), info("SGD")).first("update_ratio")
    assert (alert.step, alert.severity, alert.evidence["side"]) == (40, "warning", "high")


def test_near_miss_high_ratios_while_the_loss_halves_are_the_rate_s_size() -> None:
    from tests.kernel.test_first_steps import Run, gpt_run, info

    losses = [4.9 * 0.99**n for n in range(100)]
    assert Run(gpt_run(100, [0.14] * 4, losses), info("SGD")).kinds() == []


def test_near_miss_a_ratio_falling_by_itself_is_a_transient() -> None:
    """An SGD head at 0.9, 0.5, 0.3, 0.2 ... with the loss flat: no streak holds."""
    from tests.kernel.test_first_steps import LAYERS, Run, info, sampled, step

    ratios = {0: 0.9, 20: 0.5, 40: 0.3, 60: 0.2, 80: 0.09, 100: 0.05}
    records = [
        sampled(n, [1e-3, 1e-3, 1e-3, ratios[n]], loss=4.9) if n in ratios else step(n, loss=4.9)
        for n in range(120)
    ]
    assert "update_ratio" not in Run(records, info("SGD", LAYERS)).kinds()


def test_lbfgs_blown_up_in_one_step_is_still_named(collector: FrameCollector) -> None:
    """LBFGS at 600x the example's rate: weights of norm ~1e12 after one step."""
    frames = lbfgs_run(collector, 3, lr=480.0)
    alerts, _ = diagnose(frames)
    assert alerts and alerts[0].kind == "update_ratio"
    assert (alerts[0].step, alerts[0].severity, alerts[0].subject) == (0, "error", "lstm1")


@pytest.mark.slow  # 1,000 updates through a real probe (~6 s); the healthy bench runs it too
def test_lbfgs_time_sequence_prediction_raises_nothing(collector: FrameCollector) -> None:
    """time_sequence_prediction's LBFGS (lr 0.8, 20 iterations a step), four times the
    example's 15 steps. Its first step moves the LSTM by 0.2 to 0.8 of its weights (a
    line search sized by the curvature), and once converged it takes no step at all
    (its tolerances). Before: ``update_ratio`` (error) at step 0, then
    ``updates_not_applied`` at step 39."""
    frames = lbfgs_run(collector, 60)
    steps = [f for f in frames if f["kind"] == "step"]
    assert "old_dirs" in (steps[0].get("optimizer_state") or [])  # what it is, from its state
    loss = losses(frames)
    assert mean(loss[-10:]) < 0.01 * mean(loss[:3])
    assert kinds(frames) == []
