"""The ``with probe.step():`` block, and a closure put in an optimizer step's arguments
(both for ``probes.runtime.steps.step``)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol


class Boundary(Protocol):
    """What a ``StepScope`` calls (``probes.runtime.steps.step.StepBoundary``, which imports
    this module: a protocol keeps the two out of an import circle)."""

    def begin_step(self, index: int | None = None) -> None: ...

    def end_step(self, error: BaseException | None = None) -> bool: ...


def with_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], closure: Callable[[], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The optimizer step's (args, kwargs) with ``closure`` in place of the caller's."""
    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs


class StepScope:
    """The ``with probe.step():`` block; a class rather than a generator, for speed."""

    __slots__ = ("_boundary", "_index", "_probe")

    def __init__(self, boundary: Boundary, probe: object, index: int | None) -> None:
        self._boundary = boundary
        self._probe = probe
        self._index = index

    def __enter__(self) -> Any:  # the probe
        self._boundary.begin_step(self._index)
        return self._probe

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._boundary.end_step(exc)
