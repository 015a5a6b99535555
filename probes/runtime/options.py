"""Every option of ``probes.watch``, in one place: its name, default and meaning.

``watch(model, optimizer, **options)`` and the framework callbacks
(``TraintopCallback(**options)``) take these by keyword; an unknown name is a
``TypeError`` that lists the known ones.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from probes.kernel.wire import Address


@dataclass(frozen=True)
class WatchOptions:
    """How a probe watches a run.

    Attributes:
        run: a name for the run in the monitor (default: the model's class and pid).
        address: the monitor's address (default: ``$TRAINTOP_ADDRESS``, else the
            per-user Unix socket).
        every: measure one step in ``every``.
        sample_every: costlier statistics (parameter norms, update/weight ratios,
            activation health) on one step in this many.
        grad_accumulation: the check that ``zero_grad`` runs every update is off.
            Accumulating micro-batches between updates never needs it (only the first
            backward after an update is checked); a loop without an optimizer given to
            ``watch()`` that updates every few probe steps does.
        guard: keep non-finite gradients from the weights (``optimizer.step()`` then
            changes nothing, as with AMP's GradScaler), raise an alert and pause. Costs
            one host/device sync per step. The monitor's ``g`` key turns it on and off.
        on_anomaly: what an anomaly step (the monitor's ``a`` key) does when it catches
            a non-finite gradient: ``"pause"`` (skip the update, pause the run) or
            ``"raise"`` (let the error through to the training loop).
        auto_anomaly: when a step's numbers turn non-finite, check the next step once per
            incident (forward outputs of every module, then the backward's ops: the
            producer, its op and forward line join the alert). It only observes, and
            costs that one step. False: only the ``a`` key runs such a check.
        pause_grace_s: how long a paused run waits for a monitor that went away before
            it resumes on its own (default 10, or ``$TRAINTOP_PAUSE_GRACE``).
        queue_size: records the training thread may queue before the oldest are
            dropped (and counted).
        history: step records kept for replay to a monitor that connects late.
        max_steps_per_s: step records sent a second at most (faster runs are thinned,
            peaks kept); by default 60 on rank 0 and 10 on the other ranks of a job.
        job: the id the ranks of one distributed job share (by default from torchrun,
            SLURM or the rendezvous address).
        data_parallel: how the ranks share gradients: ``"ddp"`` (all-reduced),
            ``"fsdp"`` (sharded); by default from the model's wrapper. It decides which
            cross-rank checks apply.
        infer_steps: with no ``probe.step()`` (nor a framework's callback), find the
            steps from the loop itself: one ends at each ``optimizer.step()`` (or, with
            no optimizer, where the weights change after a backward), its loss is what
            ``backward()`` ran from (``probes.runtime.steps.autostep``). False: only the
            step API measures, and updates outside it are named (steps_not_measured).
        time_and_memory: measure where each step's time and memory go (the data wait,
            forward, backward and optimizer phases, the memory, graphs kept across
            steps: ``docs/time-and-memory.md``). False: none of it, and no hook on the
            model between steps.
    """

    run: str | None = None
    address: str | Address | None = None
    every: int = 1
    sample_every: int = 20
    grad_accumulation: bool = False
    guard: bool = False
    on_anomaly: str = "pause"
    pause_grace_s: float | None = None
    queue_size: int = 8192
    history: int = 1024
    max_steps_per_s: float | None = None
    job: str | None = None
    data_parallel: str | None = None
    auto_anomaly: bool = True
    infer_steps: bool = True
    time_and_memory: bool = True

    def __post_init__(self) -> None:
        if self.every < 1 or self.sample_every < 1:
            raise ValueError("every and sample_every must be at least 1")
        if self.on_anomaly not in ("pause", "raise"):
            raise ValueError(f"on_anomaly must be 'pause' or 'raise', got {self.on_anomaly!r}")
        if self.data_parallel not in (None, "ddp", "fsdp", "unknown"):
            raise ValueError(
                f"data_parallel must be 'ddp', 'fsdp' or None, got {self.data_parallel!r}"
            )

    @classmethod
    def of(cls, options: dict[str, Any]) -> WatchOptions:
        """The options given by keyword; an unknown name is a ``TypeError`` naming the
        known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"watch() got unknown option(s) {', '.join(unknown)}; the options "
                f"are: {', '.join(sorted(known))}"
            )
        return cls(**options)
