"""The scenario names and their one-line descriptions (no torch: the monitor lists them)."""

from __future__ import annotations

SCENARIOS: dict[str, str] = {
    "healthy": "a small MLP learns a synthetic task; train and validation loss fall together",
    "exploding": "learning rate far too high: per-layer gradient norms climb until non-finite",
    "nan-forward": "-log(1 - sigmoid(z)) hits log(0) once the score saturates: an inf is born "
                   "in a named module's forward",
    "nan-backward": "a hand-written norm, sqrt(sum(h**2)), at h = 0: finite forward, NaN "
                    "gradient (PowBackward0)",
}


def describe(name: str) -> str:
    """The one-line description of a scenario; KeyError names the known ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        known = ", ".join(SCENARIOS)
        raise KeyError(f"unknown scenario {name!r}; known: {known}") from None


def listing() -> str:
    """One line per scenario, for ``--list``."""
    width = max(len(name) for name in SCENARIOS)
    return "\n".join(f"{name:<{width}}  {text}" for name, text in SCENARIOS.items())
