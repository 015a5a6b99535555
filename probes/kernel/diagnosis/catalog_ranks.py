"""The catalog's entries for the checks across a job's ranks (run in the monitor)."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung

JOB_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.RANK_OUTLIER: Entry(
        Rung.DATA,
        (
            "One rank's numbers (its loss, a non-finite value, or the scale of its inputs) "
            "stand far from every other rank's at the same step, while the others are fine: "
            "that rank's data shard or its host is the first suspect. It does not prove which "
            "of the two."
        ),
        (
            "Inspect that rank's batch at this step (its shard, its data loader's worker).",
            "Rerun with that rank's shard given to another rank (or another host) alone.",
            "Check that host's hardware and drivers (memory errors, a different library).",
        ),
    ),
    AlertKind.GRADS_NOT_SYNCED: Entry(
        Rung.GRADIENT_PATH,
        (
            "Under DistributedDataParallel every rank must hold the same gradient after the "
            "all-reduce; here the ranks disagree at the same step, so some backward skipped "
            "the all-reduce (a forward through the inner module, no_sync left on). It does "
            "not say which rank is right."
        ),
        (
            "Call the DDP-wrapped model in every forward, never model.module, outside "
            "deliberate no_sync() accumulation.",
            "Check that no_sync() is exited before the backward that must synchronise.",
            "Compare the ranks' gradient norms at one step with find_unused_parameters on.",
        ),
    ),
    AlertKind.REPLICAS_DIVERGED: Entry(
        Rung.UPDATE,
        (
            "The ranks' copies of the model no longer agree at the same step: they trained "
            "apart (unsynchronised gradients, different learning rates, a rank that skipped "
            "an update). Every rank's own loss may still look fine. It does not say which "
            "copy is right."
        ),
        (
            "Find the step where they parted (grads_not_synced names it, if the gradients "
            "did) and the code path taken there.",
            "Check that every rank builds the same optimizer and scheduler and steps both.",
            "Broadcast rank 0's weights (or restart from a checkpoint) and watch them stay equal.",
        ),
    ),
    AlertKind.RANK_STALLED: Entry(
        Rung.PROBE,
        (
            "One rank stopped sending (it died, or hangs) while the others went on or now "
            "wait for it in a collective. It says which rank went quiet first, not why."
        ),
        (
            "Look at that rank's process: its exit status, its last output, py-spy dump.",
            "Check its host (memory, disk, network) and the collective timeout in effect.",
            "Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see which collective waits.",
        ),
    ),
}
