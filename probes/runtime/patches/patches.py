"""The one owner of every process-global thing traintop changes.

A probe needs to see what happens outside the objects it was given: ``backward()``
(the loss of an inferred step), the clip (the unclipped norms), the GradScaler (gradients
still scaled), the loss and dropout functions of ``torch.nn.functional`` (evaluations),
``warnings.showwarning`` (torch's own warnings), the optimizers' and modules' global
hooks, ``Optimizer.__init__`` and the Trainers (``traintop run``). Each of those is a
:class:`Seam` declared once in this module, and every part of traintop that needs one
adds a :class:`Layer` to it through :data:`REGISTRY`:

- **installed once, chained in a fixed order.** The first layer on a seam installs one
  stand-in (an attribute replaced, or one of torch's global hooks registered); every
  layer added later joins the chain the stand-in calls, ordered by ``Layer.order``
  (lower runs first, outermost), whatever order the probes opened in. The chain is
  composed when it changes, not on each call.
- **refcounted, restored in reverse.** Removing the last layer of a seam puts torch's
  (or the framework's) own object back: the very object that was there before, so
  ``torch.autograd.backward is <torch's>`` holds again. A class attribute that was
  inherited is deleted rather than set, so the base class's shows through as before.
  If someone replaced the stand-in after us (a library's own patch), theirs is left in
  place and ours stays beneath it as a pass-through: restoring would undo their patch.
- **listed.** :meth:`PatchRegistry.patched` says what is patched now and by whom, so a
  test can prove that everything is restored after the last probe closes.

Every layer runs inside the user's call: the layers are written never to raise (a
failure inside the probe switches that probe off; ``probes.runtime.steps.autostep``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Member = TypeVar("Member")


@dataclass(frozen=True, eq=False)
class Layer:
    """One part's piece of a seam's chain.

    For an attribute seam, ``around(proceed, *args, **kwargs)`` stands for the original
    call and decides when (or whether) to call ``proceed``. For a hook seam, ``around``
    is the hook itself, called with the hook's arguments; the first non-None result
    is the hook's.

    Args:
        name: who adds it (for the listing): ``"autostep"``, ``"clip"``, ...
        around: the layer's function.
        order: lower is outer (runs first).
    """

    name: str
    around: Callable[..., Any]
    order: int = 50


class Seam:
    """A process-global attribute traintop may replace: ``owner.attribute``.

    ``owner`` is a module or a class, given as a function so that importing this module
    imports nothing (the frameworks' modules are imported when their seams are used).
    """

    def __init__(self, name: str, owner: Callable[[], Any], attribute: str) -> None:
        self.name = name
        self._owner = owner
        self.attribute = attribute
        self._layers: list[Layer] = []
        self._original: Any = None
        self._owned = False  # the attribute was in the owner's own namespace
        self._stand_in: Callable[..., Any] | None = None
        self._call: Callable[..., Any] | None = None
        self._made: tuple[Any, Callable[..., Any]] | None = None  # (original, stand-in)

    @property
    def owner(self) -> Any:
        """The module or class that holds the attribute."""
        return self._owner()

    @property
    def original(self) -> Any:
        """What was there before the stand-in (the current object when none is)."""
        return self._original if self._stand_in is not None else self.current

    @property
    def current(self) -> Any:
        """What ``owner.attribute`` is now."""
        return getattr(self.owner, self.attribute)

    @property
    def layers(self) -> tuple[Layer, ...]:
        return tuple(self._layers)

    def _add(self, layer: Layer) -> None:
        if not self._layers:
            self._install()
        self._layers.append(layer)
        self._layers.sort(key=lambda each: each.order)  # stable: equal orders keep theirs
        self._compose()

    def _remove(self, layer: Layer) -> None:
        if layer not in self._layers:
            return
        self._layers.remove(layer)
        self._compose()
        if not self._layers:
            self._restore()

    def _install(self) -> None:
        if self._stand_in is not None:
            return  # left beneath someone's patch last time: it still calls ours
        owner = self.owner
        original = getattr(owner, self.attribute)
        self._original = original
        self._owned = not isinstance(owner, type) or self.attribute in vars(owner)
        # The same stand-in each time for the same original: code compiled while it
        # stood (dynamo guards on the function's identity) is not compiled again.
        made = self._made
        if made is None or made[0] is not original:
            made = self._made = (original, self._make_stand_in(original))
        self._stand_in = made[1]
        setattr(owner, self.attribute, made[1])

    def _make_stand_in(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def stand_in(*args: Any, **kwargs: Any) -> Any:
            call = self._call
            if call is None:  # (a caller that kept the stand-in after it was restored)
                return original(*args, **kwargs)
            return call(*args, **kwargs)

        return stand_in

    def _compose(self) -> None:
        call: Callable[..., Any] = self._original
        for layer in reversed(self._layers):
            call = functools.partial(layer.around, call)
        self._call = call if self._layers else None

    def _restore(self) -> None:
        owner = self.owner
        if getattr(owner, self.attribute, None) is not self._stand_in:
            return  # replaced after us: theirs stays, ours passes through beneath it
        if self._owned:
            setattr(owner, self.attribute, self._original)
        else:
            delattr(owner, self.attribute)  # the base class's shows through again
        self._stand_in = None
        self._original = None

    @property
    def installed(self) -> bool:
        """Is the stand-in in place (layered or left beneath another patch)?"""
        return self._stand_in is not None


class HookSeam:
    """One of torch's global hooks: ``register(hook)`` returns a removable handle."""

    def __init__(self, name: str, register: Callable[[Callable[..., Any]], Any]) -> None:
        self.name = name
        self._register = register
        self._layers: list[Layer] = []
        self._handle: Any = None
        self._hooks: tuple[Callable[..., Any], ...] = ()

    @property
    def layers(self) -> tuple[Layer, ...]:
        return tuple(self._layers)

    @property
    def installed(self) -> bool:
        return self._handle is not None

    def _add(self, layer: Layer) -> None:
        self._layers.append(layer)
        self._layers.sort(key=lambda each: each.order)
        self._hooks = tuple(each.around for each in self._layers)
        if self._handle is None:
            self._handle = self._register(self._dispatch)

    def _remove(self, layer: Layer) -> None:
        if layer not in self._layers:
            return
        self._layers.remove(layer)
        self._hooks = tuple(each.around for each in self._layers)
        if not self._layers and self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _dispatch(self, *args: Any) -> Any:
        found = None
        for hook in self._hooks:
            result = hook(*args)
            if found is None:
                found = result
        return found


AnySeam = Seam | HookSeam


@dataclass
class PatchRegistry:
    """Adds and removes layers on seams, under one lock; lists what is patched."""

    _lock: threading.RLock = field(default_factory=threading.RLock)
    _seams: dict[str, AnySeam] = field(default_factory=dict)
    #: How many holders each (seam, layer) has: one layer shared by every open probe
    #: (the clip's, ``torch.compile``'s) is added by each and goes with the last.
    _holders: dict[tuple[str, Layer], int] = field(default_factory=dict)

    def add(self, seam: AnySeam, layer: Layer) -> Layer:
        """Add ``layer`` to ``seam`` (installing the seam's stand-in if it is the first),
        or count one more holder of it; returns the layer, the key to ``remove`` it."""
        with self._lock:
            self._seams[seam.name] = seam
            key = (seam.name, layer)
            self._holders[key] = self._holders.get(key, 0) + 1
            if self._holders[key] == 1:
                seam._add(layer)
        return layer

    def remove(self, seam: AnySeam, layer: Layer) -> None:
        """Undo one ``add`` (a layer not held: nothing); its last holder takes it off, and
        the seam's last layer restores the original."""
        with self._lock:
            key = (seam.name, layer)
            held = self._holders.get(key, 0)
            if held > 1:
                self._holders[key] = held - 1
            elif held == 1:
                del self._holders[key]
                seam._remove(layer)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """torch's own objects in place of every stand-in for the block, the stand-ins
        back after: for code that compiles a function from its source and globals
        (TorchScript reads ``F.dropout``'s stand-in as ``F.dropout``'s source with the
        stand-in's globals, and fails). Other threads meanwhile call torch's own."""
        with self._lock:
            swapped = [
                seam
                for seam in self._seams.values()
                if isinstance(seam, Seam)
                and seam._stand_in is not None
                and getattr(seam.owner, seam.attribute, None) is seam._stand_in
            ]
            for seam in swapped:
                setattr(seam.owner, seam.attribute, seam._original)
            try:
                yield
            finally:
                for seam in swapped:
                    if getattr(seam.owner, seam.attribute, None) is seam._original:
                        setattr(seam.owner, seam.attribute, seam._stand_in)

    def patched(self) -> dict[str, list[str]]:
        """Each seam patched now, with the names of its layers, outermost first (a seam
        left beneath someone else's patch shows with no layers)."""
        with self._lock:
            return {
                name: [layer.name for layer in seam.layers]
                for name, seam in self._seams.items()
                if seam.installed
            }


#: The process's one registry.
REGISTRY = PatchRegistry()


def patched() -> dict[str, list[str]]:
    """What traintop has patched in this process now, and by which of its parts.

    Returns:
        Each global's name (``"torch.autograd.backward"``, ...) with the names of the
        layers on it, outermost first; empty once every probe has closed (under
        ``traintop run``, the layers it holds for the process stay).

    Example::

        >>> probes.patched()
        {}
    """
    return REGISTRY.patched()


class Held:
    """Layers one owner holds on several seams, added together and removed together
    (in reverse) with ``release``; releasing twice is a no-op."""

    def __init__(self, registry: PatchRegistry = REGISTRY) -> None:
        self._registry = registry
        self._held: list[tuple[AnySeam, Layer]] = []

    def hold(self, seam: AnySeam, layer: Layer) -> Layer:
        """Add ``layer`` to ``seam`` and keep it until ``release``."""
        self._registry.add(seam, layer)
        self._held.append((seam, layer))
        return layer

    def release(self) -> None:
        """Remove every layer held, the last added first."""
        held, self._held = self._held, []
        for seam, layer in reversed(held):
            self._registry.remove(seam, layer)

    def __bool__(self) -> bool:
        return bool(self._held)


class Shared(Generic[Member]):
    """Layers on seams kept while any member listens: each layer's code reads
    ``members`` (who hears the call), added when the first member joins and removed,
    in reverse, when the last leaves. One for each process-wide listener (the
    evaluations' dropout count, torch's warnings, the live loss contract): the probes
    that open and close share it, across threads.

    Args:
        layers: the (seam, layer) pairs to hold, made when the first member joins (a
            seam may exist only once torch has loaded it).
    """

    def __init__(self, layers: Callable[[], list[tuple[AnySeam, Layer]]]) -> None:
        self._layers = layers
        self._lock = threading.Lock()
        self._held = Held()
        #: who listens now, in the order they joined (a tuple: read without the lock)
        self.members: tuple[Member, ...] = ()

    def join(self, member: Member) -> None:
        with self._lock:
            self.members = (*self.members, member)
            if len(self.members) == 1:
                for seam, layer in self._layers():
                    self._held.hold(seam, layer)

    def leave(self, member: Member) -> None:
        """``member`` stops listening (one that does not: nothing)."""
        with self._lock:
            if member not in self.members:
                return
            self.members = tuple(each for each in self.members if each is not member)
            if not self.members:
                self._held.release()
