"""Rung two's loss contract: what a common loss expects of its outputs and targets.

Logits where a loss takes logits (not probabilities), class indices where it takes
them, targets of the outputs' shape where a loss would broadcast silently, targets on
the outputs' device. ``check_batch`` (``probes.checks.batch_checks``) runs these on one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from probes.checks.reports import Finding
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CLASSIFICATION_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
REGRESSION_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)


def loss_contract(loss_fn: LossFn, outputs: torch.Tensor, targets: Any) -> list[Finding]:
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


def _looks_like_probabilities(outputs: torch.Tensor, dim: int = 1) -> bool:
    if outputs.dim() < 2 or not outputs.is_floating_point():
        return False
    detached = outputs.detach().float()
    in_range = bool(((detached >= 0) & (detached <= 1)).all())
    sums = detached.sum(dim=dim)
    return in_range and bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3))


def _looks_like_log_probabilities(outputs: torch.Tensor) -> bool:
    if outputs.dim() < 2 or not outputs.is_floating_point():
        return False
    lse = torch.logsumexp(outputs.detach().float(), dim=1)
    return bool((outputs <= 1e-6).all()) and bool(
        torch.allclose(lse, torch.zeros_like(lse), atol=1e-3)
    )


def _classification_contract(
    loss_fn: nn.Module, outputs: torch.Tensor, targets: torch.Tensor
) -> list[Finding]:
    findings = []
    name = type(loss_fn).__name__
    if isinstance(loss_fn, nn.CrossEntropyLoss) and _looks_like_probabilities(outputs):
        findings.append(
            Finding(
                AlertKind.PROBABILITIES_INTO_LOGIT_LOSS,
                Severity.ERROR,
                "outputs",
                "the outputs are probabilities (in [0, 1], summing to 1), but CrossEntropyLoss "
                "applies log-softmax itself: softmax is applied twice and gradients shrink",
                "Remove the softmax at the end of the model and give CrossEntropyLoss the "
                "raw logits.",
            )
        )
    if isinstance(loss_fn, nn.NLLLoss) and not _looks_like_log_probabilities(outputs):
        kind = "probabilities" if _looks_like_probabilities(outputs) else "raw logits"
        findings.append(
            Finding(
                AlertKind.LOGITS_INTO_NLL_LOSS,
                Severity.ERROR,
                "outputs",
                f"NLLLoss expects log-probabilities, but the outputs look like {kind}",
                "End the model with log_softmax, or use CrossEntropyLoss on the logits.",
            )
        )
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
        findings.append(
            Finding(
                AlertKind.BCE_WITH_LOGITS_GIVEN_PROBABILITIES,
                Severity.WARNING,
                "outputs",
                "BCEWithLogitsLoss applies a sigmoid itself, but the outputs all lie in [0, 1] "
                "as if a sigmoid were applied already",
                "Remove the final sigmoid from the model, or use BCELoss (less stable).",
            )
        )
    if targets.shape != outputs.shape:
        findings.append(_shape_finding(outputs, targets, type(loss_fn).__name__))
    return findings


def _regression_contract(outputs: torch.Tensor, targets: torch.Tensor) -> list[Finding]:
    if targets.shape == outputs.shape:
        return []
    return [_shape_finding(outputs, targets, "the loss")]


def _shape_finding(outputs: torch.Tensor, targets: torch.Tensor, loss_name: str) -> Finding:
    try:
        broadcast = tuple(torch.broadcast_shapes(outputs.shape, targets.shape))
    except RuntimeError:
        broadcast = None
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
