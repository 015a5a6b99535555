"""One incident per root cause: grouping, folding consequences under their cause, the
checklist's order, and the rules that need a cause's context (updates_not_applied,
probe_overhead). Pure: synthetic records through ``Diagnoser`` and ``MonitorState``."""

from __future__ import annotations

import math
import random
from typing import Any

from probes.kernel.diagnosis import Alert, AlertChange, Diagnoser, RunInfo, rung_of
from probes.kernel.wire import make_frame
from tui.events import AlertRaised
from tui.headless import causes_line
from tui.state import MonitorState

Record = dict[str, Any]
DEEP = tuple(str(2 * i) for i in range(16))  # a 16-layer stack: 0, 2, ..., 30


def step(n: int, grads: Any = (1.0, 1.0, 1.0), loss: float = 1.0, **fields: Any) -> Record:
    grads = list(grads)
    return {
        "kind": "step",
        "step": n,
        "scalars": {"loss": loss},
        "grad_norms": grads,
        "grad_norm_total": math.sqrt(sum((g or 0.0) ** 2 for g in grads)),
        "lr": [1e-3],
        **fields,
    }


def evaluation(n: int, val_loss: float) -> Record:
    return {
        "kind": "eval",
        "step": n,
        "scalars": {"val_loss": val_loss},
        "forwards": 1,
        "train_mode_forwards": 0,
        "grad_forwards": 0,
    }


def run(records: list[Record], info: RunInfo) -> tuple[Diagnoser, list[AlertChange]]:
    diagnoser = Diagnoser(info)
    changes = [c for r in records for c in diagnoser.observe(r)] + diagnoser.finish()
    return diagnoser, changes


def lines(changes: list[AlertChange]) -> list[str]:
    return [c.alert.line() for c in changes if c.raised]


# --- grouping ------------------------------------------------------------------------------


def vanishing_stack(steps: int, sample_every: int = 20) -> list[Record]:
    """Layer i's gradient 1e-(15 - i) of the last's: the first 11 vanish (below 1e-4)."""
    records = []
    for n in range(steps):
        record = step(n, [10.0 ** (i - 15) for i in range(16)])
        if n % sample_every == 0:
            record["param_norms"] = [1.0] * 16
            record["update_ratios"] = [1e-9] * 14 + [1e-3] * 2  # tiny updates where tiny grads
        records.append(record)
    return records


def test_a_vanishing_stack_is_one_line_naming_the_first_layer() -> None:
    diagnoser, changes = run(vanishing_stack(120), RunInfo(layers=DEEP))
    assert len(lines(changes)) == 1, lines(changes)
    alert = changes[0].alert
    assert (alert.kind, alert.subject, alert.step) == ("vanishing_gradient", "0", 19)
    assert (alert.evidence["layers_affected"], alert.evidence["range"]) == (11, "0..20")
    # its consequence, tiny updates on the same layers, is listed under it, not raised
    assert diagnoser.active["vanishing_gradient"].folded == ("update_ratio@40",)
    assert diagnoser.folded == {"update_ratio": "vanishing_gradient"}


def test_low_update_ratios_on_other_layers_are_not_folded() -> None:
    """Near miss for the fold: tiny updates on most layers, some of them with fine
    gradients, are their own cause (a learning rate too low), even while the first
    layers vanish: only tiny updates all on vanishing layers fold under them."""
    records = vanishing_stack(120)
    for record in records:
        if "update_ratios" in record:
            record["update_ratios"] = [1e-3] * 6 + [1e-9] * 10  # layers 12..30: 28, 30 fine
    _, changes = run(records, RunInfo(layers=DEEP))
    assert [c.alert.kind for c in changes if c.raised] == ["vanishing_gradient", "update_ratio"]
    assert changes[1].alert.subject == "12"


def test_two_low_layers_of_sixteen_are_not_a_learning_rate_too_low() -> None:
    records = vanishing_stack(120)
    for record in records:
        if "update_ratios" in record:
            record["update_ratios"] = [1e-3] * 14 + [1e-9] * 2
    _, changes = run(records, RunInfo(layers=DEEP))
    assert [c.alert.kind for c in changes if c.raised] == ["vanishing_gradient"]


# --- folding --------------------------------------------------------------------------------


def explosion(start: int = 40, *, evals: bool = True, spike_before: bool = False) -> list[Record]:
    """Gradients grow 3x a step from ``start``; the validation loss rises meanwhile (as
    a diverging model's does) while the train loss's smoothed level falls at first."""
    rng = random.Random(0)
    records: list[Record] = []
    for n in range(start + 20):
        g = 1.0 if n < start else 3.0 ** (n - start)
        loss = 2.0 * math.exp(-n / 20) + 0.05 * rng.random()
        if spike_before and n == start + 2:
            loss = 40.0
        records.append(step(n, [g, 0.5, 0.5], loss=loss))
        if evals and n % 10 == 9:
            records.append(evaluation(n, 1.0 if n < start else 1.0 + (n - start) * 0.3))
    return records


def test_no_overfitting_signal_while_exploding() -> None:
    diagnoser, changes = run(explosion(), RunInfo(layers=("a", "b", "c")))
    assert [c.alert.kind for c in changes if c.raised] == ["exploding_gradient"]
    folded = diagnoser.active["exploding_gradient"].folded
    assert [f.split("@")[0] for f in folded] == ["overfitting_signal"]


def test_the_same_validation_rise_without_an_explosion_is_an_overfitting_signal() -> None:
    records = [r for r in explosion() if r["kind"] == "eval" or r["step"] < 40]
    records += [step(n, loss=2.0 * math.exp(-n / 20)) for n in range(40, 60)]
    records.sort(key=lambda r: (r["step"], r["kind"] == "eval"))
    _, changes = run(records, RunInfo(layers=("a", "b", "c")))
    assert [c.alert.kind for c in changes if c.raised] == ["overfitting_signal"]


def test_a_loss_spike_found_just_before_its_explosion_waits_for_it_and_folds() -> None:
    diagnoser, changes = run(
        explosion(evals=False, spike_before=True), RunInfo(layers=("a", "b", "c"))
    )
    assert [c.alert.kind for c in changes if c.raised] == ["exploding_gradient"]
    assert diagnoser.active["exploding_gradient"].folded == ("loss_spike@42",)


def test_a_consequence_whose_cause_never_comes_is_raised_at_its_own_step() -> None:
    rng = random.Random(5)
    records = [step(n, loss=(30.0 if n == 60 else 1.0 + 0.05 * rng.random())) for n in range(64)]
    diagnoser = Diagnoser(RunInfo(layers=("a", "b", "c")))
    during = [c for r in records for c in diagnoser.observe(r)]
    assert during == []  # still waiting for a cause when the run ends
    ended = diagnoser.finish()
    assert [(c.alert.kind, c.alert.step) for c in ended] == [("loss_spike", 60)]
    later = Diagnoser(RunInfo(layers=("a", "b", "c")))
    more = [c for r in [*records, *(step(n) for n in range(64, 70))] for c in later.observe(r)]
    assert [(c.alert.kind, c.alert.step) for c in more if c.raised] == [("loss_spike", 60)]


def test_an_explosion_grown_from_uncleared_gradients_folds_under_them() -> None:
    records = [step(n, [1.0 + 0.5 * n**2, 1.0, 1.0], grads_not_cleared=n > 0) for n in range(40)]
    records.append(step(40, [math.inf, 1.0, 1.0], loss=math.nan, grads_not_cleared=True))
    diagnoser, changes = run(records, RunInfo(layers=("a", "b", "c")))
    assert lines(changes) == [changes[0].alert.line()]
    assert (changes[0].alert.kind, changes[0].alert.step) == ("grad_not_cleared", 2)
    folded = [f.split("@")[0] for f in diagnoser.active["grad_not_cleared"].folded]
    assert folded == ["exploding_gradient", "non_finite"]


def test_consequences_fold_under_a_cause_raised_by_the_probe() -> None:
    """mostly_frozen comes from the training side at step 0; the flat loss it causes is
    listed under it, in the monitor's entry too."""
    state = MonitorState()
    hello = make_frame("hello", run="r", name="frozen", layers=["bn1", "bn2"], config={"every": 1})
    frozen = Alert(
        "mostly_frozen", "warning", 0, "", {"frozen_fraction": 0.97}, "s", (), layers=("bn1", "bn2")
    )
    frames = [hello, make_frame("alert", run="r", step=0, alert=frozen.to_dict())]
    rng = random.Random(6)
    frames += [
        make_frame(
            "step",
            run="r",
            step=n,
            time=float(n),
            duration=0.01,
            scalars={"loss": 1.0 + 0.01 * rng.random()},
            lr=[1e-3],
            grad_norms=[0.1, 0.1],
            grad_norm_total=0.14,
            none_grads=0,
        )
        for n in range(260)
    ]
    frames.append(make_frame("bye", run="r", reason="closed"))
    raised = [e.alert for f in frames for e in state.apply(1, f) if isinstance(e, AlertRaised)]
    assert [a.kind for a in raised] == ["mostly_frozen"]
    run_state = state.runs["r"]
    assert [f.split("@")[0] for f in run_state.alerts[0].alert.folded] == ["flat_loss"]
    assert "update/mostly_frozen@0(run) folded=flat_loss@200" in causes_line(run_state)


# --- the checklist's order -------------------------------------------------------------------


def test_alerts_rising_together_come_in_checklist_order() -> None:
    """One record: a NaN loss (values), an exploding layer (gradient path) and uncleared
    gradients (update)."""
    records = [step(n) for n in range(3)]
    records.append(step(3, [500.0, 1.0, 1.0], loss=math.nan, grads_not_cleared=True))
    records.append(step(4, [500.0, 1.0, 1.0], loss=math.nan, grads_not_cleared=True))
    _, changes = run(records, RunInfo(layers=("a", "b", "c")))
    kinds = [c.alert.kind for c in changes if c.raised]
    assert kinds == ["non_finite", "exploding_gradient", "grad_not_cleared"]
    assert [rung_of(k) for k in kinds] == [2, 4, 5]


def test_the_catalog_orders_the_checklist() -> None:
    assert (
        rung_of("duplicates_across_splits")
        < rung_of("broadcast_in_loss")
        < rung_of("flat_loss")
        < rung_of("vanishing_gradient")
        < rung_of("grad_not_cleared")
        < rung_of("overfitting_signal")
        < rung_of("probe_overhead")
    )


# --- updates_not_applied ---------------------------------------------------------------------


INFO = RunInfo(layers=("a", "b", "c"), update_check=True)


def test_a_learning_rate_of_zero_is_an_update_not_applied_from_the_third_step() -> None:
    _, changes = run([step(n, lr=[0.0]) for n in range(10)], INFO)
    alert = next(c.alert for c in changes if c.raised)
    assert (alert.kind, alert.subject, alert.step) == ("updates_not_applied", "a", 2)
    assert alert.evidence["evidence"] == "lr=0"


def test_a_warmup_from_zero_is_not_an_update_not_applied() -> None:
    _, changes = run([step(n, lr=[0.0 if n == 0 else 1e-4 * n]) for n in range(30)], INFO)
    assert lines(changes) == []


def test_a_layer_the_optimizer_never_touches() -> None:
    _, changes = run([step(n, not_stepped=[1]) for n in range(10)], INFO)
    alert = next(c.alert for c in changes if c.raised)
    assert (alert.kind, alert.subject, alert.layers) == ("updates_not_applied", "b", ("b",))
    assert alert.evidence["evidence"] == "not_stepped"


def test_untouched_version_counters_are_not_trusted_once_weights_are_seen_to_move() -> None:
    """A custom optimizer writing through .data bumps no version counter: the sampled
    update ratio shows the weights do move, and the counters are ignored from then on."""
    records = [
        step(
            n,
            not_stepped=[0, 1, 2],
            **({"update_ratios": [1e-3] * 3, "param_norms": [1.0] * 3} if n % 20 == 0 else {}),
        )
        for n in range(60)
    ]
    _, changes = run(records, INFO)
    assert lines(changes) == []


def test_no_update_evidence_without_the_probe_saying_it_checks() -> None:
    records = [step(n, not_stepped=[0, 1, 2]) for n in range(10)]
    _, changes = run(records, RunInfo(layers=("a", "b", "c")))  # an older probe
    assert lines(changes) == []


# --- probe_overhead ---------------------------------------------------------------------------


def timed(
    n: int,
    probe: float,
    *,
    sampled_probe: float | None = None,
    step_s: float = 0.010,
    **fields: Any,
) -> Record:
    sampled = n % 20 == 0
    own = sampled_probe if sampled and sampled_probe is not None else probe
    extra = {"param_norms": [1.0] * 3} if sampled else {}
    return step(
        n, loss=math.exp(-n / 50), duration=step_s, probe_time=own * step_s, **extra, **fields
    )


def test_probe_overhead_names_every_when_each_step_costs_too_much() -> None:
    _, changes = run(
        [timed(n, 0.10) for n in range(130)],
        RunInfo(layers=("a", "b", "c"), every=1, sample_every=20),
    )
    alert = next(c.alert for c in changes if c.raised)
    assert (alert.kind, alert.severity, alert.step) == ("probe_overhead", "info", 109)
    assert math.isclose(alert.evidence["probe_share"], 0.10)
    assert alert.evidence["setting"] == "watch(every=2)"


def test_probe_overhead_names_sample_every_when_sampled_steps_cost_it() -> None:
    _, changes = run(
        [timed(n, 0.01, sampled_probe=1.5) for n in range(130)],
        RunInfo(layers=("a", "b", "c"), sample_every=20),
    )
    alert = next(c.alert for c in changes if c.raised)
    assert alert.evidence["setting"].startswith("watch(sample_every=")
    assert int(alert.evidence["setting"].split("=")[1].rstrip(")")) > 20


def test_probe_overhead_near_misses() -> None:
    info = RunInfo(layers=("a", "b", "c"))
    assert lines(run([timed(n, 0.04) for n in range(300)], info)[1]) == []  # 4%
    assert lines(run([timed(n, 0.10) for n in range(90)], info)[1]) == []  # 80 steps
    # 10% of a 1 ms step: a tenth of a millisecond is not what makes a run slow
    tiny = [timed(n, 0.10, step_s=0.001) for n in range(300)]
    assert lines(run(tiny, info)[1]) == []
    older_probe = [step(n, loss=math.exp(-n / 50), duration=0.01) for n in range(300)]
    assert lines(run(older_probe, info)[1]) == []  # no probe_time: never raised


def test_probe_overhead_near_miss_on_a_crowded_machine() -> None:
    """A small model's probe (0.1 ms of a 1 ms step) on a machine busy with other work:
    half the steps stretched tenfold, the probe's part with them. Its mean share and
    cost pass the bounds; its own cost, the cheapest steps', does not."""
    records = [timed(n, 0.10, step_s=0.010 if n % 2 else 0.001) for n in range(300)]
    assert lines(run(records, RunInfo(layers=("a", "b", "c")))[1]) == []
    stretched = [timed(n, 0.10, step_s=0.010) for n in range(300)]  # every step: a cost
    assert [
        c.alert.kind for c in run(stretched, RunInfo(layers=("a", "b", "c")))[1] if c.raised
    ] == ["probe_overhead"]


def thinned_timed(index: int, probe: float, step_s: float, steps: int = 50) -> Record:
    """Record ``index`` of a fast run: ``steps`` steps merged, their times summed."""
    first, last = index * steps, index * steps + steps - 1
    return step(
        last,
        loss=math.exp(-last / 500),
        duration=steps * step_s,
        probe_time=steps * probe * step_s,
        span=[first, last],
    )


def test_probe_overhead_of_a_fast_run_needs_a_cheap_record_among_several() -> None:
    """A fast run's records stand for 50 steps each: 100 steps are two records, and a
    busy machine stretches both alike. The cheapest of at least ``MIN_RECORDS`` tells
    the probe's cost from the machine's: one cheap record in every four is enough."""
    info = RunInfo(layers=("a", "b", "c"))
    busy = [thinned_timed(i, 0.10, 0.001 if i % 4 == 0 else 0.010) for i in range(24)]
    assert lines(run(busy, info)[1]) == []
    slow = [thinned_timed(i, 0.10, 0.010) for i in range(24)]  # every record: a cost
    [alert] = [c.alert for c in run(slow, info)[1] if c.raised]
    assert alert.kind == "probe_overhead"
    assert alert.step == 8 * 50 + 49  # the 8th record after warm-up (record 0 is in it)
    assert math.isclose(alert.evidence["probe_share"], 0.10)


# --- counts that agree with their lists ----------------------------------------------------

THREE = RunInfo.from_hello({"layers": ["enc.0", "enc.1", "head"]})


def test_an_incident_that_comes_to_concern_more_layers_counts_them_all() -> None:
    """The exploding gradient raised on two layers, then a third crosses: the evidence's
    count and range follow the layers listed (the line printed at the raise stays)."""
    records = [step(n, [200.0, 200.0, 1.0]) for n in range(3)]
    records += [step(n, [200.0, 200.0, 300.0]) for n in range(3, 6)]
    diagnoser, changes = run(records, THREE)
    [line] = lines(changes)
    assert "layers_over=2 range=enc.0..enc.1" in line
    alert = diagnoser.incidents["exploding_gradient"]
    assert alert.layers == ("enc.0", "enc.1", "head")
    assert (alert.evidence["layers_over"], alert.evidence["range"]) == (3, "enc.0..head")


def update_sample(n: int, ratios: list[float]) -> Record:
    return step(n, param_norms=[5.0] * 3, update_ratios=ratios)


def test_an_update_ratio_alert_lists_only_the_layers_on_its_side() -> None:
    """Two layers far too low (the learning rate) and one far too high: the alert says
    low, and lists the two low layers, not the high one."""
    records = [update_sample(n * 20, [1e-7, 0.5, 1e-7]) for n in range(3)]
    _, changes = run(records, THREE)
    [alert] = [c.alert for c in changes if c.raised and c.alert.kind == "update_ratio"]
    assert alert.evidence["side"] == "low"
    assert alert.layers == ("enc.0", "head")
    assert (alert.evidence["layers_affected"], alert.evidence["range"]) == (2, "enc.0..head")


def test_an_update_ratio_held_high_takes_no_layer_that_is_low() -> None:
    """Raised high on one layer; then every layer's ratio near zero: the incident still
    says high, and lists no layer whose ratio is near zero."""
    records = [update_sample(n * 20, [1e-3, 0.5, 1e-3]) for n in range(3)]
    records += [update_sample(60 + n * 20, [1e-7, 0.5, 1e-7]) for n in range(3)]
    diagnoser, _ = run(records, THREE)
    alert = diagnoser.incidents["update_ratio"]
    assert alert.evidence["side"] == "high"
    assert alert.layers == ("enc.1",)


def test_dead_activations_count_the_layers_they_list() -> None:
    """Two dead ReLUs fed by one layer, and a layer whose input is all zero: the
    count and range are of the layers listed, not of the activations found."""
    info = RunInfo.from_hello(
        {
            "layers": ["0", "3", "7"],
            "activations": [["1", "relu", 0], ["2", "relu", 0], ["7(input)", "input", 1]],
        }
    )
    records = [step(n * 20, activations=[1.0, 1.0, 1.0]) for n in range(3)]
    _, changes = run(records, info)
    [alert] = [c.alert for c in changes if c.raised and c.alert.kind == "dead_activations"]
    assert alert.layers == ("0", "3", "7")
    assert (alert.evidence["layers_affected"], alert.evidence["range"]) == (3, "0..7")


def test_the_alert_detail_says_how_many_layers_it_shows_of_how_many() -> None:
    from tui.screens.alert_detail import MAX_LAYERS_SHOWN, incident_text

    layers = DEEP
    alert = Alert("vanishing_gradient", "warning", 19, "0", {}, "s", (), layers=layers)
    text = incident_text(alert).plain
    shown = ", ".join(layers[:MAX_LAYERS_SHOWN])
    assert f"Layers ({MAX_LAYERS_SHOWN} shown of 16, the first failing first): {shown} ..." in text
    few = Alert("vanishing_gradient", "warning", 19, "0", {}, "s", (), layers=layers[:3])
    assert "Layers (3, the first failing first): 0, 2, 4\n" in incident_text(few).plain
