"""Rung two's loss contract, checked live on the loss calls of training steps.

``probes.check_batch`` checks the loss's contract when a person calls it. This checks
it in the run itself, however it is watched (``traintop run``, ``watch()`` alone, the
step API, the HF and Lightning callbacks): the loss functions of
``torch.nn.functional`` (the ``nn`` loss modules call them) get a layer on their
stand-ins (``probes.runtime.patches.patches``, the seams of ``seams.functional``) while a probe
is open, and a call is checked when

- a training step of the probe is open (not an evaluation: a loss whose input needs no
  gradient, under ``no_grad``, is not a training loss either), and it is one of the
  probe's first ``FIRST_STEPS`` steps with a loss call or a sampled step
  (``sample_every``), and fewer than ``CALLS_PER_STEP`` calls of that step were checked;
- the loss's input comes from the probe's model: its autograd graph reaches one of the
  model's parameters within ``GRAPH_NODES`` nodes (a GAN's two runs, or two models
  trained one after the other, each check only their own losses); and it is not the
  tensor ``check_batch`` has just checked by hand (its own call of the loss).

The check (``probes.checks.loss_contract.live_contract``) reads a few rows of the
input and the loss's value, in one transfer to the host; each kind it finds is sent
once a run, as a check report and its alerts (``probes.checks.reports``), at the step
it was found. A regression loss whose call torch warned about (its target's size) is
left to that warning's alert (``probes.runtime.live_checks.torch_warnings``: one cause, one
alert): a layer on ``warnings.showwarning`` counts those warnings as they are shown.

On every other call the layer costs a few attribute reads: no tensor is touched,
nothing is synchronised. The loss is torch's own result, returned as it came; a check
that fails is dropped (the call is left unchecked), never raised.

A function imported by name before the probe was made (``from torch.nn.functional
import cross_entropy``) is not seen under ``watch()``; under ``traintop run`` the
stand-ins are there from torch's import (``probes.runtime.evaluation.functional.hold_losses``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from probes.checks.loss_contract import (
    LIVE_FUNCTIONS,
    REGRESSION_FUNCTIONS,
    SIGNAL,
    checked_by_hand,
    live_contract,
)
from probes.checks.reports import CheckReport, Finding, Probe
from probes.runtime.options import WatchOptions
from probes.runtime.patches import seams
from probes.runtime.patches.patches import AnySeam, Layer, Seam, Shared


class Run(Probe, Protocol):
    """What the live check reads of its run (``probes.runtime.probe.Probe``, which
    imports this module: a protocol keeps the two out of an import circle)."""

    @property
    def options(self) -> WatchOptions: ...

    @property
    def in_step(self) -> bool: ...

    @property
    def evaluating(self) -> bool: ...

    @property
    def step_index(self) -> int: ...

    def owns(self, param: torch.Tensor) -> bool: ...


#: Every run's first steps are checked (the contract is broken from the first call, or
#: by a change the sampled steps see later), then every ``sample_every`` steps.
FIRST_STEPS = 3
#: A step's loss is one call, or a few (heads, micro-batches); a loop that calls the
#: loss at every position of a sequence has its first calls checked.
CALLS_PER_STEP = 4
#: Calls looked at in a due step, this run's or not (another model's losses: a GAN's).
LOOKS_PER_STEP = 16
#: Autograd nodes walked from the loss's input to find the model's parameters: the
#: output layer's weights are a few nodes away (a softmax, a view, the matmul).
GRAPH_NODES = 256
#: The layer's place in each loss function's chain (``Layer.order``): inside the
#: evaluations' layer (``evaluation.functional``, 50). Every layer there returns torch's
#: result as it came, so the order changes what none of them sees.
ORDER = 60
CHECK = "loss contract (live)"

_WRAPPED = (torch.Tensor, torch.nn.Parameter)
#: Where each function takes ``reduction`` positionally (``torch.nn.functional``'s order).
_REDUCTION_AT = {
    "cross_entropy": 6,
    "nll_loss": 6,
    "binary_cross_entropy": 5,
    "binary_cross_entropy_with_logits": 5,
    "mse_loss": 4,
    "l1_loss": 4,
    "smooth_l1_loss": 4,
    "huber_loss": 2,
}


class LiveContract:
    """One probe's live loss contract (``watch`` makes it, ``remove`` ends it).

    Args:
        run: the probe (its step, whether it evaluates, its parameters, its sender).
        count_time: adds the seconds since a start to the step's probe time.
    """

    def __init__(self, run: Run, count_time: Callable[[float], None]) -> None:
        self._run = run
        self._count_time = count_time
        self._every = run.options.sample_every
        self._said: set[str] = set()
        self._step = -1  # the step whose calls are counted
        self._due = False  # is that step checked
        self._calls = 0  # of its loss calls, those checked (this run's)
        self._looked = 0  # ... and those looked at (anyone's)
        self._steps = 0  # steps due so far (the first FIRST_STEPS of them, then sampled)

    def due(self) -> bool:
        """Is a loss call now one to look at (before its input is)? A step is due when
        its first loss call comes: one of the run's first ``FIRST_STEPS`` steps with a
        loss call, or a sampled step."""
        run = self._run
        if not run.in_step or run.evaluating:
            return False
        step = run.step_index
        if step != self._step:
            self._step, self._calls, self._looked = step, 0, 0
            self._due = self._steps < FIRST_STEPS or step % self._every == 0
            self._steps += self._due
        return self._due and self._calls < CALLS_PER_STEP and self._looked < LOOKS_PER_STEP

    def take(self, loss_input: torch.Tensor) -> bool:
        """A due call: is it this run's (its input made from the model's parameters)? If
        so it counts among its step's checked calls."""
        self._looked += 1
        if not _reaches(loss_input, self._run.owns):
            return False
        self._calls += 1
        return True

    def report(self, function: str, findings: list[Finding]) -> None:
        """Send the kinds not said before in this run: a check report and its alerts."""
        new = [f for f in findings if f.kind not in self._said]
        if not new:
            return
        self._said.update(f.kind for f in new)
        summary = {"function": function, "step": max(self._run.step_index, 0)}
        CheckReport(CHECK, summary, new, SIGNAL).send(self._run)

    def count(self, started: float) -> None:
        self._count_time(started)

    def remove(self) -> None:
        """Stop checking (idempotent); the layers go with the last probe's."""
        _LISTENERS.leave(self)


def watch(run: Run, count_time: Callable[[float], None]) -> LiveContract:
    """Check ``run``'s losses against their contract (see the module)."""
    contract = LiveContract(run, count_time)
    _LISTENERS.join(contract)
    return contract


def _reaches(tensor: torch.Tensor, owns: Callable[[torch.Tensor], bool]) -> bool:
    """Does ``tensor``'s autograd graph reach a parameter ``owns`` (breadth first, at
    most ``GRAPH_NODES`` nodes)?"""
    node = tensor.grad_fn
    if node is None:
        return bool(owns(tensor))  # a parameter itself
    seen = {node}
    queue = deque([node])
    while queue:
        node = queue.popleft()
        variable = getattr(node, "variable", None)  # an AccumulateGrad: a leaf
        if variable is not None:
            if owns(variable):
                return True
            continue
        for following, _ in node.next_functions:
            if following is not None and following not in seen:
                if len(seen) >= GRAPH_NODES:
                    return False
                seen.add(following)
                queue.append(following)
    return False


def _checkable(loss_input: Any) -> bool:
    """A plain tensor (no subclass: a DTensor would gather, a fake one has no values)
    that needs a gradient, outside compilation, tracing and graph capture."""
    if type(loss_input) not in _WRAPPED or not loss_input.requires_grad:
        return False
    if torch.jit.is_tracing() or loss_input.device.type == "meta":
        return False
    return not (loss_input.is_cuda and torch.cuda.is_current_stream_capturing())


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _look(
    function: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, told: bool
) -> None:
    """A loss call returned ``result``: check it for each open probe it is due for
    (``told``: torch warned of its sizes, and that warning's alert says it already)."""
    due = [each for each in _LISTENERS.members if each.due()]
    if not due or (told and function in REGRESSION_FUNCTIONS):
        return  # (every call of every other step: a few attribute reads, nothing more)
    started = time.perf_counter()
    loss_input = _argument(args, kwargs, 0, "input")
    if not _checkable(loss_input) or checked_by_hand(loss_input):
        return  # (``check_batch``'s own call of the loss: its report says what it finds)
    mine = [each for each in due if each.take(loss_input)]
    if not mine:
        return
    target = _argument(args, kwargs, 1, "target")
    reduction = _argument(args, kwargs, _REDUCTION_AT.get(function, len(args)), "reduction")
    reduction = "mean" if reduction is None else reduction
    findings = live_contract(function, loss_input, target, result, reduction)
    for each in mine:
        each.report(function, findings)
        each.count(started)


def _checking(function: str, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A loss function's layer: torch's result, returned as it came; the call checked
    when a probe's step is due for it."""
    heard = _heard[0]
    result = proceed(*args, **kwargs)
    # (traced by dynamo as a constant: a compiled loss is left whole, nothing guarded)
    if _LISTENERS.members and not torch.compiler.is_compiling():
        # a check that fails leaves the call unchecked, and the run as it was
        with contextlib.suppress(Exception):
            _look(function, args, kwargs, result, _heard[0] != heard)
    return result


#: torch's own warning of a regression loss whose target's size differs from its
#: input's. Shown during a step, it is ``broadcast_in_loss`` already
#: (``probes.runtime.live_checks.torch_warnings``); a call it was shown for is not said again here.
TORCH_SIZE_WARNING = "different to the input size"
_heard = [0]  # torch's size warnings shown so far (compared around each loss call)


def _hearing(
    proceed: Callable[..., Any], message: Any, category: Any, *args: Any, **kwargs: Any
) -> Any:
    """The layer on ``warnings.showwarning``: counts torch's size warnings, passes all."""
    with contextlib.suppress(Exception):
        if issubclass(category, UserWarning) and TORCH_SIZE_WARNING in str(message):
            _heard[0] += 1
    return proceed(message, category, *args, **kwargs)


def _contract_layers() -> list[tuple[AnySeam, Layer]]:
    """The layers on the loss functions and on torch's warnings, made once (the same
    layers each time the first probe opens)."""
    layers: list[tuple[AnySeam, Layer]] = [
        (seam, Layer(CHECK, functools.partial(_checking, name), order=ORDER))
        for name, seam in ((name, seams.functional(name)) for name in LIVE_FUNCTIONS)
        if isinstance(seam, Seam)
    ]
    layers.append((seams.SHOW_WARNING, Layer(CHECK, _hearing, order=ORDER)))
    return layers


_LAYERS = _contract_layers()
#: The open probes' contracts; the layers are on while any is.
_LISTENERS: Shared[LiveContract] = Shared(lambda: _LAYERS)
