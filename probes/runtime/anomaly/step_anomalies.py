"""A step's anomaly modes, one part of the step boundary: the monitor's anomaly step (on
demand: ``torch.autograd.detect_anomaly`` for one step, ``probes.runtime.anomaly.anomaly``)
and the automatic check a non-finite read arms for the next step
(``probes.runtime.anomaly.auto_anomaly``). The boundary tells it where steps begin and
end; it sends their reports, pauses the run where the options say, and keeps a failed
backward's partial gradients from the weights (``skip_update``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from probes.runtime.anomaly.anomaly import AnomalyStep, backward_op
from probes.runtime.anomaly.auto_anomaly import AutoAnomaly, ScopedCheck
from probes.runtime.job import JobIdentity
from probes.runtime.link.control import Control
from probes.runtime.measure.measurer import StepMeasurer
from probes.runtime.options import WatchOptions


class StepAnomalies:
    """The anomaly step and the automatic check of the step under way (see the module).

    Args:
        module: the watched model, unwrapped (anomaly steps hook its layers).
        options: ``on_anomaly`` (pause, record or raise) and ``auto_anomaly``.
        identity: the run's place in its job (anomaly mode never stops one rank).
        measurer: the step under way (its scalars go with the reports).
        control: pauses the run; its state goes with the reports.
        send: where the reports go, in the order the monitor must see them.
        skip_update: keeps ``optimizer.step()`` from changing any weight.
        on_caught: the anomaly step's backward failed and was caught there.
        on_error: switches the probe off after an internal error.
    """

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        options: WatchOptions,
        identity: JobIdentity,
        measurer: StepMeasurer,
        control: Control,
        send: Callable[[Any], None],
        skip_update: Callable[[], None],
        on_caught: Callable[[BaseException], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._module = module
        self._options = options
        self._identity = identity
        self._measurer = measurer
        self._control = control
        self._send = send
        self._skip_update = skip_update
        self._on_caught = on_caught
        self._fail = on_error
        self._anomaly: AnomalyStep | None = None
        # The check a non-finite read arms for the next step (the sender tells ``auto``).
        self.auto = AutoAnomaly(options.auto_anomaly)
        self._check: ScopedCheck | None = None

    def begin(self, index: int) -> None:
        """Step ``index`` begins: the anomaly step the monitor armed, else the automatic
        check a non-finite value armed."""
        if self._control.state.anomaly_armed and self._control.take_anomaly_step():
            self._begin_anomaly(index)
        elif self.auto.pending is not None and self._anomaly is None and self._check is None:
            armed_by = self.auto.take()
            if armed_by is not None:
                self._check = ScopedCheck(self._module, index, armed_by, self.auto.switch_off)
                self._check.start()

    def _begin_anomaly(self, index: int) -> None:
        """The monitor's anomaly step begins. In a multi-rank job a backward stopped on
        one rank would leave the others waiting in DDP's all-reduce: anomaly mode then
        only records, never stops."""
        self._anomaly = AnomalyStep(
            self._module,
            index,
            on_error=self._fail,
            on_caught=self._on_caught,
            catch=self._options.on_anomaly == "pause",
            check_nan=not self._identity.distributed,
        )
        self._anomaly.start()
        self.auto.covered(index)

    def finish(self, error: BaseException | None, index: int) -> bool:
        """Step ``index`` ends with ``error`` (None: none): the reports are sent; True
        when the error is the anomaly step's own and was dealt with (swallowed)."""
        if self._check is not None:
            self._finish_check()
        if self._anomaly is None:
            return False
        anomaly, self._anomaly = self._anomaly, None
        step = self._measurer.current
        scalars = dict(step.float_scalars) if step is not None else {}
        error = error if error is not None else anomaly.caught
        caught = backward_op(error) is not None
        pause = caught and self._options.on_anomaly == "pause"
        report = anomaly.finish(
            error,
            scalars=scalars,
            paused=pause,
            raise_on_anomaly=self._options.on_anomaly == "raise",
        )
        if caught:
            self._skip_update()  # partial sums of the failed backward must not leak on
        if pause:
            self._control.pause("the anomaly step found a non-finite gradient", index)
        report["state"] = self._control.state.as_dict()
        self._send(dict(report))
        return pause

    def _finish_check(self, *, send: bool = True) -> None:
        """The automatic check's step ended: everything off, its report sent. A failure
        switches the automatic check off, never the probe or the run."""
        check, self._check = self._check, None
        assert check is not None
        try:
            step = self._measurer.current
            report = check.finish(dict(step.float_scalars) if step is not None else {})
            report["state"] = self._control.state.as_dict()
            if send:
                self._send(dict(report))
        except Exception as exc:
            self.auto.switch_off(exc)

    def end(self) -> None:
        """Turn off an anomaly step that will not finish normally (close, failure)."""
        anomaly, self._anomaly = self._anomaly, None
        if anomaly is not None:
            anomaly.finish(None, scalars={}, paused=False, raise_on_anomaly=False)
        if self._check is not None:
            self._finish_check(send=False)
