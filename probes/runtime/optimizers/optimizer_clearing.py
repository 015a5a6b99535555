"""Was one optimizer's gradient cleared since its last step, when several optimizers
share a run (a GAN's generator and discriminator): on every loop shape, gradient
accumulation included, without reading a value.

One parameter of the optimizer, its *anchor* (its first with a gradient), carries a
tensor hook (autograd calls it before each backward pass accumulates into ``.grad``)
and a post-accumulate hook (after). From the optimizer's step on they see every pass
that lands on its gradient and the version counter around it, so at its next step:

- a new gradient tensor since that step (``zero_grad()``, set to None) is cleared;
- the same tensor changed in place where no pass explains it, before the first pass
  or between two passes (``zero_grad(set_to_none=False)``), is cleared;
- the same tensor grown by passes alone is not: the step adds to the last one's
  gradient. Any number of passes: a loop that accumulates k micro-batches without
  clearing is seen as one that runs one backward.

In-place changes after the last pass (AMP's ``unscale_``, a clip) are the step's own
and count for nothing. Passes that land after the step and are cleared before the
next (the canonical GAN loop: the generator's backward adds into the discriminator's
gradients after it stepped) are healthy: the clear comes after them. They are also
what says the run is a game (``discarded``): another loss went through this
optimizer's parameters and its gradient was thrown away, not stepped on; the losses
of such a run are two players' and do not simply fall (``probes.kernel.diagnosis``
judges them so).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from time import perf_counter

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


class OptimizerClearing:
    """The clearing check of one optimizer of several (see the module).

    Args:
        params: the watched parameters the optimizer holds, in model order.
        on_error: called with an exception raised inside a hook of ours.
    """

    def __init__(
        self, params: Sequence[nn.Parameter], on_error: Callable[[Exception], None]
    ) -> None:
        self._params = list(params)
        self._on_error = on_error  # nothing of ours raises into backward
        self._anchor: nn.Parameter | None = None
        self._handles: list[RemovableHandle] = []
        self._stepped: weakref.ref[torch.Tensor] | None = None  # the gradient at the step
        self._version = 0  # its version then, and after each pass since
        self._passes = 0  # passes onto that very tensor since the step
        self._cleared = False  # a clear seen since the step
        self.discarded = False  # passes after a step were cleared, never stepped on
        self.spent = 0.0  # seconds in its hooks (inside backward): the probe's own time

    def before_step(self) -> bool:
        """The optimizer is about to step: True when its gradient is the last step's
        grown by backward passes alone (never cleared)."""
        grad = None if self._anchor is None else self._anchor.grad
        uncleared = (
            grad is not None
            and self._stepped is not None
            and self._stepped() is grad
            and self._passes > 0
            and not self._cleared
        )
        if self._anchor is None or grad is None:
            self._hook_first_with_grad()
        return uncleared

    def after_step(self) -> None:
        """The optimizer stepped: what lands on its gradient from now on is watched."""
        grad = None if self._anchor is None else self._anchor.grad
        self._stepped = None if grad is None else weakref.ref(grad)
        self._version = 0 if grad is None else grad._version
        self._passes, self._cleared = 0, False

    def remove(self) -> None:
        """Remove the hooks (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook_first_with_grad(self) -> None:
        anchor = next((p for p in self._params if p.grad is not None), None)
        if anchor is None or anchor is self._anchor:
            return
        self.remove()
        self._anchor, self._stepped = anchor, None  # checked from its next step on
        self._handles = [
            anchor.register_hook(self._before_pass),
            anchor.register_post_accumulate_grad_hook(self._after_pass),
        ]

    def _before_pass(self, incoming: torch.Tensor) -> None:
        started = perf_counter()
        try:
            held = None if self._anchor is None else self._anchor.grad
            stepped = None if self._stepped is None else self._stepped()
            if held is None or held is not stepped or held._version != self._version:
                if self._passes and not self._cleared:
                    self.discarded = True  # those passes' gradient went unused
                self._cleared = True  # set to None, or changed where no pass explains it
        except Exception as exc:
            self._on_error(exc)
        self.spent += perf_counter() - started

    def _after_pass(self, param: torch.Tensor) -> None:
        started = perf_counter()
        try:
            grad = param.grad
            if grad is not None and self._stepped is not None and self._stepped() is grad:
                self._passes += 1
                self._version = grad._version
        except Exception as exc:
            self._on_error(exc)
        self.spent += perf_counter() - started
