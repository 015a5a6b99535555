"""Every per-step check on every loop shape (issue 18 item 1): a forgotten ``zero_grad``
raises ``grad_not_cleared`` within 3 steps, and the healthy twin of each loop (the same
loop clearing once per update) raises nothing.

The shapes: one backward per update; gradient accumulation over micro-batches; a
closure (LBFGS: many backward passes in one step); hand-written updates with no
optimizer; AMP with a GradScaler; a ``torch.compile``d model; DDP (one rank, in
process, with ``no_sync``); the HF Trainer; Lightning. Tiny models, a few steps,
in process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import probes
from tests.collector import Frame, FrameCollector, raised_alerts, wait_for_bye, watch_unthinned

STEPS = 5
WITHIN = 3  # grad_not_cleared is raised at step 2 or before: within the first 3 steps


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    )


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,), generator=generator)


def loss_of(model: nn.Module, seed: int) -> torch.Tensor:
    x, y = batch(seed)
    return nn.functional.cross_entropy(model(x), y)


def frames_of(collector: FrameCollector, probe: Any) -> list[Frame]:
    probe.close()
    wait_for_bye(collector)
    assert collector.errors == []
    return list(collector.frames)


def raised(frames: list[Frame]) -> dict[str, int]:
    """Each kind raised (by the monitor's rules, or the probe), at its first step."""
    kinds: dict[str, int] = {}
    for alert in raised_alerts(frames):
        kinds.setdefault(str(alert.kind), alert.step)
    return kinds


# --- the loops: each takes ``clear`` (False: zero_grad forgotten) ---------------------------

Loop = Callable[[FrameCollector, bool], list[Frame]]


def one_backward(collector: FrameCollector, clear: bool) -> list[Frame]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            if clear:
                opt.zero_grad()
            loss = loss_of(model, i)
            loss.backward()
            opt.step()
            probe.log(loss=loss)
    return frames_of(collector, probe)


def zeroed_in_place(collector: FrameCollector, clear: bool) -> list[Frame]:
    """``zero_grad(set_to_none=False)`` after the update: the same tensors, zeroed."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            loss = loss_of(model, i)
            loss.backward()
            probes.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
            if clear:
                opt.zero_grad(set_to_none=False)
    return frames_of(collector, probe)


def accumulation(collector: FrameCollector, clear: bool, micro_batches: int = 4) -> list[Frame]:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            for k in range(micro_batches):
                (loss_of(model, i * micro_batches + k) / micro_batches).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # torch's, routed
            opt.step()
            if clear:
                opt.zero_grad(set_to_none=True)
    return frames_of(collector, probe)


def accumulation_across_steps(collector: FrameCollector, clear: bool) -> list[Frame]:
    """One probe step per micro-batch, the update every second one, nothing declared."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector)
    for i in range(2 * STEPS):
        with probe.step():
            (loss_of(model, i) / 2).backward()
            if i % 2 == 1:
                opt.step()
                if clear:
                    opt.zero_grad()
    return frames_of(collector, probe)


def lbfgs(collector: FrameCollector, clear: bool) -> list[Frame]:
    model = mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):

        def closure(data: tuple[torch.Tensor, torch.Tensor] = batch(i)) -> torch.Tensor:
            if clear:
                opt.zero_grad()
            loss = nn.functional.cross_entropy(model(data[0]), data[1])
            loss.backward()
            return loss

        with probe.step():
            probe.log(loss=opt.step(closure))
    return frames_of(collector, probe)


def no_optimizer(collector: FrameCollector, clear: bool, at_end: bool = False) -> list[Frame]:
    """The word-language-model way: ``p.data.add_(p.grad, alpha=-lr)``, watch(model)."""
    model = mlp()
    probe = watch_unthinned(model, None, collector, sample_every=2)
    for i in range(STEPS):
        with probe.step():
            if clear and not at_end:
                model.zero_grad()
            loss = loss_of(model, i)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.05)
            probe.log(loss=loss)
            if clear and at_end:
                probe.gradients_final()
                model.zero_grad(set_to_none=False)  # zeroed in place, before the step ends
    return frames_of(collector, probe)


def amp(collector: FrameCollector, clear: bool) -> list[Frame]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            if clear:
                opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, i)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # bumps every gradient's version, as a pass would
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            scaler.step(opt)
            scaler.update()
    return frames_of(collector, probe)


def compiled(collector: FrameCollector, clear: bool) -> list[Frame]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fast = torch.compile(model, backend="aot_eager")  # AOTAutograd's backward, no compiler
    probe = watch_unthinned(fast, opt, collector)
    for i in range(STEPS):
        with probe.step():
            if clear:
                opt.zero_grad()
            x, y = batch(i)
            nn.functional.cross_entropy(fast(x), y).backward()
            opt.step()
    return frames_of(collector, probe)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A process group of one rank (gloo), in this process: DDP's reducer runs as on many."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def ddp_no_sync(collector: FrameCollector, clear: bool) -> list[Frame]:
    """DDP, two micro-batches an update: the first under ``no_sync`` (no all-reduce)."""
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            with model.no_sync():
                (loss_of(model, 2 * i) / 2).backward()
            (loss_of(model, 2 * i + 1) / 2).backward()
            opt.step()
            if clear:
                opt.zero_grad()
    return frames_of(collector, probe)


SHAPES: dict[str, Loop] = {
    "one-backward": one_backward,
    "zeroed-in-place": zeroed_in_place,
    "accumulation": accumulation,
    "lbfgs-closure": lbfgs,
    "no-optimizer": no_optimizer,
    "no-optimizer-zeroed-at-end": lambda c, clear: no_optimizer(c, clear, at_end=True),
    "amp-gradscaler": amp,
    "compiled": compiled,
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_forgotten_zero_grad_is_raised_within_3_steps(
    shape: str, collector: FrameCollector
) -> None:
    kinds = raised(SHAPES[shape](collector, False))
    assert "grad_not_cleared" in kinds, kinds
    assert kinds["grad_not_cleared"] < WITHIN


@pytest.mark.parametrize("shape", SHAPES)
def test_the_healthy_twin_raises_nothing(shape: str, collector: FrameCollector) -> None:
    assert raised(SHAPES[shape](collector, True)) == {}


def test_accumulation_across_probe_steps(collector: FrameCollector) -> None:
    """Updates at odd steps: a forgotten zero_grad is raised by the third update (step
    5); the healthy twin is the next test's."""
    kinds = raised(accumulation_across_steps(collector, False))
    assert kinds.get("grad_not_cleared", 2 * WITHIN) < 2 * WITHIN, kinds


def test_accumulation_across_probe_steps_healthy(collector: FrameCollector) -> None:
    assert raised(accumulation_across_steps(collector, True)) == {}


@pytest.mark.parametrize("clear", [False, True], ids=["forgotten", "healthy"])
def test_ddp_with_no_sync(clear: bool, collector: FrameCollector, one_rank_group: None) -> None:
    kinds = raised(ddp_no_sync(collector, clear))
    if clear:
        assert kinds == {}
    else:
        assert kinds.get("grad_not_cleared", WITHIN) < WITHIN, kinds


# --- hand-written updates: applied, and their ratios -----------------------------------------


def manual_updates(collector: FrameCollector, *, apply: bool) -> list[Frame]:
    model = mlp()
    probe = watch_unthinned(model, None, collector, sample_every=2)
    for i in range(8):
        with probe.step():
            model.zero_grad()
            loss_of(model, i).backward()
            if apply:
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.05)
    return frames_of(collector, probe)


def test_no_optimizer_updates_not_applied_is_raised(collector: FrameCollector) -> None:
    frames = manual_updates(collector, apply=False)
    steps = [f for f in frames if f["kind"] == "step"]
    assert next(s["update_ratios"] for s in steps if s["step"] == 0) == [0.0] * 3
    assert "updates_not_applied" in raised(frames)


def test_no_optimizer_updates_applied_have_their_ratios(collector: FrameCollector) -> None:
    frames = manual_updates(collector, apply=True)
    steps = {f["step"]: f for f in frames if f["kind"] == "step"}
    assert all(r > 0 for s in (0, 2, 4, 6) for r in steps[s]["update_ratios"])
    assert all("update_ratios" not in steps[s] for s in (1, 3, 5, 7))
    assert raised(frames) == {}


# --- the frameworks -----------------------------------------------------------------------


def hf_run(collector: FrameCollector, tmp_path: Any, clear: bool) -> list[Frame]:
    transformers = pytest.importorskip("transformers")
    from probes.hf import TraintopCallback
    from tests.frameworks.test_hf import arguments, tiny_gpt2, token_data

    model = tiny_gpt2()
    if not clear:
        model.zero_grad = lambda *args, **kwargs: None  # the Trainer's clear, forgotten
    callback = TraintopCallback(address=collector.address, max_steps_per_s=1e9)
    trainer = transformers.Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=STEPS),
        train_dataset=token_data(32),
        callbacks=[callback],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    wait_for_bye(collector)
    return list(collector.frames)


@pytest.mark.parametrize("clear", [False, True], ids=["forgotten", "healthy"])
def test_hf_trainer(clear: bool, collector: FrameCollector, tmp_path: Any) -> None:
    kinds = raised(hf_run(collector, tmp_path, clear))
    if clear:
        assert "grad_not_cleared" not in kinds, kinds
    else:
        assert kinds.get("grad_not_cleared", WITHIN) < WITHIN, kinds


def lightning_run(collector: FrameCollector, clear: bool) -> list[Frame]:
    pl = pytest.importorskip("pytorch_lightning")
    from torch.utils.data import DataLoader, TensorDataset

    from probes.lightning import TraintopCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            if clear:
                optimizer.zero_grad()

    x, y = batch(0)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TraintopCallback(address=collector.address, max_steps_per_s=1e9)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), DataLoader(TensorDataset(x, y), batch_size=4))
    wait_for_bye(collector)
    return list(collector.frames)


@pytest.mark.parametrize("clear", [False, True], ids=["forgotten", "healthy"])
def test_lightning(clear: bool, collector: FrameCollector) -> None:
    kinds = raised(lightning_run(collector, clear))
    if clear:
        assert "grad_not_cleared" not in kinds, kinds
    else:
        assert kinds.get("grad_not_cleared", WITHIN) < WITHIN, kinds


# --- backward passes per layer, where the version moves for other reasons ---------------------


def passes_of(frames: list[Frame]) -> list[list[int | None]]:
    steps = sorted((f for f in frames if f["kind"] == "step"), key=lambda f: f["step"])
    return [s["backward_passes"] for s in steps]


@pytest.mark.parametrize("clear", ["none", "zero"])
def test_passes_under_amp_unscale_and_in_place_zeroing(
    clear: str, collector: FrameCollector
) -> None:
    """``scaler.unscale_`` and ``zero_grad(set_to_none=False)`` bump every gradient's
    version as a pass would: the passes still count backward passes only."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            opt.zero_grad(set_to_none=clear == "none")
            for k in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_of(model, 2 * i + k) / 2
                scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            scaler.step(opt)
            scaler.update()
    assert passes_of(frames_of(collector, probe)) == [[2, 2, 2]] * STEPS


def test_passes_under_amp_grow_when_never_cleared(collector: FrameCollector) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    probe = watch_unthinned(model, opt, collector)
    for i in range(STEPS):
        with probe.step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, i)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
    assert passes_of(frames_of(collector, probe)) == [[n + 1] * 3 for n in range(STEPS)]


# --- DDP across two ranks (gloo, a subprocess of two) ---------------------------------------


def ddp_rank(rank: int, address: str, port: int, clear: bool) -> None:
    """One rank of a 2-rank job: DDP over gloo, a micro-batch under ``no_sync``, then
    one synced; the probe reports to ``address``."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = nn.parallel.DistributedDataParallel(mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        probe = probes.watch(model, opt, address=address, max_steps_per_s=1e9)
        for i in range(STEPS):
            with probe.step():
                with model.no_sync():
                    (loss_of(model, 4 * i + rank) / 2).backward()
                (loss_of(model, 4 * i + 2 + rank) / 2).backward()
                opt.step()
                if clear:
                    opt.zero_grad()
        probe.close()
    finally:
        dist.destroy_process_group()


def ddp_job(address: str, clear: bool) -> None:
    torch.multiprocessing.spawn(ddp_rank, args=(address, free_port(), clear), nprocs=2)


@pytest.mark.slow  # two spawned ranks: tens of seconds on a loaded machine (-m slow)
@pytest.mark.parametrize("clear", [False, True], ids=["forgotten", "healthy"])
def test_ddp_two_ranks(clear: bool, collector: FrameCollector) -> None:
    code = (
        "from tests.runtime.test_loop_shapes import ddp_job; "
        f"ddp_job({str(collector.address)!r}, {clear})"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=90, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    byes = lambda frames: sum(f["kind"] == "bye" for f in frames) == 2  # noqa: E731
    assert collector.wait_for(byes)
    frames = list(collector.frames)
    rank0 = next(f["run"] for f in frames if f["kind"] == "hello" and f.get("rank") == 0)
    kinds = raised([f for f in frames if f.get("run") == rank0])
    if clear:
        assert kinds == {}
    else:
        assert kinds.get("grad_not_cleared", WITHIN) < WITHIN, kinds
