"""The closed vocabularies of the diagnosis: alert kinds, severities and the rungs of the
lesson's checklist, each value carrying how it is shown.

They are ``str`` (and ``int``) enums so that they travel as they always have: an alert
frame, a run log and a JSON report hold the bare value (``"exploding_gradient"``,
``"error"``, ``4``), and a value read back compares equal to its member. A kind from a
newer probe is not a member: alerts keep it as the string it came as.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum, unique


@unique
class Severity(StrEnum):
    """How bad an alert is; ``order`` ranks them (``--fail-on`` compares by it)."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def order(self) -> int:
        """0 for info, 1 for warning, 2 for error."""
        return _SEVERITY_ORDER[self]

    @property
    def label(self) -> str:
        """As a person reads it (a toast's title, a headless line)."""
        return self.value

    @property
    def style(self) -> str:
        """The rich style of an active alert's text (the panel, the status line)."""
        return SEVERITY_STYLES[self]

    @property
    def colour(self) -> str:
        """The colour of its mark on a chart."""
        return SEVERITY_COLOURS[self]

    @property
    def mark(self) -> str:
        """One letter for a narrow column: E, W, i."""
        return SEVERITY_MARKS[self]

    @classmethod
    def of(cls, value: str) -> Severity:
        """``value`` as a severity; warning for a value that is none (a newer probe's)."""
        try:
            return cls(value)
        except ValueError:
            return cls.WARNING

    def at_least(self, threshold: str) -> bool:
        """True if this severity is ``threshold`` or worse."""
        return self.order >= Severity(threshold).order


_SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "error": 2}
SEVERITY_STYLES: dict[Severity, str] = {
    Severity.INFO: "cyan",
    Severity.WARNING: "yellow",
    Severity.ERROR: "bold red",
}
SEVERITY_COLOURS: dict[Severity, str] = {
    Severity.INFO: "blue",
    Severity.WARNING: "yellow",
    Severity.ERROR: "red",
}
SEVERITY_MARKS: dict[Severity, str] = {
    Severity.INFO: "i",
    Severity.WARNING: "W",
    Severity.ERROR: "E",
}


@unique
class Rung(IntEnum):
    """The lesson's layered checklist; root causes are shown in this order (7: the
    probe itself and the job's ranks)."""

    DATA = 1
    VALUES = 2
    TINY_BATCH = 3
    GRADIENT_PATH = 4
    UPDATE = 5
    EVALUATION = 6
    PROBE = 7
    RESOURCES = 8

    @property
    def label(self) -> str:
        """Its name on the checklist (``shapes, values and the loss contract``)."""
        return RUNG_LABELS[self]

    @property
    def tag(self) -> str:
        """One word for a line of causes: the label's first part (``shapes``)."""
        return self.label.split(",")[0].replace(" ", "_")


RUNG_LABELS: dict[Rung, str] = {
    Rung.DATA: "data and split",
    Rung.VALUES: "shapes, values and the loss contract",
    Rung.TINY_BATCH: "tiny-batch test",
    Rung.GRADIENT_PATH: "gradient path",
    Rung.UPDATE: "update",
    Rung.EVALUATION: "evaluation",
    Rung.PROBE: "the probe and the job's ranks",
    Rung.RESOURCES: "time and memory",
}


@unique
class AlertKind(StrEnum):
    """Every kind of alert, the monitor's rules' and the training side's checks'
    (``catalog`` says each one's rung, signal and experiments)."""

    # 1. data and split (the training side's checks)
    DUPLICATE_ROWS = "duplicate_rows"
    DUPLICATES_ACROSS_SPLITS = "duplicates_across_splits"
    ENTITY_OVERLAP = "entity_overlap"
    TIME_LEAK = "time_leak"
    MISSING_VALUES = "missing_values"
    TARGET_SHIFT = "target_shift"
    LEAKAGE = "leakage"
    PREPROCESSING_MISMATCH = "preprocessing_mismatch"
    # 2. shapes, values and the loss contract
    NON_FINITE = "non_finite"
    OUTPUT_NOT_TENSOR = "output_not_tensor"
    DEVICE_MISMATCH = "device_mismatch"
    PROBABILITIES_INTO_LOGIT_LOSS = "probabilities_into_logit_loss"
    LOGITS_INTO_NLL_LOSS = "logits_into_nll_loss"
    FLOAT_TARGETS_FOR_CLASSIFICATION = "float_targets_for_classification"
    TARGET_OUT_OF_RANGE = "target_out_of_range"
    BCE_GIVEN_LOGITS = "bce_given_logits"
    BCE_WITH_LOGITS_GIVEN_PROBABILITIES = "bce_with_logits_given_probabilities"
    BROADCAST_IN_LOSS = "broadcast_in_loss"
    SHAPE_MISMATCH = "shape_mismatch"
    LOSS_ERROR = "loss_error"
    NON_FINITE_LOSS = "non_finite_loss"
    LOSS_NOT_SCALAR = "loss_not_scalar"
    SUM_REDUCTION = "sum_reduction"
    # 3. the tiny-batch test
    FLAT_LOSS = "flat_loss"
    CANNOT_OVERFIT = "cannot_overfit"
    # 4. the gradient path
    EXPLODING_GRADIENT = "exploding_gradient"
    VANISHING_GRADIENT = "vanishing_gradient"
    NONE_GRADIENTS = "none_gradients"
    DEAD_ACTIVATIONS = "dead_activations"
    SATURATED_ACTIVATIONS = "saturated_activations"
    GUARD_SKIPPED_UPDATE = "guard_skipped_update"
    # 5. the update
    PARAMS_NOT_IN_OPTIMIZER = "params_not_in_optimizer"
    OPTIMIZER_NOT_FOR_MODEL = "optimizer_not_for_model"
    MOSTLY_FROZEN = "mostly_frozen"
    UPDATES_NOT_APPLIED = "updates_not_applied"
    GRAD_NOT_CLEARED = "grad_not_cleared"
    UPDATE_RATIO = "update_ratio"
    SKIPPED_UPDATES = "skipped_updates"
    NO_UPDATES = "no_updates"
    LOSS_SPIKE = "loss_spike"
    LR_EXPERIMENT_UNDONE = "lr_experiment_undone"
    # 6. evaluation
    EVAL_IN_TRAIN_MODE = "eval_in_train_mode"
    EVAL_WITH_GRAD = "eval_with_grad"
    OVERFITTING_SIGNAL = "overfitting_signal"
    # across a job's ranks (rungs 1, 4, 5 and 7)
    RANK_OUTLIER = "rank_outlier"
    GRADS_NOT_SYNCED = "grads_not_synced"
    REPLICAS_DIVERGED = "replicas_diverged"
    RANK_STALLED = "rank_stalled"
    # 7. the probe
    PROBE_OVERHEAD = "probe_overhead"
    STEPS_NOT_MEASURED = "steps_not_measured"
    # 5. the update (issue 18 item 7)
    LR_TOO_LOW_TO_UPDATE = "lr_too_low_to_update"
    # 5. the update (issue 29): low-precision weights the updates no longer move
    LOW_PRECISION_STALL = "low_precision_stall"
    # 2. shapes, values and the loss contract: torch's own warnings during a step
    TORCH_WARNING = "torch_warning"
    # the first steps and the run's own scale (issue 18: rungs 4 to 6)
    LOSS_DIVERGED = "loss_diverged"
    CLIP_ALWAYS_ACTIVE = "clip_always_active"
    GRADS_STILL_SCALED = "grads_still_scaled"
    LOSS_REDUCTION_MISMATCH = "loss_reduction_mismatch"
    # 8. the step's time and memory
    INPUT_BOUND = "input_bound"
    MEMORY_CREEP = "memory_creep"
    RETAINED_GRAPH = "retained_graph"
    RECOMPILES = "recompiles"
    STRAGGLER = "straggler"
    OUT_OF_MEMORY = "out_of_memory"

    @property
    def label(self) -> str:
        """As the alerts panel and the headless lines show it: the kind itself."""
        return self.value


@unique
class RankSubject(StrEnum):
    """What a cross-rank alert of one rank apart from the others is about, where it is
    not a layer (``rank_outlier``'s subject): the code that folds it reads it."""

    INPUTS = "inputs"  # the rank's inputs' scale (a bad shard): nothing of rank 0 explains it
    LOCAL_GRADIENTS = "local_gradients"  # its own gradients, before the all-reduce


@unique
class Evidence(StrEnum):
    """Evidence keys that decide, not only show (every other key is only shown)."""

    # update_ratio's: the first sampled step's updates far too high on most layers (no
    # grace to wait for a cause: nothing comes before it)
    FAR_TOO_HIGH = "far_too_high"
    # update_ratio's side, "high" or "low": a change of side is another incident, and
    # only a rate too high explains what follows from it
    SIDE = "side"
    # a job incident's rank and the phase that explains it (straggler's): the rank's own
    # alerts it explains fold under it on that rank alone, with that phase
    RANK = "rank"
    PHASE = "phase"
    # non_finite's module that produced the value, joined from an anomaly report: the
    # first report found joins, a later one does not overwrite it
    PRODUCER = "producer"
