"""Rung two of the checklist: one batch's shapes, values and loss contract.

``check_batch`` runs one forward pass and checks what reaches the loss: shapes,
dtypes, devices, finiteness, and the contract of common losses (``probes.checks.loss_contract``:
logits vs probabilities, class-index targets, silent broadcasting), and the reduction.
It does not touch the model: weights, mode and gradients are as they were. (Rung three,
the tiny-batch test, is ``probes.checks.tiny_batch.overfit_batch``.)
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probes.checks.loss_contract import LossFn, loss_contract
from probes.checks.reports import CheckReport, Finding
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity

if TYPE_CHECKING:
    from probes.runtime.probe import Probe


def split_batch(batch: Any) -> tuple[Any, torch.Tensor]:
    if isinstance(batch, dict) and {"inputs", "targets"} <= set(batch):
        return batch["inputs"], batch["targets"]
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError("batch must be (inputs, targets) or {'inputs': ..., 'targets': ...}")


def forward(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)


class _Untouched:
    """Restore the model's modes, gradients and buffers (batch-norm running statistics
    move on a forward in training mode) on exit; weights are never stepped."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.modes = {m: m.training for m in self.model.modules()}
        self.grads = {
            p: (None if p.grad is None else p.grad.clone()) for p in self.model.parameters()
        }
        self.buffers = {name: b.clone() for name, b in self.model.named_buffers()}

    def __exit__(self, *exc: object) -> None:
        for module, mode in self.modes.items():
            module.training = mode
        for param, grad in self.grads.items():
            param.grad = grad
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                buffer.copy_(self.buffers[name])


def check_batch(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    *,
    probe: Probe | None = None,
) -> CheckReport:
    """One forward pass, checked against the loss's contract (no backward, no step).

    Args:
        model: the model (left as it was: mode, gradients, weights).
        batch: ``(inputs, targets)``.
        loss_fn: the loss module or function training uses.
        probe: send the report and its findings to the monitor through this probe.

    Returns:
        A ``CheckReport``. Findings: ``shape_mismatch``, ``broadcast_in_loss``,
        ``dtype_mismatch``, ``device_mismatch``, ``non_finite_inputs``,
        ``non_finite_outputs``, ``probabilities_into_logit_loss``,
        ``logits_into_nll_loss``, ``float_targets_for_classification``,
        ``target_out_of_range``, ``bce_given_logits``, ``bce_with_logits_given_probabilities``,
        ``loss_not_scalar``, ``sum_reduction``, ``loss_error``.
    """
    inputs, targets = split_batch(batch)
    report = CheckReport(
        "check_batch",
        signal="A batch that passes the contract can still carry wrong labels: look at a "
        "few rows yourself.",
    )
    add = report.findings.append
    for finding in _check_tensors("inputs", inputs, finite=True):
        add(finding)
    # torch's own warning about a target of another size is reported below as a
    # finding with the shapes, so it is silenced here.
    with _Untouched(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = forward(model, inputs)
        if not isinstance(outputs, torch.Tensor):
            add(
                Finding(
                    AlertKind.OUTPUT_NOT_TENSOR,
                    Severity.INFO,
                    "outputs",
                    f"the model returned {type(outputs).__name__}; only a tensor output is checked",
                    "Pass the tensor the loss receives as the output.",
                )
            )
            return report.send(probe)
        report.summary.update(
            inputs=_describe(inputs), outputs=_describe(outputs), targets=_describe(targets)
        )
        for finding in _check_tensors("outputs", outputs, finite=True):
            add(finding)
        for finding in loss_contract(loss_fn, outputs, targets):
            add(finding)
        loss = _run_loss(loss_fn, outputs, targets, report)
        if loss is not None:
            report.summary["loss"] = _scalar_or_shape(loss)
            for finding in _reduction(loss_fn, loss):
                add(finding)
    return report.send(probe)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).replace('torch.', '')} {value.device}"
    return type(value).__name__


def _check_tensors(label: str, value: Any, *, finite: bool) -> list[Finding]:
    tensors = (
        [value]
        if isinstance(value, torch.Tensor)
        else [
            v
            for v in (value.values() if isinstance(value, dict) else value)
            if isinstance(v, torch.Tensor)
        ]
        if isinstance(value, dict | list | tuple)
        else []
    )
    findings = []
    for tensor in tensors:
        if finite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            findings.append(
                Finding(
                    f"non_finite_{label}",
                    Severity.ERROR,
                    label,
                    f"{bad} of {tensor.numel()} values of the {label} are NaN or Inf",
                    "Find where they come from (missing values, a division, a log) and clean "
                    "or impute them before training."
                    if label == "inputs"
                    else "Run one step under anomaly detection to find the module that makes them.",
                    {"non_finite": bad, "elements": tensor.numel()},
                )
            )
    return findings


def _run_loss(
    loss_fn: LossFn, outputs: torch.Tensor, targets: Any, report: CheckReport
) -> torch.Tensor | None:
    try:
        loss = loss_fn(outputs, targets)
    except Exception as exc:  # the contract broken badly enough that torch refuses
        if not report.findings:
            report.findings.append(
                Finding(
                    AlertKind.LOSS_ERROR,
                    Severity.ERROR,
                    "loss",
                    f"the loss raised {type(exc).__name__}: {str(exc).splitlines()[0]}",
                    "Fix the shapes and dtypes the message names.",
                )
            )
        return None
    if loss.numel() == 1 and not bool(torch.isfinite(loss)):
        report.findings.append(
            Finding(
                AlertKind.NON_FINITE_LOSS,
                Severity.ERROR,
                "loss",
                f"the loss of this batch is {float(loss)}",
                "Check the outputs and targets above; run one step under anomaly detection.",
            )
        )
    return loss


def _reduction(loss_fn: LossFn, loss: torch.Tensor) -> list[Finding]:
    findings = []
    if loss.numel() != 1:
        findings.append(
            Finding(
                AlertKind.LOSS_NOT_SCALAR,
                Severity.ERROR,
                "loss",
                f"the loss has shape {tuple(loss.shape)} (reduction='none'?): backward needs "
                "one number, and .mean() vs .sum() changes the effective learning rate",
                "Use reduction='mean' (or reduce it yourself, deliberately).",
            )
        )
    elif getattr(loss_fn, "reduction", "mean") == "sum":
        findings.append(
            Finding(
                AlertKind.SUM_REDUCTION,
                Severity.INFO,
                "loss",
                "reduction='sum': the loss and its gradients grow with the batch size, so a "
                "different batch size changes the effective learning rate",
                "Prefer reduction='mean', or scale the learning rate with the batch size "
                "on purpose.",
            )
        )
    return findings


def _scalar_or_shape(loss: torch.Tensor) -> float | list[int]:
    return float(loss) if loss.numel() == 1 else list(loss.shape)
