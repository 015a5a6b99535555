"""Filing what ``probe.log`` is given: one-element tensors (not read: they travel with the
step's batched copy), plain numbers, and a warning, once per name, for anything else."""

from __future__ import annotations

import torch

from probes.runtime.link.sender import warn

Scalar = float | int | torch.Tensor


class ScalarFiler:
    """Files logged scalars into a record's tensors and floats (a step's or an eval's)."""

    def __init__(self) -> None:
        self._bad_names: set[str] = set()  # names warned about once

    def file(
        self,
        tensors: dict[str, torch.Tensor],
        floats: dict[str, float],
        scalars: dict[str, Scalar],
    ) -> None:
        """File each scalar; a value that is not one number is dropped with one warning
        per name (a mistake in what is logged must not stop the measuring)."""
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                # kept off the graph; one that records none already (a framework's
                # loss, detached) is kept as it is: no new tensor on every step
                tensors[name] = value.detach() if value.requires_grad else value
            elif isinstance(value, int | float) and not isinstance(value, bool):
                floats[name] = float(value)
            elif name not in self._bad_names:
                self._bad_names.add(name)
                shape = (
                    f"a tensor of shape {tuple(value.shape)}"
                    if isinstance(value, torch.Tensor)
                    else type(value).__name__
                )
                warn(
                    f"log({name}=...) takes a float or a one-element tensor, got {shape}; "
                    "that value is not recorded"
                )
