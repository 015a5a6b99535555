"""Rungs two and three of the checklist: one batch's contract, and a tiny-batch overfit.

``check_batch`` runs one forward pass and checks what reaches the loss: shapes,
dtypes, devices, finiteness, and the contract of common losses (logits vs
probabilities, class-index targets, silent broadcasting, reduction). ``overfit_batch``
trains a copy of the model on a few examples with dropout off and says whether it can
drive the loss down. Neither touches the model: weights, mode and gradients are as
they were.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probes.reports import CheckReport, Finding

if TYPE_CHECKING:
    from probes.probe import Probe

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CLASSIFICATION_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
REGRESSION_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)


def _split_batch(batch: Any) -> tuple[Any, torch.Tensor]:
    if isinstance(batch, dict) and {"inputs", "targets"} <= set(batch):
        return batch["inputs"], batch["targets"]
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError("batch must be (inputs, targets) or {'inputs': ..., 'targets': ...}")


def _forward(model: nn.Module, inputs: Any) -> Any:
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
    inputs, targets = _split_batch(batch)
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
        outputs = _forward(model, inputs)
        if not isinstance(outputs, torch.Tensor):
            add(
                Finding(
                    "output_not_tensor",
                    "info",
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
        for finding in _contract(loss_fn, outputs, targets):
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
                    "error",
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


def _contract(loss_fn: LossFn, outputs: torch.Tensor, targets: Any) -> list[Finding]:
    findings: list[Finding] = []
    if not isinstance(targets, torch.Tensor):
        return findings
    if outputs.device != targets.device:
        findings.append(
            Finding(
                "device_mismatch",
                "error",
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
                "probabilities_into_logit_loss",
                "error",
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
                "logits_into_nll_loss",
                "error",
                "outputs",
                f"NLLLoss expects log-probabilities, but the outputs look like {kind}",
                "End the model with log_softmax, or use CrossEntropyLoss on the logits.",
            )
        )
    soft_targets = targets.is_floating_point() and targets.shape == outputs.shape
    if targets.is_floating_point() and not soft_targets:
        findings.append(
            Finding(
                "float_targets_for_classification",
                "error",
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
                    "target_out_of_range",
                    "error",
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
                "bce_given_logits",
                "error",
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
                "bce_with_logits_given_probabilities",
                "warning",
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
            "broadcast_in_loss",
            "error",
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
        "shape_mismatch",
        "error",
        "targets",
        f"outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)} differ",
        "Make the targets the outputs' shape (or fix the model's last layer).",
        {"outputs": list(outputs.shape), "targets": list(targets.shape)},
    )


def _run_loss(
    loss_fn: LossFn, outputs: torch.Tensor, targets: Any, report: CheckReport
) -> torch.Tensor | None:
    try:
        loss = loss_fn(outputs, targets)
    except Exception as exc:  # the contract broken badly enough that torch refuses
        if not report.findings:
            report.findings.append(
                Finding(
                    "loss_error",
                    "error",
                    "loss",
                    f"the loss raised {type(exc).__name__}: {str(exc).splitlines()[0]}",
                    "Fix the shapes and dtypes the message names.",
                )
            )
        return None
    if loss.numel() == 1 and not bool(torch.isfinite(loss)):
        report.findings.append(
            Finding(
                "non_finite_loss",
                "error",
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
                "loss_not_scalar",
                "error",
                "loss",
                f"the loss has shape {tuple(loss.shape)} (reduction='none'?): backward needs "
                "one number, and .mean() vs .sum() changes the effective learning rate",
                "Use reduction='mean' (or reduce it yourself, deliberately).",
            )
        )
    elif getattr(loss_fn, "reduction", "mean") == "sum":
        findings.append(
            Finding(
                "sum_reduction",
                "info",
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


# --- the tiny-batch overfit -------------------------------------------------------------


STOCHASTIC_REGULARISERS = (nn.modules.dropout._DropoutNd,)


def overfit_batch(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    steps: int = 300,
    target: float | None = None,
    *,
    probe: Probe | None = None,
) -> CheckReport:
    """Can a copy of the model drive the loss down on a few examples?

    The copy has dropout (and the like) switched off; the original model's weights,
    mode and gradients are untouched.

    Args:
        model: the model.
        batch: ``(inputs, targets)``, a few examples.
        loss_fn: the training loss.
        optimizer: a function from parameters to an optimizer (default: Adam, lr 1e-2:
            a few examples should be fitted fast).
        steps: training steps on the batch.
        target: success when the loss ends at or below this; by default when it falls
            to 5% of its first value.
        probe: stream the curve and send the report to the monitor through this probe.

    Returns:
        A ``CheckReport`` with the loss curve in its summary; findings
        ``cannot_overfit`` (error) or ``non_finite_loss``.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    inputs, targets = _split_batch(batch)
    twin = copy.deepcopy(model)
    twin.train()
    for module in twin.modules():
        if isinstance(module, STOCHASTIC_REGULARISERS):
            module.eval()  # stochastic regularisers off: only fitting is tested
    make = optimizer or (lambda params: torch.optim.Adam(params, lr=1e-2))
    opt = make(twin.parameters())
    curve: list[float] = []
    started = time.perf_counter()
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(_forward(twin, inputs), targets)
        curve.append(float(loss))
        if not math.isfinite(curve[-1]):
            break
        loss.backward()
        opt.step()
        if probe is not None and (step % max(steps // 50, 1) == 0):
            probe.event("overfit_batch", loss=curve[-1], at=step)
    return _overfit_report(curve, target, steps, time.perf_counter() - started).send(probe)


def _overfit_report(
    curve: list[float], target: float | None, steps: int, seconds: float
) -> CheckReport:
    first, last = curve[0], curve[-1]
    goal = target if target is not None else 0.05 * first
    report = CheckReport(
        "overfit_batch",
        summary={
            "first_loss": first,
            "last_loss": last,
            "goal": goal,
            "steps": len(curve),
            "seconds": round(seconds, 3),
            "curve": [curve[i] for i in range(0, len(curve), max(len(curve) // 20, 1))],
        },
        signal="Success does not prove the model will generalise; failure points at wiring "
        "(a detached layer, a wrong loss) or optimisation (learning rate, init).",
    )
    if not math.isfinite(last):
        report.findings.append(
            Finding(
                "non_finite_loss",
                "error",
                "loss",
                f"the loss became non-finite after {len(curve)} steps on a tiny batch",
                "Lower the learning rate alone; if it persists, run one step under anomaly "
                "detection.",
                {"steps": len(curve)},
            )
        )
    elif last > goal:
        report.findings.append(
            Finding(
                "cannot_overfit",
                "error",
                "loss",
                f"after {steps} steps on a tiny batch the loss went from {first:.4g} to "
                f"{last:.4g}, not down to {goal:.4g}",
                "Check that gradients reach every layer (no .detach(), no frozen parts), then "
                "the loss contract (check_batch), then the learning rate alone.",
                {"first_loss": first, "last_loss": last, "goal": goal},
            )
        )
    return report
