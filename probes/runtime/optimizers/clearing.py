"""Were the gradients cleared between updates, and how many backward passes went into
them: on every loop shape, without reading a value. One algorithm, for the model's
layers under its update (the measurer's watch) and for each optimizer's own layers when
several share a run (a GAN's generator and discriminator, ``PerOptimizerReads``).

One parameter, the *anchor* (the first layer's first parameter, or the first to hold a
gradient), carries two hooks of ours: a tensor hook, called by autograd before each
backward pass accumulates into its ``.grad`` (one Python call a pass), and a
post-accumulate hook, after it. Between them they see every pass, the gradient tensor
the pass lands on and its version counter, so:

- **cleared?** At each update the anchor's gradient is noted (tensor and version). The
  first pass after it must find that gradient gone (set to None: a new tensor) or
  changed in place (``zero_grad(set_to_none=False)`` bumps the version); finding the
  very tensor at the very version means the pass adds to the last update's gradient,
  unless a clear still comes before the next update uses it: a later pass that finds
  the gradient changed where no pass explains it (a new tensor, or a version moved by
  more than the in-place ops we know of). The verdict is the next update's. Any number
  of passes: a loop that accumulates k micro-batches without clearing is seen as one
  that runs one backward.
  The update is ``optimizer.step()`` (its post-hook; no gradient is touched in place
  between it and the next backward but by a clear) and each closure call (LBFGS
  evaluates it many times a step; each call should clear). Without an optimizer the
  update is somewhere inside the step: the note is then the anchor's gradient after
  its last pass of the step, with the in-place ops we know of since (our clips), and
  the first pass of the next step checks it. Gradient accumulation over micro-batches,
  DDP's ``no_sync``, AMP's ``unscale_`` (before the update) and clips are all healthy
  by construction: none of them sits between an update and the next backward.
- **a game?** Passes that land after an update and are cleared before the next one
  used them are healthy, and say the run is a game (``discarded``): another loss went
  through these parameters and its gradient was thrown away, not stepped on (the
  canonical GAN loop: the generator's backward adds into the discriminator's gradient
  after it stepped, and the discriminator's next ``zero_grad()`` throws it away). The
  losses of such a run are two players' and do not simply fall
  (``probes.kernel.diagnosis`` judges them so).
- **passes** (``backward_passes``, per layer): each layer's gradient version counts
  one in-place change a pass after the one that made the tensor; what else changed it
  in place (AMP's ``unscale_``, a clip, torch's or ours: the anchor's version moved
  since its last pass) and an in-place clear are measured on the anchor and taken off
  every layer (they touch every gradient alike). Host integers, no device sync.

Several optimizers: each has a watch of its own, on the layers it holds, told of its
own ``step()`` alone (one note for the whole step would compare one optimizer's
gradient with another's step). Without the clearing check (the user accumulates on
purpose) such a watch hooks nothing and counts from the versions alone: a clear in
place or a clip then counts as a pass.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import add, attrgetter, sub
from time import perf_counter

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

_GRAD = attrgetter("grad")
_VERSION = attrgetter("_version")
# A gradient tensor held weakly (the loop's clear must free it), with a version it had.
# Kept as two plain attributes each, not a small object: the hooks run every pass.
_Ref = weakref.ref[torch.Tensor] | None


class ClearingWatch:
    """The anchor's hooks and what they tell, for one set of layers (see the module).

    Args:
        layer_params: each layer's first trainable parameter, in layer order (the
            model's, or those of the layers one optimizer holds).
        on_error: called with an exception raised inside a hook of ours.
        hooked: False: no hooks (no verdict; passes from the versions alone).
    """

    def __init__(
        self,
        layer_params: Sequence[nn.Parameter],
        *,
        on_error: Callable[[Exception], None],
        hooked: bool = True,
    ) -> None:
        self._layer_params = list(layer_params)
        self._on_error = on_error
        self._hooked = hooked
        self._anchor: nn.Parameter | None = None
        self._handles: list[RemovableHandle] = []
        # the anchor's grad at the last update (None: none), and its version then
        self._reference: _Ref = None
        self._reference_version = 0
        self._armed = False  # the next pass is the first since an update: check it
        self._uncleared = False  # a pass since the last ``take`` found it uncleared
        # the anchor's grad after its last pass (None: none), and its version then
        self._after: _Ref = None
        self._after_version = 0
        self._known_ops = 0  # in-place ops we know of since the anchor's last pass
        self._head = 0  # in-place changes before this update's first pass (a clear)
        # Per layer, its gradient's version and backward passes at the last update, and
        # the anchor's gradient then (None: no note; a new tensor since: set to None).
        self._note: _Ref = None
        self._note_versions: list[int | None] = []
        self._note_passes: list[int | None] = []
        self.passes = 0  # backward passes into the anchor's gradient since it was cleared
        # Passes after an update were cleared before any update used them: another
        # player's loss went through these layers (a GAN's D under G's loss). Once seen,
        # the run is a game (``discarded_grads``).
        self.discarded = False
        # ... or this model's loss made such a gradient in another watched model (the
        # other player: a GAN's G, told by D's probe): the run is a game too.
        self.in_game = False
        # Seconds in its hooks (inside the user's backward, where the step's boundary
        # does not see them): the probe's own time too, drained by the measurer.
        self.spent = 0.0
        if self._layer_params:
            self._anchor = self._layer_params[0]
            if hooked:
                self._hook(self._anchor)

    def _hook(self, anchor: nn.Parameter) -> None:
        self.remove()
        self._anchor = anchor
        self._handles = [
            anchor.register_hook(self._before_pass),
            anchor.register_post_accumulate_grad_hook(self._after_pass_hook),
        ]

    def remove(self) -> None:
        """Remove the hooks (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # --- the hooks (autograd calls them; they never raise) --------------------------------

    def _before_pass(self, incoming: torch.Tensor) -> None:
        started = perf_counter()
        try:
            anchor = self._anchor
            held = None if anchor is None else anchor.grad
            after = self._after
            if held is None or after is None or after() is not held:
                self.passes = 0  # a new tensor will be made: counted from this pass
            if self._armed:
                self._armed = False
                reference = self._reference
                if reference is not None and held is not None and reference() is held:
                    moved = held._version - self._reference_version
                    if moved == 0:
                        self._uncleared = True  # the last update's gradient, untouched
                    else:
                        self._head += moved  # cleared in place (zero_): counted anew
                        self.passes = 0
            elif self._uncleared and (
                held is None
                or after is None
                or after() is not held
                or held._version != self._after_version + self._known_ops
            ):
                # Cleared after the passes that added to it, before any update used
                # them: a GAN's generator backward through the discriminator, whose
                # gradient the discriminator's next zero_grad() throws away. Healthy.
                self._uncleared = False
                self.discarded = True
            self.passes += 1
        except Exception as exc:  # never into the user's backward
            self._on_error(exc)
        self.spent += perf_counter() - started

    def _after_pass_hook(self, param: torch.Tensor) -> None:
        started = perf_counter()
        try:
            grad = param.grad
            if grad is None:
                self._after = None
            else:
                self._after = weakref.ref(grad)
                self._after_version = grad._version
            self._known_ops = 0
        except Exception as exc:
            self._on_error(exc)
        self.spent += perf_counter() - started

    # --- what the step boundary and the optimizer's hooks tell it ---------------------------

    def updated(self) -> None:
        """An update used the gradients (``optimizer.step()`` ran, or a closure call
        returned): the next pass must find them cleared."""
        anchor = self._anchor
        grad = None if anchor is None else anchor.grad
        if grad is None:
            self._reference = None
        else:
            self._reference = weakref.ref(grad)
            self._reference_version = grad._version
        self._armed = True

    def step_ended(self) -> None:
        """A step without an optimizer ended (its update was somewhere inside it): the
        next pass must find the gradient of this step's last pass cleared."""
        self._reference = self._after
        self._reference_version = self._after_version + self._known_ops
        self._armed = True

    def in_place_op(self) -> None:
        """We are about to change every gradient in place once (our clip)."""
        self._known_ops += 1

    def take_uncleared(self) -> bool:
        """Whether this update's gradient holds the last update's: a pass after that
        one added to it and no clear came before this update."""
        uncleared, self._uncleared = self._uncleared, False
        return uncleared

    # --- per layer ---------------------------------------------------------------------------

    def count_passes(self) -> list[int | None]:
        """Per layer, the backward passes accumulated into its gradient since it was last
        cleared, at an update (see the module); the note for the next one."""
        if not self.passes:
            self._reanchor_if_idle()
        raw: list[int | None]
        try:  # (in C: every layer has a gradient, the common case)
            raw = list(map(_VERSION, map(_GRAD, self._layer_params)))
        except AttributeError:  # a layer without one
            raw = [None if g is None else g._version for g in map(_GRAD, self._layer_params)]
        anchor = None if self._anchor is None else self._anchor.grad
        after = self._after
        tail = 0  # the anchor's in-place changes since its last pass (unscale_, clips)
        if anchor is not None and after is not None and after() is anchor:
            tail = anchor._version - self._after_version
        head, self._head = self._head, 0
        note = self._note
        if note is not None and (anchor is None or note() is not anchor):
            note = None  # a new tensor (set to None since): counted from 1
        versions, before = self._note_versions, self._note_passes
        passes: list[int | None]
        if note is None and None not in raw:  # every gradient new since (in C)
            passes = list(map(add, raw, repeat(1 - tail)))
        elif note is None:
            passes = [None if v is None else v - tail + 1 for v in raw]
        elif head:  # cleared in place: what moved since, less the clear
            passes = [
                None if v is None or n is None else v - n - head - tail
                for v, n in zip(raw, versions, strict=True)
            ]
        elif None not in raw and None not in before:  # (in C)
            passes = list(map(add, before, map(sub, raw, versions)))
            if tail:
                passes = [p - tail for p in passes]  # type: ignore[operator]
        else:
            passes = [
                None
                if v is None
                else (v - tail + 1 if p is None or n is None else p + v - tail - n)
                for v, n, p in zip(raw, versions, before, strict=True)
            ]
        if anchor is None:
            self._note = None
        else:
            self._note = weakref.ref(anchor)
            self._note_versions, self._note_passes = raw, passes
        return passes

    def _reanchor_if_idle(self) -> None:
        """The anchor never had a gradient (a layer unused, say): hook the first layer
        that has one instead, from the next pass on (unhooked: the versions alone)."""
        anchor = self._anchor
        if anchor is None or anchor.grad is not None or self.passes or not self._hooked:
            return
        for param in self._layer_params:
            if param.grad is not None:
                self._hook(param)
                return
