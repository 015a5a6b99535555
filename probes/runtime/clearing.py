"""Were the gradients cleared between updates, and how many backward passes went into
them: on every loop shape, without reading a value.

One parameter, the *anchor* (the first layer's first parameter, or the first to hold a
gradient), carries two hooks of ours: a tensor hook, called by autograd before each
backward pass accumulates into its ``.grad`` (one Python call a pass), and a
post-accumulate hook, after it. Between them they see every pass, the gradient tensor
the pass lands on and its version counter, so:

- **cleared?** At each update the anchor's gradient is noted (tensor and version). The
  first pass after it must find that gradient gone (set to None: a new tensor) or
  changed in place (``zero_grad(set_to_none=False)`` bumps the version); finding the
  very tensor at the very version means the pass adds to the last update's gradient.
  The update is ``optimizer.step()`` (its post-hook; no gradient is touched in place
  between it and the next backward but by a clear) and each closure call (LBFGS
  evaluates it many times a step; each call should clear). Without an optimizer the
  update is somewhere inside the step: the note is then the anchor's gradient after
  its last pass of the step, with the in-place ops we know of since (our clips), and
  the first pass of the next step checks it. Gradient accumulation over micro-batches,
  DDP's ``no_sync``, AMP's ``unscale_`` (before the update) and clips are all healthy
  by construction: none of them sits between an update and the next backward.
- **passes** (``backward_passes``, per layer): each layer's gradient version counts
  one in-place change a pass after the one that made the tensor; what else changed it
  in place (AMP's ``unscale_``, a clip, torch's or ours: the anchor's version moved
  since its last pass) and an in-place clear are measured on the anchor and taken off
  every layer (they touch every gradient alike). Host integers, no device sync.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from operator import add, attrgetter, sub
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

_GRAD = attrgetter("grad")


class _Held(NamedTuple):
    """A gradient tensor and the version it had (or is expected to have)."""

    grad: weakref.ref[torch.Tensor]
    version: int


class _PassNote(NamedTuple):
    """Per layer, its gradient's version and backward passes at the last update; and
    the anchor's gradient then (a new tensor since: the gradients were set to None)."""

    grad: weakref.ref[torch.Tensor]
    versions: list[int | None]
    passes: list[int | None]


class ClearingWatch:
    """The anchor's hooks and what they tell (see the module).

    Args:
        layer_params: each layer's first trainable parameter, in layer order.
        on_error: called with an exception raised inside a hook of ours.
    """

    def __init__(
        self, layer_params: Sequence[nn.Parameter], *, on_error: Callable[[Exception], None]
    ) -> None:
        self._layer_params = list(layer_params)
        self._on_error = on_error
        self._anchor: nn.Parameter | None = None
        self._handles: list[RemovableHandle] = []
        self._reference: _Held | None = None  # the anchor's grad at the last update
        self._armed = False  # the next pass is the first since an update: check it
        self._uncleared = False  # a pass since the last ``take`` found it uncleared
        self._after_pass: _Held | None = None  # the anchor's grad after its last pass
        self._known_ops = 0  # in-place ops we know of since the anchor's last pass
        self._head = 0  # in-place changes before this update's first pass (a clear)
        self._pass_note: _PassNote | None = None
        self.passes = 0  # backward passes into the anchor's gradient since it was cleared
        if self._layer_params:
            self._hook(self._layer_params[0])

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
        try:
            anchor = self._anchor
            held = None if anchor is None else anchor.grad
            after = self._after_pass
            if held is None or after is None or after.grad() is not held:
                self.passes = 0  # a new tensor will be made: counted from this pass
            if self._armed:
                self._armed = False
                reference = self._reference
                if reference is not None and held is not None and reference.grad() is held:
                    moved = held._version - reference.version
                    if moved == 0:
                        self._uncleared = True  # the last update's gradient, untouched
                    else:
                        self._head += moved  # cleared in place (zero_): counted anew
                        self.passes = 0
            self.passes += 1
        except Exception as exc:  # never into the user's backward
            self._on_error(exc)

    def _after_pass_hook(self, param: torch.Tensor) -> None:
        try:
            grad = param.grad
            self._after_pass = None if grad is None else _Held(weakref.ref(grad), grad._version)
            self._known_ops = 0
        except Exception as exc:
            self._on_error(exc)

    # --- what the step boundary and the optimizer's hooks tell it ---------------------------

    def updated(self) -> None:
        """An update used the gradients (``optimizer.step()`` ran, or a closure call
        returned): the next pass must find them cleared."""
        anchor = self._anchor
        grad = None if anchor is None else anchor.grad
        self._reference = None if grad is None else _Held(weakref.ref(grad), grad._version)
        self._armed = True

    def step_ended(self) -> None:
        """A step without an optimizer ended (its update was somewhere inside it): the
        next pass must find the gradient of this step's last pass cleared."""
        after = self._after_pass
        self._reference = (
            None if after is None else _Held(after.grad, after.version + self._known_ops)
        )
        self._armed = True

    def in_place_op(self) -> None:
        """We are about to change every gradient in place once (our clip)."""
        self._known_ops += 1

    def take_uncleared(self) -> bool:
        """Whether a pass since the last call added to an update's gradient."""
        uncleared, self._uncleared = self._uncleared, False
        return uncleared

    # --- per layer ---------------------------------------------------------------------------

    def count_passes(self) -> list[int | None]:
        """Per layer, the backward passes accumulated into its gradient since it was last
        cleared, at an update (see the module); the note for the next one."""
        self._reanchor_if_idle()
        grads = list(map(_GRAD, self._layer_params))  # (in C)
        raw: list[int | None] = [None if g is None else g._version for g in grads]
        anchor = None if self._anchor is None else self._anchor.grad
        after = self._after_pass
        tail = 0  # the anchor's in-place changes since its last pass (unscale_, clips)
        if anchor is not None and after is not None and after.grad() is anchor:
            tail = anchor._version - after.version
        head, self._head = self._head, 0
        note = self._pass_note
        if note is not None and (anchor is None or note.grad() is not anchor):
            note = None  # a new tensor (set to None since): counted from 1
        passes: list[int | None]
        if note is not None and head:  # cleared in place: what moved since, less the clear
            passes = [
                None if v is None or n is None else v - n - head - tail
                for v, n in zip(raw, note.versions, strict=True)
            ]
        elif note is not None and None not in raw and None not in note.passes:  # (in C)
            passes = list(map(add, note.passes, map(sub, raw, note.versions)))
            if tail:
                passes = [p - tail for p in passes]  # type: ignore[operator]
        elif note is not None:
            passes = [
                None
                if v is None
                else (v - tail + 1 if p is None or n is None else p + v - tail - n)
                for v, n, p in zip(raw, note.versions, note.passes, strict=True)
            ]
        else:
            passes = [None if v is None else v - tail + 1 for v in raw]
        self._pass_note = None if anchor is None else _PassNote(weakref.ref(anchor), raw, passes)
        return passes

    def _reanchor_if_idle(self) -> None:
        """The anchor never had a gradient (a layer unused, say): hook the first layer
        that has one instead, from the next pass on."""
        anchor = self._anchor
        if anchor is None or anchor.grad is not None or self.passes:
            return
        for param in self._layer_params:
            if param.grad is not None:
                self._hook(param)
                return
