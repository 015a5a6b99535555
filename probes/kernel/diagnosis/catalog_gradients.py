"""The catalog's entries for rung 4, the gradient path: norms by layer, missing
gradients, dead or saturated activations, the guard, and the clip."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

_LAYERS_AFFECTED = ("layers_affected", "with several layers: how many")
_RANGE = ("range", "with several layers: the first and the last, in model order (`a..b`)")

_DEAD = (
    "Lower the learning rate alone: large updates push units into the dead region.",
    "Swap ReLU for LeakyReLU/GELU in this layer only.",
    "Re-initialise this layer (Kaiming) or add normalisation before it, one at a time.",
)

GRADIENT_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.EXPLODING_GRADIENT: Entry(
        rung=Rung.GRADIENT_PATH,
        signal="Gradient norms are blowing up: the update path is unstable.",
        not_proved=(
            "It does not say why: learning rate, initialisation, data scale or architecture."
        ),
        experiments=(
            "Lower the learning rate alone by 10x; nothing else changes.",
            "Keep the learning rate and clip at a norm near the healthy values (log the "
            "unclipped norm with probes.clip_grad_norm_).",
            "Check the scale of inputs and targets of the batches where it began.",
        ),
        evidence=(
            ("grad_norm", "the first failing layer's gradient norm when it crossed"),
            ("growth", "how many times its recent level that norm (or the total) is"),
            ("since_step", "the step that layer crossed at"),
            ("grad_norm_total", "the total gradient norm now (`nan` when not measured)"),
            ("layers_over", "how many layers are over the bound"),
            _RANGE,
            (
                "first_grad_norm_total",
                "for a run above the bound from its first record: that record's total norm "
                "(it is then judged against its own scale)",
            ),
            (
                "crossed",
                "`the total norm` when the total crossed before any one layer did (the "
                "subject is then the layer that carries it)",
            ),
        ),
        example={
            "step": 311,
            "subject": "encoder.2",
            "grad_norm": 1843.0,
            "growth": 92.15,
            "since_step": 311,
            "grad_norm_total": 2110.4,
            "layers_over": 2,
            "range": "encoder.0..encoder.2",
        },
        traits=Traits(sticky=True, recoverable=True, held=True),
    ),
    AlertKind.VANISHING_GRADIENT: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "These layers barely receive gradient, so they barely learn (typical of the early "
            "layers of a deep sigmoid or tanh stack)."
        ),
        not_proved="It does not prove they are useless or that the model cannot fit.",
        experiments=(
            "Swap the saturating activation for ReLU/GELU alone, same depth and optimizer.",
            "Add normalisation (LayerNorm/BatchNorm) or residual connections, nothing else.",
            "Re-initialise with a variance-preserving scheme (Xavier for tanh, Kaiming for ReLU).",
        ),
        evidence=(
            ("grad_norm", "the first failing layer's gradient norm"),
            ("to_largest_layer", "that norm over the largest layer's gradient norm"),
            (
                "to_weight_norm",
                "that norm over the layer's own weight norm (`inf` when the weights are not "
                "measured)",
            ),
            ("steps", "how many steps in a row it has stayed that small"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 60,
            "subject": "layers.0",
            "grad_norm": 3.1e-07,
            "to_largest_layer": 2.4e-05,
            "to_weight_norm": 4.4e-08,
            "steps": 21,
            "layers_affected": 3,
            "range": "layers.0..layers.2",
        },
        traits=Traits(waits_for_cause=True),
    ),
    AlertKind.NONE_GRADIENTS: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "These trainable parameters get no gradient: an unused module, a detached branch, "
            "or gradients cleared between backward() and step()."
        ),
        not_proved="It does not prove a bug if the module is meant to be idle.",
        experiments=(
            "Freeze the parameters (requires_grad=False) if they are meant to be idle; nothing "
            "else.",
            "Look for .detach(), .item() or torch.no_grad() on the path from these modules to "
            "the loss, and for zero_grad() between backward() and step().",
            "Check that the module is called in forward (a branch behind a condition?).",
        ),
        evidence=(
            ("params", "how many trainable parameters have no gradient (`.grad` is None)"),
            ("names", "the first six of them"),
            ("steps", "how many steps in a row they have had none"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 2,
            "subject": "aux_head",
            "params": 2,
            "names": "aux_head.weight, aux_head.bias",
            "steps": 3,
        },
    ),
    AlertKind.DEAD_ACTIVATIONS: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "Most outputs of this ReLU (or most inputs of this layer) are exactly zero: those "
            "units pass no gradient and no longer learn."
        ),
        not_proved=(
            "It does not prove the layer is useless: it may be sparse by design (a one-hot "
            "input looks the same)."
        ),
        experiments=_DEAD,
        evidence=(
            ("zero_fraction", "a ReLU's: the fraction of its outputs exactly zero"),
            (
                "input_zero_fraction",
                "instead, for a layer's input (wherever the ReLU was written): the fraction "
                "exactly zero",
            ),
            ("samples", "how many sampled steps in a row showed it"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 140,
            "subject": "relu2",
            "zero_fraction": 0.97,
            "samples": 2,
        },
        traits=Traits(held=True),
    ),
    AlertKind.SATURATED_ACTIVATIONS: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "Most outputs of this activation sit at its flat ends, where the gradient is near zero."
        ),
        not_proved="It does not prove the layer cannot learn, only that it learns slowly now.",
        experiments=(
            "Normalise the inputs of this layer (scale, LayerNorm) alone.",
            "Swap the activation for ReLU/GELU in this layer only.",
            "Re-initialise with smaller weights (Xavier) and compare the fraction.",
        ),
        evidence=(
            (
                "saturated_fraction",
                "the fraction of a tanh's or sigmoid's outputs at its flat ends",
            ),
            ("samples", "how many sampled steps in a row showed it"),
            _LAYERS_AFFECTED,
            _RANGE,
        ),
        example={
            "step": 140,
            "subject": "act1",
            "saturated_fraction": 0.93,
            "samples": 2,
            "layers_affected": 2,
            "range": "fc1..fc2",
        },
        traits=Traits(held=True),
    ),
    AlertKind.GUARD_SKIPPED_UPDATE: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "Non-finite gradients reached optimizer.step(): the guard skipped this update, as "
            "GradScaler does, so the weights stay finite, and paused the run."
        ),
        not_proved="It hides the symptom once; it does not remove the cause.",
        experiments=(
            "Run the next step under anomaly detection (press a) to find the op and layer.",
            "Lower the learning rate alone (x0.5) and resume.",
            "Inspect this step's batch for extreme or non-finite inputs.",
        ),
        evidence=(
            ("non_finite_layers", "how many layers' gradients were non-finite"),
            ("layers", "the first six of them, in model order"),
            ("first_value", "the first one's gradient norm"),
        ),
        example={
            "step": 87,
            "subject": "fc1",
            "non_finite_layers": 2,
            "layers": "fc1, fc2",
            "first_value": float("nan"),
        },
        raised_by=(
            "the guard of `probes.watch(..., guard=True)` (or the monitor's `g` key), which "
            "skips an update with non-finite gradients (`probes/runtime/guard.py`)"
        ),
        severity=Severity.ERROR,
        traits=Traits(sticky=True, recoverable=True),
    ),
    AlertKind.CLIP_ALWAYS_ACTIVE: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "The gradient clip cuts almost every step and the instability shows under it: "
            "the unclipped norm keeps growing, or the loss got worse, while clipped. The "
            "clip keeps the run finite and hides a persistent instability rather than an "
            "occasional spike."
        ),
        not_proved="It does not say where the instability comes from.",
        experiments=(
            "Log the unclipped norms (probes.clip_grad_norm_) with the clip removed for a "
            "few hundred steps, nothing else changed.",
            "Check the loss's reduction: summed where a mean is meant, or not divided by "
            "the gradient accumulation steps.",
            "Lower the learning rate alone and compare how often the clip is active.",
        ),
        evidence=(
            ("clip_active_steps", "steps of the window whose unclipped norm was above max_norm"),
            ("clipped_steps", "steps of the window that went through the clip"),
            ("fraction", "the first over the second"),
            ("window_steps", "the window, in steps"),
            (
                "unclipped_norm_from",
                "when the norm shows it: the median unclipped total norm over the window's "
                "first quarter",
            ),
            ("unclipped_norm_to", "... and over its last quarter"),
            (
                "loss_from",
                "when the loss shows it instead: the median loss over the window's first quarter",
            ),
            ("loss_to", "... over its last quarter"),
            ("loss_spread", "... and the first quarter's own spread about its median"),
        ),
        example={
            "step": 1200,
            "subject": "",
            "clip_active_steps": 200,
            "clipped_steps": 200,
            "fraction": 1.0,
            "window_steps": 200,
            "unclipped_norm_from": 4.21,
            "unclipped_norm_to": 11.7,
        },
        traits=Traits(waits_for_cause=True),
    ),
    AlertKind.GRADS_STILL_SCALED: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "The gradients were clipped (or read) while a GradScaler still held them "
            "multiplied by its loss scale: scaler.unscale_(optimizer) was not called first, "
            "so max_norm is compared with scaled norms and the clip cuts every step."
        ),
        not_proved="The norms shown are the scale times the real ones, not an explosion.",
        experiments=(
            "Call scaler.unscale_(optimizer) after backward and before clip_grad_norm_; "
            "nothing else.",
            "Compare the total norm divided by scaler.get_scale() with a run without AMP.",
            "Step through scaler.step(optimizer) and scaler.update(), not optimizer.step().",
        ),
        evidence=(
            ("loss_scale", "the GradScaler's scale still in the gradients"),
            ("missing", "the call that was missing: `scaler.unscale_(optimizer)`"),
            ("grad_norm_total", "the total gradient norm as read (still scaled)"),
            ("unscaled_total", "that norm divided by the scale: the real one"),
        ),
        example={
            "step": 3,
            "subject": "",
            "loss_scale": 65536.0,
            "missing": "scaler.unscale_(optimizer)",
            "grad_norm_total": 183500.0,
            "unscaled_total": 2.8,
        },
    ),
}
