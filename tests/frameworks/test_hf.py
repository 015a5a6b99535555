"""The Hugging Face Trainer with ``callbacks=[TraintopCallback()]`` and nothing else
changed: a tiny GPT-2 built from a config (no hub), on CPU, through the real Trainer."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
import transformers

from probes.hf import TraintopCallback
from probes.kernel.schema import validation_loss_name
from probes.runtime.measure.layers import map_layers
from tests.collector import (
    Frame,
    FrameCollector,
    diagnose,
    raised_alerts,
    verdicts,
    wait_for_bye,
)

REL_TOL = 1e-5
VOCAB, LENGTH = 64, 16


def tiny_gpt2(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=LENGTH,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def token_data(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=generator)
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def arguments(tmp_path: Any, **overrides: Any) -> Any:
    """TrainingArguments at their defaults, but for size, CPU and no outside reporting."""
    options = {
        "output_dir": str(tmp_path),
        "max_steps": 6,
        "per_device_train_batch_size": 4,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "logging_strategy": "no",
    }
    options.update(overrides)
    return transformers.TrainingArguments(**options)


class OracleTrainer(transformers.Trainer):
    """Records, beside the probe, what a naive computation says: per-layer gradient norms
    just before the Trainer clips, and each micro-batch's training_step loss."""

    def __init__(self, *args: Any, poison_at: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.naive_norms: list[list[float | None]] = []
        self.micro_losses: list[list[float]] = []
        self.poison_at = poison_at
        # Every transformers version clips through its accelerator (4.4x inline in the
        # training loop, later in ``Trainer._clip_grad_norm``): read the norms there.
        clip = self.accelerator.clip_grad_norm_

        def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
            if math.isfinite(max_norm):  # (not the unclipped norm of a run without a clip)
                self.naive_norms.append(self._naive_norms())
            return clip(parameters, max_norm, *args, **kwargs)

        self.accelerator.clip_grad_norm_ = clip_grad_norm_

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        # (``num_items_in_batch`` came in transformers 4.46: passed on only when given)
        if len(self.micro_losses) <= self.state.global_step:
            self.micro_losses.append([])
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.micro_losses[self.state.global_step].append(loss.item())
        return loss

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if self.state.global_step == self.poison_at:
            loss = loss * float("nan")  # a NaN born in this step
        return loss

    def _naive_norms(self) -> list[float | None]:
        layers = map_layers(self.model)
        sums: list[float | None] = [None] * layers.num_layers
        for param, layer in zip(layers.params, layers.param_layer, strict=True):
            if param.grad is not None:
                square = param.grad.double().norm().item() ** 2
                sums[layer] = square + (sums[layer] or 0.0)
        return [None if s is None else math.sqrt(s) for s in sums]


class WaitForMonitor(transformers.TrainerCallback):
    """Holds training until the probe reached the monitor: a run pauses itself (the
    guard, an anomaly step) only when a monitor is there to resume it."""

    def __init__(self, traintop: TraintopCallback) -> None:
        self.traintop = traintop

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        assert self.traintop.probe is not None
        assert self.traintop.probe.sender.connected.wait(10), "the probe never connected"


def train(
    tmp_path: Any,
    collector: FrameCollector,
    *,
    callbacks: list[Any] | None = None,
    poison_at: int | None = None,
    **argument_overrides: Any,
) -> OracleTrainer:
    callback = TraintopCallback(
        address=collector.address, max_steps_per_s=1e9, **argument_overrides.pop("watch", {})
    )
    trainer = OracleTrainer(
        model=tiny_gpt2(),
        args=arguments(tmp_path, **argument_overrides),
        train_dataset=token_data(64),
        eval_dataset=token_data(8, seed=1),
        callbacks=[*(callbacks or []), callback, WaitForMonitor(callback)],
        poison_at=poison_at,
    )
    trainer.traintop = callback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()  # never raises: whatever the probe does, training goes on
    wait_for_bye(collector)
    return trainer


def kinds(frames: list[Frame], kind: str) -> list[Frame]:
    return [f for f in frames if f["kind"] == kind]


def test_accumulated_clipped_run_is_recorded_as_it_trained(
    tmp_path: Any, collector: FrameCollector
) -> None:
    # A max norm under this model's gradient norms, so the clip really cuts.
    trainer = train(
        tmp_path,
        collector,
        gradient_accumulation_steps=4,
        eval_strategy="steps",
        eval_steps=3,
        max_grad_norm=0.1,
        run_name="gpt2-tiny",
    )
    frames = list(collector.frames)
    steps = kinds(frames, "step")
    assert [s["step"] for s in steps] == list(range(6))  # one probe step per update
    assert len(trainer.naive_norms) == 6
    clipped_any = False
    for record, naive, micro in zip(steps, trainer.naive_norms, trainer.micro_losses, strict=True):
        for got, want in zip(record["grad_norms"], naive, strict=True):
            assert want is not None and got is not None
            assert abs(got - want) / want < REL_TOL  # unclipped, every layer, every step
        assert record["clip"]["max_norm"] == 0.1
        clipped_any |= record["clip"]["total_before"] > 0.1
        assert len(micro) == 4
        assert record["scalars"]["loss"] == pytest.approx(sum(micro), rel=1e-6)
        # The rate this update used: the default linear decay from 5e-5 over 6 steps, in
        # both of the Trainer's param groups (with and without weight decay).
        expected_lr = pytest.approx(5e-5 * (1 - record["step"] / 6), rel=1e-9)
        assert record["lr"] == [expected_lr, expected_lr]
    assert clipped_any, "the clip never cut: the test would not tell clipped from unclipped"
    evals = kinds(frames, "eval")
    assert [e["step"] for e in evals] == [3, 6]  # the Trainer's global_step: updates done
    for record in evals:
        assert validation_loss_name(record["scalars"]) == "eval_loss"
        assert record["forwards"] > 0 and record["train_mode_forwards"] == 0
        assert record["grad_forwards"] == 0
    assert raised_alerts(frames) == []  # healthy: nothing raised
    hello = kinds(frames, "hello")[0]
    assert hello["name"] == "gpt2-tiny"  # TrainingArguments.run_name
    assert hello["optimizer"] == "AdamW"  # the one inside accelerate's wrapper
    assert kinds(frames, "bye")[0]["reason"] == "closed"


def test_sgd_at_lr_50_is_caught_exploding_despite_clipping(
    tmp_path: Any, collector: FrameCollector
) -> None:
    train(tmp_path, collector, optim="sgd", learning_rate=50.0, max_steps=8)
    frames = list(collector.frames)
    layers = kinds(frames, "hello")[0]["layers"]
    # The rate far too high is seen at its first sample (updates as large as the
    # weights) and is the root cause: the explosion the Trainer's clipping hid
    # follows it, folded.
    first = raised_alerts(frames)[0]
    assert first.kind == "update_ratio" and "far_too_high" in first.evidence, first.line()
    assert first.severity == "error" and first.step == 0 and first.subject in layers
    # What follows it folds under it: the loss diverging (the explosion the clip hides
    # is named on its own only once it has held half a window, longer than 8 steps)
    folded = diagnose(frames)[1].incidents[first.key].folded
    assert any(name.startswith(("exploding_gradient@", "loss_diverged@")) for name in folded), (
        folded
    )
    steps = kinds(frames, "step")
    # What clipping hid: the update saw norm 1, the gradients had far more.
    assert max(s["clip"]["total_before"] for s in steps) > 20 * steps[0]["clip"]["max_norm"]


class ArmAnomalyBefore(transformers.TrainerCallback):
    """Presses `a` (arms one anomaly step) at the end of the step before ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.traintop: TraintopCallback | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step and self.traintop and self.traintop.probe:
            self.traintop.probe.arm_anomaly()


def test_guard_skip_inside_the_trainer(tmp_path: Any, resuming_collector: FrameCollector) -> None:
    trainer = train(tmp_path, resuming_collector, poison_at=3, watch={"guard": True})
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    alerts = kinds(list(resuming_collector.frames), "alert")
    assert [a["alert"]["kind"] for a in alerts] == ["guard_skipped_update"]
    assert alerts[0]["step"] == 3


def test_anomaly_step_inside_the_trainer(tmp_path: Any, resuming_collector: FrameCollector) -> None:
    arm = ArmAnomalyBefore(3)
    callback = TraintopCallback(address=resuming_collector.address, max_steps_per_s=1e9)
    arm.traintop = callback
    trainer = OracleTrainer(
        model=tiny_gpt2(),
        args=arguments(tmp_path),
        train_dataset=token_data(64),
        callbacks=[arm, callback, WaitForMonitor(callback)],
        poison_at=3,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    wait_for_bye(resuming_collector)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    reports = kinds(list(resuming_collector.frames), "anomaly")
    assert len(reports) == 1
    assert reports[0]["step"] == 3 and reports[0]["outcome"] == "non_finite_backward"
    assert reports[0]["backward_op"] and reports[0]["update_skipped"] and reports[0]["paused"]


def test_training_is_bitwise_the_same_with_and_without_the_callback(
    tmp_path: Any, collector: FrameCollector
) -> None:
    """Accumulation, the Trainer's clipping and evaluation, with and without traintop."""
    options = {
        "gradient_accumulation_steps": 2,
        "max_steps": 4,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "max_grad_norm": 0.1,
    }
    watched = train(tmp_path / "watched", collector, **options)
    bare = OracleTrainer(
        model=tiny_gpt2(),
        args=arguments(tmp_path / "bare", **options),
        train_dataset=token_data(64),
        eval_dataset=token_data(8, seed=1),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare.train()
    assert len(kinds(list(collector.frames), "step")) == 4  # the probe did watch
    for (name, mine), theirs in zip(
        watched.model.named_parameters(), bare.model.parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), f"{name} differs"


def test_a_healthy_run_at_the_trainers_defaults_raises_nothing(
    tmp_path: Any, collector: FrameCollector
) -> None:
    """AdamW at 5e-5 with a linear decay, long enough for the update ratios' samples:
    the LayerNorm gains move by about 1e-6 of their weights a step, as they should at
    a fine-tuning rate (the rule raised "too low" at step 120 before it knew that)."""
    train(tmp_path, collector, max_steps=160, eval_strategy="steps", eval_steps=80)
    frames = list(collector.frames)
    assert len([s for s in kinds(frames, "step") if "update_ratios" in s]) >= 3
    # No warning or error; an info note may say the probe's own cost (on this tiny
    # model's ~13 ms step the probe with its sender thread is about 5%, on a quiet
    # machine or not: tests/bench/probe_overhead.py measures it)
    assert [a.line() for a in verdicts(raised_alerts(frames))] == []
