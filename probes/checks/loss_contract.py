"""Rung two's loss contract: what a common loss expects of its outputs and targets.

Logits where a loss takes logits (not probabilities), log-probabilities where it takes
them, class indices where it takes them, targets of the outputs' shape where a loss
would broadcast silently, targets on the outputs' device. ``check_batch``
(``probes.checks.batch_checks``) runs ``loss_contract`` on one batch, by hand;
``live_contract`` is the same contract for one call of a loss function of
``torch.nn.functional`` during training (``probes.runtime.live_checks.loss_contract_live`` calls it
on the first steps and on sampled steps), its numbers read in one transfer.

The tests are principled, not tuned (the tolerances below: ``row_sum_tolerance``,
``logsumexp_tolerance``): a row of probabilities lies in [0, 1] and sums to 1 within
what rounding in its dtype allows; a row of log-probabilities has a logsumexp of 0
within as much. Raw logits meet neither but by a coincidence no run repeats row after
row. A binary loss's single column has no such signature (a young model's logits may
all lie in [0, 1]), so there the live check asks the autograd node that made the
outputs (``squashed_by``: a sigmoid).
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from probes.checks.reports import Finding
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CLASSIFICATION_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
REGRESSION_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)

#: Rows (along the class dimension) a live check reads: every row of a softmax's output
#: sums to 1, so a few rows tell as well as all of them, at a fixed cost whatever the
#: batch (a language model's loss input is batch x sequence rows).
CONTRACT_ROWS = 16
#: A log of probabilities smoothed against log(0) (``log(p + 1e-8)``, ``log(p.clamp(
#: min=1e-6))``) has rows whose logsumexp is C x epsilon above 0: 0.01 nats takes in
#: epsilon 1e-6 over 10,000 classes, and is a shift of the loss no curve shows. Raw
#: logits are off by O(1): log(C) at initialisation (0.69 for two classes).
LOG_PROB_SLACK = 0.01
#: What made a tensor, as its autograd node says: a squashing function (its outputs
#: are probabilities), reached back through shape-only operations (a view, a squeeze, a
#: cast) at most ``MADE_BY_NODES`` nodes. Values alone cannot tell a sigmoid's outputs
#: from a young model's logits that all lie in [0, 1] (a discriminator's, biased above
#: 0 at initialisation); the node that made them can.
SQUASHING = frozenset({"Sigmoid", "Hardsigmoid"})
SHAPE_ONLY = frozenset(
    {
        "View",
        "Reshape",
        "ReshapeAlias",
        "UnsafeView",
        "Squeeze",
        "Unsqueeze",
        "ToCopy",
        "Clone",
        "Expand",
        "Permute",
        "Transpose",
        "T",
        "Select",
        "Slice",
        "AsStrided",
        "Alias",
    }
)
MADE_BY_NODES = 8
_BACKWARD = re.compile(r"Backward\d*$")

CLASS_FUNCTIONS = ("cross_entropy", "nll_loss")
BINARY_FUNCTIONS = ("binary_cross_entropy", "binary_cross_entropy_with_logits")
REGRESSION_FUNCTIONS = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
#: The functions a live check reads (not ``gaussian_nll_loss``: it goes negative as it
#: should; nor ``kl_div``: its input is log-probabilities by its own contract, its
#: targets anything a user means).
LIVE_FUNCTIONS = CLASS_FUNCTIONS + BINARY_FUNCTIONS + REGRESSION_FUNCTIONS
#: Of these, the losses that cannot be negative for inputs and targets that keep the
#: contract (a regression loss cannot be negative at all: it is not read).
NON_NEGATIVE = CLASS_FUNCTIONS + BINARY_FUNCTIONS

SIGNAL = (
    "Seen live, on a call of the loss during a training step (the run's first steps and "
    "sampled steps): what the loss was given breaks its contract, and the loss it "
    "returns is not the one meant. It does not say which line of the model or loop made "
    "the wrong tensor."
)


def row_sum_tolerance(dtype: torch.dtype, classes: int) -> float:
    """How far a row of probabilities stored in ``dtype`` may sum from 1: each of its
    terms rounded to ``dtype`` (half an epsilon of each, so at most half an epsilon of
    the sum), the softmax's normaliser summed over ``classes`` terms in float32, and the
    row summed again in float32 to check it (each at most ``classes`` epsilons of
    float32); twice that bound. (Terms below float16's smallest subnormal, flushed to
    0, lose under half of it each: less than an epsilon of float32, so within the
    second term.)"""
    eps32 = torch.finfo(torch.float32).eps
    return 2 * (torch.finfo(dtype).eps / 2 + 2 * classes * eps32)


def logsumexp_tolerance(dtype: torch.dtype, classes: int) -> float:
    """How far a row of log-probabilities stored in ``dtype`` may have a logsumexp from
    0: each value rounded to ``dtype`` by half an epsilon of itself, weighted by its
    probability (at most the entropy, log C, of half an epsilon), and the normaliser's
    and the check's float32 sums over ``classes`` terms; twice that bound, and never
    under ``LOG_PROB_SLACK``."""
    eps32 = torch.finfo(torch.float32).eps
    rounding = torch.finfo(dtype).eps / 2 * math.log(classes) + 2 * classes * eps32
    return max(2 * rounding, LOG_PROB_SLACK)


def class_rows(outputs: torch.Tensor, rows: int | None = None) -> torch.Tensor | None:
    """A classification loss's input as (rows, classes), detached, in float32 (float64
    kept): the class dimension is 1, or 0 for one unbatched example. At most ``rows``
    rows (a live check: the first example's first positions when there are spatial
    dimensions, no copy of the rest); None for an input that is not float or has fewer
    than two classes."""
    if not outputs.is_floating_point() or outputs.dim() == 0:
        return None
    x = outputs.detach()
    if x.dim() == 1:
        x = x.unsqueeze(0)
    elif x.dim() > 2:
        if rows is not None:
            x = x.narrow(0, 0, 1).flatten(2)[..., :rows]
        x = x.flatten(2).transpose(1, 2).reshape(-1, x.shape[1])
    if rows is not None:
        x = x[:rows]
    if x.shape[1] < 2 or x.shape[0] == 0:
        return None
    return x if x.dtype == torch.float64 else x.float()


def _probability_stats(rows: torch.Tensor) -> list[torch.Tensor]:
    """The smallest value, the largest, and the farthest a row sums from 1."""
    return [rows.amin(), rows.amax(), (rows.sum(dim=1) - 1).abs().amax()]


def _is_probabilities(low: float, high: float, off: float, dtype: torch.dtype, c: int) -> bool:
    return low >= 0 and high <= 1 and off <= row_sum_tolerance(dtype, c)


def _looks_like_probabilities(outputs: torch.Tensor) -> bool:
    rows = class_rows(outputs)
    if rows is None or outputs.dim() < 2:
        return False
    low, high, off = torch.stack(_probability_stats(rows)).tolist()
    return _is_probabilities(low, high, off, outputs.dtype, rows.shape[1])


def _looks_like_log_probabilities(outputs: torch.Tensor) -> bool:
    rows = class_rows(outputs)
    if rows is None or outputs.dim() < 2:
        return False
    off = float(torch.logsumexp(rows, dim=1).abs().amax())
    return off <= logsumexp_tolerance(outputs.dtype, rows.shape[1])


def squashed_by(outputs: torch.Tensor) -> str:
    """The squashing function that made ``outputs`` (``"Sigmoid"``), through shape-only
    operations; "" when another operation did (or none: a leaf, a compiled graph)."""
    node = outputs.grad_fn
    for _ in range(MADE_BY_NODES):
        if node is None:
            return ""
        name = _BACKWARD.sub("", type(node).__name__)
        if name in SQUASHING:
            return name
        following = [each for each, _ in node.next_functions if each is not None]
        if name not in SHAPE_ONLY or len(following) != 1:
            return ""
        node = following[0]
    return ""


# --- the findings, by hand and live alike --------------------------------------------------


def _probabilities_finding(name: str, evidence: dict[str, Any] | None = None) -> Finding:
    return Finding(
        AlertKind.PROBABILITIES_INTO_LOGIT_LOSS,
        Severity.ERROR,
        "outputs",
        f"the outputs are probabilities (in [0, 1], summing to 1), but {name} "
        "applies log-softmax itself: softmax is applied twice and gradients shrink",
        f"Remove the softmax at the end of the model and give {name} the raw logits.",
        evidence or {},
    )


def _nll_finding(name: str, looks: str, evidence: dict[str, Any] | None = None) -> Finding:
    return Finding(
        AlertKind.LOGITS_INTO_NLL_LOSS,
        Severity.ERROR,
        "outputs",
        f"{name} expects log-probabilities, but the outputs look like {looks}",
        "End the model with log_softmax, or use CrossEntropyLoss on the logits.",
        evidence or {},
    )


def _sigmoid_finding(evidence: dict[str, Any] | None = None) -> Finding:
    return Finding(
        AlertKind.BCE_WITH_LOGITS_GIVEN_PROBABILITIES,
        Severity.WARNING,
        "outputs",
        "BCEWithLogitsLoss applies a sigmoid itself, but the outputs all lie in [0, 1] "
        "as if a sigmoid were applied already",
        "Remove the final sigmoid from the model, or use BCELoss (less stable).",
        evidence or {},
    )


def _none() -> None:
    return None


#: The outputs ``loss_contract`` was last given: ``check_batch`` gives the loss the same
#: tensor next, and that call is its own, not a training step's (``checked_by_hand``).
_by_hand: Callable[[], torch.Tensor | None] = _none


def checked_by_hand(outputs: torch.Tensor) -> bool:
    """Were ``outputs`` just checked by hand (``check_batch``'s own call of the loss,
    which the live check leaves to it)?"""
    return outputs is _by_hand()


def loss_contract(loss_fn: LossFn, outputs: torch.Tensor, targets: Any) -> list[Finding]:
    global _by_hand
    if isinstance(outputs, torch.Tensor):
        _by_hand = weakref.ref(outputs)
    findings: list[Finding] = []
    if not isinstance(targets, torch.Tensor):
        return findings
    if outputs.device != targets.device:
        findings.append(
            Finding(
                AlertKind.DEVICE_MISMATCH,
                Severity.ERROR,
                "targets",
                f"outputs are on {outputs.device} but targets on {targets.device}",
                "Move the targets to the model's device with the inputs.",
            )
        )
    if isinstance(loss_fn, CLASSIFICATION_LOSSES):
        findings += _classification_contract(loss_fn, outputs, targets)
    elif isinstance(loss_fn, nn.BCELoss | nn.BCEWithLogitsLoss):
        findings += _binary_contract(loss_fn, outputs, targets)
    elif isinstance(loss_fn, REGRESSION_LOSSES):
        findings += _regression_contract(outputs, targets)
    return findings


def _classification_contract(
    loss_fn: nn.Module, outputs: torch.Tensor, targets: torch.Tensor
) -> list[Finding]:
    findings = []
    name = type(loss_fn).__name__
    if isinstance(loss_fn, nn.CrossEntropyLoss) and _looks_like_probabilities(outputs):
        findings.append(_probabilities_finding(name))
    if isinstance(loss_fn, nn.NLLLoss) and not _looks_like_log_probabilities(outputs):
        kind = "probabilities" if _looks_like_probabilities(outputs) else "raw logits"
        findings.append(_nll_finding(name, kind))
    soft_targets = targets.is_floating_point() and targets.shape == outputs.shape
    if targets.is_floating_point() and not soft_targets:
        findings.append(
            Finding(
                AlertKind.FLOAT_TARGETS_FOR_CLASSIFICATION,
                Severity.ERROR,
                "targets",
                f"{name} takes class indices (int64) of shape {tuple(outputs.shape[:1])}, but "
                f"the targets are {str(targets.dtype).replace('torch.', '')} of shape "
                f"{tuple(targets.shape)}",
                "Convert the labels with targets.long() (or pass class probabilities of the "
                "outputs' shape on purpose).",
            )
        )
    elif not targets.is_floating_point() and outputs.dim() >= 2:
        classes = outputs.shape[1]
        ignore = getattr(loss_fn, "ignore_index", -100)
        valid = targets[targets != ignore]
        if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= classes):
            findings.append(
                Finding(
                    AlertKind.TARGET_OUT_OF_RANGE,
                    Severity.ERROR,
                    "targets",
                    f"class indices must lie in [0, {classes - 1}] but range over "
                    f"[{int(valid.min())}, {int(valid.max())}]",
                    "Check the label encoding (0-based?) and the model's number of outputs.",
                    {"classes": classes, "min": int(valid.min()), "max": int(valid.max())},
                )
            )
    return findings


def _binary_contract(
    loss_fn: nn.Module, outputs: torch.Tensor, targets: torch.Tensor
) -> list[Finding]:
    detached = outputs.detach().float()
    in_unit = bool(((detached >= 0) & (detached <= 1)).all())
    findings = []
    if isinstance(loss_fn, nn.BCELoss) and not in_unit:
        findings.append(
            Finding(
                AlertKind.BCE_GIVEN_LOGITS,
                Severity.ERROR,
                "outputs",
                f"BCELoss needs probabilities in [0, 1], but the outputs range over "
                f"[{float(detached.min()):.3g}, {float(detached.max()):.3g}]: they are logits",
                "Use BCEWithLogitsLoss on the logits (it is also numerically safer) rather "
                "than adding a sigmoid.",
            )
        )
    if (
        isinstance(loss_fn, nn.BCEWithLogitsLoss)
        and in_unit
        and detached.numel() > 1
        and (float(detached.max()) - float(detached.min()) > 0)
    ):
        findings.append(_sigmoid_finding())
    if targets.shape != outputs.shape:
        findings.append(_shape_finding(outputs, targets, type(loss_fn).__name__))
    return findings


def _regression_contract(outputs: torch.Tensor, targets: torch.Tensor) -> list[Finding]:
    if targets.shape == outputs.shape:
        return []
    return [_shape_finding(outputs, targets, "the loss")]


def _broadcast_shape(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(outputs.shape, targets.shape))
    except RuntimeError:
        return None


def _shape_finding(outputs: torch.Tensor, targets: torch.Tensor, loss_name: str) -> Finding:
    broadcast = _broadcast_shape(outputs, targets)
    if broadcast is not None and broadcast != tuple(outputs.shape):
        return Finding(
            AlertKind.BROADCAST_IN_LOSS,
            Severity.ERROR,
            "targets",
            f"outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)} broadcast "
            f"to {broadcast} in {loss_name}: every output is compared with every target",
            "Make the shapes equal: outputs.squeeze(-1) or targets.unsqueeze(-1).",
            {
                "outputs": list(outputs.shape),
                "targets": list(targets.shape),
                "broadcast": list(broadcast),
            },
        )
    return Finding(
        AlertKind.SHAPE_MISMATCH,
        Severity.ERROR,
        "targets",
        f"outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)} differ",
        "Make the targets the outputs' shape (or fix the model's last layer).",
        {"outputs": list(outputs.shape), "targets": list(targets.shape)},
    )


# --- live: one call of a loss function, its numbers in one transfer ------------------------


def live_contract(
    function: str, outputs: Any, targets: Any, result: Any, reduction: Any = "mean"
) -> list[Finding]:
    """The contract of one call ``F.<function>(outputs, targets, reduction=...)`` that
    returned ``result``: its findings, each naming the function and the numbers that
    show it (the loss too when it is negative, which these losses cannot be while the
    contract holds). Reads a few rows of ``outputs`` (a binary loss's: their range, when
    a sigmoid made them), float targets' range and the result, with one transfer to the
    host; a regression loss's shapes alone, with none."""
    if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return []
    if function in REGRESSION_FUNCTIONS:
        return _live_broadcast(function, outputs, targets)
    stats: dict[str, torch.Tensor] = {}
    rows = class_rows(outputs, CONTRACT_ROWS) if function in CLASS_FUNCTIONS else None
    if rows is not None:
        stats.update(zip(("low", "high", "off"), _probability_stats(rows), strict=True))
        if function == "nll_loss":
            stats["lse_off"] = torch.logsumexp(rows, dim=1).abs().amax()
    squashed = function == "binary_cross_entropy_with_logits" and squashed_by(outputs)
    if squashed and outputs.numel():
        stats["out_low"], stats["out_high"] = torch.aminmax(outputs.detach())
    soft = function in CLASS_FUNCTIONS and targets.shape == outputs.shape
    if targets.is_floating_point() and targets.numel() and (soft or function in BINARY_FUNCTIONS):
        stats["target_low"], stats["target_high"] = torch.aminmax(targets.detach())
    if isinstance(result, torch.Tensor) and result.is_floating_point() and result.numel():
        stats["loss"] = result.detach().amin()
    if not stats:
        return []
    read = dict(
        zip(stats, torch.stack([s.detach().float() for s in stats.values()]).tolist(), strict=True)
    )  # one transfer to the host
    if squashed:
        read["made_by"] = squashed
    return _live_findings(function, outputs.dtype, rows, read, reduction)


def _live_findings(
    function: str,
    dtype: torch.dtype,
    rows: torch.Tensor | None,
    read: dict[str, Any],
    reduction: Any,
) -> list[Finding]:
    evidence: dict[str, Any] = {"function": function, "reduction": str(reduction)}
    probabilities = False
    if rows is not None:
        classes = rows.shape[1]
        evidence.update(classes=classes, rows_read=rows.shape[0])
        probabilities = _is_probabilities(read["low"], read["high"], read["off"], dtype, classes)
    loss = read.get("loss")
    if loss is not None and loss < 0 and function in NON_NEGATIVE:
        evidence["negative_loss"] = loss
    findings: list[Finding] = []
    if function == "cross_entropy" and probabilities:
        found = {**evidence, "row_sum_off_1": read["off"]}
        findings.append(_probabilities_finding("cross_entropy", found))
    if rows is not None and "lse_off" in read:
        lse_off = read["lse_off"]
        if lse_off > logsumexp_tolerance(dtype, rows.shape[1]) or "negative_loss" in evidence:
            looks = "probabilities" if probabilities else "raw logits"
            found = {**evidence, "logsumexp_off_0": lse_off}
            findings.append(_nll_finding("nll_loss", looks, found))
    low, high = read.get("out_low"), read.get("out_high")
    if low is not None and high is not None and 0 <= low <= high <= 1:
        found = {**evidence, "made_by": read["made_by"], "min": low, "max": high}
        findings.append(_sigmoid_finding(found))
    low, high = read.get("target_low"), read.get("target_high")
    if low is not None and high is not None and (low < 0 or high > 1):
        findings.append(_target_range_finding(function, (low, high), evidence))
    return findings


def _target_range_finding(
    function: str, target_range: tuple[float, float], evidence: dict[str, Any]
) -> Finding:
    low, high = target_range
    what = "class probabilities" if function in CLASS_FUNCTIONS else "probabilities of 1"
    return Finding(
        AlertKind.TARGET_OUT_OF_RANGE,
        Severity.ERROR,
        "targets",
        f"{function}'s float targets are {what}, in [0, 1], but range over [{low:.3g}, {high:.3g}]",
        "Map the labels to [0, 1] (e.g. (y + 1) / 2 for labels in {-1, 1}).",
        {**evidence, "min": low, "max": high},
    )


def _live_broadcast(function: str, outputs: torch.Tensor, targets: torch.Tensor) -> list[Finding]:
    """A regression loss whose targets broadcast against its outputs to more elements
    (shapes only: nothing read). Targets that broadcast to the outputs' own shape (a
    constant target) are left alone. Its subject is the loss, as the alert from torch's
    own warning of the same call says (``probes.runtime.live_checks.torch_warnings``): one cause."""
    if targets.shape == outputs.shape:
        return []
    broadcast = _broadcast_shape(outputs, targets)
    if broadcast is None or broadcast == tuple(outputs.shape):
        return []
    finding = _shape_finding(outputs, targets, function)
    return [replace(finding, subject="loss", evidence={**finding.evidence, "function": function})]
