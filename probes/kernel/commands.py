"""The commands a monitor sends a probe: one closed vocabulary for both processes.

A command frame carries the command's value (``"pause"``, ...) as a plain string, as it
always has; the monitor builds it from a ``Command`` and the probe's control
(``probes.runtime.link.control``) reads it back into one, refusing what is not a member.
Each member also carries how the screen offers it: the key that sends it and the label
of that key.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class Command(StrEnum):
    """A command from the monitor, applied by the probe at a step boundary.

    Arguments travel in the frame's ``args``: ``anomaly`` takes ``count`` and
    ``step_now``, ``guard`` takes ``on``, ``lr_scale`` takes ``factor``; any command
    for the ranks of a job takes ``at_step``.
    """

    key: str
    label: str

    def __new__(cls, value: str, key: str, label: str) -> Command:
        member = str.__new__(cls, value)
        member._value_ = value
        member.key = key
        member.label = label
        return member

    PAUSE = ("pause", "p", "Pause/resume")
    RESUME = ("resume", "p", "Pause/resume")
    STEP = ("step", "n", "Step")
    ANOMALY = ("anomaly", "a", "Anomaly step")
    GUARD = ("guard", "g", "Guard")
    LR_SCALE = ("lr_scale", "minus / plus", "LR x0.5 / LR x2")

    def __str__(self) -> str:  # the wire's spelling, wherever it is formatted
        return str(self.value)

    @classmethod
    def parse(cls, text: str) -> Command | None:
        """The command ``text`` names, or None when it names none."""
        return _BY_VALUE.get(text)


_BY_VALUE: dict[str, Command] = {command.value: command for command in Command}
