"""Every optimizer of a run is watched (issue 18 item 8): ``watch(model, [opt_g, opt_d])``
reads each optimizer's parameters at its own ``step()``, counts a layer as updated
when any optimizer moved it, and raises no wiring alert for parameters another
optimizer holds; watching one optimizer of two still names the other's layers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probes.runtime.optimizers.optimizers import OptimizerSet, optimizer_of
from tests.collector import FrameCollector, wait_for_bye, watch_unthinned


class Gan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.g = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
        self.d = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))


def layer_norm(module: nn.Module) -> float:
    return float(torch.sqrt(sum(p.grad.pow(2).sum() for p in module.parameters())))


def train_gan(probe: Any, gan: Gan, opt_g: Any, opt_d: Any, steps: int) -> list[dict[str, float]]:
    """The canonical GAN loop (the generator's backward adds into the discriminator's
    gradients after the discriminator stepped); the norms each optimizer stepped with."""
    seen = []
    for _ in range(steps):
        with probe.step():
            real, noise = torch.randn(16, 2) + 3, torch.randn(16, 2)
            fake = gan.g(noise)
            opt_d.zero_grad()
            ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)
            d_loss = F.binary_cross_entropy_with_logits(gan.d(real), ones)
            d_loss = d_loss + F.binary_cross_entropy_with_logits(gan.d(fake.detach()), zeros)
            d_loss.backward()
            norms = {"d.0": layer_norm(gan.d[0]), "d.2": layer_norm(gan.d[2])}
            opt_d.step()
            opt_g.zero_grad()
            g_loss = F.binary_cross_entropy_with_logits(gan.d(fake), ones)
            g_loss.backward()  # into D's gradients too
            norms |= {"g.0": layer_norm(gan.g[0]), "g.2": layer_norm(gan.g[2])}
            opt_g.step()
            probe.log(loss=g_loss + d_loss)
        seen.append(norms)
    return seen


def frames_of(probe: Any, collector: FrameCollector) -> list[dict[str, Any]]:
    probe.close()
    wait_for_bye(collector)
    return list(collector.frames)


def test_two_optimizers_are_each_read_at_their_own_step(collector: FrameCollector) -> None:
    gan = Gan()
    opt_g = torch.optim.Adam(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-2)
    probe = watch_unthinned(gan, [opt_g, opt_d], collector, sample_every=1)
    assert isinstance(probe.optimizer, OptimizerSet)
    seen = train_gan(probe, gan, opt_g, opt_d, 4)
    frames = frames_of(probe, collector)
    hello = next(f for f in frames if f["kind"] == "hello")
    assert hello["optimizer"] == "Adam+SGD"
    assert [f for f in frames if f["kind"] == "alert"] == []  # D's params are opt_d's
    steps = [f for f in frames if f["kind"] == "step"]
    assert len(steps) == 4
    for record, expected in zip(steps, seen, strict=True):
        norms = dict(zip(hello["layers"], record["grad_norms"], strict=True))
        for name, value in expected.items():
            assert norms[name] == pytest.approx(value, rel=1e-5), name
        assert "not_stepped" not in record  # every layer moved, by one optimizer or the other
        assert not record.get("grads_not_cleared")  # each optimizer's own were cleared
        assert record["backward_passes"] == [1, 1, 1, 1]  # as each optimizer stepped them
        ratios = dict(zip(hello["layers"], record["update_ratios"], strict=True))
        assert all(r is not None and r > 0 for r in ratios.values()), ratios
        assert record["lr"] == [1e-3, 1e-2]
        assert record["scalars"]["loss"] > 0


def test_one_optimizer_of_two_watched_names_the_other_networks_layers(
    collector: FrameCollector,
) -> None:
    """The near miss: watching the first optimizer only is what the Lightning callback
    did; the discriminator's parameters are then in no watched optimizer."""
    gan = Gan()
    opt_g = torch.optim.Adam(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-2)
    probe = watch_unthinned(gan, opt_g, collector)
    train_gan(probe, gan, opt_g, opt_d, 1)
    frames = frames_of(probe, collector)
    [alert] = [f["alert"] for f in frames if f["kind"] == "alert"]
    assert alert["kind"] == "params_not_in_optimizer" and alert["layers"] == ["d.0", "d.2"]


def test_a_forgotten_zero_grad_under_two_optimizers_is_seen(collector: FrameCollector) -> None:
    gan = Gan()
    opt_g = torch.optim.SGD(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-3)
    opt_g.zero_grad = lambda set_to_none=True: None  # type: ignore[method-assign]
    probe = watch_unthinned(gan, [opt_g, opt_d], collector, sample_every=1)
    train_gan(probe, gan, opt_g, opt_d, 4)
    steps = [f for f in frames_of(probe, collector) if f["kind"] == "step"]
    assert [bool(s.get("grads_not_cleared")) for s in steps] == [False, True, True, True]


def train_gan_accumulating(
    probe: Any, gan: Gan, opt_g: Any, opt_d: Any, steps: int, *, micro: int = 2
) -> None:
    """The GAN loop accumulating ``micro`` batches into each optimizer's step, each
    optimizer cleared where its own accumulation starts (``zero_grad`` as given)."""
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    for _ in range(steps):
        with probe.step():
            opt_d.zero_grad()
            for _ in range(micro):
                real, fake = torch.randn(8, 2) + 3, gan.g(torch.randn(8, 2)).detach()
                d_loss = F.binary_cross_entropy_with_logits(gan.d(real), ones)
                d_loss = d_loss + F.binary_cross_entropy_with_logits(gan.d(fake), zeros)
                (d_loss / micro).backward()
            opt_d.step()
            opt_g.zero_grad()
            for _ in range(micro):
                g_loss = F.binary_cross_entropy_with_logits(gan.d(gan.g(torch.randn(8, 2))), ones)
                (g_loss / micro).backward()  # into D's gradients too, after D stepped
            opt_g.step()
            probe.log(loss=g_loss + d_loss)


def uncleared_flags(probe: Any, collector: FrameCollector) -> list[bool]:
    steps = [f for f in frames_of(probe, collector) if f["kind"] == "step"]
    return [bool(s.get("grads_not_cleared")) for s in steps]


@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("forgotten", ["g", "d"])
def test_a_forgotten_zero_grad_of_either_network_is_seen(
    forgotten: str, micro: int, collector: FrameCollector
) -> None:
    """Without its clear, the discriminator's gradient grows by two passes a step (its
    own backward and the generator's, after it stepped), and by 2 x ``micro`` when the
    loop accumulates micro-batches: seen as one pass is."""
    gan = Gan()
    opt_g = torch.optim.SGD(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-3)
    never = opt_g if forgotten == "g" else opt_d
    never.zero_grad = lambda set_to_none=True: None  # type: ignore[method-assign]
    probe = watch_unthinned(gan, [opt_g, opt_d], collector, sample_every=1)
    if micro == 1:
        train_gan(probe, gan, opt_g, opt_d, 4)  # the canonical loop
    else:
        train_gan_accumulating(probe, gan, opt_g, opt_d, 4, micro=micro)
    assert uncleared_flags(probe, collector) == [False, True, True, True]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_gan_accumulating_micro_batches_and_clearing_raises_nothing(
    set_to_none: bool, collector: FrameCollector
) -> None:
    gan = Gan()
    opt_g = torch.optim.SGD(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-3)
    for opt in (opt_g, opt_d):
        clear = opt.zero_grad
        opt.zero_grad = lambda set_to_none=set_to_none, clear=clear: clear(set_to_none)  # type: ignore[method-assign]
    probe = watch_unthinned(gan, [opt_g, opt_d], collector, sample_every=1)
    train_gan_accumulating(probe, gan, opt_g, opt_d, 5, micro=3)
    frames = frames_of(probe, collector)
    steps = [f for f in frames if f["kind"] == "step"]
    assert len(steps) == 5
    assert not any(s.get("grads_not_cleared") for s in steps)
    assert [f["alert"]["kind"] for f in frames if f["kind"] == "alert"] == []


def test_the_optimizer_argument() -> None:
    model = nn.Linear(2, 2)
    one = torch.optim.SGD(model.parameters(), lr=0.1)
    assert optimizer_of(one) is one
    assert optimizer_of([one]) is one
    assert optimizer_of([one, one]) is one  # the same optimizer twice is one
    other = torch.optim.Adam(model.parameters())
    both = optimizer_of((one, other))
    assert isinstance(both, OptimizerSet) and both.optimizers == (one, other)
    assert both.param_groups == [*one.param_groups, *other.param_groups]
    with pytest.raises(TypeError, match="watch\\(\\) takes the optimizer"):
        optimizer_of(list(model.parameters()))  # parameters where the optimizer goes
    with pytest.raises(TypeError):
        both.step()


def test_a_failure_in_the_per_optimizer_hooks_never_reaches_training(
    collector: FrameCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    gan = Gan()
    opt_g = torch.optim.SGD(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-3)
    probe = watch_unthinned(gan, [opt_g, opt_d], collector)

    def broken(index: int) -> None:
        raise RuntimeError("broken hook")

    probe._per_optimizer._keep = broken  # type: ignore[union-attr]
    train_gan(probe, gan, opt_g, opt_d, 2)  # trains on: nothing raised into step()
    frames = frames_of(probe, collector)
    errors = [f for f in frames if f["kind"] == "event" and f["name"] == "probe_error"]
    assert len(errors) == 1 and "broken hook" in errors[0]["message"]
    assert "probe switched off" in capsys.readouterr().err


def test_each_optimizers_passes_are_counted_as_one_optimizers_are(
    collector: FrameCollector,
) -> None:
    """Each optimizer's gradient is watched by the clearing watch one optimizer has
    (``probes.runtime.optimizers.clearing``): a clip of it, in place after its pass,
    is no pass, and an in-place clear of the generator's, before its pass, neither."""
    gan = Gan()
    opt_g = torch.optim.SGD(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-3)
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    probe = watch_unthinned(gan, [opt_g, opt_d], collector, sample_every=1)
    for _ in range(4):
        with probe.step():
            opt_d.zero_grad()
            fake = gan.g(torch.randn(8, 2))
            d_loss = F.binary_cross_entropy_with_logits(gan.d(torch.randn(8, 2) + 3), ones)
            d_loss = d_loss + F.binary_cross_entropy_with_logits(gan.d(fake.detach()), zeros)
            d_loss.backward()
            torch.nn.utils.clip_grad_norm_(gan.d.parameters(), 0.5)
            opt_d.step()
            opt_g.zero_grad(set_to_none=False)
            F.binary_cross_entropy_with_logits(gan.d(fake), ones).backward()
            torch.nn.utils.clip_grad_norm_(gan.g.parameters(), 0.5)
            opt_g.step()
    steps = [f for f in frames_of(probe, collector) if f["kind"] == "step"]
    assert [s["backward_passes"] for s in steps] == [[1, 1, 1, 1]] * 4
    assert not any(s.get("grads_not_cleared") for s in steps)


def test_accumulating_on_purpose_each_optimizers_passes_are_counted_without_hooks(
    collector: FrameCollector,
) -> None:
    """With ``grad_accumulation`` nothing checks clearing: the optimizers' watches hook
    nothing (the model's own watch keeps its anchor, the first layer's weight) and
    count each one's passes from the versions alone."""
    gan = Gan()
    opt_g = torch.optim.SGD(gan.g.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(gan.d.parameters(), lr=1e-3)
    probe = watch_unthinned(gan, [opt_g, opt_d], collector, sample_every=1, grad_accumulation=True)
    hooked = [p for p in gan.parameters() if p._post_accumulate_grad_hooks]
    assert hooked == [gan.g[0].weight]
    train_gan_accumulating(probe, gan, opt_g, opt_d, 3, micro=3)
    steps = [f for f in frames_of(probe, collector) if f["kind"] == "step"]
    assert [s["backward_passes"] for s in steps] == [[3, 3, 3, 3]] * 3
