"""The probe's behaviour around a training loop: hooks, records, failures, the sender."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

import probes
from probes.kernel.wire import resolve_address
from probes.runtime.link.sender import Sender
from probes.runtime.optimizers.optimizer_hooks import OptimizerHooks
from tests.collector import Frame, FrameCollector, wait_for_bye, watch_unthinned
from tests.waiting import wait_until

# --- helpers ---------------------------------------------------------------------------


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def batch(seed: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 8, generator=generator)
    y = torch.randint(0, 3, (size,), generator=generator)
    return x, y


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> torch.Tensor:
    x, y = batch(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def traintop_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("traintop:")]


def params_snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def changed(before: list[torch.Tensor], model: nn.Module) -> bool:
    return any(
        not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters(), strict=True)
    )


# --- hooks and closing -----------------------------------------------------------------


def test_close_removes_every_hook() -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert len(optimizer._optimizer_step_pre_hooks) == 0
    probe = probes.watch(model, optimizer)
    # one pre-hook (the gradients, guard, and the update check's versions) and one
    # post-hook (the update check, the clearing watch's note)
    assert len(optimizer._optimizer_step_pre_hooks) == 1
    assert len(optimizer._optimizer_step_post_hooks) == 1
    for i in range(3):
        with probe.step():
            probe.log(loss=train_step(model, optimizer, i))

    # one pre-hook for the probe's life: where the model is entered (the step's phases)
    assert len(model._forward_pre_hooks) == 1
    with probe.evaluate():
        assert len(model._forward_pre_hooks) == 2
        with torch.no_grad():
            model(batch(99)[0])
    assert len(model._forward_pre_hooks) == 1

    probe.close()
    assert probe.closed
    assert len(optimizer._optimizer_step_pre_hooks) == 0
    assert len(optimizer._optimizer_step_post_hooks) == 0
    assert len(model._forward_pre_hooks) == 0
    assert not probe.sender.alive

    probe.close()  # a second close is a no-op
    assert probe.closed
    assert len(optimizer._optimizer_step_pre_hooks) == 0

    # The closed probe stays out of the way of further training.
    before = params_snapshot(model)
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 7))
    with probe.evaluate():
        model(batch(8)[0])
    assert changed(before, model)
    assert len(model._forward_pre_hooks) == 0
    assert len(optimizer._optimizer_step_pre_hooks) == 0


def test_closing_inside_a_sampled_step_removes_the_measurers_hook_too() -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, optimizer)
    probe.begin_step()  # step 0 is sampled: its update is measured after optimizer.step()
    assert len(optimizer._optimizer_step_post_hooks) == 2
    probe.close()
    assert len(optimizer._optimizer_step_pre_hooks) == 0
    assert len(optimizer._optimizer_step_post_hooks) == 0


def test_the_optimizer_hooks_owner_removes_a_hook_its_caller_left() -> None:
    optimizer = torch.optim.SGD(mlp().parameters(), lr=0.1)
    hooks = OptimizerHooks(optimizer, on_error=lambda exc: None)
    hooks.add_post_hook(lambda opt, args, kwargs: None)
    second = hooks.add_post_hook(lambda opt, args, kwargs: None)  # one at a time
    assert len(optimizer._optimizer_step_post_hooks) == 1
    second.remove()  # its caller's removal, then the owner's: both fine
    hooks.add_post_hook(lambda opt, args, kwargs: None)
    hooks.remove()
    assert len(optimizer._optimizer_step_post_hooks) == 0


def test_context_manager_closes(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with probes.watch(model, optimizer, address=collector.address) as probe:
        assert not probe.closed
        with probe.step():
            probe.log(loss=train_step(model, optimizer, 0))
    assert probe.closed
    assert len(optimizer._optimizer_step_pre_hooks) == 0
    assert not probe.sender.alive
    wait_for_bye(collector)
    assert [f["step"] for f in collector.kinds("step")] == [0]


def test_training_without_monitor_finishes_and_closes_fast() -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    probe = probes.watch(model, optimizer)  # the autouse fixture's address: nobody there
    first = last = None
    for i in range(200):
        with probe.step():
            loss = train_step(model, optimizer, i % 4)
            probe.log(loss=loss)
        if i == 0:
            first = loss.item()
        last = loss.item()
    assert probe.step_index == 199
    assert first is not None and last is not None and last < first
    assert not probe.sender.connected.is_set()

    started = time.monotonic()
    probe.close()
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"close() took {elapsed:.2f} s with no monitor"
    assert not probe.sender.alive


# --- log() ---------------------------------------------------------------------------


def test_log_accepts_floats_ints_and_one_element_tensors(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    expected_loss = []
    for i in range(2):
        with probe.step():
            loss = train_step(model, optimizer, i)
            assert loss.requires_grad and loss.dim() == 0
            weight = torch.tensor(2.5, requires_grad=True)
            probe.log(
                acc=0.75,
                count=3,
                weight=weight * 2,
                loss=loss,
                single=torch.tensor([4.0]),
                n_int=torch.tensor(7),
            )
            expected_loss.append(loss.item())
    probe.close()
    wait_for_bye(collector)

    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 1]
    for frame, loss in zip(steps, expected_loss, strict=True):
        scalars = frame["scalars"]
        assert next(iter(scalars)) == "loss"
        assert set(scalars) == {"loss", "acc", "count", "weight", "single", "n_int"}
        assert scalars["loss"] == pytest.approx(loss, rel=1e-6)
        assert scalars["acc"] == 0.75
        assert scalars["count"] == 3
        assert scalars["weight"] == pytest.approx(5.0)
        assert scalars["single"] == pytest.approx(4.0)
        assert scalars["n_int"] == pytest.approx(7.0)


@pytest.mark.parametrize(
    "bad", [torch.ones(3), "high", torch.zeros(2, 2)], ids=["vector", "string", "matrix"]
)
def test_a_bad_logged_value_is_dropped_with_one_warning(
    bad: object, collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 0))
    before = params_snapshot(model)
    with probe.step():
        loss = train_step(model, optimizer, 1)
        probe.log(loss=loss, bad=bad)  # must not raise
    for i in range(2, 6):  # training goes on, and so does the measuring
        with probe.step():
            probe.log(loss=train_step(model, optimizer, i), bad=bad)
        probe.log(bad=bad)
        with probe.evaluate():
            probe.log(bad=bad, val_loss=0.5)
    assert changed(before, model)
    probe.close()
    wait_for_bye(collector)

    lines = traintop_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines  # one warning for the name, not one per call
    assert lines[0].startswith("traintop: log(bad=...) takes a float or a one-element tensor")
    assert not [f for f in collector.kinds("event") if f["name"] == "probe_error"]
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == list(range(6))
    assert all("bad" not in f["scalars"] and "loss" in f["scalars"] for f in steps)
    evals = collector.kinds("eval")
    assert [f["step"] for f in evals] == [3, 4, 5, 6]  # one per evaluate block, none lost
    assert all(f["scalars"] == {"val_loss": 0.5} for f in evals)


def test_log_after_step_block_attaches_to_that_step(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    losses = []
    for i in range(3):
        with probe.step():
            loss = train_step(model, optimizer, i)
            probe.log(acc=0.5 + i)
        probe.log(loss=loss, tokens=100 * i)
        losses.append(loss.item())
    probe.close()
    wait_for_bye(collector)

    steps = {f["step"]: f for f in collector.kinds("step")}
    assert sorted(steps) == [0, 1, 2]
    for i in range(3):
        scalars = steps[i]["scalars"]
        assert next(iter(scalars)) == "loss"
        assert scalars["loss"] == pytest.approx(losses[i], rel=1e-6)
        assert scalars["acc"] == 0.5 + i
        assert scalars["tokens"] == 100 * i


def test_loss_logged_after_an_evaluate_block_still_attaches_to_the_step(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    with probe.step():
        loss = train_step(model, optimizer, 0)
    with probe.evaluate():
        probe.log(val_loss=0.25)
    probe.log(loss=loss)
    probe.close()
    wait_for_bye(collector)
    [record] = collector.kinds("step")
    assert record["scalars"]["loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert collector.kinds("eval")[0]["scalars"] == {"val_loss": 0.25}
    assert "traintop:" not in capsys.readouterr().err


def test_log_before_first_step_is_ignored_with_a_warning(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    probe.log(loss=1.0)
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 0))
    probe.close()
    wait_for_bye(collector)
    lines = traintop_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "before the first step" in lines[0]
    assert [f["step"] for f in collector.kinds("step")] == [0]


# --- step records ----------------------------------------------------------------------


def test_step_records_carry_index_time_duration_lr_and_norms(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "lr": 0.1},
            {"params": model[2].parameters(), "lr": 0.01},
        ],
        momentum=0.9,
    )
    probe = watch_unthinned(model, optimizer, collector)
    expected_lrs = []
    started = time.time()
    for i in range(5):
        with probe.step():
            for group, base in zip(optimizer.param_groups, (0.1, 0.01), strict=True):
                group["lr"] = base * 0.5**i
            probe.log(loss=train_step(model, optimizer, i))
        expected_lrs.append([g["lr"] for g in optimizer.param_groups])
    probe.close()
    ended = time.time()
    wait_for_bye(collector)

    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 1, 2, 3, 4]
    times = [f["time"] for f in steps]
    assert times == sorted(times)
    for frame, lrs in zip(steps, expected_lrs, strict=True):
        assert started <= frame["time"] <= ended
        assert frame["duration"] > 0
        assert frame["lr"] == pytest.approx(lrs)
        assert len(frame["lr"]) == 2
        assert isinstance(frame["grad_norm_total"], float)
        assert math.isfinite(frame["grad_norm_total"]) and frame["grad_norm_total"] > 0
        assert frame["none_grads"] == 0
        assert len(frame["grad_norms"]) == 2  # two Linear layers
        assert frame["dropped"] == 0
        assert frame["run"] == probe.run_id
    hello = collector.kinds("hello")[0]
    assert hello["layers"] == ["0", "2"]
    assert hello["param_counts"] == [8 * 16 + 16, 16 * 3 + 3]
    assert hello["optimizer"] == "SGD"


def test_tensor_learning_rate_is_reported(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.02), foreach=False)
    probe = watch_unthinned(model, optimizer, collector)
    for i in range(2):
        with probe.step():
            probe.log(loss=train_step(model, optimizer, i))
    probe.close()
    wait_for_bye(collector)
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 1]
    for frame in steps:
        assert frame["lr"] == [pytest.approx(0.02)]
        assert "lr/0" not in frame["scalars"]


def test_every_two_records_only_even_steps(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector, every=2)
    for i in range(7):
        with probe.step():
            train_step(model, optimizer, i)
            probe.log(index=i)
    probe.close()
    wait_for_bye(collector)
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 2, 4, 6]
    assert [f["scalars"]["index"] for f in steps] == [0, 2, 4, 6]
    assert traintop_lines(capsys.readouterr().err) == []


def test_every_two_with_loss_logged_after_the_block(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    # Logging after the block on a step that is not measured must be quietly ignored:
    # it is neither "before the first step" nor an error.
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector, every=2)
    for i in range(5):
        with probe.step():
            loss = train_step(model, optimizer, i)
        probe.log(loss=loss, index=i)
    probe.close()
    wait_for_bye(collector)
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 2, 4]
    assert [f["scalars"]["index"] for f in steps] == [0, 2, 4]
    assert traintop_lines(capsys.readouterr().err) == []


def test_step_index_can_be_set_when_resuming(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    with probe.step(100):
        probe.log(loss=train_step(model, optimizer, 0))
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 1))
    assert probe.step_index == 101
    probe.close()
    wait_for_bye(collector)
    assert [f["step"] for f in collector.kinds("step")] == [100, 101]


def test_exception_in_step_propagates_and_step_is_not_recorded(
    collector: FrameCollector,
) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 0))
    with pytest.raises(RuntimeError, match="boom"), probe.step():
        train_step(model, optimizer, 1)
        raise RuntimeError("boom")
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 2))
    probe.close()
    wait_for_bye(collector)
    assert [f["step"] for f in collector.kinds("step")] == [0, 2]


# --- evaluate() ----------------------------------------------------------------------


def test_evaluate_records_eval_frames_and_how_forwards_ran(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    for i in range(3):
        with probe.step():
            probe.log(loss=train_step(model, optimizer, i))

    x, y = batch(50)
    with probe.evaluate():
        model.eval()
        with torch.inference_mode():
            val = nn.functional.cross_entropy(model(x), y)
            probe.log(val_loss=val, val_acc=0.5)
        model.train()

    # Careless validation: training mode, gradients on, two forwards.
    with probe.evaluate():
        careless = nn.functional.cross_entropy(model(x), y)
        model(x)
        probe.log(val_loss=careless)

    # Orthogonal controls: eval mode but gradients still recorded.
    with probe.evaluate():
        model.eval()
        model(x)
        model.train()
        probe.log(val_loss=1.0)

    with probe.step():
        probe.log(loss=train_step(model, optimizer, 3))
    probe.close()
    wait_for_bye(collector)

    evals = collector.kinds("eval")
    assert len(evals) == 3
    clean, sloppy, half = evals
    assert clean["step"] == 3  # after steps 0, 1 and 2: three updates done
    assert clean["scalars"]["val_loss"] == pytest.approx(val.item(), rel=1e-6)
    assert clean["scalars"]["val_acc"] == 0.5
    assert clean["forwards"] == 1
    assert clean["train_mode_forwards"] == 0
    assert clean["grad_forwards"] == 0

    assert sloppy["step"] == 3
    assert sloppy["scalars"]["val_loss"] == pytest.approx(careless.item(), rel=1e-6)
    assert sloppy["forwards"] == 2
    assert sloppy["train_mode_forwards"] == 2
    assert sloppy["grad_forwards"] == 2

    assert half["forwards"] == 1
    assert half["train_mode_forwards"] == 0
    assert half["grad_forwards"] == 1

    # The eval scalars do not leak into the step records.
    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 1, 2, 3]
    assert all(set(f["scalars"]) == {"loss"} for f in steps)


# --- watch() arguments and unusual models --------------------------------------------


def test_model_without_parameters(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Sequential(nn.ReLU(), nn.Flatten())
    probe = probes.watch(model, address=collector.address, max_steps_per_s=1e9)
    lines = traintop_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert "no trainable parameters" in lines[0]
    outputs = []
    for i in range(3):
        with probe.step():
            out = model(batch(i)[0]).mean()
            probe.log(loss=out, step_number=i)
        outputs.append(out.item())
    probe.close()
    wait_for_bye(collector)

    steps = collector.kinds("step")
    assert [f["step"] for f in steps] == [0, 1, 2]
    for frame, value in zip(steps, outputs, strict=True):
        assert frame["scalars"]["loss"] == pytest.approx(value, rel=1e-6)
        assert frame["scalars"]["step_number"] == frame["step"]
        assert frame["grad_norms"] == []
        assert frame["grad_norm_total"] is None
        assert frame["lr"] == []
        assert "param_norms" not in frame
    assert collector.kinds("hello")[0]["layers"] == []
    assert traintop_lines(capsys.readouterr().err) == []


def test_watch_rejects_bad_arguments() -> None:
    model = mlp()
    with pytest.raises(TypeError, match=r"nn\.Module"):
        probes.watch("not a model")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        probes.watch(model.state_dict())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        probes.watch(model, every=0)
    with pytest.raises(ValueError):
        probes.watch(model, sample_every=0)


def test_event_is_sent_with_the_current_step(collector: FrameCollector) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    for i in range(2):
        with probe.step():
            probe.log(loss=train_step(model, optimizer, i))
    probe.event("lr_drop", factor=0.1)
    probe.close()
    wait_for_bye(collector)
    events = [f for f in collector.kinds("event") if f["name"] == "lr_drop"]
    assert len(events) == 1
    assert events[0]["step"] == 1
    assert events[0]["factor"] == 0.1
    assert sorted(f["step"] for f in collector.kinds("step")) == [0, 1]


# --- the monitor side: late start, drops, refusal ------------------------------------


def test_late_monitor_gets_hello_and_history(socket_path: str) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, optimizer, address=f"unix:{socket_path}")
    for i in range(50):
        with probe.step():
            probe.log(loss=train_step(model, optimizer, i))
        if i % 10 == 9:
            with probe.evaluate():
                probe.log(val_loss=1.0)
    # The last step's record (and the evaluation after it) is held until the next step
    # begins: one more step files them, so the history holds all five evaluations
    # whenever the monitor connects (a race with the sender's back-off otherwise).
    with probe.step():
        probe.log(loss=train_step(model, optimizer, 50))
    assert not probe.sender.connected.is_set()
    # the sender has taken every record into its history (nobody to send it to yet)
    wait_until(
        lambda: sum(r["kind"] == "eval" for r in probe.sender._history.replay()) == 5,
        "the history to hold every evaluation",
    )

    collector = FrameCollector(socket_path)
    try:
        for i in range(51, 55):
            with probe.step():
                probe.log(loss=train_step(model, optimizer, i))
        probe.close()
        wait_for_bye(collector)
        hellos = collector.kinds("hello")
        assert len(hellos) >= 1
        assert hellos[0]["run"] == probe.run_id
        assert hellos[0]["state"] == {"paused": False, "anomaly_armed": 0, "guard": False}
        steps = collector.kinds("step")
        assert steps[0]["step"] == 0
        assert "span" not in steps[0]
        assert any(f["step"] == 54 for f in steps)
        assert max(f["step"] for f in steps) == 54
        assert collector.errors == []
        # the history comes marked as such, in the order it happened
        history = [f for f in collector.frames if f.get("replayed")]
        assert [f["seq"] for f in history if f["kind"] == "step"] == sorted(
            f["seq"] for f in history if f["kind"] == "step"
        )
        evals = [i for i, f in enumerate(history) if f["kind"] == "eval"]
        assert len(evals) == 5
        assert all(
            history[i - 1]["kind"] == "step" and history[i - 1]["step"] <= history[i]["step"]
            for i in evals
        )
    finally:
        collector.close()


def test_sender_counts_drops_when_queue_is_full() -> None:
    sender = Sender(resolve_address(), hello={"run": "x"}, queue_size=4, flush_interval=10.0)
    try:
        # Let the thread finish its first pass (collect, failed connect); it then sleeps
        # for flush_interval, so nothing drains the queue while we fill it.
        wait_until(lambda: sender._next_attempt > 0.0, "the first attempt", 5, every=0.005)
        for i in range(10):
            sender.put({"kind": "event", "name": "n", "step": i})
        assert sender.dropped == 6
    finally:
        sender.close()
    assert not sender.alive
    assert sender.dropped == 6


def test_dropped_count_travels_in_step_frames(collector: FrameCollector) -> None:
    sender = Sender(collector.address, hello={"run": "x"}, queue_size=4, flush_interval=0.5)
    try:
        assert sender.connected.wait(5), "the sender did not connect"
        for i in range(10):
            sender.put({"kind": "step", "step": i, "time": time.time(), "scalars": {}})
    finally:
        sender.close()
    wait_for_bye(collector)
    steps = collector.kinds("step")
    assert steps, "no step frame arrived"
    assert steps[-1]["dropped"] == 6
    assert steps[-1]["step"] == 9
    assert all(f["step"] >= 6 for f in steps)  # the oldest six were the ones dropped


def test_monitor_refusal_is_reported_once_and_training_goes_on(
    socket_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refusal = {"v": 1, "kind": "refuse", "reason": "protocol version 9 is not supported"}

    def reply(frame: Frame) -> list[Frame]:
        return [refusal] if frame["kind"] == "hello" else []

    collector = FrameCollector(socket_path, reply=reply)
    err = ""
    try:
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        probe = probes.watch(model, optimizer, address=f"unix:{socket_path}")
        before = params_snapshot(model)
        deadline = time.monotonic() + 10
        i = 0
        while "refused" not in err and time.monotonic() < deadline:
            with probe.step():
                probe.log(loss=train_step(model, optimizer, i))
            i += 1
            err += capsys.readouterr().err
        assert "refused" in err, "the refusal was never reported"
        for j in range(i, i + 20):  # training goes on after the refusal
            with probe.step():
                probe.log(loss=train_step(model, optimizer, j))
        assert probe.step_index == i + 19
        assert changed(before, model)
        probe.close()
        assert not probe.sender.alive
        err += capsys.readouterr().err
    finally:
        collector.close()
    refused = [line for line in err.splitlines() if "refused" in line]
    assert len(refused) == 1, refused
    assert refused[0].startswith("traintop:")
    assert "protocol version 9 is not supported" in refused[0]


def test_probe_will_not_connect_through_a_default_folder_others_can_write(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("TRAINTOP_ADDRESS")
    folder = runtime / "traintop"
    folder.mkdir(mode=0o700)
    collector = FrameCollector(str(folder / "monitor.sock"))
    try:
        folder.chmod(0o777)  # someone opened it to everyone: nothing may be sent there
        probe = probes.watch(mlp())
        for _ in range(3):
            with probe.step():
                pass
        err = ""

        def refused() -> bool:
            nonlocal err
            err += capsys.readouterr().err
            return "writable by others; not connecting" in err

        wait_until(refused, "the sender to refuse the folder")  # it tried, and sent nothing
        probe.close()
        assert collector.frames == []
        err += capsys.readouterr().err
        assert "writable by others; not connecting" in err and err.count("traintop:") == 1
    finally:
        folder.chmod(0o700)
        collector.close()


def test_an_eval_reaches_the_monitor_after_the_step_it_belongs_to(
    collector: FrameCollector,
) -> None:
    """A NaN born in training at step 3 is seen in that step before the eval after it
    (tagged 4: four updates done; it inherits the NaN): the diagnosis must blame the
    loss, not validation."""
    from probes.kernel.diagnosis import Diagnoser

    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch_unthinned(model, optimizer, collector) as probe:
        for index in range(5):
            x = torch.randn(8, 4)
            if index == 3:
                x[0, 0] = math.nan
            with probe.step():
                optimizer.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
            probe.log(late=1.0)  # after the block: still joins its step
            with probe.evaluate():
                probe.log(val_loss=model(torch.randn(8, 4)).pow(2).mean())
    wait_for_bye(collector)
    order = [(f["kind"], f["step"]) for f in collector.frames if f["kind"] in ("step", "eval")]
    assert order == [pair for n in range(5) for pair in (("step", n), ("eval", n + 1))]
    assert all(f["scalars"]["late"] == 1.0 for f in collector.kinds("step"))
    diagnoser = Diagnoser()
    for frame in collector.frames:
        diagnoser.observe(frame)
    assert diagnoser.active["non_finite"].subject == "loss"


def test_a_logged_tensor_is_kept_off_the_graph_and_a_detached_one_as_it_is() -> None:
    """``log`` keeps no autograd graph alive until the step is sent; a tensor that
    records none (a framework's loss, detached already) is not copied again."""
    from probes.runtime.measure.scalars import ScalarFiler

    tensors: dict[str, torch.Tensor] = {}
    floats: dict[str, float] = {}
    weight = torch.ones(1, requires_grad=True)
    with_graph = (weight * 2).sum()
    plain = with_graph.detach()
    ScalarFiler().file(tensors, floats, {"loss": with_graph, "plain": plain, "lr": 0.5})
    assert tensors["loss"].grad_fn is None and not tensors["loss"].requires_grad
    assert tensors["loss"].item() == 2.0
    assert tensors["plain"] is plain
    assert floats == {"lr": 0.5}
