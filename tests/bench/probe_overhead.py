"""Probe overhead benchmark: median step time against a bare loop, in the same run.

    python tests/bench/probe_overhead.py [--quick]

For each model the variants (bare loop, traintop probe, and TensorBoard per-layer
logging when tensorboard is installed) train copies of the same model on the same
batches, alternated in short blocks so that drift of the machine hits all of them
alike. A real monitor (``traintop --headless``) runs in another process and stays
connected. The whole step (its ratio to the bare twin's, and the time added) swings by
several percent on a shared CPU; beside it the table gives the probe's own time a step:
its code on the training thread, measured directly, plus its sender thread's CPU time
(``time.thread_time`` there: thinning, building, encoding and sending the records, on
the GIL and the cores training needs), and the floor: one bare ``torch._foreach_norm``
over all gradients. Targets at the default settings: own time at most 1.5 x floor +
30 us, and a whole-step ratio of at most 1.03 on (a).
It also times the guard (one host/device sync a step) and an anomaly step (what one
press of ``a`` costs), which are not on by default.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import probes
from probes.runtime.probe import Probe

#: Where the plain workloads train (``--device``): on a GPU every timed step ends with
#: a synchronisation, the bare one's and the probed one's alike.
DEVICE = torch.device("cpu")


def sync() -> None:
    """Wait for the device (a no-op on the CPU): a step's time is then its whole time."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def on_device(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    x, y = batch
    return model.to(DEVICE), x.to(DEVICE), y.to(DEVICE)


@dataclass
class Workload:
    name: str
    build: Callable[[], nn.Module]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rounds: int
    block: int  # steps per variant per round


def mlp24() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(24):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            256, 4, dim_feedforward=1024, batch_first=True, dropout=0.0
        )
        self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def mlp3() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )


def workloads(quick: bool) -> list[Workload]:
    scale = 2 if quick else 1
    return [
        Workload(
            "(a) MLP 24 x Linear(512,512), b64, Adam",
            mlp24,
            lambda p: torch.optim.Adam(p, lr=1e-4),
            lambda: (torch.randn(64, 512), torch.randn(64, 512)),
            nn.functional.mse_loss,
            rounds=12 // scale,
            block=10,
        ),
        Workload(
            "(b) Transformer 6 x d256 h4, seq128 b8, AdamW",
            TinyTransformer,
            lambda p: torch.optim.AdamW(p, lr=1e-4),
            lambda: (torch.randn(8, 128, 256), torch.randn(8, 128, 1)),
            nn.functional.mse_loss,
            rounds=6 // scale,
            block=3,
        ),
        Workload(
            "(c) MLP 3 x width 64, b32",
            mlp3,
            lambda p: torch.optim.Adam(p, lr=1e-3),
            lambda: (torch.randn(32, 64), torch.randn(32, 1)),
            nn.functional.mse_loss,
            rounds=20 // scale,
            block=200,
        ),
    ]


def count_own_time(probe: Probe) -> list[float]:
    """The probe's own time on the training thread of each step it sends, as it measures
    it (``probe_time`` when queued: its code at the step boundaries and in the
    optimizer's and clip's hooks; the sender adds its own later, ``sender_time``)."""
    spent: list[float] = []
    put = probe.sender.put

    def counting_put(item: Any) -> None:
        own = getattr(item, "probe_time", None)
        if own is not None:
            spent.append(own)
        put(item)

    probe.sender.put = counting_put  # type: ignore[method-assign]
    return spent


def sender_time(probes_seen: list[Probe], since: float, steps: int) -> float:
    """The sender threads' CPU seconds a step since ``since`` (their total then); read
    once the probes are closed (their last records sent)."""
    total = sum(probe.sender.cpu_seconds for probe in probes_seen)
    return (total - since) / steps if steps else 0.0


@dataclass
class Variant:
    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[], None]
    times: list[float] = field(default_factory=list)
    probe: Probe | None = None
    own: list[float] = field(default_factory=list)  # the probe's time, per step sent
    sender: float = 0.0  # the sender thread's CPU seconds a step


def make_variants(work: Workload, address: str, names: list[str]) -> list[Variant]:
    """Copies of one model (same initial weights, same batch), one per variant asked:
    ``bare``, ``probe``, ``guard``, ``anomaly``, ``tensorboard`` (if installed)."""
    torch.manual_seed(0)
    base, x, y = on_device(work.build(), work.batch())

    def bare() -> Variant:
        model = copy.deepcopy(base)
        opt = work.optimizer(model.parameters())

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss = work.loss(model(x), y)
            loss.backward()
            opt.step()

        return Variant("bare loop", model, opt, step)

    def probed(
        label: str, *, guard: bool = False, anomaly: bool = False, timed: bool = True
    ) -> Variant:
        model = copy.deepcopy(base)
        opt = work.optimizer(model.parameters())
        probe = probes.watch(
            model, opt, run=label, address=address, guard=guard, time_and_memory=timed
        )
        own = count_own_time(probe)

        def step() -> None:
            if anomaly:
                probe.arm_anomaly()
            with probe.step():
                opt.zero_grad(set_to_none=True)
                loss = work.loss(model(x), y)
                loss.backward()
                opt.step()
                probe.log(loss=loss)

        return Variant(label, model, opt, step, probe=probe, own=own)

    def tensorboard() -> Variant | None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
        writer = SummaryWriter(tempfile.mkdtemp(prefix="tt-bench-tb-"))
        model = copy.deepcopy(base)
        opt = work.optimizer(model.parameters())
        named = list(model.named_parameters())
        counter = [0]

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss = work.loss(model(x), y)
            loss.backward()
            writer.add_scalar("loss", loss.item(), counter[0])
            for name, param in named:
                writer.add_scalar(f"grad_norm/{name}", param.grad.norm().item(), counter[0])
            opt.step()
            counter[0] += 1

        return Variant("tensorboard add_scalar", model, opt, step)

    builders: dict[str, Callable[[], Variant | None]] = {
        "bare": bare,
        "probe": lambda: probed("traintop probe"),
        "guard": lambda: probed("probe, guard on", guard=True),
        "anomaly": lambda: probed("probe, anomaly step", anomaly=True),
        "untimed": lambda: probed("probe, no time/memory", timed=False),
        "tensorboard": tensorboard,
    }
    return [v for v in (builders[name]() for name in names) if v is not None]


def floor_costs(work: Workload) -> tuple[float, float]:
    """(bare _foreach_norm over all grads, naive p.grad.norm().item() loop), seconds."""
    torch.manual_seed(0)
    model, x, y = on_device(work.build(), work.batch())
    work.loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    repeats = 200 if sum(g.numel() for g in grads) < 1e6 else 40

    def timed(fn: Callable[[], object]) -> float:
        fn()
        samples = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    foreach = timed(lambda: torch._foreach_norm(grads))
    naive = timed(lambda: [g.norm().item() for g in grads])
    return foreach, naive


def floor_in_step(work: Workload, steps: int) -> float:
    """One bare ``_foreach_norm`` over all grads timed where the probe runs it: right
    after backward, when caches hold the backward's data, not the norm's."""
    torch.manual_seed(0)
    model, x, y = on_device(work.build(), work.batch())
    opt = work.optimizer(model.parameters())
    samples = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        work.loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        sync()  # (on a GPU: the launch's cost, what the probe's own time counts)
        start = time.perf_counter()
        torch._foreach_norm(grads)
        samples.append(time.perf_counter() - start)
        opt.step()
    return statistics.median(samples[1:])


def measure(variants: list[Variant], work: Workload) -> dict[str, float]:
    """Alternate the variants in blocks; return each probe's own time on the training
    thread per step (the sender's is left in the variant)."""
    probed = [v for v in variants if v.probe is not None]
    for variant in variants:  # warm up: allocator, kernels, the monitor connection
        for _ in range(3):
            variant.step()
    for variant in probed:
        assert variant.probe is not None
        if not variant.probe.sender.connected.wait(10):
            print("warning: the monitor did not connect; numbers are without a monitor")
        variant.own.clear()
        variant.sender = variant.probe.sender.cpu_seconds  # (a total, until closed)
    for _ in range(work.rounds):
        for variant in variants:
            for _ in range(work.block):
                start = time.perf_counter()
                variant.step()
                sync()
                variant.times.append(time.perf_counter() - start)
    own = {}
    for variant in probed:
        assert variant.probe is not None
        variant.probe.close()  # flushes the last step's record
        own[variant.name] = statistics.fmean(variant.own)
        variant.sender = sender_time([variant.probe], variant.sender, len(variant.times))
        if variant.probe.sender.dropped:
            print(f"warning: {variant.name} dropped {variant.probe.sender.dropped} records")
    return own


def table(variants: list[Variant], own: dict[str, float], budget: float) -> list[str]:
    bare = statistics.median(variants[0].times)
    rows = [
        f"  {'variant':<24}{'median step':>14}{'whole step':>11}{'added':>12}"
        f"{'own time':>12}{'(training':>11}{'+ sender)':>11}{'verdict':>9}"
    ]
    for variant in variants:
        median = statistics.median(variant.times)
        own_time = training = sending = verdict = ""
        if variant.name in own:
            total = own[variant.name] + variant.sender
            own_time = f"{total * 1e6:9.1f} us"
            training = f"{own[variant.name] * 1e6:8.1f} us"
            sending = f"{variant.sender * 1e6:8.1f} us"
        if variant.name == "traintop probe":
            verdict = "ok" if own[variant.name] + variant.sender <= budget else "OVER"
        rows.append(
            f"  {variant.name:<24}{median * 1e3:11.3f} ms{median / bare:11.3f}"
            f"{(median - bare) * 1e6:9.1f} us{own_time:>12}{training:>11}{sending:>11}"
            f"{verdict:>9}"
        )
    return rows


def bare_median(variants: list[Variant]) -> float:
    """The bare loop's median step (the first variant)."""
    return statistics.median(variants[0].times)


def run_workload(work: Workload, address: str, *, costly_too: bool = True) -> list[str]:
    # Default settings first, on their own: other probes in the process would add
    # their sender threads to the GIL contention being measured.
    main = make_variants(work, address, ["bare", "probe", "tensorboard"])
    own = measure(main, work)
    costly = make_variants(work, address, ["bare", "guard", "anomaly"]) if costly_too else []
    if costly:
        own.update(measure(costly, work))
    # What the step's time and memory add: the probe with and without, in one pass.
    timing = make_variants(work, address, ["bare", "untimed", "probe"])
    timing_own = measure(timing, work)
    foreach, naive = floor_costs(work)
    in_step = floor_in_step(work, min(work.rounds * work.block, 400))
    budget = 1.5 * in_step + 30e-6
    rows = [
        f"\n{work.name}   ({work.rounds} rounds x {work.block} steps per variant)",
        f"  floor, one _foreach_norm over all grads: {in_step * 1e6:.1f} us in the step "
        f"(after backward), {foreach * 1e6:.1f} us in a tight loop",
        f"  naive p.grad.norm().item() loop: {naive * 1e6:.1f} us   "
        f"budget = 1.5 x floor in the step + 30 us = {budget * 1e6:.0f} us",
        "  default settings (probe every step, sampled statistics every 20):",
        *table(main, own, budget),
        # The per-layer gradient norms every step cost at least the floor: a whole-step
        # ratio below this one is out of reach whatever else the probe cuts.
        f"  the floor alone would make the whole step {1 + in_step / bare_median(main):.3f}",
    ]
    if costly:
        rows += [
            "  not on by default (a separate pass against its own bare loop):",
            *table(costly, own, budget),
        ]
    return rows + timing_rows(timing, timing_own, budget)


def timing_rows(variants: list[Variant], own: dict[str, float], budget: float) -> list[str]:
    """The probe with and without the step's time and memory, against one bare loop in
    the same pass: what the phases, the memory and the graph markers add a step."""
    off, on = variants[1], variants[2]
    added_own = (own[on.name] + on.sender) - (own[off.name] + off.sender)
    added_step = statistics.median(on.times) - statistics.median(off.times)
    return [
        "  the step's time and memory (a pass of its own):",
        *table(variants, own, budget),
        f"  time and memory add {added_own * 1e6:.1f} us a step of the probe's own time, "
        f"{added_step * 1e6:.1f} us to the median step",
    ]


# --- the frameworks: a bare Trainer against the same Trainer with the callback --------


class StepClock:
    """Times each optimizer step from one step's start to the next (everything the
    framework does in between counts); framework-neutral, fed by either callback."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: float | None = None

    def tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now

    def restart(self) -> None:
        self._last = None


def gpt2() -> nn.Module:
    """The HF row's model: a 2-layer GPT-2, d128, built from its config."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=128,
        n_head=4,
        vocab_size=512,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def mlp8() -> nn.Module:
    """The Lightning row's network: 8 x Linear(256, 256) + ReLU."""
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(256, 256), nn.ReLU())])


def time_norm(model: nn.Module, floor: list[float]) -> None:
    """Time one bare ``_foreach_norm`` over the model's gradients, where it is called
    (inside the framework's step, just before its optimizer step): the floor."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads:
        start = time.perf_counter()
        torch._foreach_norm(grads)
        floor.append(time.perf_counter() - start)


#: The steps a framework row leaves out of the training thread's own time, as the plain
#: rows warm up 3 steps before they count: a fit's first step pays the probe's one-off
#: costs (its plans, its first sampled step: 1.6 ms under the HF Trainer, 3.1 ms under
#: Lightning), which a 60-step fit would spread over too few steps. (The sender's time
#: is counted whole, its connect and hello included.)
WARM_UP_STEPS = 3


def hf_round(
    address: str | None,
    steps: int,
    clock: StepClock,
    floor: list[float] | None = None,
    seen: list[Probe] | None = None,
) -> list[float]:
    """One ``Trainer.train()`` of ``steps`` steps: a 2-layer GPT-2 (d128, seq 64, b8) at
    the Trainer's defaults; with the callback when ``address`` is given (its probe added
    to ``seen``), or timing the floor into ``floor``. Returns the probe's own time on the
    training thread per step."""
    import transformers

    from probes.hf import TraintopCallback

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            clock.tick()

    model = gpt2()
    ids = torch.randint(0, 512, (64,))
    data = [{"input_ids": ids, "labels": ids}] * (8 * steps)
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="tt-bench-hf-"),
        max_steps=steps,
        per_device_train_batch_size=8,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
    )
    callbacks: list[Any] = [Clock()]
    own_lists: list[list[float]] = []
    if address is not None:
        traintop = TraintopCallback(run="bench-hf", address=address)

        class CountOwn(transformers.TrainerCallback):
            def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
                if traintop.probe is not None:
                    own_lists.append(count_own_time(traintop.probe))
                    if seen is not None:  # (its sender's time, once closed)
                        seen.append(traintop.probe)

        callbacks += [traintop, CountOwn()]  # (after traintop: its probe exists by then)
    clock.restart()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    clip = torch.nn.utils.clip_grad_norm_
    if floor is not None:  # the probe reads the gradients just before the Trainer clips

        def timed_clip(*args: Any, **kwargs: Any) -> torch.Tensor:
            time_norm(model, floor)
            return clip(*args, **kwargs)

        torch.nn.utils.clip_grad_norm_ = timed_clip
    try:
        trainer.train()
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    return [t for counted in own_lists for t in counted[WARM_UP_STEPS:]]


def lightning_round(
    address: str | None,
    steps: int,
    clock: StepClock,
    floor: list[float] | None = None,
    seen: list[Probe] | None = None,
) -> list[float]:
    """One ``fit`` of ``steps`` steps of a small LightningModule (an MLP, 8 x 256, b64,
    Adam); with the callback when ``address`` is given, or timing the floor."""
    import pytorch_lightning as pl

    from probes.lightning import TraintopCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp8()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    class Clock(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            clock.tick()

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            if floor is not None:
                time_norm(module, floor)

    x = torch.randn(64, 256)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x.repeat(steps, 1), x.repeat(steps, 1)), batch_size=64
    )
    callbacks: list[Any] = [Clock()]
    own_lists: list[list[float]] = []
    if address is not None:
        traintop = TraintopCallback(run="bench-lightning", address=address)

        class CountOwn(pl.Callback):
            def on_train_start(self, *args: Any) -> None:
                if traintop.probe is not None:
                    own_lists.append(count_own_time(traintop.probe))
                    if seen is not None:  # (its sender's time, once closed)
                        seen.append(traintop.probe)

        callbacks += [traintop, CountOwn()]
    clock.restart()
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(Module(), loader)
    return [t for counted in own_lists for t in counted[WARM_UP_STEPS:]]


def framework_rows(address: str, rounds: int, steps: int) -> list[str]:
    """A row per framework: the bare Trainer and the Trainer with traintop's callback,
    alternated round by round, median time per optimizer step."""
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    rows = [
        "\n(d, e) the frameworks: Trainer alone against Trainer + TraintopCallback "
        f"({rounds} rounds x {steps} steps each)",
        f"  {'framework':<34}{'bare step':>12}{'with callback':>15}{'ratio':>8}"
        f"{'added':>11}{'own time':>12}{'floor':>10}{'budget':>10}{'verdict':>9}",
    ]
    for name, run_round in (
        ("(d) HF Trainer, GPT-2 2 x d128", hf_round),
        ("(e) Lightning, MLP 8 x 256", lightning_round),
    ):
        bare, watched, own = StepClock(), StepClock(), []
        seen: list[Probe] = []
        for _ in range(rounds):
            run_round(None, steps, bare)
            own += run_round(address, steps, watched, seen=seen)
        bare_median = statistics.median(bare.times)
        watched_median = statistics.median(watched.times)
        # the training thread's after warm-up, and the sender's over every step it ran
        # (the probes are closed: their last records counted)
        own_mean = statistics.fmean(own) + sender_time(seen, 0.0, rounds * steps)
        floor: list[float] = []  # a round of its own: its norms would slow the bare steps
        run_round(None, steps, StepClock(), floor)
        floor_median = statistics.median(floor[1:])
        budget = 1.5 * floor_median + 30e-6  # the plain probe's budget
        rows.append(
            f"  {name:<34}{bare_median * 1e3:9.2f} ms{watched_median * 1e3:12.2f} ms"
            f"{watched_median / bare_median:8.3f}"
            f"{(watched_median - bare_median) * 1e6:8.0f} us"
            f"{own_mean * 1e6:9.0f} us{floor_median * 1e6:7.0f} us{budget * 1e6:7.0f} us"
            f"{'ok' if own_mean <= budget else 'OVER':>9}"
        )
    return rows


def start_monitor(address: str) -> subprocess.Popen:
    env = {**os.environ, "TRAINTOP_ADDRESS": address}
    return subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "--headless", "--summary-every", "1000000000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--only",
        help="run only workloads whose name contains this ('frameworks': only their rows)",
    )
    parser.add_argument(
        "--no-frameworks", action="store_true", help="skip the HF Trainer and Lightning rows"
    )
    parser.add_argument(
        "--default-only", action="store_true", help="skip the guard and anomaly-step pass"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where (a), (b), (c) train, e.g. cuda (the framework and compiled rows stay "
        "on the CPU)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="add the torch.compile row (a GPT with dropout, Inductor: minutes to compile)",
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    folder = tempfile.mkdtemp(prefix="tt-bench-")
    address = f"unix:{folder}/monitor.sock"
    monitor = start_monitor(address)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"probes {probes.__name__}, monitor pid {monitor.pid}, workloads on {DEVICE}"
    )
    try:
        for work in workloads(args.quick):
            if args.only and args.only not in work.name:
                continue
            rows = run_workload(work, address, costly_too=not args.default_only)
            print("\n".join(rows), flush=True)
        if not args.no_frameworks and args.only in (None, "frameworks") and DEVICE.type == "cpu":
            rounds = 2 if args.quick else 4
            print("\n".join(framework_rows(address, rounds, 60)), flush=True)
        if args.compiled:
            from tests.bench.compiled_overhead import compiled_rows

            print("\n".join(compiled_rows(address, rounds=4 if args.quick else 10)), flush=True)
    finally:
        monitor.terminate()
        monitor.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
