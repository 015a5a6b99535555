"""Evaluations found in a loop watched with no step API (``probes.runtime.steps.autostep``).

While steps are inferred, a forward pre-hook on the watched model (removed once the step
API is used, and at close) sees each forward: one with the model in eval mode or with
gradients off (``no_grad``, ``inference_mode``) begins an evaluation
(``Probe.begin_evaluation``: the eval-mode checks hook the model's layers from there
on), and the next training forward, backward, ``optimizer.step()`` or loss with
gradients (the model in train mode) ends it. A forward in train mode under ``no_grad``
is the bug the eval-mode check names, so it counts as an evaluation too, if a loss
judges its outputs or the script logs in it: one that nothing judges is sampling (a
GAN's fixed noise drawn for its image grid, ``generate()``), not an evaluation, and
sends no record. (An evaluation that computes only a metric by hand, ``argmax`` against
the labels, is taken for sampling too: ``probe.evaluate()`` declares it.)

While such a probe is open, its losses are taken as the script computes them: the
stand-ins of ``torch.nn.functional``'s loss functions
(``probes.runtime.evaluation.functional``) hand each one-element loss, reduced as the
script reduces it, to the open evaluation.


**Splits.** The k-th loss after each forward of the model belongs to series k: a loader
loop's one loss a batch is one series; one full-graph forward followed by a loss on
each of the train, val and test masks (a GCN or GAT) is three, never averaged into a
number the script does not print. Each series is named from the line that called its
loss (read once per call site, ``linecache``, never run): a line that names one split
(``idx_val``, ``data.test_mask``, ``loss_train = ...``) names it ``train_loss``,
``val_loss`` or ``test_loss``; else ``val_loss[k]``. The validation loss (``val_loss``,
the one the screen draws and the overfitting rule reads) is the series named for
validation, else the first unnamed one, else the test split, else the first: the
first is what every loader loop has, and it is the series a script adds others after.
A loss the script logs itself in the evaluation (``probe.log(val_loss=...)``) wins:
then none of these is filed.

Not seen: a loss computed by hand (``(out - y).pow(2).mean()``), a loss of several
elements (``reduction="none"``, summed by the script), nor, with ``watch()``, a
function imported by name before the probe was made (``from torch.nn.functional import
cross_entropy``); under ``traintop run`` the stand-ins are there from torch's import.
Two loaders evaluated one after the other with no training between are one evaluation
(one series: nothing marks where one loader ends).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from probes.runtime.evaluation import functional
from probes.runtime.evaluation.functional import Terms
from probes.runtime.patches.hooks import EntryHandle, eager, entry_pre_hook

VALIDATION_LOSS = "val_loss"


def _gone() -> None:
    return None


class ForwardHook:
    """The pre-hook on the watched model. ``copy.deepcopy(model)`` (an EMA twin) and
    ``torch.save(model)`` take a model's hooks along: a bound method would take the
    probe (its threads and locks) and fail. This one is copied, and pickled, as an inert
    stand-in; and it only hears its own model's forwards."""

    def __init__(self, owner: InferredEvaluation, module: torch.nn.Module) -> None:
        self._owner: Callable[[], InferredEvaluation | None] = weakref.ref(owner)
        self._module: Callable[[], torch.nn.Module | None] = weakref.ref(module)

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        owner = self._owner()
        if owner is not None and module is self._module():
            owner._forward(module, args)

    def __reduce__(self) -> tuple[Callable[[], ForwardHook], tuple[()]]:
        return ForwardHook.inert, ()

    @staticmethod
    def inert() -> ForwardHook:
        """A hook that does nothing (what a copy of the model carries)."""
        hook = object.__new__(ForwardHook)
        hook._owner = hook._module = _gone
        return hook


class Split:
    """One series of an evaluation: the k-th loss after each forward (see the module)."""

    __slots__ = ("broken", "label", "terms", "total")

    def __init__(self, label: str | None) -> None:
        self.label = label  # "train", "val", "test" (its call sites' words) or None
        self.total: torch.Tensor | None = None  # the sums, float64 (detached)
        self.terms: Terms = 0
        self.broken = False  # a sum that could not be added (two devices): not filed

    def add(self, value: torch.Tensor, terms: Terms, label: str | None) -> None:
        if label != self.label:  # call sites that disagree name no split
            self.label = None
        try:
            self.total = value if self.total is None else self.total + value
            self.terms = self.terms + terms
        except Exception:
            self.broken = True

    def loss(self) -> torch.Tensor | None:
        """The series' loss: Σ sums / Σ terms (a device tensor: read with the record)."""
        if self.broken or self.total is None:
            return None
        return self.total / self.terms


class InferredEvaluation:
    """The watched model's evaluations, found (see the module).

    Args:
        module: the watched model, unwrapped.
        begin: opens an evaluation (``Probe.begin_evaluation``); False if none opened.
        end: ends it with its losses by name (what the script logged wins over them).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        begin: Callable[[], bool],
        end: Callable[[dict[str, torch.Tensor]], None],
    ) -> None:
        self._begin, self._end = begin, end
        self._module: Callable[[], torch.nn.Module | None] = weakref.ref(module)
        self.open = False
        self._splits: list[Split] = []
        self._after_forward = 0  # losses since the latest forward: the next one's split
        hook = ForwardHook(self, module)
        # Where the model is entered, outside any compiled region (a hook traced there
        # would break the graph: ``probes.runtime.patches.hooks``).
        self._handle: EntryHandle | None = entry_pre_hook(module, eager(hook))
        # On from the start, not from the evaluation's first forward: in
        # ``F.cross_entropy(model(x), y)`` the function is looked up before the forward.
        functional.watch_losses()

    def _forward(self, module: torch.nn.Module, args: Any) -> None:
        evaluating = not module.training or not torch.is_grad_enabled()
        if evaluating and not self.open:
            if self._begin():
                self.open = True
                self._splits, self._after_forward = [], 0
                functional.start(self)
        elif not evaluating and self.open:
            self.finish()
        else:
            self._after_forward = 0  # the next loss is the first of this forward's

    def model_training(self) -> bool:
        """Is the watched model in training mode? A loss with gradients then, after an
        evaluation opened by ``no_grad`` alone, is training again (a GAN's D stepping
        after G sampled its fixed noise): it ends the evaluation, it is not its loss."""
        module = self._module()
        return module is not None and module.training

    def add_loss(self, value: torch.Tensor, terms: Terms = 1, label: str | None = None) -> None:
        """One loss call: ``value``, the sum over its ``terms`` (``_reduced``), joins the
        series of its place after the latest forward."""
        index = self._after_forward
        self._after_forward += 1
        if index == len(self._splits):
            self._splits.append(Split(label))
        self._splits[index].add(value, terms, label)

    def finish(self) -> None:
        """The evaluation (if one is open) ends: its record, with each series' loss."""
        if not self.open:
            return
        self.open = False
        functional.stop(self)
        splits, self._splits = self._splits, []
        losses = {}
        for name, split in zip(series_names([s.label for s in splits]), splits, strict=True):
            loss = split.loss()
            if loss is not None:
                losses[name] = loss
        self._end(losses)

    def remove(self) -> None:
        """No more evaluations found (the step API took over, or the probe closes)."""
        self.finish()
        if self._handle is not None:  # (once: the losses' hold goes with the hook)
            self._handle.remove()
            self._handle = None
            functional.unwatch_losses()


#: Which series is the validation loss: named for validation, else unnamed, else test.
_PREFERENCE = {"val": 0, None: 1, "test": 2, "train": 3}


def series_names(labels: list[str | None]) -> list[str]:
    """The names of an evaluation's series from their call sites' labels (see the
    module): one ``val_loss`` (the validation loss), the others ``train_loss`` or
    ``test_loss`` where their label is theirs alone, else ``val_loss[k]``.

    Example::

        >>> series_names([None, None, None])
        ['val_loss', 'val_loss[1]', 'val_loss[2]']
        >>> series_names(["train", "val", "test"])
        ['train_loss', 'val_loss', 'test_loss']
    """
    if not labels:
        return []
    main = min(range(len(labels)), key=lambda k: (_PREFERENCE.get(labels[k], 1), k))
    names = []
    for k, label in enumerate(labels):
        if k == main:
            names.append(VALIDATION_LOSS)
        elif label is not None and label != "val" and labels.count(label) == 1:
            names.append(f"{label}_loss")
        else:
            names.append(f"{VALIDATION_LOSS}[{k}]")
    return names
