"""The probe's sender: a daemon thread between the training loop and the monitor.

The training thread only appends to a bounded deque (``put``). The sender wakes on a
timer, turns finished measurements into records, keeps them in a bounded history,
and, when a monitor is connected, encodes the batch and sends it in one write. When
no monitor listens it retries with back-off; on connect it sends the hello and the
history, so a monitor started late still sees the run from step 0. When the queue is
full the oldest entries are dropped and counted, and the count travels in every step
frame. Commands from the monitor are read on the same connection and handed to a
callback. The sender's own CPU time on step records is the probe's cost too: it is
added to the ``probe_time`` of the records built next. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from probes.kernel import auth
from probes.kernel.merge import Peaks
from probes.kernel.replay import ReplayHistory
from probes.kernel.schema.spec import FLOAT32_FIELDS, FrameKind
from probes.kernel.thinning import Thinner
from probes.kernel.wire import (
    PACKED_FLOAT32,
    Address,
    Frame,
    FrameError,
    FrameReader,
    encode_frame,
    make_frame,
    pack_float32,
)
from probes.runtime.link.link import Refused, missing_token, open_connection, refusal
from probes.runtime.link.link import warn as warn  # where every probe module finds it

Record = dict[str, Any]

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
REFUSED_BACKOFF_S = 30.0


class PendingRecord(Protocol):
    """A step still being measured (e.g. a device-to-host copy in flight)."""

    step: int
    span: tuple[int, int] | None
    sampled: bool
    update_norms: list[Any] | None  # an update measured in this step (its ratios)
    optimizer_step: bool | None  # did optimizer.step() run (None: no optimizer watched)
    merged: dict[str, Any] | None  # the merged fields of the steps it stands for

    def ready(self) -> bool: ...

    def has_non_finite(self) -> bool: ...

    def merge_values(self) -> dict[str, Any]:
        """The fields a merged record is made of (``probes.kernel.merge``), by name;
        waits for the copy if needed."""
        ...

    def to_record(self) -> Record: ...


class PendingSteps:
    """Pending measurements as the thinning policy (``probes.kernel.thinning``) reads
    them: thinned before they become records, so a fast run costs the sender little."""

    def is_step(self, item: object) -> bool:
        return not isinstance(item, dict)

    def step(self, item: PendingRecord) -> int:
        return item.step

    def values(self, item: PendingRecord) -> Mapping[str, Any]:
        # A merged one: its merged fields (the peaks) stand for it, and its own values
        # (per-layer norms combined anew) are not needed.
        return item.merge_values() if item.merged is None else item.merged

    def non_finite(self, item: PendingRecord) -> bool:
        return item.has_non_finite()

    def keep(self, item: PendingRecord) -> bool:
        return bool(item.sampled or item.update_norms)

    def sampled(self, item: PendingRecord) -> bool:
        return item.sampled

    def skipped(self, item: PendingRecord) -> bool:
        return item.optimizer_step is False

    def stand_for(
        self, group: Sequence[PendingRecord], representative: int, peaks: Peaks
    ) -> PendingRecord:
        shown = group[representative]
        first = group[0].span[0] if group[0].span else group[0].step
        shown.span = (first, group[-1].step)
        shown.merged = peaks.fields()
        if peaks.updated:  # an accumulation loop's last step need not update
            shown.optimizer_step = True
        return shown


class Sender:
    """Send a run's records to the monitor from a daemon thread; never block training.

    Args:
        address: where the monitor listens (None: nowhere usable; the sender keeps the
            run's history and sends nothing).
        hello: the hello frame's fields (run id, name, layers, ...).
        queue_size: entries the training thread may queue before the oldest are dropped.
        flush_interval: seconds between sends (a tenth: live to a person, and a run of
            15 steps a second sends a few records a wake, not one: a fifth less of the
            sender's time a record, which the training shares).
        max_steps_per_s: step records kept per second at most; faster runs are thinned
            (``probes.kernel.thinning``), never losing the first non-finite step.
        history_capacity: step records kept for replay to a late monitor.
        on_command: called on the sender thread with each command frame received.
        connected: the event to set while a monitor is connected (made if None).
        hello_state: the run's control state now, sent in each hello (a monitor that
            connects to a paused run must know it is paused now, not from history).
        anchor_every: for a rank of a multi-rank job, the period of the sampled steps
            always sent on their own (every rank sends the same ones); 0 for none.
        token: the shared token (``TRAINTOP_TOKEN``); in token mode
            (``probes.kernel.auth.uses_token``) the handshake proves it both ways, and
            without it the sender never connects.
    """

    def __init__(
        self,
        address: Address | None,
        hello: Mapping[str, Any],
        *,
        queue_size: int = 8192,
        flush_interval: float = 0.1,
        max_steps_per_s: float = 60.0,
        history_capacity: int = 1024,
        on_command: Callable[[Frame], None] | None = None,
        connected: threading.Event | None = None,
        hello_state: Callable[[], Mapping[str, Any]] | None = None,
        anchor_every: int = 0,
        token: str | None = None,
    ) -> None:
        if address is not None and auth.uses_token(address, token) and not token:
            warn(missing_token(address))
            address = None
        self.address = address
        self._token = token
        self.run_id = str(hello["run"])
        self._hello = make_frame("hello", **hello)
        self._queue: deque[Record | PendingRecord] = deque(maxlen=queue_size)
        self._queue_size = queue_size
        self._flush_interval = flush_interval
        self._max_steps_per_s = max_steps_per_s
        self._history = ReplayHistory(history_capacity)
        self._thinner: Thinner[PendingRecord] = Thinner(PendingSteps(), anchor_every)
        self._on_command = on_command
        self._waiting: deque[Record | PendingRecord] = deque()  # popped, not ready yet
        self._outbox: list[Record] = []
        self._sock: socket.socket | None = None
        self._reader = FrameReader()
        # The monitor said it reads packed float32 lists (its ``welcome``): step frames
        # carry their norms packed from then on (``probes.kernel.wire``), per connection.
        self._packed = False
        self._seq = 0
        self._next_attempt = 0.0
        self._refused_until = 0.0  # until then, a refusal stands (closing does not retry)
        self._backoff = BACKOFF_MIN_S
        self._last_collect = time.monotonic()
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._bye_reason = "closed"
        self._hello_state = hello_state
        self.dropped = 0
        # The sender's CPU seconds on step records (thinning them, building, encoding and
        # sending them: ``time.thread_time`` on this thread), all of it so far, and what
        # is not yet counted in a record's ``probe_time`` (the next records built share it).
        self.cpu_seconds = 0.0
        self._cpu_owed = 0.0
        # Told (on this thread) each step whose numbers read non-finite: the probe's
        # automatic check of the next step (``probes.runtime.anomaly.auto_anomaly``).
        self.on_non_finite: Callable[[int], None] | None = None
        self.connected = connected or threading.Event()
        self._thread = threading.Thread(target=self._run, name="traintop-sender", daemon=True)
        self._thread.start()

    # --- training thread ------------------------------------------------------------

    def put(self, item: Record | PendingRecord) -> None:
        """Queue a record or a pending measurement; O(1), never blocks on the network.

        No lock on this path (it runs every step): the deque is bounded and drops its
        oldest entry itself when full; the count of drops may be one high if the
        sender takes an entry at that very moment, never low."""
        queue = self._queue
        if len(queue) >= self._queue_size:
            self.dropped += 1
        queue.append(item)

    def close(self, timeout: float = 5.0, reason: str = "closed") -> None:
        """Flush what is queued, say bye (with ``reason``), and stop the thread (at most
        ``timeout`` s)."""
        self._bye_reason = reason
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- sender thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stop.is_set()
                started = time.thread_time()
                built = self._collect(final=stopping)
                spent = time.thread_time() - started
                if self._sock is None and (stopping or time.monotonic() >= self._next_attempt):
                    self._connect()  # (once per connection: not a step's cost)
                sent = bool(self._sock is not None and self._outbox)
                if sent:
                    started = time.thread_time()
                    self._send_outbox()
                    spent += time.thread_time() - started
                if built or sent:  # (an idle wake-up is no step's cost)
                    self._count_cpu(spent)
                if stopping:
                    self._say_bye()
                    return
                self._wait()
        except Exception as exc:  # a bug here must never reach the training loop
            warn(f"sender stopped after an internal error: {exc!r}")
        finally:
            self._disconnect()

    def _count_cpu(self, seconds: float) -> None:
        """The sender spent ``seconds`` of CPU on step records: the probe's cost too."""
        self.cpu_seconds += seconds
        self._cpu_owed += seconds

    def _collect(self, *, final: bool) -> int:
        """Move what is ready from the queue into the history (and the outbox); the
        number of step records built from measurements.

        Step measurements beyond ``max_steps_per_s`` are thinned here, before they are
        turned into records, so a fast run costs the sender little per step; thinning
        keeps a non-finite step over its neighbours (see ``probes.kernel.thinning``).
        The sender's own CPU time on the records before (``_cpu_owed``) is added to the
        ``probe_time`` of the step records built now, shared alike: the probe's time is
        the training thread's and the sender's, which shares its GIL and its cores.
        """
        queue = self._queue
        while queue:  # popleft and append are atomic: no lock with the training thread
            self._waiting.append(queue.popleft())
        ready: list[Record | PendingRecord] = []
        while self._waiting:
            item = self._waiting[0]
            # A copy still in flight: wait for it, unless closing or far behind.
            if not isinstance(item, dict) and not (
                final or len(self._waiting) > 64 or item.ready()
            ):
                break
            ready.append(self._waiting.popleft())
        if self.on_non_finite is not None:
            self._tell_non_finite(ready)
        now = time.monotonic()
        budget = max(1, int(self._max_steps_per_s * max(now - self._last_collect, 1e-3)))
        self._last_collect = now
        kept = self._thinner.thin(ready, budget)  # the first step alone, as the first sent
        connected = self._sock is not None
        built = sum(1 for item in kept if not isinstance(item, dict))
        share = self._cpu_owed / built if built else 0.0
        if built:
            self._cpu_owed = 0.0
        for item in kept:
            if isinstance(item, dict):
                record = item
            else:
                record = item.to_record()
                record["probe_time"] = record.get("probe_time", 0.0) + share
            self._seq += 1
            record["seq"] = self._seq
            self._history.add(record)
            if connected:
                self._outbox.append(record)
        return built

    def _tell_non_finite(self, ready: list[Record | PendingRecord]) -> None:
        """Tell ``on_non_finite`` the steps whose delayed read shows a non-finite number
        (read here, on the sender's thread: never a sync on the training thread)."""
        try:
            for item in ready:
                if not isinstance(item, dict) and item.has_non_finite() and _alarming(item):
                    assert self.on_non_finite is not None
                    self.on_non_finite(item.step)
        except Exception as exc:  # the check is a help: never a reason to stop sending
            self.on_non_finite = None
            self._warn_once("non-finite", f"the non-finite check stopped: {exc!r}")

    def _connect(self) -> None:
        if self.address is None:
            self._next_attempt = math.inf  # unwatched: nothing to connect to, ever
            return
        if self._stop.is_set() and time.monotonic() < self._refused_until:
            return  # refused lately: closing need not wait on that monitor again
        sock = None
        try:
            sock, reader = open_connection(self.address, self._token)
            # History is marked as such: a monitor must not act on an old pause.
            history = [{**record, "replayed": True} for record in self._history.replay()]
            hello = self._hello
            if self._hello_state is not None:
                hello = {**hello, "state": self._hello_state()}
            first = [hello, *history]
            sock.sendall(b"".join(self._encode(r) for r in first))
        except Refused as exc:  # said once; tried again much later
            self._warn_once(f"refused:{exc}", str(exc))
            self._next_attempt = self._refused_until = time.monotonic() + REFUSED_BACKOFF_S
            return
        except OSError:
            if sock is not None:
                sock.close()
            self._next_attempt = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
            return
        self._sock = sock
        self._reader = reader
        self._backoff = BACKOFF_MIN_S
        self.connected.set()

    def _send_outbox(self) -> None:
        batch, self._outbox = self._outbox, []
        self._send(b"".join(self._encode(r) for r in batch))

    def _send(self, data: bytes) -> None:
        if self._sock is None or not data:
            return
        try:
            self._sock.sendall(data)
        except OSError:
            self._disconnect()

    def _encode(self, record: Record) -> bytes:
        frame = record if "v" in record else make_frame(record["kind"], **_without_kind(record))
        frame["run"] = self.run_id
        if frame["kind"] == FrameKind.STEP:
            if frame is record:  # (packed lists must not reach the history, kept to replay)
                frame = dict(record)
            frame["dropped"] = self.dropped
            for key in FLOAT32_FIELDS:
                values = frame.get(key)
                if values:
                    packed = pack_float32(values) if self._packed else None
                    frame[key] = [_wire_float(v) for v in values] if packed is None else packed
        try:
            data = encode_frame(frame)
        except FrameError as exc:
            self._warn_once("encode", f"a {frame['kind']} record was not sent: {exc}")
            return b""
        return data

    def _wait(self) -> None:
        sock = self._sock
        if sock is None:
            self._stop.wait(self._flush_interval)
            return
        deadline = time.monotonic() + self._flush_interval
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            readable, _, _ = select.select([sock], [], [], min(remaining, self._flush_interval))
            if readable and not self._read(sock):
                return

    def _read(self, sock: socket.socket) -> bool:
        """Read what the monitor sent; False when the connection is gone."""
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._disconnect()
            return False
        for item in self._reader.feed(data):
            if isinstance(item, FrameError):
                self._warn_once("bad-frame", f"ignored a bad frame from the monitor: {item}")
            elif item["kind"] == FrameKind.REFUSE:
                self._refused(refusal(self.address, item))
                return False
            elif item["kind"] == FrameKind.COMMAND and self._on_command is not None:
                self._on_command(item)
            elif item["kind"] == FrameKind.WELCOME:  # (a token's proof was read before the hello)
                reads = item.get("reads")
                self._packed = isinstance(reads, list) and PACKED_FLOAT32 in reads
        return True

    def _refused(self, message: str) -> None:
        self._warn_once(f"refused:{message}", message)
        self._disconnect()
        self._next_attempt = self._refused_until = time.monotonic() + REFUSED_BACKOFF_S

    def _say_bye(self) -> None:
        if self._sock is None:
            return
        self._send(self._encode(make_frame("bye", reason=self._bye_reason, pid=os.getpid())))

    def _disconnect(self) -> None:
        sock, self._sock = self._sock, None
        self._packed = False  # the next monitor says again what it reads
        self.connected.clear()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message)


def _alarming(item: PendingRecord) -> bool:
    """A non-finite step worth a check: not one whose update AMP's GradScaler skipped
    with a finite loss (it finds its scale so at the start of every run, by design)."""
    if item.optimizer_step is not False:
        return True
    scalars = item.merge_values().get("scalars") or {}
    return not all(math.isfinite(value) for value in scalars.values())


def _wire_float(value: object) -> object:
    """A step record's float32 values (the norms are computed in float32, the spec's
    ``FLOAT32_FIELDS``) with the 9 significant digits that carry a float32 exactly.
    Python's 17-digit floats made a record of 200 layers cost the monitor 100 us to
    parse; 9 digits, 40."""
    return float(f"{value:.9g}") if type(value) is float else value


def _without_kind(record: Record) -> Record:
    return {k: v for k, v in record.items() if k != "kind"}
