"""The records both sides must agree on (stdlib only: the probe writes them, the monitor
reads them; both import this).

- ``spec``: every field of every frame, declared once (type, shape, how it merges when
  steps are thinned); the checks, the views and the thinning merge are derived from it;
- ``records``: typed definitions of each kind of frame (hello, step, eval, anomaly
  report, ack, the control state), and what their fields mean where a choice must be
  made once (which eval scalar is the validation loss);
- ``checks``: the field checks the monitor runs before a frame reaches its state;
- ``views``: the one parser of records (``StepView``, ``EvalView``, ``RunInfo``), used by
  the monitor's state and by the diagnosis alike.
"""

from probes.kernel.schema.checks import check_frame
from probes.kernel.schema.records import (
    INPUT_SUFFIX,
    VALIDATION_LOSS_NAMES,
    AckRecord,
    AnomalyReport,
    ControlStateFields,
    EvalRecord,
    HelloRecord,
    StepRecord,
    validation_loss,
    validation_loss_name,
)
from probes.kernel.schema.views import EvalView, RunInfo, StepView, as_number

__all__ = [
    "INPUT_SUFFIX",
    "VALIDATION_LOSS_NAMES",
    "AckRecord",
    "AnomalyReport",
    "ControlStateFields",
    "EvalRecord",
    "EvalView",
    "HelloRecord",
    "RunInfo",
    "StepRecord",
    "StepView",
    "as_number",
    "check_frame",
    "validation_loss",
    "validation_loss_name",
]
