"""Synthetic step records that carry their time by phase and their memory."""

from __future__ import annotations

from tests.frames import Frame, hello, step

GIB = 1024.0**3
MIB = 1024.0**2


def timed(
    frame: Frame,
    *,
    cycle: float = 0.04,
    data: float = 0.25,
    forward: float = 0.3,
    backward: float = 0.3,
    optimizer: float = 0.08,
    probe: float = 0.01,
    memory: float | None = None,
    samples: int = 32,
) -> Frame:
    """``frame`` with its cycle (seconds) and each phase's share of it; its memory in
    bytes when given (a thinned record's sums: ``steps`` times one step's)."""
    first, last = frame.get("span", (frame["step"], frame["step"]))
    steps = last - first + 1
    total = cycle * steps
    frame.update(
        cycle=total,
        duration=total * (1 - data),
        data_time=data * total,
        forward_time=forward * total,
        backward_time=backward * total,
        optimizer_time=optimizer * total,
        probe_time=probe * total,
        samples=samples * steps,
    )
    if memory is not None:
        frame["memory"] = memory
    return frame


def timed_run(
    steps: int = 60,
    *,
    run: str = "run-a",
    name: str = "mlp",
    data: float = 0.25,
    memory: float = 3.1 * GIB,
    growth: float = 12 * MIB,
) -> list[Frame]:
    """A hello (its memory read as the process's resident bytes) and ``steps`` records
    whose data wait is ``data`` of a 40 ms cycle, but for every tenth step, which waits
    twice as long on its data (a slow batch: the time chart's tall bars), and whose
    memory grows by ``growth`` a step."""
    frames = [hello(run, name)]
    frames[0]["memory_source"] = "rss"
    for i in range(steps):
        slow = i % 10 == 9
        cycle = 0.04 * (1 + data) if slow else 0.04
        share = 2 * data / (1 + data) if slow else data
        rest = (1 - share) / (1 - data)  # the other phases keep their seconds
        frames.append(
            timed(
                step(i, run),
                cycle=cycle,
                data=share,
                forward=0.3 * rest,
                backward=0.3 * rest,
                optimizer=0.08 * rest,
                probe=0.01 * rest,
                memory=memory + growth * i,
            )
        )
    return frames
