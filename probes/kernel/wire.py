"""The traintop wire protocol, version 1 (stdlib only: both sides import it).

Frames are JSON objects, one per line (NDJSON). NaN and Infinity are allowed, since
both ends are Python and a non-finite loss is exactly what a debugger must carry.
Every frame has ``v`` (the protocol version) and ``kind``. A frame is at most
``MAX_FRAME_BYTES`` long, newline included; a longer or undecodable one is rejected
with a ``FrameError`` whose message fits on one line.

The same frames, one per line in a file, are the run log (``traintop --record``).

The packed form. A step's float32 lists (``FLOAT32_FIELDS``: its per-layer norms) may
travel as one JSON string each: the base64 of their little-endian float32 bytes, a
quarter of the bytes of their decimals and a sixth of the time to read (a list holding
a None, or a finite value beyond float32, stays a list). ``decode_frame`` reads either
form into the same list of floats, NaN and Inf as they were. A probe packs only for a
monitor that said it reads it: on taking a probe's hello the monitor sends a
``welcome`` frame with ``reads`` naming ``PACKED_FLOAT32`` (a probe from before ignores
it, as it ignores every frame but commands and refusals), and the probe sends plain
lists until that has arrived; a monitor from before never says it, so it is never sent
one. A run log holds what the monitor decoded: plain lists.

Addresses: a per-user Unix socket by default, or ``tcp://HOST:PORT``; the
``TRAINTOP_ADDRESS`` environment variable overrides the default in both processes.

The handshake. Without a token (a Unix socket, or loopback with no ``TRAINTOP_TOKEN``)
the probe's first frame is its ``hello``: no round trip. In token mode
(``probes.kernel.auth.uses_token``) the monitor speaks first and neither end reads a
record before the other has proven it holds the token, which never travels:

    monitor -> probe    challenge {nonce: M}
    probe   -> monitor  answer    {nonce: P, proof: HMAC(token, "probe", M, P)}
    monitor -> probe    welcome   {proof: HMAC(token, "monitor", P, M)}   (or refuse)
    probe   -> monitor  hello, history, ...   then signed commands as ever

These three kinds were added to version 1 (no record changed, so run logs stay
readable): a peer from before them fails closed, with a line that names the fix.
"""

from __future__ import annotations

import binascii
import json
import math
import os
import re
import sys
import tempfile
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, Literal

# Its home is probes.kernel.auth; importable from here too, where it always was.
from probes.kernel.auth import command_signature as command_signature
from probes.kernel.schema.floats import Float32List
from probes.kernel.schema.spec import FLOAT32_FIELDS, FrameKind

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 4 * 1024 * 1024
ADDRESS_ENV = "TRAINTOP_ADDRESS"
TOKEN_ENV = "TRAINTOP_TOKEN"

#: Frames a probe sends to the monitor.
PROBE_KINDS = frozenset(
    {
        FrameKind.HELLO,
        FrameKind.STEP,
        FrameKind.EVAL,
        FrameKind.EVENT,
        FrameKind.ANOMALY,
        FrameKind.ALERT,
        FrameKind.ACK,
        FrameKind.BYE,
        FrameKind.ANSWER,
    }
)
#: Frames a monitor sends to a probe.
MONITOR_KINDS = frozenset(
    {FrameKind.COMMAND, FrameKind.REFUSE, FrameKind.CHALLENGE, FrameKind.WELCOME}
)
KINDS = PROBE_KINDS | MONITOR_KINDS
#: A monitor's ``welcome`` names this in ``reads`` when it reads packed float32 lists.
PACKED_FLOAT32 = "float32-base64"
#: What this side's ``decode_frame`` reads beyond plain JSON (a monitor's ``reads``).
READS = (PACKED_FLOAT32,)

Frame = dict[str, Any]


class FrameError(ValueError):
    """A frame that cannot be accepted: too large, not JSON, or not a traintop frame."""


class VersionMismatch(FrameError):
    """A frame of a protocol version this side does not speak."""

    def __init__(self, version: object) -> None:
        super().__init__(
            f"protocol version {version!r} is not supported "
            f"(this side speaks version {PROTOCOL_VERSION}); upgrade the older of the two"
        )
        self.version = version


def make_frame(kind: str, **fields: Any) -> Frame:
    """Return a frame of ``kind`` with the protocol version set."""
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    return {"v": PROTOCOL_VERSION, "kind": kind, **fields}


def encode_frame(frame: Mapping[str, Any]) -> bytes:
    """Encode one frame as a line of UTF-8 JSON, newline included.

    Raises:
        FrameError: the frame is larger than ``MAX_FRAME_BYTES`` or holds a value
            JSON cannot carry.
    """
    try:
        text = json.dumps(frame, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise FrameError(f"frame cannot be encoded: {exc}") from None
    data = text.encode() + b"\n"
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return data


def decode_frame(line: bytes | str) -> Frame:
    """Decode one line into a frame and check its version and kind.

    Raises:
        VersionMismatch: the frame's ``v`` is not ``PROTOCOL_VERSION``.
        FrameError: anything else that makes the line unacceptable.
    """
    size = len(line)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    try:
        frame = _loads(line)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, huge integers
        raise FrameError(f"malformed frame: {exc}") from None
    if not isinstance(frame, dict):
        raise FrameError(f"malformed frame: expected a JSON object, got {type(frame).__name__}")
    if "v" not in frame:
        raise FrameError("malformed frame: no protocol version field 'v'")
    if frame["v"] != PROTOCOL_VERSION:
        raise VersionMismatch(frame["v"])
    kind = frame.get("kind")
    if kind not in KINDS:
        raise FrameError(f"malformed frame: unknown kind {kind!r}")
    if kind == FrameKind.STEP:
        for name in FLOAT32_FIELDS:
            value = frame.get(name)
            if type(value) is str:
                frame[name] = unpack_float32(name, value)
    return frame


# --- the packed form of float32 lists --------------------------------------------------

FLOAT32_MAX = 3.4028234663852886e38
_SWAP = sys.byteorder != "little"  # the packed bytes are little-endian


def pack_float32(values: list[Any]) -> str | None:
    """``values`` as the packed form (base64 of little-endian float32), or None when it
    cannot carry them exactly: a None, a value that is not a float, or a finite one
    beyond float32's range (it would read back as Inf: a false non-finite). NaN and Inf
    are carried as they are."""
    if not values or any(type(v) is not float for v in values):
        return None
    packed = array("f", values)
    if not math.isfinite(sum(packed)) and any(
        math.isfinite(v) and abs(v) > FLOAT32_MAX for v in values
    ):
        return None
    if _SWAP:
        packed.byteswap()
    return binascii.b2a_base64(packed.tobytes(), newline=False).decode("ascii")


def unpack_float32(name: str, text: str) -> Float32List:
    """A packed list read back (``pack_float32``), as a list that says it holds floats
    only (``Float32List``); ``name``: its field, for the error.

    Raises:
        FrameError: ``text`` is not base64 of a whole number of float32 values.
    """
    # a2b_base64 skips characters outside the alphabet: a length that is not the one
    # the text's own length implies shows them (strict_mode is Python 3.11 only).
    size = len(text)
    try:
        data = binascii.a2b_base64(text)
    except (binascii.Error, ValueError) as exc:  # (ValueError: a non-ASCII character)
        raise FrameError(f"malformed frame: {name} is not packed float32: {exc}") from None
    expected = size // 4 * 3 - text[-2:].count("=") if size % 4 == 0 else -1
    if len(data) != expected or len(data) % 4:
        raise FrameError(
            f"malformed frame: {name} is not packed float32 "
            f"({size} characters of base64, {len(data)} bytes: not whole float32 values)"
        )
    values = array("f")
    values.frombytes(data)
    if _SWAP:
        values.byteswap()
    return Float32List.of(values)


# The C scanner of a default decoder: NaN and Infinity allowed, as ``json.loads``.
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(line: bytes | str) -> Any:
    """``json.loads`` of a frame's line: a UTF-8 line that is one JSON value and nothing
    else is scanned at once (skipping ``loads``' encoding guess and its two whitespace
    matches, a few microseconds of each of thousands of records a second); any other
    goes through ``json.loads``, for its answer and its error."""
    text = line.decode() if isinstance(line, bytes) else line
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:  # (leading whitespace, or not JSON: loads says which)
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


class FrameReader:
    """Split a byte stream into frames, surviving oversized and malformed lines.

    ``feed`` returns, in order, a decoded frame or a ``FrameError`` for each complete
    line. A line longer than the limit is skipped up to its newline and reported once,
    so the stream stays in step instead of decoding the tail of a giant line.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self._skipping = False  # inside an oversized line, waiting for its newline

    def feed(self, data: bytes) -> list[Frame | FrameError]:
        """Consume ``data``; return the frames (or errors) of every complete line."""
        out: list[Frame | FrameError] = []
        buffer = self._buffer
        buffer += data
        start = 0  # lines are cut by position; the buffer is trimmed once, at the end
        while True:
            newline = buffer.find(b"\n", start)
            if newline < 0:
                del buffer[:start]
                if not self._skipping and len(buffer) > self._max:
                    out.append(self._oversized())
                    self._skipping = True
                if self._skipping:
                    buffer.clear()
                return out
            line = bytes(buffer[start:newline])
            start = newline + 1
            if self._skipping:
                self._skipping = False
                continue
            if len(line) + 1 > self._max:
                out.append(self._oversized())
                continue
            if not line or line.isspace():  # (no stripped copy of every line)
                continue
            try:
                out.append(decode_frame(line))
            except FrameError as exc:
                out.append(exc)

    @property
    def pending_bytes(self) -> int:
        """Bytes held of an incomplete line."""
        return len(self._buffer)

    def _oversized(self) -> FrameError:
        return FrameError(f"frame exceeds the limit of {self._max} bytes; skipped")


# --- addresses -------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    """Where a monitor listens: a Unix socket path, or a TCP host and port."""

    scheme: Literal["unix", "tcp"]
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """True for Unix sockets and loopback TCP hosts (no token needed)."""
        if self.scheme == "unix":
            return True
        if self.host == "localhost":
            return True
        try:
            return ip_address(self.host).is_loopback
        except ValueError:
            return False


_HOST_PORT = re.compile(r"\[?[\w.:-]*\]?:\d+")


def parse_address(text: str) -> Address:
    """Parse ``unix:/path``, a bare ``/path``, or ``tcp://HOST:PORT``. A bare
    ``HOST:PORT`` is refused rather than read as a socket file's name.

    Raises:
        ValueError: the text is none of those forms.
    """
    text = text.strip()
    if text.startswith("tcp://"):
        rest = text[len("tcp://") :]
        host, sep, port_text = rest.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            raise ValueError(f"bad TCP address {text!r}: expected tcp://HOST:PORT")
        return Address("tcp", host=host, port=int(port_text))
    if text.startswith("unix:"):
        text = text[len("unix:") :]
    elif _HOST_PORT.fullmatch(text):
        # "127.0.0.1:7007" would otherwise name a socket file in the working folder
        raise ValueError(
            f"ambiguous address {text!r}: write tcp://{text} for TCP, "
            f"or unix:{text} for a socket file"
        )
    if not text:
        raise ValueError("empty address")
    if "://" in text:
        raise ValueError(f"unsupported address {text!r}: use unix:/path or tcp://HOST:PORT")
    return Address("unix", path=os.path.abspath(os.path.expanduser(text)))


def socket_folder_problem(path: str) -> str:
    """Why no monitor can ever listen at the Unix socket ``path`` ('' if one can): its
    folder is missing or is not a folder. The private default folder is exempt: the
    monitor makes it (0700); no other folder is ever made, on either side."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(folder) or os.path.abspath(folder) == os.path.abspath(default_socket_dir()):
        return ""
    what = "is not a folder" if os.path.exists(folder) else "does not exist"
    return f"the socket's folder {folder} {what}"


def default_socket_dir() -> str:
    """The per-user folder of the default socket: ``$XDG_RUNTIME_DIR/traintop``,
    else ``<tmp>/traintop-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "traintop")
    return os.path.join(tempfile.gettempdir(), f"traintop-{os.getuid()}")


def resolve_address(explicit: str | Address | None = None) -> Address:
    """The address to use: the argument, else ``$TRAINTOP_ADDRESS``, else the default.

    Raises:
        ValueError: the address does not parse; the message names where it came from.
    """
    if isinstance(explicit, Address):
        return explicit
    if explicit:
        return parse_address(explicit)
    text = os.environ.get(ADDRESS_ENV)
    if text:
        try:
            return parse_address(text)
        except ValueError as exc:
            raise ValueError(f"{ADDRESS_ENV}: {exc}") from None
    return Address("unix", path=os.path.join(default_socket_dir(), "monitor.sock"))
