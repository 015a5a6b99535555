"""The first steps count (issue 18, item 2): a learning rate far too high is an error at
the first sampled step that shows it; a loss that jumps and stays high is
``loss_diverged`` within a few steps; a clip active on nearly every step and training
and validation losses a steady factor apart are signals of their own. Each against its
near miss, fed as step and eval records through the diagnoser (as the monitor does)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from probes.kernel.diagnosis import Alert, Diagnoser, RunInfo, Thresholds
from tests.frames import thinned_as_sent

Record = dict[str, Any]
LAYERS = ["wte", "h.0.attn", "h.0.mlp", "lm_head"]


def info(optimizer: str | None = "AdamW", layers: Sequence[str] = LAYERS) -> RunInfo:
    return RunInfo.from_hello({"layers": list(layers), "optimizer": optimizer, "config": {}})


def step(n: int, loss: float = 4.0, grads: Sequence[float] = (0.5, 0.5, 0.5, 0.5), **fields: Any):
    record: Record = {"kind": "step", "step": n, "scalars": {"loss": loss}}
    record["grad_norms"] = list(grads)
    record["grad_norm_total"] = math.sqrt(sum(g * g for g in grads))
    record.update(fields)
    return record


def sampled(n: int, ratios: Sequence[float], **fields: Any) -> Record:
    params = [5.0] * len(ratios)
    return step(n, param_norms=params, update_ratios=list(ratios), **fields)


def evaluation(n: int, val_loss: float) -> Record:
    return {
        "kind": "eval",
        "step": n,
        "scalars": {"val_loss": val_loss},
        "forwards": 4,
        "train_mode_forwards": 0,
        "grad_forwards": 0,
    }


class Run:
    """A diagnoser fed ``records``, then told the run ended: what was raised, at which
    record (the step the monitor knew it), and the incidents with their folds."""

    def __init__(self, records: Iterable[Record], run_info: RunInfo | None = None) -> None:
        self.diagnoser = Diagnoser(run_info or info(), Thresholds())
        self.raised: list[tuple[int, Alert]] = []  # (the record's step, the alert)
        for record in records:
            for change in self.diagnoser.observe(record):
                if change.raised:
                    self.raised.append((record["step"], change.alert))
        self.raised += [(-1, c.alert) for c in self.diagnoser.finish() if c.raised]

    def kinds(self) -> list[str]:
        return [alert.kind for _, alert in self.raised]

    def first(self, kind: str) -> tuple[int, Alert]:
        return next((at, a) for at, a in self.raised if a.kind == kind)

    def folded(self) -> list[str]:
        return [name for a in self.diagnoser.incidents.values() for name in a.folded]


def gpt_run(steps: int, ratios: Sequence[float], losses: Sequence[float] | None = None):
    """A GPT-like run: sampled every 20 steps (step 0 included), gradients moderate."""
    records = []
    for n in range(steps):
        loss = losses[n] if losses is not None else 4.9 - 0.001 * n
        records.append(sampled(n, ratios, loss=loss) if n % 20 == 0 else step(n, loss=loss))
    return records


# --- update ratios near 1: the learning rate far too high, from step 0 ----------------------


def test_ratios_near_one_on_most_layers_are_an_error_at_the_first_sample() -> None:
    """The issue's GPT at lr 0.6 (600x): every layer 0.93 to 0.99 at step 0. Before: one
    ``update_ratio`` warning at step 40 (two samples over 40 steps; measured at 60).
    Now: an error dated step 0, raised within the consequence grace (by step 5)."""
    run = Run(gpt_run(60, [0.93, 0.97, 0.99, 0.95]))
    at, alert = run.first("update_ratio")
    assert (alert.step, alert.severity, alert.subject) == (0, "error", "wte")
    assert at <= 5
    assert alert.evidence["side"] == "high"
    # AdamW's bound on its first update (the rate in every coordinate: issue 29)
    assert alert.evidence["far_too_high"] == ">=0.89 on 4 of 4 layers"
    assert alert.layers == tuple(LAYERS)
    assert run.kinds() == ["update_ratio"]


def test_the_far_too_high_bound_is_lower_for_sgd() -> None:
    run = Run(gpt_run(30, [0.35, 0.4, 0.32, 0.05]), info("SGD"))
    _, alert = run.first("update_ratio")
    assert (alert.step, alert.severity, alert.subject) == (0, "error", "wte")
    assert alert.layers == ("wte", "h.0.attn", "h.0.mlp")


def test_near_miss_one_layer_near_one_of_four_is_the_band_rule_not_an_error() -> None:
    """A head at 0.6 while the rest learn in the band: not most layers, so no error at
    once; the band's streak (two samples over 40 steps) still says high, as a warning."""
    run = Run(gpt_run(60, [1e-3, 1e-3, 1e-3, 0.6]), info("SGD"))
    _, alert = run.first("update_ratio")
    assert (alert.step, alert.severity, alert.subject) == (40, "warning", "lm_head")


def test_near_miss_adam_first_steps_at_its_usual_rate_raise_nothing() -> None:
    """Adam's first updates move each weight by the rate itself: ratios of 0.2 to 0.4 on
    narrow layers at lr 1e-2 are not far too high for it (the adaptive band)."""
    records = gpt_run(80, [1e-3, 2e-3, 1e-3, 3e-3])
    records[0] = sampled(0, [0.4, 0.45, 0.2, 0.35], loss=4.9)
    assert Run(records, info("Adam")).kinds() == []
    assert Run(records, info("SGD")).first("update_ratio")[1].severity == "error"


def test_near_miss_zero_initialised_layers_move_by_their_whole_weight() -> None:
    """Weights all zero before the first update (the flat-loss demo's one layer, a LoRA
    B, a zero-initialised head): |dw|/|w_after| is exactly 1, whatever the rate."""
    records = gpt_run(60, [1e-3, 2e-3, 1e-3, 3e-3])
    records[0] = sampled(0, [1.0, 1.0, 1.0, 2e-3], loss=4.9)
    assert Run(records, info("Adam")).kinds() == []
    records[0] = sampled(0, [1.0, 1.0, 0.97, 0.99], loss=4.9)  # two zero, two far too high
    _, alert = Run(records, info("Adam")).first("update_ratio")
    assert (alert.severity, alert.subject, alert.layers) == ("error", "h.0.mlp", tuple(LAYERS[2:]))


def test_weights_blown_up_in_one_step_are_not_a_zero_initialised_layer() -> None:
    """LBFGS at 600x its rate: the inner iterations of one ``optimizer.step()`` take
    weights of norm ~1 to ~1e12, so |dw|/|w_after| is 1 to six places as for a layer
    that started at zero; the weights' norm after the step tells them apart (before:
    nothing at step 0, then ``exploding_gradient`` at step 1)."""
    records = gpt_run(60, [1e-3, 2e-3, 1e-3, 3e-3])
    records[0] = step(0, param_norms=[7.5e11, 1.1e12, 1.6e12, 2.0], update_ratios=[1.0] * 4)
    _, alert = Run(records, info("LBFGS")).first("update_ratio")
    assert (alert.step, alert.severity, alert.subject) == (0, "error", "wte")
    assert alert.layers == tuple(LAYERS[:3])  # the fourth: weights of norm 2, from zero
    # a quasi-Newton step's bound: an update the size of the weights (LBFGS's line search
    # is sized by the curvature, not by a rate)
    assert alert.evidence["far_too_high"] == ">=0.8 on 3 of 3 layers"


def test_adaptive_optimizers_have_their_own_band() -> None:
    """A healthy CNN under Adadelta at lr 1.0 sits at 0.14: silent; the same under SGD
    is high for SGD's band (a warning after its streak)."""
    for name in ("Adadelta", "Adagrad", "RMSprop", "AdamW", "FusedAdam"):
        assert Run(gpt_run(100, [0.14] * 4), info(name)).kinds() == [], name
    _, alert = Run(gpt_run(100, [0.14] * 4), info("SGD")).first("update_ratio")
    assert (alert.severity, alert.evidence["band"]) == ("warning", "1e-05..0.1")


# --- loss_diverged: a loss that jumps and stays high ------------------------------------------


def lstm_losses(steps: int) -> list[float]:
    """AdamW at lr 20 on an LSTM: 9, then 550 at step 1 and about 1,500 after."""
    return [9.0, 550.0] + [1500.0 + 10 * math.sin(n) for n in range(2, steps)]


def test_a_loss_that_jumps_and_stays_is_loss_diverged_within_a_few_steps() -> None:
    """Before: nothing for 28 steps, then vanishing_gradient (its consequence). Now:
    loss_diverged dated step 3 (three steps high), raised by step 8."""
    records = [step(n, loss=loss) for n, loss in enumerate(lstm_losses(40))]
    run = Run(records)
    at, alert = run.first("loss_diverged")
    assert (alert.step, alert.severity, alert.subject) == (3, "error", "loss")
    assert at <= 8
    assert alert.evidence["first_loss"] == 9.0
    assert alert.evidence["since_step"] == 1
    assert run.kinds() == ["loss_diverged"]


def test_vanishing_gradients_after_a_divergence_fold_under_it() -> None:
    """The measured run's first alert was vanishing_gradient at step 28: a consequence."""
    records = []
    for n, loss in enumerate(lstm_losses(60)):
        grads = (1e-7, 1e-7, 1.0, 1.0) if n >= 8 else (0.5, 0.5, 0.5, 0.5)
        records.append(step(n, loss=loss, grads=grads))
    run = Run(records)
    assert run.kinds() == ["loss_diverged"]
    assert any(name.startswith("vanishing_gradient@") for name in run.folded())


def test_a_divergence_after_an_explosion_folds_under_the_explosion() -> None:
    records = [step(0, loss=2.0, grads=(0.1, 0.1, 0.1, 0.1))]
    records += [step(n, loss=900.0, grads=(500.0, 1.0, 1.0, 1.0)) for n in range(1, 10)]
    run = Run(records)
    assert run.kinds() == ["exploding_gradient"]
    assert any(name.startswith("loss_diverged@") for name in run.folded())


def test_near_miss_a_spike_that_returns_is_not_a_divergence() -> None:
    losses = [9.0, 8.8, 200.0, 8.5, 8.3] + [8.0 - 0.01 * n for n in range(40)]
    run = Run([step(n, loss=loss) for n, loss in enumerate(losses)])
    assert "loss_diverged" not in run.kinds()


def test_near_miss_the_healthy_run_s_early_noise() -> None:
    """A small-batch run: the loss jumps around its trend by up to 2x, never 4x for long."""
    rng = random.Random(3)
    losses = [4.0 * (1 + rng.uniform(-0.5, 1.0)) * (0.99**n) for n in range(300)]
    run = Run([step(n, loss=loss) for n, loss in enumerate(losses)])
    assert run.kinds() == []


def test_near_miss_a_loss_that_goes_negative_has_no_scale() -> None:
    losses = [-5.0] + [-1.0] * 20  # an ELBO going up from a negative start
    assert Run([step(n, loss=loss) for n, loss in enumerate(losses)]).kinds() == []


# --- clip_always_active -----------------------------------------------------------------------


def clipped_run(
    steps: int,
    active: Iterable[bool],
    span: int = 1,
    *,
    norm: Callable[[int], float] = lambda n: 1.0,
    loss: Callable[[int], float] = lambda n: 4.0 * 0.995**n,
) -> list[Record]:
    """Records of ``span`` steps each, every step clipped, ``active`` saying per record
    how many of its steps had an unclipped total above max_norm (all or none); the
    unclipped norm (each of the 4 layers' a half of it) and the loss by step."""
    records = []
    for index, hot in zip(range(0, steps, span), active, strict=False):
        last = index + span - 1
        fields: dict[str, Any] = {"clip_steps": span, "clip_active_steps": span if hot else 0}
        if span > 1:
            fields["span"] = [index, last]
        records.append(step(last, loss=loss(last), grads=[norm(last) / 2] * 4, **fields))
    return records


def growing(n: int) -> float:
    """An unclipped norm that keeps growing under the clip: x4 over 250 steps."""
    return 1.5 * (1 + 3 * n / 250)


def rising(n: int) -> float:
    """An unclipped norm that keeps growing under the clip: x2.45 every 150 steps."""
    return 1.5 * 1.006**n


def flat(n: int) -> float:
    """A loss that came down in its first steps and then no longer improves."""
    return 8.0 if n < 5 else 4.0


def test_a_clip_active_on_every_step_while_the_norm_grows_is_a_signal() -> None:
    """The lesson's case: the clip keeps the run finite while the norm it cuts grows,
    and the loss does not improve for it: raised after the first window."""
    run = Run(clipped_run(251, [True] * 251, norm=growing, loss=flat))
    at, alert = run.first("clip_always_active")
    assert alert.severity == "warning"
    assert 199 <= alert.step <= 205 and at <= 205
    assert alert.evidence["fraction"] == 1.0
    assert alert.evidence["unclipped_norm_to"] >= 2 * alert.evidence["unclipped_norm_from"]
    assert run.kinds() == ["clip_always_active"]


def test_a_norm_that_keeps_growing_past_the_first_window_is_a_signal_while_the_loss_falls() -> None:
    """x2.45 every 150 steps for 500 steps, the loss falling all along: past the run's
    first window the growth alone is the instability the clip hides."""
    run = Run(clipped_run(500, [True] * 500, norm=rising))
    at, alert = run.first("clip_always_active")
    assert 399 <= alert.step <= 405 and at <= 405
    assert alert.evidence["unclipped_norm_to"] >= 2 * alert.evidence["unclipped_norm_from"]


def test_near_miss_a_norm_that_grows_as_the_model_learns_then_holds() -> None:
    """minGPT's sort demo at clip 1.0 (dropout 0.1): its norm grows x5 in its first 150
    steps while its loss falls x4, then holds at ~8 for the rest of 1,000 steps."""
    rng = random.Random(7)
    run = Run(
        clipped_run(
            1000,
            [True] * 1000,
            norm=lambda n: (1.7 + 6.8 * min(n, 150) / 150) * (0.8 + 0.4 * rng.random()),
            loss=lambda n: 0.04 + 0.7 * 0.985**n,
        )
    )
    assert run.kinds() == []


def test_near_miss_a_converged_models_rare_large_batches_under_a_clip() -> None:
    """minGPT's sort demo driven to a loss of 1e-4: norms of 0.02 but for one batch in
    20 at 30 (the clip bounds each). Each is a new start, not one growth held across
    the quiet steps between them (it was: exploding_gradient at the second)."""
    run = Run(
        clipped_run(
            400,
            [n % 20 == 10 for n in range(400)],
            norm=lambda n: 30.0 if n % 20 == 10 and n >= 100 else 0.02,
            loss=lambda n: max(0.9 * 0.9**n, 1e-4),
        )
    )
    assert "exploding_gradient" not in run.kinds()


def test_a_clip_active_on_every_step_while_the_loss_gets_worse_is_a_signal() -> None:
    """The norm holds at 3x the bound, the loss climbs beyond its noise while clipped."""
    rng = random.Random(2)
    run = Run(
        clipped_run(
            260, [True] * 260, norm=lambda n: 3.0, loss=lambda n: 2.0 + n / 200 + rng.random() * 0.1
        )
    )
    _, alert = run.first("clip_always_active")
    assert alert.evidence["loss_to"] > alert.evidence["loss_from"]
    assert 199 <= alert.step <= 260


def test_near_miss_a_clip_below_the_runs_scale_while_it_learns() -> None:
    """A GPT at clip 1.0 (nanoGPT's, minGPT's, the HF Trainer's): above the bound on
    every step, the norm steady, the loss falling: the bound doing its job."""
    rng = random.Random(3)
    run = Run(
        clipped_run(
            1000, [True] * 1000, norm=lambda n: 2.5 + rng.random(), loss=lambda n: 4.0 * 0.999**n
        )
    )
    assert run.kinds() == []


def test_near_miss_a_clip_active_at_the_noise_floor() -> None:
    """A regression at its noise floor, clip 1.0: the loss fell there in its first
    hundreds of steps and then no longer falls, only noise."""
    rng = random.Random(4)
    run = Run(
        clipped_run(
            1000,
            [True] * 1000,
            norm=lambda n: 1.5 + rng.random(),
            loss=lambda n: 0.25 + 2 * 0.99**n + rng.gauss(0, 0.02),
        )
    )
    assert run.kinds() == []


def test_a_clip_always_active_after_a_reduction_mismatch_folds_under_it() -> None:
    records = clipped_run(450, [True] * 450, norm=rising)
    curve = lambda n: 3.0 * 0.998**n + 0.5  # noqa: E731
    for record in records:
        record["scalars"] = {"loss": 4 * curve(record["step"])}
    evals = [evaluation(n, curve(n)) for n in range(49, 450, 50)]
    merged = sorted(records + evals, key=lambda r: (r["step"], r["kind"] == "eval"))
    run = Run(merged)
    assert run.kinds() == ["loss_reduction_mismatch"]
    assert any(name.startswith("clip_always_active@") for name in run.folded())


def test_the_clip_count_holds_for_thinned_records() -> None:
    run = Run(clipped_run(500, [True] * 100, span=5, norm=rising))
    _, alert = run.first("clip_always_active")
    assert 399 <= alert.step <= 410
    assert alert.evidence["clipped_steps"] >= 195


def test_the_thinning_policy_sums_the_clip_counts() -> None:
    """As a 3,000 steps/s run is sent: 50 steps a record, the counts summed (the spec)."""
    sent = thinned_as_sent(clipped_run(500, [n % 4 != 0 for n in range(500)], norm=rising), 50)
    assert len(sent) < 15
    assert sum(r.get("clip_steps", 0) for r in sent) == 500
    assert sum(r.get("clip_active_steps", 0) for r in sent) == 375
    assert Run(sent).kinds() == []  # 75% active: a near miss, at any speed
    sent = thinned_as_sent(clipped_run(500, [True] * 500, norm=rising), 50)
    assert Run(sent).kinds() == ["clip_always_active"]


def test_near_miss_the_healthy_run_clips_now_and_then() -> None:
    """The healthy GPT: 36 of 251 steps clipped by a norm above max_norm."""
    rng = random.Random(1)
    active = [rng.random() < 36 / 251 for _ in range(251)]
    assert Run(clipped_run(251, active, norm=growing)).kinds() == []


def test_near_miss_active_on_nine_steps_in_ten() -> None:
    assert Run(clipped_run(300, [n % 10 != 0 for n in range(300)], norm=growing)).kinds() == []


def test_near_miss_a_run_that_clips_for_fewer_steps_than_the_window() -> None:
    """A healthy start can sit above max_norm for its first tens of steps."""
    assert Run(clipped_run(180, [True] * 180, norm=growing)).kinds() == []


# --- loss_reduction_mismatch: train a steady multiple of validation ---------------------------


def train_and_val(steps: int, train: Any, val: Any, every: int = 50) -> list[Record]:
    records: list[Record] = []
    for n in range(steps):
        records.append(step(n, loss=train(n)))
        if n % every == every - 1:
            records.append(evaluation(n, val(n)))
    return records


def test_train_four_times_validation_on_every_evaluation_is_a_reduction_mismatch() -> None:
    """Four micro-batches whose losses are summed, not averaged: train 4.0x val."""
    curve = lambda n: 3.0 * 0.998**n + 0.5  # noqa: E731
    run = Run(train_and_val(400, lambda n: 4 * curve(n), curve))
    _, alert = run.first("loss_reduction_mismatch")
    assert alert.severity == "warning"
    assert alert.step == 149  # the third evaluation
    assert alert.evidence["nearest_whole"] == 4
    assert 3.5 < alert.evidence["train_over_val"] < 4.5
    assert run.kinds() == ["loss_reduction_mismatch"]


def test_near_miss_ordinary_overfitting_train_below_val_and_a_growing_gap() -> None:
    run = Run(train_and_val(400, lambda n: 2.0 * 0.99**n + 0.01, lambda n: 1.0 + n / 400))
    assert "loss_reduction_mismatch" not in run.kinds()


def test_near_miss_the_healthy_run_train_and_val_close() -> None:
    curve = lambda n: 2.0 * 0.995**n + 0.3  # noqa: E731
    for train, val in ((curve, curve), (curve, lambda n: 1.1 * curve(n))):
        assert Run(train_and_val(400, train, val)).kinds() == []


def test_near_miss_dropout_train_somewhat_above_val() -> None:
    curve = lambda n: 2.0 * 0.995**n + 0.3  # noqa: E731
    assert Run(train_and_val(400, lambda n: 1.4 * curve(n), curve)).kinds() == []


def test_near_miss_a_ratio_that_is_not_steady() -> None:
    """Early on, the smoothed train loss trails a fast fall: high once, then close."""
    ratios = {49: 3.0, 99: 2.2, 149: 5.0, 199: 2.1}
    curve = lambda n: 2.0 * 0.99**n + 0.3  # noqa: E731
    run = Run(train_and_val(250, curve, lambda n: curve(n) / ratios.get(n, 1.0)))
    assert "loss_reduction_mismatch" not in run.kinds()


# --- the measured case, in a real loop: accumulation without dividing the loss ---------------


def accumulating_run(collector: Any, divide: bool, steps: int = 60) -> list[Record]:
    """Four micro-batches an update, the clip at 1.0, an evaluation every 15 steps; the
    bug leaves each micro-batch's loss undivided (the update sees 4x the loss)."""
    import torch
    from torch import nn

    from tests.collector import wait_for_bye, watch_unthinned

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    teacher = torch.randn(16, 4)
    x, xv = torch.randn(4096, 16), torch.randn(512, 16)
    y, yv = (x @ teacher).argmax(1), (xv @ teacher).argmax(1)
    with watch_unthinned(model, optimizer, collector) as probe:
        for i in range(steps):
            with probe.step():
                optimizer.zero_grad(set_to_none=True)
                total = torch.zeros(())
                for k in range(4):
                    at = (i * 4 + k) * 16 % 4096
                    loss = nn.functional.cross_entropy(model(x[at : at + 16]), y[at : at + 16])
                    loss = loss / 4 if divide else loss
                    loss.backward()
                    total = total + loss.detach()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                probe.log(loss=total)
            if i % 15 == 14:
                with probe.evaluate():
                    model.eval()
                    with torch.inference_mode():
                        probe.log(val_loss=nn.functional.cross_entropy(model(xv), yv))
                    model.train()
    wait_for_bye(collector)
    return [f for f in collector.frames if f["kind"] in ("hello", "step", "eval")]


def test_an_undivided_accumulated_loss_is_a_reduction_mismatch(
    collector: Any,
) -> None:
    frames = accumulating_run(collector, divide=False)
    steps = [f for f in frames if f["kind"] == "step"]
    assert sum(f.get("clip_active_steps", 0) for f in steps) >= 57  # of 60 clipped
    run = Run([f for f in frames if f["kind"] != "hello"], RunInfo.from_hello(frames[0]))
    # at the third update: the passes themselves, before any evaluation could say it
    assert run.kinds() == ["loss_reduction_mismatch"]
    _, alert = run.first("loss_reduction_mismatch")
    assert alert.step == 2 and alert.evidence["backward_passes"] == 4


def test_near_miss_the_same_loop_dividing_the_loss(collector: Any) -> None:
    frames = accumulating_run(collector, divide=True)
    steps = [f for f in frames if f["kind"] == "step"]
    assert sum(f.get("clip_steps", 0) for f in steps) == 60
    run = Run([f for f in frames if f["kind"] != "hello"], RunInfo.from_hello(frames[0]))
    assert run.kinds() == []
