"""An evaluation's loss is seen however the script writes it: ``F.cross_entropy(model(x),
y)`` looks the function up before the forward that opens the evaluation, a name
imported at the top of a script was bound before any probe existed, and an ``nn`` loss
module calls the functional one."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.collector import FrameCollector, wait_for_bye
from tests.e2e.test_run import traintop_run


def _printed(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"^validation (\S+)$", output, re.MULTILINE)]


@pytest.mark.parametrize(
    "how",
    [
        "functional",
        pytest.param("imported", marks=pytest.mark.slow),  # (-m slow: a child each)
        pytest.param("module", marks=pytest.mark.slow),
    ],
)
def test_traintop_run_sees_each_validation_loss(tmp_path: Any, how: str) -> None:
    """Before: no eval record carried a loss for ``functional`` (and ``imported``)."""
    done, frames = traintop_run(tmp_path, "validates", how)
    assert done.returncode == 0, done.stderr
    printed = _printed(done.stdout)
    evals = [f for f in frames if f["kind"] == "eval"]
    assert len(printed) == 3 and len(evals) == 3
    assert [f["scalars"]["val_loss"] for f in evals] == pytest.approx(printed, rel=1e-6)


@pytest.mark.parametrize("how", ["functional", "module"])
def test_watch_alone_sees_each_validation_loss(collector: FrameCollector, how: str) -> None:
    """Before: ``F.cross_entropy(model(x), y)`` gave evaluations with no loss at all."""
    import probes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x_val, y_val = torch.randn(32, 8), torch.randint(0, 3, (32,))
    computed = []
    with probes.watch(model, optimizer, address=collector.address):
        for _ in range(3):
            model.train()
            for _ in range(6):
                optimizer.zero_grad()
                F.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,))).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                if how == "module":
                    loss = nn.CrossEntropyLoss()(model(x_val), y_val)
                else:
                    loss = F.cross_entropy(model(x_val), y_val)
            computed.append(loss.item())
    wait_for_bye(collector)
    evals = collector.kinds("eval")
    assert [f["scalars"]["val_loss"] for f in evals] == pytest.approx(computed, rel=1e-6)
