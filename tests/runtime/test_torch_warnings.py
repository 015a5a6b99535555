"""torch's own warnings during a step become evidence on rung 2 (issue 18 item 8): the
loss broadcasting its target is named a shape mismatch in the loss; other torch
warnings are a ``torch_warning``; the user's own warnings, and warnings outside steps,
raise nothing, and every warning still reaches the user's handler unchanged."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probes
from probes.runtime.live_checks import torch_warnings
from probes.runtime.live_checks.torch_warnings import MESSAGE_CHARS, plain, warning_alert


@dataclass
class FakeRun:
    in_step: bool = True
    step_index: int = 3
    sent: list[dict[str, Any]] = field(default_factory=list)

    def send(self, record: dict[str, Any]) -> None:
        self.sent.append(record)


def broadcast_loss() -> torch.Tensor:
    return F.mse_loss(torch.zeros(4, 1), torch.ones(4))  # [B, 1] against [B]


def test_a_loss_broadcasting_its_target_is_a_shape_mismatch_in_the_loss() -> None:
    run = FakeRun()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        listener = torch_warnings.watch(run)
        try:
            broadcast_loss()
        finally:
            listener.remove()
    assert any("target size" in str(w.message) for w in shown)  # still shown, unchanged
    [record] = run.sent
    alert = record["alert"]
    assert (record["kind"], record["step"]) == ("alert", 3)
    assert (alert["kind"], alert["severity"], alert["subject"]) == (
        "broadcast_in_loss",
        "error",
        "loss",
    )
    assert alert["evidence"]["targets"] == "[4]"
    assert alert["evidence"]["outputs"] == "[4, 1]"
    assert "Using a target size" in alert["evidence"]["torch_warning"]
    assert "shape mismatch in the loss" in alert["signal"]


def test_another_torch_warning_is_a_torch_warning_once() -> None:
    run = FakeRun()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        listener = torch_warnings.watch(run)
        try:
            for _ in range(3):
                F.softmax(torch.ones(2, 3))  # torch warns: no dim given
        finally:
            listener.remove()
    [record] = run.sent  # three times the same message: one alert
    alert = record["alert"]
    assert (alert["kind"], alert["severity"]) == ("torch_warning", "warning")
    assert "softmax" in alert["evidence"]["torch_warning"]


def test_the_users_own_warnings_raise_nothing() -> None:
    """The near miss: a deprecation (or any warning) of the user's own code is theirs to
    read on stderr; it says nothing about the run's numbers."""
    run = FakeRun()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        listener = torch_warnings.watch(run)
        try:
            warnings.warn("old_api() is deprecated", DeprecationWarning, stacklevel=1)
            warnings.warn("check your config", UserWarning, stacklevel=1)
        finally:
            listener.remove()
    assert len(shown) == 2 and run.sent == []


def test_torch_warnings_outside_a_step_raise_nothing() -> None:
    run = FakeRun(in_step=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        listener = torch_warnings.watch(run)
        try:
            broadcast_loss()
        finally:
            listener.remove()
    assert run.sent == []


def test_the_hook_is_removed_with_the_last_listener() -> None:
    before = warnings.showwarning
    first, second = torch_warnings.watch(FakeRun()), torch_warnings.watch(FakeRun())
    assert warnings.showwarning is not before
    first.remove()
    assert warnings.showwarning is not before  # the second still listens
    second.remove()
    second.remove()  # idempotent
    assert warnings.showwarning is before


def test_the_message_is_plain_and_bounded() -> None:
    text = plain("line one\nline\x1b[31m two " + "x" * 1000)
    assert "\n" not in text and "\x1b" not in text and len(text) == MESSAGE_CHARS
    alert = warning_alert(text, "UserWarning", 0)
    assert alert.kind == "torch_warning" and len(alert.evidence["torch_warning"]) <= MESSAGE_CHARS


def test_a_probe_reports_torchs_warning_during_its_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sent: list[dict[str, Any]] = []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        probe = probes.watch(model, optimizer, address="unix:/nonexistent/traintop.sock")
        probe.send = sent.append  # type: ignore[method-assign]
        try:
            for _ in range(2):
                with probe.step():
                    loss = F.mse_loss(model(torch.randn(8, 3)), torch.randn(8))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        finally:
            probe.close()
    kinds = [r["alert"]["kind"] for r in sent if r.get("kind") == "alert"]
    assert kinds == ["broadcast_in_loss"]


@pytest.mark.slow  # a child process (~4 s)
def test_a_warning_from_a_loss_is_shown_at_the_users_line(tmp_path: Any) -> None:
    """torch warns at its caller's line (``stacklevel=2``); a stand-in of ours on
    ``torch.nn.functional`` is that caller while a probe is open, so without care the
    user would be sent to traintop's file. The line shown is the user's, as unwatched."""
    import os
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import torch, torch.nn.functional as F, probes\n"
        "m = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "with probes.watch(m, opt, address='unix:' + __import__('sys').argv[1]) as p:\n"
        "    for i in range(2):\n"
        "        loss = F.mse_loss(m(torch.randn(4, 3)), torch.randn(4))\n"
        "        loss.backward(); opt.step(); opt.zero_grad()\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": root},
    )
    shown = [line for line in done.stderr.splitlines() if "UserWarning" in line]
    assert shown and shown[0].startswith(f"{script}:6: UserWarning: Using a target size")
