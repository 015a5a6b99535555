"""Healthy recipes (``tests/bench/healthy_recipes.py``) through the frameworks: the
Hugging Face Trainer at its defaults, Lightning at its defaults (and with
``gradient_clip_val=0.5``), a Lightning GAN under manual optimization, and an unmodified
script under ``traintop run --headless``.

Each framework's callback gets ``bench.callback_options()`` (the bench's monitor, the
mode's options); in the slow mode a callback of the framework's sleeps after each
batch. ``traintop run`` cannot be given watch options: its run's records are thinned
by the probe's default in every mode, so its slow and every modes sleep ``RUN_DELAY`` a
step (under 60 steps a second: each step its own record).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.bench.healthy_recipes import Bench, Frames, Recipe, Trained
from tests.runtime.test_update_ratio_healthy import learnable_text

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "healthy_scripts"
RUN_DELAY = 0.02  # s a step under traintop run's slow/every modes: 50 steps/s, not thinned


def text_windows(length: int, count: int, seed: int = 0) -> torch.Tensor:
    text = learnable_text(40000)
    starts = torch.randint(
        0, len(text) - length, (count,), generator=torch.Generator().manual_seed(seed)
    )
    return torch.stack([text[s : s + length] for s in starts.tolist()])


# --- the Hugging Face Trainer ----------------------------------------------------------------


def hf_trainer(bench: Bench, steps: int) -> None:
    """``transformers.Trainer`` at its defaults (AdamW 5e-5, linear decay, clip 1.0,
    batch 8, logging and saving every 500 steps) on a tiny GPT-2 from a config, with
    ``probes.hf.TraintopCallback``; only ``max_steps``, ``use_cpu``, the output folder
    and no progress bar are set."""
    import transformers

    from probes.hf import TraintopCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=16, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    rows = [{"input_ids": w, "labels": w} for w in text_windows(32, 5000)]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(bench.folder, "hf"),
        max_steps=steps,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    callbacks: list[Any] = [TraintopCallback(**bench.callback_options())]
    bench.slow(model)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # (and its printed logs: the bench's stdout is the table)
        trainer.train()


# --- Lightning ---------------------------------------------------------------------------


def lightning_fit(bench: Bench, module: Any, max_steps: int, val: bool, **options: Any) -> None:
    """``pl.Trainer(max_steps=...)`` at its defaults but for CPU, the root folder and
    no progress bar or model summary (output only), with traintop's callback."""
    import pytorch_lightning as pl

    from probes.lightning import TraintopCallback

    callbacks: list[Any] = [TraintopCallback(**bench.callback_options())]
    bench.slow(module)
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        default_root_dir=os.path.join(bench.folder, "pl"),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **options,
    )
    windows = text_windows(21, 4096)
    train = DataLoader(TensorDataset(windows[:, :-1], windows[:, 1:]), batch_size=32, shuffle=True)
    held = text_windows(21, 256, seed=1)
    checked = DataLoader(TensorDataset(held[:, :-1], held[:, 1:]), batch_size=64) if val else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train, checked)


def language_model() -> Any:
    import pytorch_lightning as pl

    class GRULM(pl.LightningModule):
        """A GRU language model, Adam 1e-3, validation loss logged."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.rnn = nn.Embedding(16, 32), nn.GRU(32, 64, batch_first=True)
            self.head = nn.Linear(64, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(self.embed(x))[0])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten())
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten()))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return GRULM()


def lightning_defaults(bench: Bench, steps: int) -> None:
    lightning_fit(bench, language_model(), steps, val=True)


def lightning_clip(bench: Bench, steps: int) -> None:
    lightning_fit(bench, language_model(), steps, val=True, gradient_clip_val=0.5)


def lightning_gan(bench: Bench, steps: int) -> Trained:
    """Lightning's manual-optimization GAN (its docs' example: D's step on real and
    detached fake, then G's through D, ``manual_backward``, ``log_dict``), MLPs on
    2-D points, Adam 1e-3 (0.5, 0.999): the docs' 2e-4 is MNIST's over epochs, and
    moves 2-D points' G a quarter of the way in 1,000 batches, as plain torch does too.
    Lightning counts each optimizer's steps: 2 a batch. Its own check: the generated
    points' mean and spread near the data's."""
    import pytorch_lightning as pl

    real_mean, real_std = torch.tensor([0.5, -0.5]), torch.tensor([0.5, 0.3])

    class GAN(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.automatic_optimization = False
            self.G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
            self.D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
            self.criterion = nn.BCEWithLogitsLoss()

        def training_step(self, batch: Any, batch_idx: int) -> None:
            g_opt, d_opt = self.optimizers()  # type: ignore[attr-defined]
            x = real_mean + real_std * torch.randn(len(batch[0]), 2)  # the data: 2-D points
            z = torch.randn(len(x), 8)
            real_label, fake_label = torch.ones(len(x), 1), torch.zeros(len(x), 1)
            fake = self.G(z)
            err_d = self.criterion(self.D(x), real_label)
            err_d = err_d + self.criterion(self.D(fake.detach()), fake_label)
            d_opt.zero_grad()
            self.manual_backward(err_d)
            d_opt.step()
            err_g = self.criterion(self.D(fake), real_label)
            g_opt.zero_grad()
            self.manual_backward(err_g)
            g_opt.step()
            self.log_dict({"g_loss": err_g, "d_loss": err_d})

        def configure_optimizers(self) -> list[torch.optim.Optimizer]:
            betas = (0.5, 0.999)
            return [
                torch.optim.Adam(self.G.parameters(), lr=1e-3, betas=betas),
                torch.optim.Adam(self.D.parameters(), lr=1e-3, betas=betas),
            ]

    module = GAN()
    noise = torch.randn(2048, 8, generator=torch.Generator().manual_seed(5))

    def gap() -> float:
        with torch.no_grad():
            points = module.G(noise)
        return float(
            (points.mean(0) - real_mean).abs().sum() + (points.std(0) - real_std).abs().sum()
        )

    before = gap()
    lightning_fit(bench, module, 2 * steps, val=False)
    after = gap()
    return Trained(learned=after < 0.5 * before, evidence=f"{before:.2f}→{after:.2f}")


# --- traintop run ------------------------------------------------------------------------


def traintop_run(bench: Bench, steps: int) -> Frames:
    """``traintop run --headless --record FILE -- python healthy_scripts/plain_mlp.py``:
    the script has no traintop line; the run's frames are what the monitor recorded."""
    from tui.runlog import read_run_log

    record = os.path.join(bench.folder, "run.log")
    losses = os.path.join(bench.folder, "losses.json")
    delay = RUN_DELAY if bench.mode in ("slow", "every") else 0.0
    command = [
        sys.executable, "-m", "tui.cli", "run", "--headless", "--record", record, "--",
        sys.executable, str(SCRIPTS / "plain_mlp.py"), "--steps", str(steps),
        "--delay", str(delay), "--losses", losses,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"traintop run exited {done.returncode}:\n{done.stderr[-3000:]}")
    frames = [f for f in read_run_log(record) if isinstance(f, dict)]
    printed = [line for line in done.stdout.splitlines() if line.startswith("ALERT")]
    bench.logged[:] = json.loads(Path(losses).read_text())
    bench.printed = printed  # the headless ALERT lines, beside the replayed frames'
    return frames


RECIPES = [
    Recipe("hf-trainer-defaults", "HF Trainer", "probes.hf.TraintopCallback", 1000, hf_trainer),
    Recipe("lightning-defaults", "Lightning automatic + val", "probes.lightning callback", 1000,
           lightning_defaults),
    Recipe("lightning-clip-0.5", "Lightning, gradient_clip_val=0.5", "probes.lightning callback",
           1000, lightning_clip),
    Recipe("lightning-gan-manual", "Lightning manual, 2 opts", "probes.lightning callback",
           1000, lightning_gan, check="generated points' gap to the data's mean/std"),
    Recipe("traintop-run-script", "plain script (Adam + StepLR)", "traintop run --headless",
           1000, traintop_run),
]  # fmt: skip
