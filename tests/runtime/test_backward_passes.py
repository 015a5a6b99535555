"""Per layer, the backward passes accumulated into its gradient since it was cleared
(``backward_passes``): measured by the probe from the gradients' versions and identity,
sent, checked and read by the monitor (``StepView.per_layer``), merged as its spec says
when steps are thinned, and read by no rule yet (no alert changes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probes
from probes.kernel.diagnosis import Diagnoser, RunInfo
from probes.kernel.schema import StepView, check_frame
from probes.kernel.thinning import RECORDS
from tests.collector import Frame, FrameCollector, wait_for_bye, watch_unthinned

LAYERS = 3


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 3))


def loss_of(model: nn.Module, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 8, generator=generator)
    y = torch.randint(0, 3, (16,), generator=generator)
    return nn.functional.cross_entropy(model(x), y)


def train(
    collector: FrameCollector,
    *,
    micro_batches: int,
    clear: str | None,
    steps: int = 5,
    clip: bool = False,
) -> tuple[Frame, list[Frame]]:
    """``steps`` updates of ``micro_batches`` backward passes each, one probe step each;
    gradients cleared before them (``clear``: "none" or "zero"), or never (None)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector)
    for i in range(steps):
        with probe.step():
            if clear is not None:
                opt.zero_grad(set_to_none=clear == "none")
            for k in range(micro_batches):
                loss = loss_of(model, i * micro_batches + k) / micro_batches
                loss.backward()
            if clip:
                probes.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
            probe.log(loss=loss)
    probe.close()
    wait_for_bye(collector)
    assert collector.errors == []
    hello = collector.kinds("hello")[0]
    return hello, sorted(collector.kinds("step"), key=lambda f: f["step"])


def at_monitor(records: list[Frame]) -> list[list[int | None] | None]:
    """Each record's passes as the monitor reads them (its checks, then its view)."""
    for record in records:
        check_frame(record)
    return [StepView.from_record(r).per_layer["backward_passes"] for r in records]


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
@pytest.mark.parametrize("clip", [False, True], ids=["plain", "probes-clip"])
def test_k_micro_batches_between_clears_are_k_passes(
    micro_batches: int, clip: bool, collector: FrameCollector
) -> None:
    _, records = train(collector, micro_batches=micro_batches, clear="none", clip=clip)
    assert at_monitor(records) == [[micro_batches] * LAYERS] * 5


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_a_forgotten_zero_grad_counts_every_pass_since_the_first(
    micro_batches: int, collector: FrameCollector
) -> None:
    _, records = train(collector, micro_batches=micro_batches, clear=None)
    assert at_monitor(records) == [[micro_batches * (n + 1)] * LAYERS for n in range(5)]


def test_accumulation_over_probe_steps_counts_at_the_update(collector: FrameCollector) -> None:
    """One probe step per micro-batch, the update every second one: the passes are
    counted at each update, where the gradient is used."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector, grad_accumulation=True)
    for i in range(8):
        with probe.step():
            loss_of(model, i).backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
    probe.close()
    wait_for_bye(collector)
    records = sorted(collector.kinds("step"), key=lambda f: f["step"])
    passes = at_monitor(records)
    assert passes[1::2] == [[2] * LAYERS] * 4
    assert passes[0::2] == [None] * 4  # no update in the step: not measured


def test_a_thinned_record_holds_the_largest_count_of_its_span() -> None:
    steps = [
        {
            "kind": "step",
            "step": n,
            "scalars": {"loss": 1.0},
            "grad_norms": [1.0] * 2,
            "backward_passes": passes,
        }
        for n, passes in enumerate(([1, 1], [3, None], [2, 2]))
    ]
    merged = RECORDS.collapse(steps)
    assert merged["backward_passes"] == [3, 2]
    assert StepView.from_record(merged).per_layer["backward_passes"] == [3, 2]


def test_no_alert_reads_it(collector: FrameCollector) -> None:
    hello, records = train(collector, micro_batches=1, clear=None, steps=8)
    stripped = [{k: v for k, v in r.items() if k != "backward_passes"} for r in records]

    def raised(frames: list[Frame]) -> list[tuple[str, str, int]]:
        diagnoser = Diagnoser(RunInfo.from_hello(hello))
        changes = [c for f in frames for c in diagnoser.observe(f)] + diagnoser.finish()
        return [(c.alert.kind, c.alert.subject, c.alert.step) for c in changes]

    assert raised(records) == raised(stripped)
    assert "grad_not_cleared" in {kind for kind, _, _ in raised(records)}
