"""The step's time and memory, one owner: its phases (``phases``), its memory
(``memory``), the earlier steps' graphs still alive (``retained``) and the graphs
``torch.compile`` has compiled so far. The step boundary tells it where steps begin and
end; it writes its fields into the step's record, and removes every hook it made.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from torch import nn

from probes.kernel.diagnosis import Alert
from probes.runtime.measure.device_phases import DeviceClock
from probes.runtime.measure.memory import MemoryGauge
from probes.runtime.measure.oom import HISTORY_SHOWN, oom_alert
from probes.runtime.measure.phases import PhaseClock
from probes.runtime.measure.retained import RetainedGraphs


class StepResources:
    """Where each step's time and memory go (see the module); with ``enabled`` False
    (``watch(time_and_memory=False)``), nothing: no hook, no field.

    Args:
        module: the watched model, unwrapped.
        on_error: switches the probe off after an internal error.
        enabled: measure at all.
    """

    def __init__(
        self, module: nn.Module, on_error: Callable[[BaseException], None], enabled: bool = True
    ) -> None:
        self._module = module
        self.graphs = RetainedGraphs()
        self.gauge = MemoryGauge(module)
        self.clock: PhaseClock | None = None
        if enabled:
            self.clock = PhaseClock(module, on_error, on_backward=self.graphs.mark)
            if self.gauge.device is not None:  # on CUDA, the device's phases (events)
                self.clock.device = DeviceClock()
        self.recent_memory: deque[float] = deque(maxlen=HISTORY_SHOWN)  # (an OOM's report)

    @property
    def memory_source(self) -> str | None:
        """What a step's memory is: ``cuda`` (the allocator's bytes) or ``rss`` (None:
        not measured)."""
        return self.gauge.source if self.clock is not None else None

    # --- where the probe tells it what happens ---------------------------------------------

    def step_begins(self, index: int, sampled: bool) -> None:
        """A measured step begins (on sampled ones, its loss is marked)."""
        if sampled and self.clock is not None:
            self.graphs.arm(index)

    def step_ends(self, index: int, into: dict[str, Any]) -> None:
        """A measured step ends: its phases, memory, kept graphs and compilations ``into``
        its record's fields."""
        if self.clock is None:
            return
        self.clock.harvest(into)
        self.gauge.read(into)
        self.recent_memory.append(into["memory"])
        self.graphs.read(index, into)
        compiles = compiled_graphs()
        if compiles:
            into["compiles"] = compiles

    def step_not_measured(self) -> None:
        """A step ended that no record stands for (``every`` > 1): its time is dropped."""
        self.restart()

    def restart(self) -> None:
        """Forget the time since the last step (a pause is nobody's phase)."""
        if self.clock is not None:
            self.clock.restart()

    def exclude_since(self, started: float) -> None:
        """The probe's own work since ``started`` is no phase of the run's."""
        if self.clock is not None:
            self.clock.exclude_since(started)

    @property
    def update_marks(self) -> tuple[Callable[[], None], Callable[[], None]] | None:
        """The clock's marks on each side of ``optimizer.step()`` (its hooks call them
        straight, every update); None when time and memory are not watched: no mark,
        and no hook after the step for them."""
        if self.clock is None:
            return None
        return self.clock.update_begins, self.clock.update_ends

    def evaluation_begins(self) -> None:
        if self.clock is not None:
            self.clock.evaluation_begins()

    def evaluation_ends(self) -> None:
        if self.clock is not None:
            self.clock.evaluation_ends()

    def out_of_memory(self, error: BaseException, step: int, optimizer: Any) -> Alert:
        """The report of a step that ran out of memory (``error``): the phase under way,
        the last steps' memory and the largest tensors by module (``oom``)."""
        return oom_alert(
            error,
            step=step,
            phase=self.clock.phase if self.clock is not None else "unknown",
            history=list(self.recent_memory),
            source=self.gauge.source,
            module=self._module,
            optimizer=optimizer,
        )

    def remove(self) -> None:
        """Every hook off, the memory file closed (idempotent)."""
        if self.clock is not None:
            self.clock.remove()
        self.gauge.close()


def compiled_graphs() -> int | None:
    """The graphs ``torch.compile`` has compiled in this process so far (None: dynamo was
    never imported: nothing is compiled, and it is not imported here)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    stats = counters.get("stats")
    return int(stats.get("unique_graphs", 0)) if stats else None
