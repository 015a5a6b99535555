"""Each evaluation keeps its own validation loss, reduced as the script reduces it, and
evaluations on different splits are not averaged (issue 29 item 3).

Before: an inferred evaluation's ``val_loss`` was the mean of its loss calls, so
pytorch/examples' MNIST ``test()`` (a ``reduction='sum'`` loss a batch, divided by the
dataset's size) showed the mean of the batch sums (about 150 for a loss of 2.3), and a
GCN's evaluation (one forward, a loss on each of the train, val and test masks) showed
the three splits averaged, a number the script never prints."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probes.kernel.replay import ReplayHistory
from probes.runtime.evaluation import functional
from probes.runtime.evaluation.autoeval import series_names
from tests.collector import FrameCollector, wait_for_bye
from tests.e2e.test_run import _FLOAT, ROOT, SCRIPTS
from tests.recorded import replay
from tui.run import RunState
from tui.state import MonitorState

# --- under ``traintop run``: unmodified scripts, the monitor's numbers and theirs ------


def traintop_run(tmp_path: Any, script: str, *args: str) -> tuple[str, RunState]:
    """``traintop run --headless --record LOG`` on ``evalsplits/SCRIPT.py``: what the
    script printed, and the run as a monitor holds it (the log replayed)."""
    log = os.path.join(tmp_path, f"{script}.ndjson")
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--record", log]
    command += [sys.executable, os.path.join(SCRIPTS, "evalsplits", f"{script}.py"), *args]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, replay(log).run()


def held(run: RunState, name: str) -> list[float]:
    """The values of the run's eval series ``name``, as the monitor holds them."""
    return run.eval_scalars[name].points()[1]


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
@pytest.mark.parametrize(
    "how",
    [
        "sum",  # F.nll_loss(output, target, reduction='sum').item(), / len(dataset)
        pytest.param("mean", marks=pytest.mark.slow),  # a batch's mean times its size
        pytest.param("module", marks=pytest.mark.slow),  # nn.NLLLoss(reduction="sum")
    ],
)
def test_mnist_test_loss_is_the_one_the_script_prints(tmp_path: Any, how: str) -> None:
    """Before: the mean of the batch sums (~147 where the script printed 2.30)."""
    output, run = traintop_run(tmp_path, "mnist_eval", how)
    printed = [float(v) for v in re.findall(rf"\btest ({_FLOAT})", output)]
    assert len(printed) == 3
    assert run.validation is not None and run.validation[0] == "val_loss"
    assert list(run.eval_scalars) == ["val_loss"]
    assert held(run, "val_loss") == pytest.approx(printed, rel=1e-6)


def _printed_splits(output: str) -> list[dict[str, float]]:
    """Each ``splits train=X val=Y test=Z`` line (written in one piece; a monitor's line
    may come between it and its newline: the stream is shared)."""
    lines = re.findall(rf"\bsplits train=({_FLOAT}) val=({_FLOAT}) test=({_FLOAT})", output)
    return [dict(zip(("train", "val", "test"), map(float, line), strict=True)) for line in lines]


@pytest.mark.slow  # (a child process, ~5 s: the same evaluation with watch() below)
def test_gcn_masks_named_in_the_script_are_three_series(tmp_path: Any) -> None:
    """``loss_val = F.nll_loss(output[idx_val], labels[idx_val])`` and its two siblings:
    three series, named for their splits; the validation one is ``val_loss``."""
    output, run = traintop_run(tmp_path, "gcn_masks", "named")
    printed = _printed_splits(output)
    assert len(printed) == 4
    assert sorted(run.eval_scalars) == ["test_loss", "train_loss", "val_loss"]
    for split in ("train", "val", "test"):
        expected = [p[split] for p in printed]
        assert held(run, f"{split}_loss") == pytest.approx(expected, rel=1e-6)
    assert run.validation is not None and run.validation[0] == "val_loss"


@pytest.mark.slow  # (a child process: the names are tested with watch() below too)
def test_gcn_masks_in_a_loop_are_three_series_by_their_order(tmp_path: Any) -> None:
    """``for mask in [idx_train, idx_val, idx_test]``: no line names a split; the k-th
    loss after the forward is series k, the first the validation loss."""
    output, run = traintop_run(tmp_path, "gcn_masks", "loop")
    printed = _printed_splits(output)
    assert sorted(run.eval_scalars) == ["val_loss", "val_loss[1]", "val_loss[2]"]
    for name, split in (("val_loss", "train"), ("val_loss[1]", "val"), ("val_loss[2]", "test")):
        assert held(run, name) == pytest.approx([p[split] for p in printed], rel=1e-6)


# --- with watch(): the loops written out here ------------------------------------------


def classifier() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_a_little(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 4, (8,))).backward()
        optimizer.step()


def evals(collector: FrameCollector) -> list[dict[str, float]]:
    """Each eval record's scalars, once the run said bye."""
    wait_for_bye(collector)
    return [frame["scalars"] for frame in collector.kinds("eval")]


def monitor_of(collector: FrameCollector) -> RunState:
    """The run as a monitor holds it, from the frames the probe sent."""
    state = MonitorState()
    for frame in [*collector.frames]:
        state.apply(0, frame)
    [run] = state.runs.values()
    return run


class Watched:
    """A classifier watched by ``watch()`` alone, sending to ``collector``."""

    def __init__(self, collector: FrameCollector) -> None:
        import probes

        self.collector = collector
        self.model, self.optimizer = classifier()
        self.probe = probes.watch(self.model, self.optimizer, address=collector.address)

    def train(self, steps: int = 2) -> None:
        train_a_little(self.model, self.optimizer, steps)

    def evals(self) -> list[dict[str, float]]:
        """Each eval record's scalars, the probe closed."""
        self.probe.close()
        return evals(self.collector)


@pytest.fixture
def watched(collector: FrameCollector) -> Iterator[Watched]:
    run = Watched(collector)
    yield run
    run.probe.close()


def batches(rows: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    x, y = torch.randn(rows, 6), torch.randint(0, 4, (rows,))
    return [(x[i : i + size], y[i : i + size]) for i in range(0, rows, size)]


def test_a_summed_loss_over_a_loader_is_its_sum_over_the_dataset(watched: Watched) -> None:
    """70 rows in batches of 32 (the last one of 6): Σ sums / 70, not the sums' mean."""
    model = watched.model
    loader = batches(70, 32)
    printed = []
    for _ in range(2):
        watched.train()
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in loader:
                total += F.cross_entropy(model(x), y, reduction="sum").item()
        printed.append(total / 70)
    assert [e["val_loss"] for e in watched.evals()] == pytest.approx(printed, rel=1e-6)
    assert held(monitor_of(watched.collector), "val_loss") == pytest.approx(printed, rel=1e-6)


def test_a_batch_mean_weighs_as_many_terms_as_it_averaged(watched: Watched) -> None:
    """A mean taken times its batch's size: ``total += loss.item() * len(x)``, / rows;
    a mean of the batch means differs by the short last batch."""
    model = watched.model
    loader = batches(70, 32)
    watched.train()
    model.eval()
    means = []
    with torch.no_grad():
        for x, y in loader:
            means.append((F.cross_entropy(model(x), y).item(), len(x)))
    watched.train()
    weighted = sum(m * n for m, n in means) / 70
    assert abs(weighted - sum(m for m, _ in means) / len(means)) > 1e-6  # (they differ)
    [scalars] = watched.evals()
    assert scalars == {"val_loss": pytest.approx(weighted, rel=1e-6)}


def test_ignored_targets_are_no_terms(watched: Watched) -> None:
    """A token loss summed over the tokens not ignored (``ignore_index``), divided by
    their number; a batch with every target ignored (its mean is NaN) adds nothing."""
    model = watched.model
    torch.manual_seed(2)
    x = torch.randn(3, 10, 6)
    y = torch.randint(0, 4, (3, 10))
    y[0, :4] = -100
    y[1, 7:] = -100
    y[2, :] = -100  # every target of this batch is padding
    watched.train()
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for xb, yb in zip(x, y, strict=True):
            total += F.cross_entropy(model(xb), yb, reduction="sum").item()
            tokens += int((yb != -100).sum())
    watched.train()
    model.eval()
    weighted = 0.0
    with torch.no_grad():
        for xb, yb in zip(x[:2], y[:2], strict=True):
            weighted += F.cross_entropy(model(xb), yb).item() * int((yb != -100).sum())
        assert math.isnan(F.cross_entropy(model(x[2]), y[2]).item())
    watched.train()
    first, second = watched.evals()
    assert first == {"val_loss": pytest.approx(total / tokens, rel=1e-6)}
    assert second == {"val_loss": pytest.approx(weighted / 13, rel=1e-6)}


def test_one_forward_with_a_loss_per_mask_keeps_each_split(watched: Watched) -> None:
    """One forward, then a loss per split: three series, never their average; named by
    the lines that computed them, the validation loss the one named for it."""
    model = watched.model
    torch.manual_seed(3)
    x, y = torch.randn(60, 6), torch.randint(0, 4, (60,))
    train_mask, val_mask, test_mask = (torch.arange(60) % 3 == k for k in range(3))
    watched.train()
    model.eval()
    with torch.no_grad():
        out = model(x)
        loss_train = F.cross_entropy(out[train_mask], y[train_mask])
        loss_val = F.cross_entropy(out[val_mask], y[val_mask])
        loss_test = F.cross_entropy(out[test_mask], y[test_mask])
    watched.train()
    model.eval()
    with torch.no_grad():
        out = model(x)
        looped = [F.cross_entropy(out[m], y[m]).item() for m in (train_mask, val_mask, test_mask)]
    watched.train()
    named, by_order = watched.evals()
    assert named == {
        "train_loss": pytest.approx(loss_train.item(), rel=1e-6),
        "val_loss": pytest.approx(loss_val.item(), rel=1e-6),
        "test_loss": pytest.approx(loss_test.item(), rel=1e-6),
    }
    assert by_order == {
        "val_loss": pytest.approx(looped[0], rel=1e-6),
        "val_loss[1]": pytest.approx(looped[1], rel=1e-6),
        "val_loss[2]": pytest.approx(looped[2], rel=1e-6),
    }
    run = monitor_of(watched.collector)
    assert run.validation is not None and run.validation[0] == "val_loss"
    assert held(run, "val_loss") == pytest.approx([loss_val.item(), looped[0]], rel=1e-6)


def test_two_losses_a_batch_are_two_series_over_the_loader(watched: Watched) -> None:
    """N forwards each followed by two loss calls: two series, each over the loader."""
    model = watched.model
    loader = batches(70, 32)
    watched.train()
    model.eval()
    ce = nll = 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            ce += F.cross_entropy(out, y, reduction="sum").item()
            nll += nn.NLLLoss(reduction="sum")(F.log_softmax(out * 2, 1), y).item()
    watched.train()
    [scalars] = watched.evals()
    assert scalars == {
        "val_loss": pytest.approx(ce / 70, rel=1e-6),
        "val_loss[1]": pytest.approx(nll / 70, rel=1e-6),
    }


def test_a_validation_loss_the_script_logs_wins(watched: Watched) -> None:
    """``probe.log`` inside a found evaluation: its validation loss is the record's (the
    losses found are not filed over it); other scalars logged leave them be."""
    model, probe = watched.model, watched.probe
    loader = batches(40, 16)
    for logged in ({"eval_loss": 7.0}, {"val_loss": 5.0}, {"accuracy": 0.5}):
        watched.train()
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in loader:
                total += F.cross_entropy(model(x), y, reduction="sum").item()
        probe.log(**logged)
    watched.train()
    first, second, third = watched.evals()
    assert first == {"eval_loss": 7.0}
    assert second == {"val_loss": 5.0}
    assert third == {"accuracy": 0.5, "val_loss": pytest.approx(total / 40, rel=1e-6)}


def test_the_explicit_api_is_unchanged(watched: Watched) -> None:
    """``with probe.evaluate(): probe.log(val_loss=...)``: the record holds what was
    logged (a mean of means, if that is what the script logs), nothing inferred."""
    model = watched.model
    loader = batches(70, 32)
    watched.train()
    with watched.probe.evaluate():
        model.eval()
        with torch.no_grad():
            means = [F.cross_entropy(model(x), y) for x, y in loader]
        watched.probe.log(val_loss=torch.stack(means).mean(), other=1.0)
    watched.train()
    [scalars] = watched.evals()
    expected = torch.stack(means).mean().item()
    assert scalars == {"val_loss": pytest.approx(expected, rel=1e-7), "other": 1.0}


def test_a_loss_inside_a_loss_counts_once(watched: Watched) -> None:
    """A tensor subclass's ``__torch_function__`` calls the loss again inside the
    call: one loss, one series (not a second split)."""

    class Tagged(torch.Tensor):
        pass

    model = watched.model
    loader = batches(40, 16)
    watched.train()
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x).as_subclass(Tagged)
            total += F.cross_entropy(out, y, reduction="sum").item()
    watched.train()
    [scalars] = watched.evals()
    assert scalars == {"val_loss": pytest.approx(total / 40, rel=1e-6)}


def test_nothing_is_read_while_the_evaluation_runs(
    watched: Watched, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No host read per batch (a sync on a GPU): the sums stay tensors until the
    evaluation ends. Every way a tensor is read on the host fails inside the loop."""
    model = watched.model
    loader = batches(70, 32)
    watched.train()
    kept = []
    with monkeypatch.context() as patched:
        for read in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__"):
            patched.setattr(torch.Tensor, read, _no_read(read))
        model.eval()
        with torch.no_grad():
            for x, y in loader:
                kept.append(F.nll_loss(F.log_softmax(model(x), 1), y, reduction="sum"))
                kept.append(F.cross_entropy(model(x), y))
    watched.train()
    [scalars] = watched.evals()
    expected = sum(float(loss) for loss in kept[::2]) / 70
    assert scalars["val_loss"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_evaluation_never_synchronises(collector: FrameCollector) -> None:
    """The same on CUDA, under torch's sync debug mode: the losses' sums, their terms
    (the targets not ignored) and the masks' series add no synchronising call."""
    import probes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(70, 6, device="cuda"), torch.randint(0, 4, (70,), device="cuda")
    y[:5] = -100
    kept = []
    with probes.watch(model, optimizer, address=collector.address):
        F.cross_entropy(model(x), y.clamp(min=0)).backward()
        optimizer.step()
        model.eval()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
        try:
            with torch.no_grad():
                for i in range(0, 70, 32):
                    kept.append(
                        F.cross_entropy(model(x[i : i + 32]), y[i : i + 32], reduction="sum")
                    )
                    F.mse_loss(
                        model(x[i : i + 32]), torch.zeros(len(x[i : i + 32]), 4, device="cuda")
                    )
        finally:
            torch.cuda.set_sync_debug_mode(0)
        model.train()
        F.cross_entropy(model(x), y.clamp(min=0)).backward()
        optimizer.step()
    [scalars] = evals(collector)
    expected = sum(float(loss) for loss in kept) / 65
    assert scalars["val_loss"] == pytest.approx(expected, rel=1e-6)
    assert set(scalars) == {"val_loss", "val_loss[1]"}


def _no_read(name: str) -> Any:
    def read(self: torch.Tensor, *args: Any) -> Any:
        raise AssertionError(f"Tensor.{name} called during the evaluation")

    return read


def test_each_evaluation_between_two_thinned_step_records_keeps_its_own(
    collector: FrameCollector,
) -> None:
    """At full speed (2 step records a second), several evaluations fall between two
    step records: each eval record travels alone, and the monitor keeps each value,
    none averaged with another's."""
    import probes

    model, optimizer = classifier()
    loader = batches(40, 16)
    printed = []
    with probes.watch(model, optimizer, address=collector.address, max_steps_per_s=2):
        for _ in range(12):
            train_a_little(model, optimizer, steps=3)
            model.eval()
            total = 0.0
            with torch.no_grad():
                for x, y in loader:
                    total += F.cross_entropy(model(x), y, reduction="sum").item()
            printed.append(total / 40)
    assert [e["val_loss"] for e in evals(collector)] == pytest.approx(printed, rel=1e-6)
    steps = collector.kinds("step")
    assert len(steps) < 36 and any(s.get("span") for s in steps)  # (thinned)
    assert held(monitor_of(collector), "val_loss") == pytest.approx(printed, rel=1e-6)


def test_a_late_monitors_history_shows_one_evaluation_for_two_never_their_mean() -> None:
    """The replay history halves its oldest evals when full: two become the later one
    (its scalars as they were), never an average."""
    history = ReplayHistory(capacity=4)
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    for seq, value in enumerate(values, start=1):
        history.add({"kind": "eval", "step": seq, "seq": seq, "scalars": {"val_loss": value}})
    kept = [r["scalars"]["val_loss"] for r in history.replay() if r["kind"] == "eval"]
    assert len(kept) < len(values) and set(kept) <= set(values)


# --- the reduction, loss by loss ------------------------------------------------------

_X = torch.randn(50, 5, generator=torch.Generator().manual_seed(4))
_CLASSES = torch.randint(0, 5, (50,), generator=torch.Generator().manual_seed(5))
_PROBS = torch.softmax(torch.randn(50, 5, generator=torch.Generator().manual_seed(6)), 1)
_TARGET = torch.randn(50, 5, generator=torch.Generator().manual_seed(7))
_BITS = (_TARGET > 0).float()

CASES = {
    "cross_entropy": lambda x, i, **kw: F.cross_entropy(x, _CLASSES[i], **kw),
    "cross_entropy(probabilities)": lambda x, i, **kw: F.cross_entropy(x, _PROBS[i], **kw),
    "nll_loss": lambda x, i, **kw: F.nll_loss(F.log_softmax(x, 1), _CLASSES[i], **kw),
    "mse_loss": lambda x, i, **kw: F.mse_loss(x, _TARGET[i], **kw),
    "l1_loss": lambda x, i, **kw: F.l1_loss(x, _TARGET[i], **kw),
    "smooth_l1_loss": lambda x, i, **kw: F.smooth_l1_loss(x, _TARGET[i], **kw),
    "huber_loss": lambda x, i, **kw: F.huber_loss(x, _TARGET[i], **kw),
    "binary_cross_entropy": lambda x, i, **kw: F.binary_cross_entropy(
        torch.sigmoid(x), _BITS[i], **kw
    ),
    "binary_cross_entropy_with_logits": lambda x, i, **kw: F.binary_cross_entropy_with_logits(
        x, _BITS[i], **kw
    ),
    "kl_div": lambda x, i, **kw: F.kl_div(F.log_softmax(x, 1), _PROBS[i], **kw),
}


class Taking:
    """An open evaluation that keeps what each loss call adds."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, Any, str | None]] = []

    def add_loss(self, value: torch.Tensor, terms: Any = 1, label: str | None = None) -> None:
        self.calls.append((value, terms, label))


@pytest.fixture
def taking() -> Iterator[Taking]:
    """The loss functions' layers on, with one open evaluation taking their losses."""
    evaluation = Taking()
    functional.watch_losses()
    functional.start(evaluation)  # type: ignore[arg-type]
    try:
        yield evaluation
    finally:
        functional.stop(evaluation)  # type: ignore[arg-type]
        functional.unwatch_losses()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_uneven_batches_reduce_to_the_whole_sets_mean(
    taking: Taking, case: str, reduction: str
) -> None:
    """Whatever the batches (16, 16, 16, 2), the series' Σ sums / Σ terms is the loss's
    mean over the whole set (``batchmean`` for ``kl_div``: its ``mean`` is per element)."""
    loss = CASES[case]
    kl = case == "kl_div"
    if kl and reduction == "mean":
        reduction = "batchmean"
    for start in range(0, 50, 16):
        rows = torch.arange(start, min(start + 16, 50))
        loss(_X[rows], rows, reduction=reduction)
    calls = list(taking.calls)
    assert len(calls) == 4
    total = sum(value for value, _, _ in calls)
    terms = sum(count for _, count, _ in calls)
    expected = loss(_X, torch.arange(50), reduction="batchmean" if kl else "mean").item()
    assert float(total / terms) == pytest.approx(expected, rel=1e-6)


@pytest.mark.filterwarnings("ignore:size_average and reduce args")
def test_reduction_given_by_position_or_by_the_legacy_arguments(taking: Taking) -> None:
    x, y = _X[:10], _TARGET[:10]
    F.mse_loss(x, y, None, None, "sum")
    F.mse_loss(x, y, size_average=False)  # torch's legacy way of saying "sum"
    (by_position, _, _), (legacy, _, _) = taking.calls
    assert float(by_position) == pytest.approx(F.mse_loss(x, y, reduction="sum").item())
    assert float(legacy) == pytest.approx(F.mse_loss(x, y, reduction="sum").item())


def test_a_call_sites_words_name_its_split(taking: Taking) -> None:
    out, y = F.log_softmax(_X, 1), _CLASSES
    idx_val, x_test, mask = torch.arange(10), torch.arange(10, 20), torch.arange(20, 30)
    F.nll_loss(out[idx_val], y[idx_val])
    loss_train = F.nll_loss(out[mask], y[mask])
    F.nll_loss(out[x_test], y[x_test])
    F.nll_loss(out[mask], y[mask])  # (nothing named)
    F.nll_loss(out[idx_val], y[x_test])  # (two splits named: neither)
    F.nll_loss(
        out[mask],
        y[idx_val],  # (a call over several lines: all of it is read)
    )
    evaluate = interval = F.nll_loss(out[mask], y[mask])  # (words holding the letters)
    assert loss_train is not None and evaluate is interval
    labels = [label for _, _, label in taking.calls]
    assert labels == ["val", "train", "test", None, None, "val", None]


async def test_the_chart_draws_the_validation_loss_and_the_other_splits() -> None:
    """A GCN's evaluations: ``val_loss`` is the validation curve (the status line's,
    the overfitting rule's); ``train_loss`` and ``test_loss`` are drawn beside it."""
    from tests.frames import evaluation, hello, step
    from tests.waiting import settle
    from tui.app import make_app
    from tui.sources import FrameListSource
    from tui.widgets import LossChart

    frames = [hello()]
    for i in range(30):
        frames.append(step(i))
        if i % 10 == 9:
            frame = evaluation(i, seq=i // 10 + 1)
            frame["scalars"] = {"train_loss": 0.3, "val_loss": 0.5 - 0.01 * i, "test_loss": 0.7}
            frames.append(frame)
    app = make_app(FrameListSource(frames))
    async with app.run_test(size=(160, 40)) as pilot:
        chart = app.query_one(LossChart)
        await settle(pilot, lambda: len(chart.plotted.get("validation (val_loss)", ())) == 3)
        assert chart.plotted["validation (val_loss)"] == pytest.approx([0.41, 0.31, 0.21])
        assert chart.plotted["eval (train_loss)"] == [0.3, 0.3, 0.3]
        assert chart.plotted["eval (test_loss)"] == [0.7, 0.7, 0.7]
        assert "validation (val_loss)" in chart.title_text
        assert "eval (test_loss)" in chart.title_text


def test_series_names() -> None:
    assert series_names([]) == []
    assert series_names([None]) == ["val_loss"]
    assert series_names(["test"]) == ["val_loss"]  # (the only series is the validation)
    assert series_names([None, None]) == ["val_loss", "val_loss[1]"]
    assert series_names(["train", "val", "test"]) == ["train_loss", "val_loss", "test_loss"]
    assert series_names(["train", None, None]) == ["train_loss", "val_loss", "val_loss[2]"]
    assert series_names(["train", "test"]) == ["train_loss", "val_loss"]
    assert series_names(["val", "val"]) == ["val_loss", "val_loss[1]"]
