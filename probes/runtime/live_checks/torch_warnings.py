"""torch's own warnings raised during a step, as evidence on rung 2.

torch warns when it sees a likely bug it will not refuse: ``mse_loss`` given a target of
shape ``[B]`` against outputs ``[B, 1]`` says "Using a target size ... that is different
to the input size" and broadcasts. Those words are the best evidence a run has, and
they scroll past on stderr. So a probe listens to what is shown, through one hook on
``warnings.showwarning`` installed once for every open probe (not
``warnings.catch_warnings``, which is not thread-safe and would cost every step):

- each warning is passed on unchanged to the handler that was there before, so what
  the user sees, filters and records (pytest's capture included) does not change;
  but one that points into traintop (torch warns with ``stacklevel=2``, its caller's
  line, and a stand-in of ours on ``torch.nn.functional`` is that caller) is shown at
  the user's line that called the function, where it pointed without traintop;
- a ``UserWarning`` issued by torch's own code (the frame that warned is under torch's
  package) while a step is open becomes an alert: ``broadcast_in_loss`` for the loss
  broadcasting its target (a shape mismatch in the loss, an error), ``torch_warning``
  (a warning) for the others, each naming torch's message (plain, bounded: it is text
  from the run) and the next experiment, once per message and at most
  ``MAX_ALERTS`` a run.

Not raised: warnings from the user's own code (a deprecation of their own says nothing
about the run's numbers; it still shows as ever), torch's ``DeprecationWarning`` and
``FutureWarning`` (about the API, not the run), and warnings outside steps. Python shows
a warning once per place by default, so a warning the user's filters hide, or that was
shown before the probe existed, is not seen either.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import torch

from probes.kernel.diagnosis import Alert, Severity
from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.vocabulary import AlertKind
from probes.runtime.patches import patches
from probes.runtime.patches.patches import Layer, Shared
from probes.runtime.patches.seams import SHOW_WARNING

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
#: traintop's own package: a warning shown as from here came through a stand-in of ours
PROBES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
MESSAGE_CHARS = 240  # of torch's message, in an alert
MAX_ALERTS = 8  # distinct torch warnings one run reports
_BROADCAST = re.compile(
    r"target size \(torch\.Size\((\[[\d, ]*\])\)\).*input size \(torch\.Size\((\[[\d, ]*\])\)\)"
)
#: The files whose frames stand between the code that warned and the listener.
_MACHINERY = frozenset((warnings.__file__, __file__, patches.__file__))


class WatchedRun(Protocol):
    """What the watch reads of a probe: whether a step is open, which, and where to send."""

    @property
    def in_step(self) -> bool: ...

    @property
    def step_index(self) -> int: ...

    def send(self, record: dict[str, Any]) -> None: ...


class TorchWarnings:
    """One probe's listener (``watch`` makes it, ``remove`` ends it)."""

    def __init__(self, run: WatchedRun) -> None:
        self._run = run
        self._seen: set[str] = set()

    def remove(self) -> None:
        """Stop listening (idempotent); the hook goes when the last probe's does."""
        _HOOK.remove(self)

    def heard(self, message: str, category: type[Warning]) -> None:
        """A torch ``UserWarning`` was shown: an alert if a step is open (once a message)."""
        run = self._run
        if not run.in_step or len(self._seen) >= MAX_ALERTS:
            return
        text = plain(message)
        if text in self._seen:
            return
        self._seen.add(text)
        alert = warning_alert(text, category.__name__, max(run.step_index, 0))
        run.send({"kind": "alert", "step": alert.step, "alert": alert.to_dict()})


def watch(run: WatchedRun) -> TorchWarnings:
    """Listen to torch's warnings during ``run``'s steps (see the module)."""
    listener = TorchWarnings(run)
    _HOOK.add(listener)
    return listener


def plain(message: str) -> str:
    """torch's message on one line, printable, at most ``MESSAGE_CHARS`` characters."""
    text = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def warning_alert(text: str, category: str, step: int) -> Alert:
    """The alert for torch's warning ``text`` (plain already) at ``step``."""
    evidence: dict[str, Any] = {"torch_warning": text, "category": category}
    broadcast = _BROADCAST.search(text)
    if broadcast is not None:
        evidence.update(targets=broadcast.group(1), outputs=broadcast.group(2))
        return Alert(
            AlertKind.BROADCAST_IN_LOSS,
            Severity.ERROR,
            step,
            "loss",
            evidence,
            (
                "A shape mismatch in the loss: torch warned that the target's shape differs "
                "from the output's and broadcasts, so every output is compared with every "
                "target and the loss is not the one meant. It does not say which of the two "
                "has the wrong shape."
            ),
            (
                "Make the shapes equal (outputs.squeeze(-1) or targets.unsqueeze(-1)) and "
                "rerun; nothing else.",
                "Run probes.check_batch on one batch to see both shapes.",
            ),
            per_subject=True,
        )
    described = entry(AlertKind.TORCH_WARNING)
    return Alert(
        AlertKind.TORCH_WARNING,
        Severity.WARNING,
        step,
        "",
        evidence,
        described.said,
        described.experiments,
    )


class _ShowHook:
    """The one layer on ``warnings.showwarning``, shared by every open probe's listener."""

    def __init__(self) -> None:
        layer = Layer("torch warnings", self.show)
        self._listeners: Shared[TorchWarnings] = Shared(lambda: [(SHOW_WARNING, layer)])

    def add(self, listener: TorchWarnings) -> None:
        self._listeners.join(listener)

    def remove(self, listener: TorchWarnings) -> None:
        self._listeners.leave(listener)

    def show(
        self,
        proceed: Callable[..., None],
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        try:
            listeners = self._listeners.members
            if listeners and issubclass(category, UserWarning) and _from_torch(filename):
                for listener in listeners:
                    listener.heard(str(message), category)
        except Exception:
            pass
        if filename.startswith(PROBES_DIR):
            filename, lineno, line = *_users_line(filename, lineno), None
        proceed(message, category, filename, lineno, file, line)


def _users_line(filename: str, lineno: int) -> tuple[str, int]:
    """The first frame above the warnings machinery, traintop's stand-ins and torch:
    the line that called the function that warned (``filename``/``lineno``: none)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name not in _MACHINERY and not name.startswith((PROBES_DIR, TORCH_DIR)):
            return name, frame.f_lineno
        frame = frame.f_back
    return filename, lineno


def _from_torch(filename: str) -> bool:
    """Was the warning issued by torch's own code? The first frame above the warnings
    machinery is the one that warned (``filename`` is where ``stacklevel`` points: the
    caller of torch, often the user's own line)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _MACHINERY:
        frame = frame.f_back
    origin = frame.f_code.co_filename if frame is not None else filename
    return origin.startswith(TORCH_DIR)


_HOOK = _ShowHook()
