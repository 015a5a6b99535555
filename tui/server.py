"""The monitor's listening socket (asyncio, no Textual): accept probes, decode frames.

Each connection must open with a ``hello`` frame. In token mode (any non-loopback TCP
address, and loopback when a token is set: ``probes.kernel.auth``) the monitor first
sends a ``challenge`` and reads nothing but the probe's ``answer`` until it has checked
it; a wrong or replayed answer gets a ``refuse``, a right one a ``welcome`` proving the
monitor holds the token too (the sequence: ``probes.kernel.wire``). A frame of another
protocol version gets a ``refuse`` frame and the connection is closed; a malformed
frame later on is counted and skipped, never a crash.

On taking a probe's hello the monitor sends a ``welcome`` naming what it reads beyond
plain JSON (``reads``: the packed float32 lists, ``probes.kernel.wire``); a probe packs
its step records' norms only once that has arrived, and one from before ignores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import socket
import stat
from typing import Protocol

from probes.kernel import auth
from probes.kernel.endings import CLOSED_BY_THE_RUN, CONNECTION_LOST
from probes.kernel.schema.spec import FrameKind
from probes.kernel.wire import (
    READS,
    Address,
    Frame,
    FrameError,
    FrameReader,
    VersionMismatch,
    default_socket_dir,
    encode_frame,
    make_frame,
    socket_folder_problem,
)

READ_CHUNK = 256 * 1024
# Connections waiting to be accepted: a job's ranks connect together (1,024 at once
# overflowed asyncio's default of 100, and each refused probe backs off for up to a
# second). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096
# Container allocations between the collector's youngest passes while the monitor
# runs. Each record allocates a few lists that live on (its per-layer values, kept in
# windows), and at the default of 700 the collections that walk them took a fifth of
# the monitor's time at 1,024 ranks; the state holds no cycles that need collecting
# sooner (``tests/bench/monitor_ingest.py``).
GC_THRESHOLD = 50_000
HANDSHAKE_TIMEOUT_S = 10.0  # a peer that connects and never answers is let go
WRONG_TOKEN = "wrong token: set the same TRAINTOP_TOKEN for the run and the monitor"


class ServerError(RuntimeError):
    """The monitor cannot listen where it was asked to (message fits on one line)."""


class Connection:
    """One connected probe, as the monitor sees it (``writer`` None: a recorded run)."""

    def __init__(self, conn_id: int, peer: str, writer: asyncio.StreamWriter | None) -> None:
        self.id = conn_id
        self.peer = peer
        self._writer = writer

    def send(self, frame: Frame) -> None:
        """Queue a frame to the probe (buffered by asyncio; never blocks the UI)."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode_frame(frame))

    def announce(self, frame: Frame) -> None:
        """Send a frame the probe may do without (the ``welcome`` after its hello): to
        the socket at once, and dropped if the probe has gone. A run may write its last
        frames and close before the monitor reads its hello (a short run, a job's start
        on a busy monitor): a write through asyncio's transport would then fail and
        close the connection, losing those frames still to be read."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        data = encode_frame(frame)
        sock = writer.get_extra_info("socket")
        if sock is not None and writer.transport.get_write_buffer_size() == 0:
            try:
                sent = os.write(sock.fileno(), data)  # (non-blocking, as asyncio's)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the probe has gone: read what it wrote, say nothing
                return
            data = data[sent:]
        if data:  # (the rest of a short write, after what asyncio still holds)
            writer.write(data)

    def refuse(self, reason: str) -> None:
        """Tell the probe why it is being turned away, then close."""
        with contextlib.suppress(OSError, FrameError):
            self.send(make_frame("refuse", reason=reason))
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()


class FrameSink(Protocol):
    """Where the server delivers what it receives (the monitor's state, a test, ...)."""

    def frame_received(self, conn: Connection, frame: Frame) -> None: ...

    def frame_rejected(self, conn: Connection, message: str) -> None: ...

    def connection_closed(self, conn: Connection, reason: str) -> None: ...


class MonitorServer:
    """Listen on ``address`` and feed every accepted probe's frames to ``sink``.

    Args:
        address: a Unix socket path or a TCP host and port (port 0 picks a free one).
        sink: receives frames, rejections and disconnections, on the event loop.
        token: the shared secret; required on a non-loopback TCP address, and used on
            any TCP address it is given for (``probes.kernel.auth.uses_token``).
    """

    def __init__(self, address: Address, sink: FrameSink, *, token: str | None = None) -> None:
        self.address = address
        self.sink = sink
        self.token = token
        self.connections: dict[int, Connection] = {}
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def uses_token(self) -> bool:
        """Whether each probe must pass the challenge-response before anything is read."""
        return auth.uses_token(self.address, self.token)

    @property
    def bound_address(self) -> Address:
        """The address actually listened on (with the real port when 0 was asked)."""
        if self._server is None or self.address.scheme == "unix":
            return self.address
        port = self._server.sockets[0].getsockname()[1]
        return Address("tcp", host=self.address.host, port=port)

    async def start(self) -> None:
        """Bind and listen. Raises ``ServerError`` with a one-line reason on failure."""
        if not self.address.is_loopback and not self.token:
            raise ServerError(
                f"listening on {self.address} (not loopback) needs a shared token: "
                "set TRAINTOP_TOKEN in both processes"
            )
        try:
            if self.address.scheme == "unix":
                self._server = await self._start_unix(self.address.path)
            else:
                self._server = await asyncio.start_server(
                    self._handle,
                    self.address.host,
                    self.address.port,
                    limit=READ_CHUNK,
                    backlog=LISTEN_BACKLOG,
                )
        except OSError as exc:
            raise ServerError(f"cannot listen on {self.address}: {exc.strerror or exc}") from None
        collect_less_often()

    async def close(self) -> None:
        """Stop listening and close every connection (the runs go on untouched)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        if self.address.scheme == "unix":
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)

    async def _start_unix(self, path: str) -> asyncio.Server:
        prepare_socket_path(path)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window for others
        try:
            server = await asyncio.start_unix_server(
                self._handle, path=path, limit=READ_CHUNK, backlog=LISTEN_BACKLOG
            )
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        return server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        peer = _peer_name(writer)
        conn = Connection(next(self._ids), peer, writer)
        reason = CONNECTION_LOST
        try:
            _, reason = await self._serve(conn, reader)
        except asyncio.CancelledError:
            reason = "monitor closed"
        except Exception as exc:  # a bug of ours: end this connection, not the monitor
            reason = f"monitor error: {type(exc).__name__}: {exc}"
        finally:
            # Greeted connections are registered; only they have a run to close.
            greeted = self.connections.pop(conn.id, None) is not None
            conn.close()
            if greeted:
                self.sink.connection_closed(conn, reason)
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, conn: Connection, reader: asyncio.StreamReader) -> tuple[bool, str]:
        frames = FrameReader()
        greeted = False
        if self.uses_token:
            try:
                problem = await asyncio.wait_for(
                    self._authenticate(conn, reader, frames), HANDSHAKE_TIMEOUT_S
                )
            except TimeoutError:
                problem = f"no answer to the challenge within {HANDSHAKE_TIMEOUT_S:g} s"
            except (ConnectionError, OSError) as exc:
                return False, f"{CONNECTION_LOST}: {exc}"
            if problem:
                self.sink.frame_rejected(conn, problem)
                conn.refuse(problem)
                return False, f"refused: {problem}"
        while True:
            try:
                data = await reader.read(READ_CHUNK)
            except (ConnectionError, OSError) as exc:
                return greeted, f"{CONNECTION_LOST}: {exc}"
            if not data:
                return greeted, CLOSED_BY_THE_RUN
            for item in frames.feed(data):
                if isinstance(item, VersionMismatch) or (
                    isinstance(item, FrameError) and not greeted
                ):
                    self.sink.frame_rejected(conn, str(item))
                    conn.refuse(str(item))
                    return greeted, f"refused: {item}"
                if isinstance(item, FrameError):
                    self.sink.frame_rejected(conn, str(item))
                    continue
                if not greeted:
                    problem = self._check_hello(item)
                    if problem:
                        self.sink.frame_rejected(conn, problem)
                        conn.refuse(problem)
                        return False, f"refused: {problem}"
                    greeted = True
                    self.connections[conn.id] = conn
                    conn.announce(make_frame("welcome", reads=list(READS)))
                self.sink.frame_received(conn, item)

    async def _authenticate(
        self, conn: Connection, reader: asyncio.StreamReader, frames: FrameReader
    ) -> str:
        """Challenge the probe and check its answer before anything else is read; on
        success prove this monitor holds the token too. Returns the problem, or ''."""
        if not self.token:  # loopback is in token mode only with one; start() saw to the rest
            return "this monitor has no token to check the answer with"
        challenge = auth.new_nonce()  # fresh per connection: an old answer is worthless
        conn.send(make_frame("challenge", nonce=challenge))
        try:
            line = await reader.readline()  # an answer is tiny: READ_CHUNK bounds it
        except ValueError:  # asyncio's line limit
            return "the answer to the challenge is too long"
        if not line:
            raise ConnectionError("closed before answering the challenge")
        items = frames.feed(line)
        answer = items[0] if items else FrameError("an empty line instead of an answer")
        if isinstance(answer, FrameError):
            return str(answer)
        if answer.get("kind") != FrameKind.ANSWER:
            return (
                f"this monitor authenticates with TRAINTOP_TOKEN and the run sent "
                f"{answer.get('kind')!r}, not an answer to its challenge: set the same token "
                "in the run (and upgrade traintop there if it is older)"
            )
        nonce = answer.get("nonce")
        if not auth.check_proof(self.token, "probe", challenge, nonce, answer.get("proof")):
            return WRONG_TOKEN
        mine = auth.proof(self.token, "monitor", str(nonce), challenge)
        conn.send(make_frame("welcome", proof=mine))
        return ""

    def _check_hello(self, frame: Frame) -> str:
        if frame.get("kind") != FrameKind.HELLO:
            return f"the first frame must be a hello, got {frame.get('kind')!r}"
        return ""


def collect_less_often() -> None:
    """Raise the collector's youngest threshold to ``GC_THRESHOLD`` (never lower it: a
    process that set its own keeps the larger)."""
    young, *older = gc.get_threshold()
    if young < GC_THRESHOLD:
        gc.set_threshold(GC_THRESHOLD, *older)


def prepare_socket_path(path: str) -> None:
    """Make the default socket's folder (0700) and clear a stale socket. Another folder
    must exist: none is made outside the private default one.

    Raises:
        ServerError: the folder is missing, belongs to someone else or is open to
            others, or a monitor is already listening there, or the path is not a socket.
    """
    folder = os.path.dirname(path) or "."
    problem = socket_folder_problem(path)
    if problem:
        raise ServerError(
            f"cannot listen on unix:{path}: {problem}; create it, or give no address "
            "for the private default socket"
        )
    if not os.path.isdir(folder):
        try:
            os.makedirs(folder, mode=0o700)
        except OSError as exc:
            raise ServerError(f"cannot create {folder}: {exc.strerror}") from None
    if os.path.abspath(folder) == os.path.abspath(default_socket_dir()):
        _check_private_folder(folder)
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise ServerError(f"{path} exists and is not a socket; remove it or pick another address")
    if _someone_listens(path):
        raise ServerError(
            f"another traintop monitor is already listening on unix:{path}; "
            "quit it, or set TRAINTOP_ADDRESS to listen elsewhere"
        )
    os.unlink(path)  # stale: left by a monitor that did not exit cleanly


def _check_private_folder(folder: str) -> None:
    info = os.stat(folder)
    if info.st_uid != os.getuid():
        raise ServerError(f"{folder} belongs to uid {info.st_uid}, not to you; refusing to use it")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)


def _someone_listens(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "local"
