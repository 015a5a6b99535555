"""traintop for PyTorch Lightning: ``pl.Trainer(..., callbacks=[TraintopCallback()])``.

What is read where (Lightning 2.4 to 2.6, ``pytorch_lightning`` or ``lightning.pytorch``;
before 2.4 Lightning imports ``pkg_resources``, which setuptools 82 on no longer has):

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

Every optimizer is watched (``trainer.optimizers``: a GAN's two under manual
optimization, each one's parameters read at its own ``step()``). Under manual
optimization (``self.automatic_optimization = False``) a probe step is one training
batch, whatever optimizer steps it takes (Lightning's ``global_step`` counts each
optimizer's: with several, the probe numbers the batches itself), and its loss is what
``training_step`` returned, else the sum of what ``manual_backward`` was given.
"""

from __future__ import annotations

from typing import Any

import torch

from probes.runtime.probe import Probe, watch

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
        self._several = False  # several optimizers: the probe numbers the steps itself
        self._manual_losses: list[torch.Tensor] = []  # manual_backward's, this step
        self._wrapped_module: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        self._several = len(optimizers) > 1
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
            optimizers if self._several else (optimizers[0] if optimizers else None),
            run=self.run or type(pl_module).__name__,
            **options,
        )
        if not getattr(pl_module, "automatic_optimization", True):
            self._wrap_manual_backward(pl_module)

    def _wrap_manual_backward(self, pl_module: Any) -> None:
        """Note each loss ``manual_backward`` is given (detached, not read): the step's
        loss when ``training_step`` returns none."""
        self._unwrap_manual_backward()
        backward = pl_module.manual_backward
        losses = self._manual_losses

        def manual_backward(loss: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                losses.append(loss.detach())
            return backward(loss, *args, **kwargs)

        pl_module.manual_backward = manual_backward
        self._wrapped_module = pl_module

    def _unwrap_manual_backward(self) -> None:
        module, self._wrapped_module = self._wrapped_module, None
        if module is not None and "manual_backward" in vars(module):
            del module.manual_backward  # the class's own again

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        probe = self.probe
        if probe is not None and not probe.in_step:
            self._loss = None
            self._manual_losses.clear()
            self._global_step_at_begin = int(trainer.global_step)
            probe.begin_step(None if self._several else self._global_step_at_begin)

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
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1) and self._manual_losses:
            loss = torch.stack([x.reshape(()) for x in self._manual_losses]).sum()  # manual's
        self._manual_losses.clear()
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
        self._unwrap_manual_backward()
        if self.probe is not None:
            self.probe.close(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._unwrap_manual_backward()
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
