"""traintop for the Hugging Face ``Trainer``: ``callbacks=[TraintopCallback()]``.

What is read where (transformers 4.41 to 5.x with accelerate 0.30 to 1.x: the oldest and
the newest are tested, ``.ci/frameworks_oldest``):

- one probe step per optimizer step: ``on_step_begin`` (the first micro-batch of an
  accumulation) to ``on_step_end``;
- the step's loss: the sum of what ``Trainer.training_step`` returns over the step's
  micro-batches, i.e. the loss the update used (already divided for gradient
  accumulation), kept as a tensor (no host/device sync) and NaN kept (the Trainer's own
  logged loss is an average over ``logging_steps`` and turns NaN into the mean so far);
- gradients: before the Trainer's clipping (``max_grad_norm``, through accelerate: its
  older releases call ``torch.nn.utils.clip_grad_norm_``, 1.16 ``get_total_norm`` then
  ``clip_grads_with_norm_``), else in ``optimizer.step()``;
- learning rates: the optimizer's, as ``optimizer.step()`` runs (the Trainer steps one
  optimizer, ``trainer.optimizer``, accelerate's wrapper unwrapped: every optimizer it
  has is watched; a plain loop with several passes them all to ``probes.watch``);
- evaluation: each ``Trainer.evaluate()`` is an eval record of its metrics
  (``eval_loss`` is the validation loss) with the eval-mode checks, at the step the
  Trainer logs it at (``state.global_step``: the updates done);
- the run's name: ``TrainingArguments.run_name`` unless given; its end: ``on_train_end``,
  or the exception that ended the script.

The Trainer does not hand itself to callbacks: the callback finds it on the call stack
of ``on_train_begin`` and wraps two of its methods on that instance
(``training_step``, ``evaluate``) for the length of training.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

try:
    import transformers
    from transformers import TrainerCallback
except ImportError:  # one line, naming what to install
    raise ImportError("probes.hf needs transformers: pip install 'traintop[hf]'") from None

import torch

from probes.runtime.link.sender import warn
from probes.runtime.probe import Probe, watch

_STACK_DEPTH = 12  # frames searched above on_train_begin for the Trainer


class TraintopCallback(TrainerCallback):
    """Watch a ``transformers.Trainer`` run with traintop.

    Args:
        run: the run's name in the monitor (default: ``TrainingArguments.run_name``,
            else the model's class).
        **watch_options: passed to ``probes.watch`` (``guard``, ``sample_every``,
            ``every``, ``address``, ...).

    Example::

        trainer = Trainer(model=model, args=args, train_dataset=data,
                          callbacks=[TraintopCallback()])
        trainer.train()
    """

    def __init__(self, run: str | None = None, **watch_options: Any) -> None:
        self.run = run
        self.watch_options = watch_options
        self.probe: Probe | None = None
        self._loss: torch.Tensor | None = None
        self._wrapped: list[tuple[object, str]] = []  # (instance, method name) to undo

    # --- the Trainer's events ------------------------------------------------------------

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        trainer = _calling_trainer()
        if trainer is not None:
            model, optimizer = trainer.model, trainer.optimizer
        if model is None:
            warn("TraintopCallback: no model reached on_train_begin; not watching")
            return
        if self.probe is not None and not self.probe.closed:
            self.probe.close()  # a second train() on the same callback: a new run
        name = self.run or getattr(args, "run_name", None) or type(model).__name__
        options = dict(self.watch_options)
        if trainer is not None:  # the Trainer's DDP wrapper is not the model it hands out
            options.setdefault("data_parallel", _sync_of(trainer))
        self.probe = watch(model, optimizer, run=name, **options)
        if trainer is None:
            warn(
                "TraintopCallback: the Trainer was not found on the call stack; the "
                "step's loss and the eval-mode checks are not recorded"
            )
            return
        self._wrap(trainer, "training_step", self._training_step)
        self._wrap(trainer, "evaluate", self._evaluate)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.probe is not None:
            self._loss = None
            self.probe.begin_step(int(state.global_step))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # (not an event of the oldest Trainers: there ``optimizer.step()`` reads them)
        if self.probe is not None:
            self.probe.gradients_final()  # read already, unless nothing clipped or stepped

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe = self.probe
        if probe is None:
            return
        if self._loss is not None:
            probe.log(loss=self._loss)
            self._loss = None
        probe.end_step()

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        probe = self.probe
        if probe is None or probe.closed:
            return
        if not probe.evaluating:  # evaluate() not wrapped (no Trainer found): metrics only
            probe.begin_evaluation()
        probe.end_evaluation(**_numbers(metrics))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unwrap()
        if self.probe is not None:
            self.probe.close()

    # --- the Trainer's methods, wrapped --------------------------------------------------

    def _training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = original(*args, **kwargs)
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                loss = loss.detach()  # (it is already; a subclass's may not be)
                self._loss = loss if self._loss is None else self._loss + loss
            return loss

        return training_step

    def _evaluate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def evaluate(*args: Any, **kwargs: Any) -> Any:
            probe = self.probe
            opened = probe is not None and probe.begin_evaluation()
            try:
                return original(*args, **kwargs)
            finally:
                if opened and probe is not None and probe.evaluating:
                    probe.end_evaluation()  # on_evaluate never came (an error)

        return evaluate

    def _wrap(
        self,
        trainer: object,
        name: str,
        wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
    ) -> None:
        setattr(trainer, name, wrapper(getattr(trainer, name)))
        self._wrapped.append((trainer, name))

    def _unwrap(self) -> None:
        for trainer, name in self._wrapped:
            if name in vars(trainer):
                delattr(trainer, name)  # the class's method shows through again
        self._wrapped.clear()


def _calling_trainer() -> Any:
    """The ``transformers.Trainer`` whose callback handler called us, from the stack."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, transformers.Trainer):
            return candidate
        frame = frame.f_back
    return None


def _sync_of(trainer: Any) -> str | None:
    """How the Trainer's ranks share gradients (None: let the probe decide)."""
    wrapped = type(getattr(trainer, "model_wrapped", None)).__name__
    return {"DistributedDataParallel": "ddp", "FullyShardedDataParallel": "fsdp"}.get(wrapped)


def _numbers(metrics: Any) -> dict[str, float]:
    """The numeric entries of an evaluation's metrics (``eval_runtime`` included)."""
    if not isinstance(metrics, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
