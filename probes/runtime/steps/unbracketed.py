"""Updates the probe cannot see: ``optimizer.step()`` runs, but no step was ever begun.

A probe measures what happens inside ``with probe.step():`` (or between a framework
callback's ``begin_step`` and ``end_step``). A loop that forgets the bracket trains
normally while the monitor shows a connected run stuck before step 0; this says so once,
with the fix, instead of leaving a silent empty screen. Updates before the loop can be
deliberate (an LR range test, warm-up steps left unmeasured): the monitor clears the
alert when the first measured step arrives.

By default such a loop is measured anyway, its steps inferred (``probes.runtime.steps.autostep``,
``infer_steps``): this alert is then never needed. It stays for ``infer_steps=False``;
``UNBRACKETED_UPDATES`` is also how many inferred steps are held back before they are
sent (a warm-up before a bracketed loop is dropped, as here it goes unnamed).
"""

from __future__ import annotations

from probes.kernel.diagnosis import Alert
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity

# A few updates before saying so: one warm-up step before the loop is not a mistake.
UNBRACKETED_UPDATES = 3


def unbracketed_alert(updates: int) -> Alert:
    """The alert for ``updates`` optimizer steps seen before any probe step."""
    return Alert(
        AlertKind.STEPS_NOT_MEASURED,
        Severity.WARNING,
        0,
        "",
        {"optimizer_steps": updates, "probe_steps": 0},
        (
            f"optimizer.step() ran {updates} times but no probe step has begun, so nothing is "
            "measured yet: the probe reads a step only inside `with probe.step():`."
        ),
        (
            "Wrap each training step (forward, backward, optimizer.step) in `with probe.step():`.",
            "With the Hugging Face Trainer or Lightning, add traintop's callback instead.",
            "Updates before the loop on purpose (an LR range test, a warm-up)? Nothing to "
            "do: this clears at the first probe step.",
        ),
    )
