"""The catalog's entries for rung 8, the step's time and memory: where a step's time goes
(the data wait, a job's straggler, recompilation) and where its memory goes (a creep, a
graph kept across steps, the report of a step that ran out of memory)."""

from __future__ import annotations

from probes.kernel.diagnosis.entry import Entry, Traits
from probes.kernel.diagnosis.vocabulary import AlertKind, Rung, Severity

RESOURCE_ENTRIES: dict[AlertKind, Entry] = {
    AlertKind.INPUT_BOUND: Entry(
        rung=Rung.RESOURCES,
        signal=(
            "The loop waits for its data for a large share of each step: from the end of "
            "one update to the first forward of the next, nothing of the model runs."
        ),
        not_proved=(
            "It does not say which part of the input path is slow (reading, decoding, "
            "augmenting, collating, copying), and a wait that only opens each epoch (the "
            "loader's workers starting again) counts too."
        ),
        experiments=(
            "Raise DataLoader(num_workers=...) and compare the data share; keep "
            "persistent_workers=True if the wait comes each epoch.",
            "Pin memory (pin_memory=True) and copy with non_blocking=True; raise prefetch_factor.",
            "Time one pass over the loader alone, with no model: if it is as slow, move "
            "decoding or augmentation off the loop (preprocess once, or on the device).",
        ),
        evidence=(
            ("data_share", "the wait's share of the steps' time over the window"),
            ("data_ms_per_step", "the wait, in milliseconds a step"),
            ("step_ms", "a whole step, the wait included, in milliseconds"),
            ("steps", "the window, in steps"),
            ("samples_per_s", "samples a second over the window, when the batch is known"),
        ),
        example={
            "step": 300,
            "subject": "",
            "data_share": 0.46,
            "data_ms_per_step": 41.2,
            "step_ms": 89.5,
            "steps": 200,
            "samples_per_s": 715.0,
        },
        severity_note=(
            "A warning from a quarter of the step, an error from half: the loop then waits "
            "for data longer than it computes. A wait under a millisecond a step is not "
            "raised: the experiments would cost about as much as they win back."
        ),
        traits=Traits(held=True),
    ),
    AlertKind.MEMORY_CREEP: Entry(
        rung=Rung.RESOURCES,
        signal=(
            "The memory the run holds grows step after step without levelling off: at this "
            "pace it runs out, however large the device."
        ),
        not_proved=(
            "It does not say what holds the memory. A cache that fills once and stops, or "
            "an allocator that keeps freed blocks, levels off and is not a creep; the "
            "process's resident memory also counts what Python and the loader hold."
        ),
        experiments=(
            "Look for what the loop keeps across steps: losses or outputs appended to a "
            "list, a running sum of tensors (keep loss.item() or loss.detach()).",
            "Look for caches keyed by step or by batch that never evict.",
            "Run the same loop with the logging and metrics off, one at a time, and "
            "compare the growth.",
        ),
        evidence=(
            ("memory", "the memory held now"),
            ("growth", "what it grew over the window"),
            ("per_step", "its growth a step, over the window"),
            ("steps", "the window, in steps"),
            ("source", "what is measured: cuda (the allocator's bytes) or rss (resident)"),
        ),
        example={
            "step": 900,
            "subject": "",
            "memory": "1.9 GiB",
            "growth": "402 MiB",
            "per_step": "502 KiB",
            "steps": 800,
            "source": "rss",
        },
        traits=Traits(held=True),
    ),
    AlertKind.RETAINED_GRAPH: Entry(
        rung=Rung.RESOURCES,
        signal=(
            "The loss (or the model's output) of earlier steps is still part of a live "
            "autograd graph steps after its update: something keeps it with its history "
            "(`total_loss += loss`, a list of losses kept for logging), so every step's "
            "graph stays in memory."
        ),
        not_proved=(
            "It does not name the variable that holds it; one step's graph kept on purpose "
            "(a best loss, kept as a tensor) is not counted."
        ),
        experiments=(
            "Accumulate numbers, not tensors: total_loss += loss.item() (or loss.detach()).",
            "Keep outputs for metrics detached: outputs.append(logits.detach()).",
            "Carry a recurrent state across steps detached: hidden = hidden.detach().",
        ),
        evidence=(
            ("graphs", "earlier steps whose graph is still alive"),
            ("origin", "the oldest of them: the loss of step N, or the output of the model"),
            ("steps", "how many steps it has been kept"),
        ),
        example={
            "step": 120,
            "subject": "loss",
            "graphs": 5,
            "origin": "the loss of step 20",
            "steps": 100,
        },
    ),
    AlertKind.RECOMPILES: Entry(
        rung=Rung.RESOURCES,
        signal=(
            "torch.compile compiles again and again while the run trains: something the "
            "compiled code guards on (a shape, a Python number) changes from step to step, "
            "and every compilation costs seconds."
        ),
        not_proved=(
            "It does not say which guard failed; a few compilations early on (a last "
            "smaller batch, evaluation) are expected and not counted."
        ),
        experiments=(
            "Run with TORCH_LOGS=recompiles to see the guard that fails.",
            "Pad or bucket the inputs to a few shapes, or drop_last=True in the DataLoader.",
            "Mark the changing dimension dynamic (torch._dynamo.mark_dynamic) or compile "
            "with dynamic=True.",
        ),
        evidence=(
            ("new", "compilations within the window"),
            ("compiles", "compilations so far"),
            ("steps", "the window, in steps"),
        ),
        example={"step": 240, "subject": "", "new": 12, "compiles": 15, "steps": 200},
    ),
    AlertKind.STRAGGLER: Entry(
        rung=Rung.RESOURCES,
        signal=(
            "One rank of the job takes longer before the gradients are shared, and every "
            "other rank waits for it in the collective each step."
        ),
        not_proved=(
            "It names the phase that explains the gap on that rank, not why that phase is "
            "slower there (its loader, its shard, its host, its device)."
        ),
        experiments=(
            "On that rank's host, compare its loader (workers, disk, shard sizes) with the "
            "others'.",
            "Swap the rank's shard with another rank's: does the straggler move with it?",
            "Check the host's load and the device's clocks (another job, thermal limits).",
        ),
        evidence=(
            ("rank", "the rank the others wait for"),
            ("host", "its host"),
            ("phase", "its phase that explains the gap (data, forward, compute)"),
            ("gap_ms", "how much longer it takes a step, before the gradients are shared"),
            ("gap_share", "the gap's share of a step"),
            ("phase_share", "the share of the gap the phase explains"),
            ("steps", "the window, in steps"),
        ),
        example={
            "step": 400,
            "subject": "rank 1",
            "rank": 1,
            "host": "node-3",
            "phase": "data",
            "gap_ms": 38.0,
            "gap_share": 0.41,
            "phase_share": 0.96,
            "steps": 200,
        },
        traits=Traits(held=True),
    ),
    AlertKind.OUT_OF_MEMORY: Entry(
        rung=Rung.RESOURCES,
        signal=(
            "A step ran out of memory. The report says in which phase, how much was held, "
            "how the memory went over the last steps and, where it can tell, which "
            "module's tensors were largest."
        ),
        not_proved=(
            "The phase that failed is where the last allocation was asked for, not "
            "necessarily what filled the memory: a creep over earlier steps fails wherever "
            "it reaches the limit."
        ),
        experiments=(
            "If the memory crept over the last steps, find what the loop keeps (see "
            "memory_creep and retained_graph) before anything else.",
            "Halve the batch (keep the effective batch with gradient accumulation).",
            "Trade compute for memory: mixed precision, activation checkpointing.",
        ),
        evidence=(
            ("phase", "the phase the step died in: forward, backward, optimizer, data"),
            ("error", "the error's first line"),
            ("memory", "the memory held at the last measured step"),
            ("peak", "the peak known (CUDA: the allocator's; CPU: the process's)"),
            ("history", "the memory of the last measured steps, oldest first"),
            ("largest", "the largest live tensors, by the module that owns them"),
        ),
        example={
            "step": 41,
            "subject": "backward",
            "phase": "backward",
            "error": "CUDA out of memory. Tried to allocate 2.00 GiB",
            "memory": "21.3 GiB",
            "peak": "23.1 GiB",
            "history": "20.1 GiB, 20.7 GiB, 21.3 GiB",
            "largest": "transformer.h.11.mlp: 1.2 GiB; lm_head: 0.6 GiB",
        },
        raised_by="the probe, when a step raises an out-of-memory error",
        severity=Severity.ERROR,
    ),
}
