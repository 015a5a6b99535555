"""Commands from the monitor, applied by the training thread at step boundaries.

The sender thread only drops command frames into ``Control.receive``; the training
thread applies them at the next ``with probe.step()`` entry (and while paused, as they
come), so every change to the run happens on the thread that owns it. A command for the
ranks of a job carries ``at_step``: the boundary (chosen by the monitor, ahead of every
rank) at which each rank applies it, so that no rank pauses while another waits for it
in a collective. A paused rank applies what comes at once: the ranks of a paused job
wait at the same boundary. A paused run
blocks there, and the sender keeps the monitor live. A dead monitor never holds a run
hostage: if it goes away while the run is paused, the run resumes after a grace period
and says why.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probes.kernel.commands import Command
from probes.kernel.schema.records import ControlStateFields
from probes.kernel.schema.spec import EventName
from probes.kernel.wire import command_signature
from probes.runtime.link.sender import warn

Frame = dict[str, Any]
LR_FACTORS = (0.5, 2.0)  # the learning-rate experiments the monitor may run


@dataclass
class ControlState:
    """What the monitor shows in its status line."""

    paused: bool = False
    steps_allowed: int = 0  # single steps granted while paused
    anomaly_armed: int = 0  # steps still to run under anomaly mode
    guard: bool = False

    def as_dict(self) -> ControlStateFields:
        return {"paused": self.paused, "anomaly_armed": self.anomaly_armed, "guard": self.guard}


class Control:
    """The run's control state and the inbox of commands.

    Args:
        connected: tells whether a monitor is connected (the sender's event).
        send: queues a record to the monitor (acks and events).
        scale_lr: multiplies every param group's learning rate; returns the new ones.
        grace_s: how long a paused run waits for a monitor that went away.
        token: when set, commands must carry its signature; '' when a signature is
            needed but no token is held (``probes.runtime.link.link.command_token``): then
            every command is refused.
        run_id: this run's id (part of the signed message).
    """

    def __init__(
        self,
        *,
        connected: threading.Event,
        send: Callable[[Frame], None],
        scale_lr: Callable[[float], list[float]] | None,
        grace_s: float,
        token: str | None,
        run_id: str,
        guard: bool = False,
    ) -> None:
        self.state = ControlState(guard=guard)
        self._inbox: deque[Frame] = deque()
        self._scheduled: list[Frame] = []  # commands for a later step (training thread)
        self._wake = threading.Event()
        self._connected = connected
        self._send = send
        self._scale_lr = scale_lr
        self._grace_s = grace_s
        self._token = token
        self._run_id = run_id
        self._step = 0
        self._handlers: dict[Command, Callable[[dict[str, Any]], tuple[bool, str]]] = {
            Command.PAUSE: self._do_pause,
            Command.RESUME: self._do_resume,
            Command.STEP: self._do_step,
            Command.ANOMALY: self._do_anomaly,
            Command.GUARD: self._do_guard,
            Command.LR_SCALE: self._do_lr_scale,
        }

    # --- sender thread -----------------------------------------------------------------

    def receive(self, frame: Frame) -> None:
        """A command frame arrived (sender thread): queue it, wake a paused run."""
        self._inbox.append(frame)
        self._wake.set()

    # --- training thread ---------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Anything to do at this boundary (cheap enough for every step)."""
        return bool(self._inbox) or bool(self._scheduled) or self.state.paused

    def boundary(self, step: int, flush: Callable[[], None]) -> None:
        """Apply queued commands; while paused, block here until resumed or stepped.

        ``flush`` sends what was measured so far, so the monitor sees the last step
        before the pause.
        """
        self._step = step
        self._apply_inbox()
        if not self.state.paused:
            return
        flush()
        gone_since: float | None = None
        while self.state.paused and self.state.steps_allowed == 0:
            self._wake.wait(0.1)
            self._wake.clear()
            self._apply_inbox()
            if self._connected.is_set():
                gone_since = None
            elif gone_since is None:
                gone_since = time.monotonic()
            elif time.monotonic() - gone_since > self._grace_s:
                self._resume_orphaned()
        if self.state.paused and self.state.steps_allowed:
            self.state.steps_allowed -= 1  # one step, then pause again at the next entry

    def pause(self, reason: str, step: int | None = None) -> None:
        """Pause at the next boundary (the guard and the anomaly step use this).

        With no monitor connected nobody could resume, so the run does not pause: it
        says so instead (a dead monitor never holds a run hostage)."""
        if step is not None:
            self._step = step
        if self.state.paused:
            return
        if not self._connected.is_set():
            self._event("pause_skipped", reason=f"{reason}; no monitor is connected")
            return
        self.state.paused = True
        self._event(EventName.PAUSED, reason=reason)

    def take_anomaly_step(self) -> bool:
        """True if this step must run under anomaly mode (consumes one)."""
        if self.state.anomaly_armed:
            self.state.anomaly_armed -= 1
            return True
        return False

    def _resume_orphaned(self) -> None:
        self.state.paused = False
        self.state.steps_allowed = 0
        message = (
            f"no monitor connected while the run was paused; resumed after {self._grace_s:g} s"
        )
        warn(message)
        self._event("resumed", reason=message)

    def _apply_inbox(self) -> None:
        while self._inbox:
            self._scheduled.append(self._inbox.popleft())
        due: list[Frame] = []
        later: list[Frame] = []
        for frame in self._scheduled:
            (due if self.state.paused or _at_step(frame) <= self._step else later).append(frame)
        if not due:
            return
        self._scheduled = later
        for frame in due:
            ok, result = self._apply(frame)
            ack = {
                "kind": "ack",
                "id": frame.get("id"),
                "command": frame.get("command"),
                "ok": ok,
                "result": result,
                "step": self._step,
                "state": self.state.as_dict(),
            }
            at = _at_step(frame)
            if at >= 0:
                ack["at_step"] = at
                ack["late"] = at < self._step and not self.state.paused
            self._send(ack)

    def _apply(self, frame: Frame) -> tuple[bool, str]:
        text = str(frame.get("command", ""))
        command = Command.parse(text)
        if command is None:
            return False, f"unknown command {text!r}"
        if not self._authentic(frame, command):
            return False, "refused: missing or wrong signature (TRAINTOP_TOKEN)"
        args = frame.get("args") or {}
        if not isinstance(args, dict):
            return False, f"refused: args must be an object, got {type(args).__name__}"
        try:
            return self._handlers[command](args)
        except (TypeError, ValueError) as exc:  # a malformed argument: refuse, run on
            return False, f"refused: bad arguments for {command}: {exc}"

    def _authentic(self, frame: Frame, command: Command) -> bool:
        if self._token is None:
            return True  # a Unix socket of this user, or loopback with no token set
        if not self._token:
            return False  # token mode without a token: no command can be authentic
        try:
            command_id = int(frame.get("id", 0))
        except (TypeError, ValueError):
            return False
        expected = command_signature(
            self._token, self._run_id, command_id, command.value, frame.get("args") or {}
        )
        return hmac.compare_digest(str(frame.get("auth", "")), expected)

    def _do_pause(self, args: dict[str, Any]) -> tuple[bool, str]:
        if self.state.paused:
            return True, f"already paused at step {self._step}"
        self.pause("the monitor asked")
        return True, f"paused before step {self._step}"

    def _do_resume(self, args: dict[str, Any]) -> tuple[bool, str]:
        if not self.state.paused:
            return True, "already running"
        self.state.paused = False
        self.state.steps_allowed = 0
        self._event("resumed", reason="the monitor asked")
        return True, f"resumed at step {self._step}"

    def _do_step(self, args: dict[str, Any]) -> tuple[bool, str]:
        if not self.state.paused:
            return False, "not paused: pause first, then step"
        self.state.steps_allowed += 1
        return True, f"running one step ({self._step})"

    def _do_anomaly(self, args: dict[str, Any]) -> tuple[bool, str]:
        count = max(1, min(int(args.get("count", 1)), 1000))
        self.state.anomaly_armed += count
        now = self.state.paused and args.get("step_now", True)
        if now:
            self.state.steps_allowed += 1  # paused: run the anomaly step right away
        if now:
            steps = "one step" if count == 1 else f"the first of {count} steps"
            return True, f"paused: running {steps} under anomaly detection now"
        if count == 1:
            return True, "the next step runs under anomaly detection"
        return True, f"the next {count} steps run under anomaly detection"

    def _do_guard(self, args: dict[str, Any]) -> tuple[bool, str]:
        self.state.guard = bool(args.get("on", not self.state.guard))
        self._event("guard", on=self.state.guard)
        return True, "guard on: non-finite gradients skip the update and pause" if (
            self.state.guard
        ) else "guard off"

    def _do_lr_scale(self, args: dict[str, Any]) -> tuple[bool, str]:
        factor = float(args.get("factor", 0))
        if factor not in LR_FACTORS:
            return False, f"factor must be one of {LR_FACTORS}"
        if self._scale_lr is None:
            return False, "no optimizer was given to probes.watch"
        new = self._scale_lr(factor)
        self._event(EventName.LR_SCALE, factor=factor, lr=new)
        return True, f"learning rate x{factor:g}: now {', '.join(f'{x:.3g}' for x in new)}"

    def _event(self, name: str, **fields: Any) -> None:
        self._send(
            {
                "kind": "event",
                "name": name,
                "step": self._step,
                "time": time.time(),
                "state": self.state.as_dict(),
                **fields,
            }
        )


def _at_step(frame: Frame) -> int:
    """The step a command is for (-1: the next boundary); among its arguments, so a
    signed command's step is signed too."""
    args = frame.get("args")
    value = args.get("at_step") if isinstance(args, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
