"""What the records' fields mean, where both sides must agree (stdlib only).

The probe writes records and the monitor (its state, its diagnosis, headless mode) reads
them; a choice such as "which eval scalar is the validation loss" is made here once.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Names that are the validation loss, whatever else an eval record holds.
VALIDATION_LOSS_NAMES = ("val_loss", "eval_loss", "valid_loss", "validation_loss")


def validation_loss_name(names: object) -> str | None:
    """The name of the validation loss among an eval record's scalar names.

    An exact name first (``val_loss``, ``eval_loss``, ``valid_loss``,
    ``validation_loss``); else the one name ending in ``loss`` that is not a training
    loss (``train_loss``, ``train/loss``); None when there is none, or several and no
    exact one (a guess between them could show the wrong curve).

    Example::

        >>> validation_loss_name(["loss", "val_loss"])
        'val_loss'
        >>> validation_loss_name(["eval_accuracy", "eval_ce_loss"])
        'eval_ce_loss'
    """
    names = [str(name) for name in names]  # type: ignore[attr-defined]
    for exact in VALIDATION_LOSS_NAMES:
        if exact in names:
            return exact
    candidates = [n for n in names if n.endswith("loss") and not _is_training_name(n)]
    return candidates[0] if len(candidates) == 1 else None


def validation_loss(scalars: Mapping[str, float]) -> float | None:
    """The validation loss of an eval record's scalars (see ``validation_loss_name``)."""
    name = validation_loss_name(scalars)
    return None if name is None else scalars[name]


def _is_training_name(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("train", "tr_")) or "/train" in lowered


#: The suffix of an activation entry that counts a layer's input (``fc2(input)``): the
#: exact zeros reaching that layer, wherever the ReLU before it was written.
INPUT_SUFFIX = "(input)"
