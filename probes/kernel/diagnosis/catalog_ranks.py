"""The catalog's entries for the checks across a job's ranks (run in the monitor)."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung

_RANKS = ("ranks", "the two ranks compared")
_RELATIVE = ("relative_difference", "(high - low) / high")

JOB_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.RANK_OUTLIER: Entry(
        rung=Rung.DATA,
        signal=(
            "One rank's numbers (its loss, a non-finite value, or the scale of its inputs) "
            "stand far from every other rank's at the same step, while the others are fine: "
            "that rank's data shard or its host is the first suspect."
        ),
        not_proved="It does not prove which of the two.",
        experiments=(
            "Inspect that rank's batch at this step (its shard, its data loader's worker).",
            "Rerun with that rank's shard given to another rank (or another host) alone.",
            "Check that host's hardware and drivers (memory errors, a different library).",
        ),
        evidence=(
            ("rank", "the rank apart"),
            ("loss", "with `subject=loss`: its loss (non-finite, or far above the others')"),
            ("input_rms", "with `subject=inputs`: the RMS of its inputs on a sampled step"),
            (
                "local_grad_norm",
                "with `subject=local_gradients`: its own gradient norm, before the all-reduce",
            ),
            ("other_ranks_median", "the median of the other ranks' values of the same"),
            ("times", "its value over that median"),
            (
                "its_first_<measure>",
                "for inputs and local gradients: its own first value of that measure "
                "(`its_first_input_rms`, `its_first_local_grad_norm`)",
            ),
            ("other_ranks", "how many other ranks were compared"),
            ("others", "`fine`: every other rank's loss is finite and close"),
        ),
        example={
            "step": 212,
            "subject": "loss",
            "rank": 3,
            "loss": 9.81,
            "other_ranks_median": 2.05,
            "times": 4.785,
            "other_ranks": 3,
            "others": "fine",
        },
    ),
    AlertKind.GRADS_NOT_SYNCED: Entry(
        rung=Rung.GRADIENT_PATH,
        signal=(
            "Under DistributedDataParallel every rank must hold the same gradient after the "
            "all-reduce; here the ranks disagree at the same step, so some backward skipped "
            "the all-reduce (a forward through the inner module, no_sync left on)."
        ),
        not_proved="It does not say which rank is right.",
        experiments=(
            "Call the DDP-wrapped model in every forward, never model.module, outside "
            "deliberate no_sync() accumulation.",
            "Check that no_sync() is exited before the backward that must synchronise.",
            "Compare the ranks' gradient norms at one step with find_unused_parameters on.",
        ),
        evidence=(
            _RANKS,
            ("grad_norm_low", "the lower of their gradient norms for the first layer apart"),
            ("grad_norm_high", "the higher"),
            _RELATIVE,
        ),
        example={
            "step": 10,
            "subject": "fc1",
            "ranks": [0, 1],
            "grad_norm_low": 0.412,
            "grad_norm_high": 0.587,
            "relative_difference": 0.2981,
        },
    ),
    AlertKind.REPLICAS_DIVERGED: Entry(
        rung=Rung.UPDATE,
        signal=(
            "The ranks' copies of the model no longer agree at the same step: they trained "
            "apart (unsynchronised gradients, different learning rates, a rank that skipped "
            "an update). Every rank's own loss may still look fine."
        ),
        not_proved="It does not say which copy is right.",
        experiments=(
            "Find the step where they parted (grads_not_synced names it, if the gradients "
            "did) and the code path taken there.",
            "Check that every rank builds the same optimizer and scheduler and steps both.",
            "Broadcast rank 0's weights (or restart from a checkpoint) and watch them stay equal.",
        ),
        evidence=(
            _RANKS,
            ("param_norm_low", "the lower of their parameter norms for the first layer apart"),
            ("param_norm_high", "the higher"),
            _RELATIVE,
        ),
        example={
            "step": 40,
            "subject": "fc1",
            "ranks": [0, 1],
            "param_norm_low": 12.31,
            "param_norm_high": 12.34,
            "relative_difference": 0.002431,
        },
    ),
    AlertKind.RANK_STALLED: Entry(
        rung=Rung.PROBE,
        signal=(
            "One rank stopped sending (it died, or hangs) while the others went on or now "
            "wait for it in a collective."
        ),
        not_proved="It says which rank went quiet first, not why.",
        experiments=(
            "Look at that rank's process: its exit status, its last output, py-spy dump.",
            "Check its host (memory, disk, network) and the collective timeout in effect.",
            "Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see which collective waits.",
        ),
        evidence=(
            ("rank", "the rank that went quiet"),
            ("last_step", "its last step"),
            (
                "reason",
                "how it ended: its connection's end (`error: <type>: <message>` when it "
                "raised), or `quiet for <n> s`",
            ),
            ("other_ranks_at", "the furthest step another rank has reached"),
        ),
        example={
            "step": 1530,
            "subject": "rank 2",
            "rank": 2,
            "last_step": 1530,
            "reason": "quiet for 25 s",
            "other_ranks_at": 1611,
        },
    ),
}
