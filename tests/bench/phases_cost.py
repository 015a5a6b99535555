"""What the step's time and memory cost a step, part by part, in microseconds.

    python tests/bench/phases_cost.py

The probe's whole-step overhead (``probe_overhead.py``, its "time and memory" pass) is
too noisy on a shared CPU to resolve a few microseconds; this times the parts the
time-and-memory measurement adds to a step directly, each in a tight loop of the calls
one step makes: the marks (a forward's entry hook, backward's layer, the update's two
hooks, the data wait's blocked-time reads), the harvest into the record, the memory
read, the graph marker and the compile counter. Alternated with an empty loop in the
same run (its cost subtracted).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from probes.runtime.measure.resources import StepResources


def timed(step: Callable[[], None], repeats: int = 2000, rounds: int = 7) -> float:
    """Median over rounds of the mean seconds a call of ``step``."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            step()
        samples.append((time.perf_counter() - started) / repeats)
    return statistics.median(samples)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    bare = nn.Linear(8, 8)
    resources = StepResources(model, on_error=print)
    clock = resources.clock
    assert clock is not None
    loss = model(x).sum()

    def marks() -> None:  # what one step's marks do besides the forward's hook
        clock.backward_begins(None)
        clock.backward_ends()
        clock.update_begins()
        clock.update_ends()
        clock.exclude_since(time.perf_counter())

    def record() -> None:  # the record's fields at the step's end (memory included)
        resources.step_ends(1, {})

    def sampled() -> None:  # a sampled step: the loss's marker
        resources.graphs.arm(1)
        resources.graphs.mark((loss,))
        loss.grad_fn.metadata.clear()

    def empty() -> None:
        pass

    with torch.no_grad():
        rows = [
            (
                "forward: the entry hook (a forward of Linear(8, 8))",
                timed(lambda: model(x)) - timed(lambda: bare(x)),
            ),
        ]
    base = timed(empty)
    rows += [
        ("backward's layer, the update's two marks, the gap's reads", timed(marks) - base),
        ("the record's fields: phases, memory, graphs, compiles", timed(record) - base),
        ("a sampled step's marker on the loss (one in 20 steps)", timed(sampled) - base),
    ]
    resources.remove()
    print(f"torch {torch.__version__}, time and memory, microseconds a step (medians)")
    print(f"  {'part':<62}{'us':>8}")
    for name, seconds in rows:
        print(f"  {name:<62}{seconds * 1e6:8.2f}")
    total = rows[0][1] + rows[1][1] + rows[2][1] + rows[3][1] / 20
    print(f"  {'a step (the sampled part amortised over 20)':<62}{total * 1e6:8.2f}")


if __name__ == "__main__":
    main()
