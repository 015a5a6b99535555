"""The probe's whole cost: the sender's CPU time counted in ``probe_time``, and the
per-step work kept out of Python loops (the same numbers, made in fewer passes)."""

from __future__ import annotations

import math
import random
import threading
from typing import Any

import pytest
import torch
from torch import nn

from probes.kernel.thinning import ESCALATION, Member, ceiling, plan
from probes.runtime.live_checks.structure import UpdateCheck
from probes.runtime.measure.host_copy import HostRing
from probes.runtime.measure.layers import LayerMap, combine_layer_norms, map_layers
from probes.runtime.measure.stats import GRADS, Measurement
from tests.collector import FrameCollector, wait_for_bye, watch_unthinned


class FakeEvent:
    """A CUDA event's stand-in: the copy it marks has landed once ``done``."""

    def __init__(self) -> None:
        self.done = True
        self.recorded = 0

    def record(self) -> None:
        self.recorded += 1

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_the_ring_reuses_a_pair_once_its_values_are_read() -> None:
    ring = HostRing(2, pin_memory=False, make_event=FakeEvent)
    first = ring.take(4, torch.float32)
    second = ring.take(4, torch.float32)
    assert first[0] is not second[0] and first[1] is not second[1]  # both held
    ring.give_back(*first)
    again = ring.take(4, torch.float32)
    assert again[0] is first[0] and again[1] is first[1]
    other = ring.take(5, torch.float32)  # another size: a pair of its own
    assert other[0].numel() == 5 and ring.made == 3


def test_the_ring_keeps_at_most_its_slots_per_size() -> None:
    ring = HostRing(1, pin_memory=False, make_event=FakeEvent)
    pairs = [ring.take(3, torch.float64) for _ in range(3)]
    for pair in pairs:
        ring.give_back(*pair)
    assert ring.take(3, torch.float64)[0] is pairs[0][0]
    ring.take(3, torch.float64)  # the others were not kept: made anew
    assert ring.made == 4


def test_a_measurement_gives_its_pair_back_once_read() -> None:
    layers = map_layers(nn.Linear(2, 2))
    ring = HostRing(pin_memory=False, make_event=FakeEvent)
    host, event = ring.take(2, torch.float32)
    host.copy_(torch.tensor([3.0, 4.0]))
    event.done = False  # the copy still in flight
    step = Measurement(layers, 0, 0.0, False)
    step.values, step.event, step.ring = host, event, ring
    step.layout.add(GRADS, 2)
    assert not step.ready()
    event.done = True
    assert step.ready()
    assert step.to_record()["grad_norms"] == [5.0]  # weight and bias: one layer
    assert ring.take(2, torch.float32)[0] is host  # read: given back
    assert step.ready() and step.has_non_finite() is False  # read once, kept


def test_per_layer_norms_in_c_are_the_loops_to_the_bit() -> None:
    """The fast path (every parameter present) against the general loop, on layouts
    of one to four parameters a layer, with NaN and Inf among them."""
    rng = random.Random(1)
    for trial in range(200):
        counts = [rng.choice([1, 1, 2, 2, 3, 4]) for _ in range(rng.randint(1, 30))]
        param_layer = tuple(i for i, count in enumerate(counts) for _ in range(count))
        layers = LayerMap(
            names=tuple(str(i) for i in range(len(counts))),
            params=(),
            param_names=(),
            param_layer=param_layer,
            param_counts=tuple(counts),
        )
        norms = [rng.random() * 10 ** rng.randint(-20, 20) for _ in param_layer]
        if trial % 7 == 0:
            norms[0] = math.nan
        if trial % 11 == 0:
            norms[-1] = math.inf
        fast = combine_layer_norms(norms, None, layers)
        loop = combine_layer_norms(norms, tuple(range(len(norms))), layers)
        assert [repr(v) for v in fast] == [repr(v) for v in loop]


def test_a_layout_out_of_layer_order_takes_the_loop() -> None:
    layers = LayerMap(
        names=("a", "b"), params=(), param_names=(), param_layer=(1, 0, 1), param_counts=(1, 2)
    )
    assert combine_layer_norms([3.0, 1.0, 4.0], None, layers) == [1.0, 5.0]


def _slow_cuts(members: list[Member], reference: tuple[float, ...]) -> list[int]:
    """The escalation scan as it was: every step divided out."""
    tops, cuts = reference, []
    for i, member in enumerate(members):
        grown = max(
            (v / t if t > 0 else 0.0 for v, t in zip(member.watched, tops, strict=False)),
            default=0.0,
        )
        tops = ceiling([Member(False, False, tops), member]) if tops else member.watched
        if grown >= ESCALATION:
            cuts.append(i)
    return cuts


def test_the_escalation_scan_finds_what_dividing_every_step_finds() -> None:
    rng = random.Random(2)
    for _ in range(300):
        width = rng.randint(1, 6)
        members = []
        for _ in range(rng.randint(1, 12)):
            values = [rng.choice([0.0, 1.0, 2.0, rng.random() * 4]) for _ in range(width)]
            members.append(Member(False, False, tuple(values)))
        reference = tuple(rng.choice([0.0, 1.0, 0.5]) for _ in range(width))
        escalated = _slow_cuts(members, reference)[:8]
        cuts = {end for _, end, _ in plan(members, reference)}
        for i in escalated:
            assert i in cuts
        # and nothing else is cut but the last step and the step before each escalation
        allowed = {len(members) - 1} | set(escalated) | {i - 1 for i in escalated}
        assert cuts <= allowed


def test_an_exact_doubling_escalates_and_a_hair_under_does_not() -> None:
    reference = (1.0, 1.0, 1.0)
    doubled = [Member(False, False, (1.0, 2.0, 1.0)), Member(False, False, (1.0, 1.0, 1.0))]
    assert [end for _, end, _ in plan(doubled, reference)] == [0, 1]
    under = [Member(False, False, (1.0, math.nextafter(2.0, 0), 1.0))]
    assert [end for _, end, _ in plan(under, reference)] == [0]
    assert ceiling([*doubled, *under]) == (1.0, 2.0, 1.0)


def test_the_update_check_still_names_the_layers_a_step_left_alone() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    check = UpdateCheck(map_layers(model))
    check.before()
    with torch.no_grad():
        model[1].weight.add_(1.0)
    assert check.after() == [0]
    assert check.after() is None  # nothing noted before


def test_the_update_check_answers_again_when_the_untouched_tensors_change() -> None:
    """Its answer is kept for as long as the same tensors are left alone (worked out
    once, not every step); each step gets its own list; a new set, a new answer."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    check = UpdateCheck(map_layers(model))

    def step(*moved: nn.Parameter) -> list[int] | None:
        check.before()
        with torch.no_grad():
            for param in moved:
                param.add_(1.0)
        return check.after()

    first = step(model[1].weight, model[1].bias, model[2].weight)
    assert first == [0]
    first.append(99)  # the record's list, not the check's
    assert step(model[1].weight, model[1].bias, model[2].weight) == [0]
    assert step(model[1].weight) == [0, 2]  # a layer counts as touched if any tensor moved
    assert step(model[2].bias) == [0, 1]
    assert step(*model.parameters()) == []
    assert step() == [0, 1, 2]  # nothing moved: a fused optimizer's step


def test_a_fused_optimizer_moves_no_version_counter_and_every_layer_reads_untouched() -> None:
    """Torch's fused AdamW (the HF Trainer's default) bumps no version counter: every
    layer reads untouched (the monitor stops trusting the counters once a sampled step's
    update ratios show the weights moved)."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    check = UpdateCheck(map_layers(model))
    for _ in range(2):
        model(torch.randn(3, 2)).sum().backward()
        check.before()
        optimizer.step()
        assert check.after() == [0, 1]


def test_gradients_read_in_one_pass_still_name_the_missing_ones(
    collector: FrameCollector,
) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    with probe.step():
        optimizer.zero_grad(set_to_none=True)
        model[1](torch.randn(2, 3)).sum().backward()  # the first layer has no gradient
        optimizer.step()
    probe.close()
    wait_for_bye(collector)
    [record] = collector.kinds("step")
    assert record["none_grads"] == 2 and record["none_grad_params"] == [0, 1]
    assert record["grad_norms"][0] is None and record["grad_norms"][1] > 0


def test_the_senders_cpu_time_is_counted_in_probe_time(collector: FrameCollector) -> None:
    """The records' probe_time adds the sender thread's CPU time to the training
    thread's: more than the training thread's alone, and no more than the sender spent."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(20)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, optimizer, collector)
    training: list[float] = []
    put = probe.sender.put

    def counting_put(item: Any) -> None:
        if not isinstance(item, dict):
            training.append(item.probe_time)
        put(item)

    probe.sender.put = counting_put
    sending = threading.Event()
    for i in range(60):
        with probe.step():
            optimizer.zero_grad()
            model(torch.randn(4, 16)).square().mean().backward()
            optimizer.step()
        if i % 10 == 9:  # let the sender run between steps: several of its cycles
            sending.wait(0.06)
    probe.close()
    wait_for_bye(collector)
    records = collector.kinds("step")
    assert len(records) == len(training) == 60
    recorded = math.fsum(r["probe_time"] for r in records)
    added = recorded - math.fsum(training)
    assert probe.sender.cpu_seconds > 0
    assert 0 < added <= probe.sender.cpu_seconds * (1 + 1e-9)


def test_an_idle_sender_owes_no_step_any_time(collector: FrameCollector) -> None:
    model = nn.Linear(2, 2)
    probe = watch_unthinned(model, None, collector)
    threading.Event().wait(0.3)  # wake-ups with nothing to send
    assert probe.sender.cpu_seconds == 0.0
    probe.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_reuse_their_pinned_buffers(collector: FrameCollector) -> None:
    model = nn.Linear(8, 8).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector)
    for _ in range(50):
        with probe.step():
            optimizer.zero_grad()
            model(torch.randn(4, 8, device="cuda")).sum().backward()
            optimizer.step()
        torch.cuda.synchronize()
        threading.Event().wait(0.002)
    ring = probe._measurer._ring
    probe.close()
    wait_for_bye(collector)
    assert len(collector.kinds("step")) == 50
    assert ring.made < 25  # most steps took a pair given back


def test_our_hooks_inside_forward_and_backward_count_as_the_probes_time(
    collector: FrameCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The activation counts (a sampled step's forward) and the clearing watch (every
    backward pass) run where the step's boundary does not see them: their time is
    added to the step's ``probe_time`` all the same. Their clocks here advance 1 ms a
    reading, so each hook call spends 1 ms."""
    import itertools

    import probes.runtime.measure.sampled as sampled
    import probes.runtime.optimizers.clearing as clearing

    for module in (clearing, sampled):
        ticks = itertools.count()
        monkeypatch.setattr(module, "perf_counter", lambda ticks=ticks: next(ticks) * 1e-3)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = watch_unthinned(model, optimizer, collector, sample_every=2)
    for _ in range(4):
        with probe.step():
            optimizer.zero_grad()
            model(torch.randn(16, 4)).sum().backward()
            optimizer.step()
    probe.close()
    wait_for_bye(collector)
    spent = {r["step"]: r["probe_time"] for r in collector.kinds("step")}
    # the backward's two hooks on the anchor (the rest of the probe: a fraction of 1 ms)
    assert spent[1] >= 0.002 and spent[3] >= 0.002
    # and the forward's: the model's input (its scale) and the ReLU's count
    assert spent[0] >= 0.004 and spent[2] >= 0.004


def test_a_fused_optimizer_is_not_version_checked_and_its_clearing_still_is(
    collector: FrameCollector,
) -> None:
    """Every param group fused: no ``not_stepped`` list of every layer on every record
    (the counters say nothing there), and the clearing check, which the same hook after
    ``optimizer.step()`` feeds, still sees a forgotten ``zero_grad``."""
    from probes.runtime.live_checks.structure import counters_blind

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 1))
    fused = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    assert counters_blind(fused)
    assert not counters_blind(torch.optim.AdamW(model.parameters(), lr=0.1))
    mixed = torch.optim.AdamW([{"params": model[0].parameters()}], lr=0.1, fused=True)
    mixed.add_param_group({"params": model[1].parameters(), "fused": False})
    assert not counters_blind(mixed)
    probe = watch_unthinned(model, fused, collector)
    for _ in range(3):
        with probe.step():  # (no zero_grad: the gradients add up)
            model(torch.randn(8, 2)).sum().backward()
            fused.step()
    probe.close()
    wait_for_bye(collector)
    records = collector.kinds("step")
    assert len(records) == 3
    assert not any("not_stepped" in r for r in records)
    assert [bool(r.get("grads_not_cleared")) for r in records] == [False, True, True]
