"""Commands at step boundaries: acks, pause and step, anomaly and guard, LR, signatures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch
from torch import nn

import probes
from probes.kernel.commands import Command
from probes.kernel.wire import command_signature
from probes.runtime.link.control import Control
from tests.collector import FrameCollector
from tests.waiting import wait_until
from tui.monitor import Monitor
from tui.server import Connection


class Sent(list):
    """Records the control sends (acks and events)."""

    def acks(self) -> list[dict]:
        return [r for r in self if r["kind"] == "ack"]

    def events(self, name: str) -> list[dict]:
        return [r for r in self if r["kind"] == "event" and r["name"] == name]


def make_control(
    *, token: str | None = None, grace: float = 10.0, scale_lr=None
) -> tuple[Control, Sent, threading.Event]:
    sent = Sent()
    connected = threading.Event()
    connected.set()
    control = Control(
        connected=connected,
        send=sent.append,
        scale_lr=scale_lr,
        grace_s=grace,
        token=token,
        run_id="run-1",
    )
    return control, sent, connected


def command(name: str, command_id: int = 1, **args: object) -> dict:
    return {"v": 1, "kind": "command", "id": command_id, "command": name, "args": args}


def test_commands_are_applied_at_the_boundary_and_acknowledged() -> None:
    control, sent, _ = make_control()
    control.receive(command("guard", on=True))
    control.receive(command("anomaly", 2, count=3))
    assert sent == [] and control.busy  # nothing happens until the training thread comes
    control.boundary(7, flush=lambda: None)
    assert [(a["id"], a["ok"]) for a in sent.acks()] == [(1, True), (2, True)]
    assert control.state.guard and control.state.anomaly_armed == 3
    assert sent.acks()[1]["state"] == {"paused": False, "anomaly_armed": 3, "guard": True}
    assert sent.events("guard")[0]["on"] is True and sent.events("guard")[0]["step"] == 7
    assert [control.take_anomaly_step() for _ in range(4)] == [True, True, True, False]


def test_bad_commands_get_a_clear_refusal() -> None:
    control, sent, _ = make_control()
    for frame in (
        command("reboot"),
        command("step"),
        command("lr_scale", factor=10.0),
        command("lr_scale", factor=0.5),
    ):
        control.receive(frame)
    control.boundary(0, flush=lambda: None)
    results = [(a["ok"], a["result"]) for a in sent.acks()]
    assert results[0] == (False, "unknown command 'reboot'")
    assert results[1] == (False, "not paused: pause first, then step")
    assert results[2][0] is False and "factor must be one of" in results[2][1]
    assert results[3] == (False, "no optimizer was given to probes.watch")


def test_pause_blocks_until_resumed_and_step_lets_exactly_one_through() -> None:
    control, sent, _ = make_control()
    flushed: list[int] = []
    control.receive(command("pause"))
    timeline: list[str] = []

    def monitor() -> None:
        # The point: a monitor slow to answer; the paused run must not go on meanwhile.
        time.sleep(0.3)
        timeline.append("step sent")
        control.receive(command("step", 2))
        time.sleep(0.3)
        timeline.append("resume sent")
        control.receive(command("resume", 3))

    threading.Thread(target=monitor, daemon=True).start()
    control.boundary(5, flush=lambda: flushed.append(5))
    timeline.append("step 5 runs")
    assert control.state.paused  # one step granted, still paused
    control.boundary(6, flush=lambda: flushed.append(6))
    timeline.append("step 6 runs")
    assert timeline == ["step sent", "step 5 runs", "resume sent", "step 6 runs"]
    assert not control.state.paused and flushed == [5, 6]
    assert [e["step"] for e in sent.events("paused")] == [5]
    assert sent.events("resumed")[0]["reason"] == "the monitor asked"


def test_a_paused_run_resumes_when_its_monitor_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    control, sent, connected = make_control(grace=0.2)
    control.receive(command("pause"))
    threading.Timer(0.2, connected.clear).start()  # the monitor goes away, run paused
    started = time.monotonic()
    control.boundary(3, flush=lambda: None)
    waited = time.monotonic() - started
    assert 0.4 <= waited < 3.0
    assert not control.state.paused
    assert "resumed after 0.2 s" in sent.events("resumed")[0]["reason"]
    assert capsys.readouterr().err.startswith("traintop: no monitor connected")


def test_with_a_token_only_signed_commands_are_obeyed() -> None:
    control, sent, _ = make_control(token="s3cret")
    unsigned = command("guard", 1, on=True)
    forged = {**command("guard", 2, on=True), "auth": "0" * 64}
    signed = {
        **command("guard", 3, on=True),
        "auth": command_signature("s3cret", "run-1", 3, "guard", {"on": True}),
    }
    tampered = {
        **command("guard", 4, on=False),  # a signature for other arguments
        "auth": command_signature("s3cret", "run-1", 4, "guard", {"on": True}),
    }
    for frame in (unsigned, forged):
        control.receive(frame)
    control.boundary(0, flush=lambda: None)
    assert not control.state.guard
    assert all(not a["ok"] and "signature" in a["result"] for a in sent.acks())
    control.receive(signed)
    control.boundary(1, flush=lambda: None)
    assert control.state.guard and sent.acks()[-1]["ok"]
    control.receive(tampered)
    control.boundary(2, flush=lambda: None)
    assert control.state.guard and not sent.acks()[-1]["ok"]


def test_malformed_commands_are_refused_and_the_run_goes_on() -> None:
    control, sent, _ = make_control()
    for frame in (
        {**command("anomaly"), "args": [1, 2]},
        command("anomaly", count="many"),
        command("lr_scale", factor="half"),
        {**command("guard"), "id": "x"},
    ):
        control.receive(frame)
    control.boundary(0, flush=lambda: None)
    oks = [a["ok"] for a in sent.acks()]
    assert oks == [False, False, False, True]  # an odd id is not a bad argument
    assert all("refused" in a["result"] for a in sent.acks()[:3])


def test_a_pause_with_no_monitor_does_not_hold_the_run() -> None:
    control, sent, connected = make_control()
    connected.clear()
    control.pause("the guard skipped a non-finite update", step=4)
    started = time.monotonic()
    control.boundary(5, flush=lambda: None)
    assert time.monotonic() - started < 0.5
    assert not control.state.paused
    [skipped] = sent.events("pause_skipped")
    assert skipped["step"] == 4 and "no monitor is connected" in skipped["reason"]


def test_lr_experiment_scales_every_group_and_is_recorded(collector: FrameCollector) -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(
        [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.02}]
    )
    probe = probes.watch(model, opt, address=collector.address)
    probe._control.receive(command("lr_scale", factor=0.5))
    for _ in range(2):
        with probe.step():
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    probe.close()
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.01]
    assert collector.wait_for(lambda f: any(x.get("name") == "lr_scale" for x in f))
    [event] = [f for f in collector.kinds("event") if f["name"] == "lr_scale"]
    assert event["factor"] == 0.5 and event["lr"] == [0.05, 0.01] and event["step"] == 0
    steps = {f["step"]: f for f in collector.kinds("step")}
    assert steps[0]["lr"] == [0.05, 0.01]  # applied at the step boundary, before step 0


def test_monitor_reports_a_run_that_is_not_connected() -> None:
    assert Monitor().send_command("nope", "pause") == "that run is not connected"


def run_lr_experiment(
    collector: FrameCollector, make_scheduler: Callable[[torch.optim.Optimizer], object]
) -> list[dict]:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = make_scheduler(opt)
    probe = probes.watch(model, opt, address=collector.address)
    for step in range(12):
        if step == 4:
            probe._control.receive(command("lr_scale", factor=0.5))
        with probe.step():
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
        scheduler.step()
    probe.close()
    assert collector.wait_for(lambda f: any(x["kind"] == "bye" for x in f))
    return [f["alert"] for f in collector.kinds("alert")]


def test_a_scheduler_that_resets_the_lr_undoes_the_experiment_and_says_so(
    collector: FrameCollector,
) -> None:
    alerts = run_lr_experiment(
        collector,
        lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - 0.01 * step),
    )
    [alert] = alerts
    assert alert["kind"] == "lr_experiment_undone" and alert["step"] == 5
    assert alert["evidence"]["lasted_steps"] == 1
    assert alert["evidence"]["lr_set"] == pytest.approx(0.048)


def test_a_scheduler_that_keeps_scaling_keeps_the_experiment(collector: FrameCollector) -> None:
    # StepLR multiplies the current LR: the experiment's x0.5 carries on through it.
    assert (
        run_lr_experiment(
            collector, lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        )
        == []
    )


# --- commands for the ranks of a job: applied at the step the monitor chose ------------


def test_a_command_for_a_later_step_waits_for_it() -> None:
    control, sent, _ = make_control()
    control.receive(command("pause", at_step=12))
    control.boundary(10, flush=lambda: None)
    control.boundary(11, flush=lambda: None)
    assert sent.acks() == [] and not control.state.paused and control.busy
    # At step 12 the rank pauses (and would block here until resumed).
    waiter = threading.Thread(target=control.boundary, args=(12, lambda: None), daemon=True)
    waiter.start()
    ack = wait_until(sent.acks, "the ack of the pause", 5)[0]
    assert ack["step"] == 12 and ack["at_step"] == 12 and ack["late"] is False
    assert control.state.paused
    # Paused, every rank waits at the same boundary: a resume applies at once.
    control.receive(command("resume", 2, at_step=40))
    waiter.join(5)
    assert not waiter.is_alive() and not control.state.paused


def test_a_command_that_arrives_after_its_step_says_it_was_late() -> None:
    control, sent, _ = make_control()
    control.receive(command("guard", on=True, at_step=5))
    control.boundary(9, flush=lambda: None)
    ack = sent.acks()[0]
    assert ack["ok"] and ack["late"] is True and ack["step"] == 9
    assert control.state.guard


def test_at_step_is_signed_with_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    control, sent, _ = make_control(token="secret")
    signed = command("guard", 1, on=True, at_step=3)
    signed["auth"] = command_signature("secret", "run-1", 1, "guard", signed["args"])
    forged = dict(signed, args={"on": True, "at_step": 4})  # the step changed in transit
    control.receive(forged)
    control.receive(signed)
    control.boundary(5, flush=lambda: None)
    assert [a["ok"] for a in sent.acks()] == [False, True]


def test_every_command_reaches_its_handler_under_its_wire_spelling() -> None:
    # The wire's spellings, as monitors and probes of earlier versions send and read them.
    assert [c.value for c in Command] == ["pause", "resume", "step", "anomaly", "guard", "lr_scale"]
    assert all(c.key and c.label for c in Command)  # the screen offers each one
    control, sent, _ = make_control()
    for command_id, name in enumerate(Command, 1):
        control.receive(command(name.value, command_id))
    control.boundary(0, flush=lambda: None)
    acks = sent.acks()
    assert [a["command"] for a in acks] == [c.value for c in Command]
    assert not [a for a in acks if str(a["result"]).startswith("unknown command")]
    assert Command.parse("pause") is Command.PAUSE and Command.parse("reboot") is None


class RecordingConnection(Connection):
    """A live connection whose frames are kept instead of written."""

    def __init__(self) -> None:
        super().__init__(1, "test", None)
        self.frames: list[dict] = []

    def send(self, frame: dict) -> None:
        self.frames.append(frame)


def test_the_monitor_sends_a_command_as_its_plain_string_and_signs_that() -> None:
    monitor = Monitor()
    monitor.token = "secret"
    conn = RecordingConnection()
    monitor.connections["run-1"] = conn
    assert monitor.send_command("run-1", Command.GUARD, on=True) is None
    assert monitor.send_command("run-1", "pause") is None  # a value does as well
    first, second = conn.frames
    assert type(first["command"]) is str and first["command"] == "guard"
    assert first["auth"] == command_signature("secret", "run-1", first["id"], "guard", {"on": True})
    assert type(second["command"]) is str and second["command"] == "pause"
    # And the probe's control takes the signed frame as it always has.
    control, sent, _ = make_control(token="secret")
    control.receive(first)
    control.boundary(0, flush=lambda: None)
    assert sent.acks()[0]["ok"] is True and control.state.guard
