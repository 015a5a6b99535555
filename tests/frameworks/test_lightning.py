"""Lightning's own Trainer with ``callbacks=[TraintopCallback()]``: a small GRU language
model, on CPU, through ``Trainer.fit``."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from probes.kernel.schema import validation_loss_name
from probes.lightning import TraintopCallback
from probes.runtime.measure.layers import map_layers
from tests.collector import Frame, FrameCollector, diagnose, raised_alerts, wait_for_bye

REL_TOL = 1e-5
VOCAB = 32


class TinyLM(pl.LightningModule):
    """A GRU language model that records, beside the probe, the naive per-layer norms
    before Lightning clips and each micro-batch's loss."""

    def __init__(
        self,
        *,
        optimizer: str = "adam",
        lr: float = 1e-2,
        poison_at: int | None = None,
        recurrent: bool = True,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 16)
        # A GRU saturates: its gradients stay bounded however far the loss diverges.
        self.rnn = (
            nn.GRU(16, 16, batch_first=True)
            if recurrent
            else nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
        )
        self.head = nn.Linear(16, VOCAB)
        self.recurrent = recurrent
        self.optimizer_name, self.lr, self.poison_at = optimizer, lr, poison_at
        self.naive_norms: list[list[float | None]] = []
        self.micro_losses: dict[int, list[float]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.rnn(self.embed(x))
        return self.head(hidden[0] if self.recurrent else hidden)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.micro_losses.setdefault(self.trainer.global_step, []).append(loss.item())
        if self.trainer.global_step == self.poison_at:
            loss = loss * float("nan")
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten()))

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        layers = map_layers(self)
        sums: list[float | None] = [None] * layers.num_layers
        for param, layer in zip(layers.params, layers.param_layer, strict=True):
            if param.grad is not None:
                sums[layer] = param.grad.double().norm().item() ** 2 + (sums[layer] or 0.0)
        self.naive_norms.append([None if s is None else math.sqrt(s) for s in sums])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr)
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (256, 13), generator=generator)
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    return DataLoader(data, batch_size=8), DataLoader(data, batch_size=64)


class WaitForMonitor(pl.Callback):
    """Holds training until the probe reached the monitor: a run pauses itself (the
    guard, an anomaly step) only when a monitor is there to resume it."""

    def __init__(self, traintop: TraintopCallback) -> None:
        self.traintop = traintop

    def on_train_start(self, *args: Any) -> None:
        assert self.traintop.probe is not None
        assert self.traintop.probe.sender.connected.wait(10), "the probe never connected"


def fit(
    module: TinyLM,
    collector: FrameCollector,
    *,
    callbacks: list[Any] | None = None,
    watch: dict[str, Any] | None = None,
    **trainer_options: Any,
) -> TraintopCallback:
    callback = TraintopCallback(address=collector.address, max_steps_per_s=1e9, **(watch or {}))
    options = {
        "max_steps": 6,
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 2,
        "limit_val_batches": 1,
    }
    options.update(trainer_options)
    trainer = pl.Trainer(
        callbacks=[*(callbacks or []), callback, WaitForMonitor(callback)], **options
    )
    train, val = loaders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train, val)  # never raises: whatever the probe does
    wait_for_bye(collector)
    return callback


def kinds(frames: list[Frame], kind: str) -> list[Frame]:
    return [f for f in frames if f["kind"] == kind]


def test_accumulated_clipped_run_is_recorded_as_it_trained(collector: FrameCollector) -> None:
    module = TinyLM()
    fit(module, collector, accumulate_grad_batches=4, gradient_clip_val=0.05, val_check_interval=12)
    frames = list(collector.frames)
    steps = kinds(frames, "step")
    assert [s["step"] for s in steps] == list(range(6))  # one probe step per update
    assert len(module.naive_norms) == 6
    for record, naive in zip(steps, module.naive_norms, strict=True):
        for got, want in zip(record["grad_norms"], naive, strict=True):
            assert want is not None and got is not None
            assert abs(got - want) / want < REL_TOL  # unclipped, every layer, every step
        assert record["clip"]["max_norm"] == 0.05
        assert record["clip"]["total_before"] > 0.05  # the clip really cut
        micro = module.micro_losses[record["step"]]
        assert len(micro) == 4
        # Lightning divides each micro-batch loss by 4: the update used their mean.
        assert record["scalars"]["loss"] == pytest.approx(sum(micro) / 4, rel=1e-6)
    evals = kinds(frames, "eval")  # every 12 batches = 3 updates; not the sanity check
    assert [e["step"] for e in evals] == [3, 6]  # Lightning's global_step: updates done
    for record in evals:
        assert validation_loss_name(record["scalars"]) == "val_loss"
        assert record["forwards"] == 1 and record["train_mode_forwards"] == 0
        assert record["grad_forwards"] == 0
    assert raised_alerts(frames) == []
    assert kinds(frames, "bye")[0]["reason"] == "closed"


def test_sgd_at_lr_50_is_caught_exploding_despite_clipping(collector: FrameCollector) -> None:
    fit(
        TinyLM(optimizer="sgd", lr=50.0, recurrent=False),
        collector,
        gradient_clip_val=1.0,
        max_steps=8,
        limit_val_batches=0,
    )
    frames = list(collector.frames)
    layers = kinds(frames, "hello")[0]["layers"]
    # The rate far too high is seen at its first sample (updates as large as the
    # weights) and is the root cause: the explosion Lightning's clipping hid follows
    # it, folded.
    first = raised_alerts(frames)[0]
    assert first.kind == "update_ratio" and "far_too_high" in first.evidence, first.line()
    assert first.severity == "error" and first.step == 0 and first.subject in layers
    folded = diagnose(frames)[1].incidents[first.key].folded
    assert any(name.startswith("exploding_gradient@") for name in folded), folded
    assert max(s["clip"]["total_before"] for s in kinds(frames, "step")) > 20


def test_guard_skip_inside_lightning(resuming_collector: FrameCollector) -> None:
    module = TinyLM(poison_at=3)
    fit(module, resuming_collector, watch={"guard": True}, limit_val_batches=0)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    frames = list(resuming_collector.frames)
    alerts = kinds(frames, "alert")
    assert [a["alert"]["kind"] for a in alerts] == ["guard_skipped_update"]
    assert alerts[0]["step"] == 3
    assert any(e.get("name") == "paused" for e in kinds(frames, "event"))


class ArmAnomalyBefore(pl.Callback):
    """Presses `a` (arms one anomaly step) after the update before ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        traintop = next(c for c in trainer.callbacks if isinstance(c, TraintopCallback))
        if trainer.global_step == self.step and traintop.probe is not None:
            traintop.probe.arm_anomaly()


def test_anomaly_step_inside_lightning(resuming_collector: FrameCollector) -> None:
    module = TinyLM(poison_at=3)
    fit(module, resuming_collector, callbacks=[ArmAnomalyBefore(3)], limit_val_batches=0)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    reports = kinds(list(resuming_collector.frames), "anomaly")
    assert len(reports) == 1
    assert reports[0]["step"] == 3 and reports[0]["outcome"] == "non_finite_backward"
    assert reports[0]["backward_op"] and reports[0]["update_skipped"] and reports[0]["paused"]


def test_an_exception_in_training_is_the_runs_end(collector: FrameCollector) -> None:
    class Failing(TinyLM):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 2:
                raise ValueError("bad batch")
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="bad batch"):
        fit(Failing(), collector, limit_val_batches=0)
    wait_for_bye(collector)
    assert kinds(list(collector.frames), "bye")[0]["reason"] == "error: ValueError: bad batch"


# --- several optimizers under manual optimization (issue 18 item 8) ---------------------


class ManualGan(pl.LightningModule):
    """A GAN under manual optimization: two optimizers, toggled, training_step returns
    nothing (its loss is what manual_backward was given)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.g = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.d = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real = batch[0].float()[:, :4] / VOCAB
        opt_g, opt_d = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        fake = self.g(torch.randn_like(real))
        self.toggle_optimizer(opt_g)
        g_loss = bce(self.d(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        d_loss = bce(self.d(real), ones) + bce(self.d(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.losses.append(g_loss.item() + d_loss.item())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.g.parameters(), lr=1e-3),
            torch.optim.Adam(self.d.parameters(), lr=1e-3),
        ]


def test_a_manual_optimization_gan_is_watched_with_both_optimizers_and_its_loss(
    collector: FrameCollector,
) -> None:
    module = ManualGan()
    fit(module, collector, max_steps=8)  # 4 batches: 2 optimizer steps each
    frames = list(collector.frames)
    hello = kinds(frames, "hello")[0]
    assert hello["optimizer"] == "Adam"  # both
    assert kinds(frames, "alert") == []  # no params_not_in_optimizer on D's
    steps = kinds(frames, "step")
    assert [s["step"] for s in steps] == [0, 1, 2, 3]  # one a batch
    assert [s["scalars"]["loss"] for s in steps] == pytest.approx(module.losses, rel=REL_TOL)
    for record in steps:
        assert all(g is not None and g > 0 for g in record["grad_norms"])  # G's and D's
        assert len(record["lr"]) == 2
    assert not [a for a in raised_alerts(frames) if a.kind == "exploding_gradient"]
