"""traintop for PyTorch Lightning: ``pl.Trainer(..., callbacks=[TraintopCallback()])``.

What is read where (Lightning 2.x, ``pytorch_lightning`` or ``lightning.pytorch``):

- one probe step per optimizer step: from the ``on_train_batch_start`` of its first
  micro-batch to the ``on_train_batch_end`` of the batch whose optimizer step ran
  (``trainer.global_step`` moved), so ``accumulate_grad_batches`` micro-batches make
  one step;
- the step's loss: the sum of ``outputs["loss"]`` over those micro-batches (Lightning
  divides each by ``accumulate_grad_batches``): the loss the update used, a tensor
  read without a sync;
- gradients: in ``on_before_optimizer_step``, after the closure's backward and before
  Lightning clips (``gradient_clip_val``), so the norms are the unclipped ones; the
  clip itself goes through ``torch.nn.utils.clip_grad_norm_`` and is recorded;
- validation (not the sanity check): an eval record of the metrics logged during it
  (``self.log("val_loss", ...)``), with the eval-mode checks, at the step Lightning
  logs it at (``trainer.global_step``: the updates done);
- the run's end: the end of ``fit``, or the exception that stopped it.

Only the first optimizer is watched (``trainer.optimizers[0]``).
"""

from __future__ import annotations

from typing import Any

import torch

from probes.runtime.probe import Probe, watch
from probes.runtime.sender import warn

_BASES: list[type] = []
try:
    import pytorch_lightning

    _BASES.append(pytorch_lightning.Callback)
except ImportError:
    pass
try:
    import lightning.pytorch

    _BASES.append(lightning.pytorch.Callback)
except ImportError:
    pass
if not _BASES:  # one line, naming what to install
    raise ImportError("probes.lightning needs Lightning: pip install 'traintop[lightning]'")


class TraintopCallback(*_BASES):  # type: ignore[misc]
    """Watch a Lightning ``Trainer.fit`` with traintop.

    A callback of both ``pytorch_lightning`` and ``lightning.pytorch`` when both are
    installed, so either Trainer takes it.

    Args:
        run: the run's name in the monitor (default: the LightningModule's class).
        **watch_options: passed to ``probes.watch`` (``guard``, ``sample_every``, ...).

    Example::

        trainer = pl.Trainer(max_steps=1000, callbacks=[TraintopCallback()])
        trainer.fit(module, train_loader, val_loader)
    """

    def __init__(self, run: str | None = None, **watch_options: Any) -> None:
        super().__init__()
        self.run = run
        self.watch_options = watch_options
        self.probe: Probe | None = None
        self._loss: torch.Tensor | None = None
        self._global_step_at_begin = 0
        self._metrics_before: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        if len(optimizers) > 1:
            warn(f"TraintopCallback: {len(optimizers)} optimizers; only the first is watched")
        if self.probe is not None and not self.probe.closed:
            self.probe.close()
        options = dict(self.watch_options)
        strategy = type(getattr(trainer, "strategy", None)).__name__
        if "FSDP" in strategy:
            options.setdefault("data_parallel", "fsdp")
        elif "DDP" in strategy:
            options.setdefault("data_parallel", "ddp")
        self.probe = watch(
            pl_module,
            optimizers[0] if optimizers else None,
            run=self.run or type(pl_module).__name__,
            **options,
        )

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        probe = self.probe
        if probe is not None and not probe.in_step:
            self._loss = None
            self._global_step_at_begin = int(trainer.global_step)
            probe.begin_step(self._global_step_at_begin)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.probe is not None:
            self.probe.gradients_final()  # before Lightning clips

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        probe = self.probe
        if probe is None or not probe.in_step:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if int(trainer.global_step) == self._global_step_at_begin:
            return  # accumulating: the optimizer has not stepped yet
        if self._loss is not None:
            probe.log(loss=self._loss)
            self._loss = None
        probe.end_step()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.probe is None or trainer.sanity_checking:
            return
        self._metrics_before = dict(trainer.callback_metrics)
        self.probe.begin_evaluation()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        probe = self.probe
        if probe is None or trainer.sanity_checking or not probe.evaluating:
            return
        # The metrics this validation logged: new ones, or new values (Lightning makes
        # new tensors for what it logs; the training metrics are left as they were).
        before = self._metrics_before
        logged = {
            name: value
            for name, value in trainer.callback_metrics.items()
            if before.get(name) is not value
        }
        probe.end_evaluation(**_numbers(logged))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.probe is not None:
            self.probe.close(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.probe is not None and stage == "fit":
            self.probe.close()


def _numbers(metrics: dict[str, Any]) -> dict[str, float | torch.Tensor]:
    """Scalar metrics: numbers, and one-element tensors (read by the probe, not here)."""
    out: dict[str, float | torch.Tensor] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[str(name)] = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[str(name)] = float(value)
    return out
