"""How a probe reaches its monitor: the address it may use, and the handshake.

Nothing about the monitor ever stops training. An address that cannot work (a typo, a
socket folder that does not exist) is one line on stderr at ``watch()`` and the run
trains unwatched; a listener that cannot be trusted, or a monitor that refuses, is one
line and a retry much later. The probe makes no folder: the monitor makes the private
default one, and any other must exist already. Nothing here imports torch.

Which listener a probe trusts (and so whose unsigned commands it obeys): a Unix socket
owned by its own user (made 0600 by the monitor; the default folder must be private
too), or loopback TCP with no token set. Anything else is token mode
(``probes.kernel.auth``): the monitor must prove it holds ``TRAINTOP_TOKEN`` before the
probe sends its hello, and every command must be signed.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from probes.kernel import auth
from probes.kernel.schema.spec import FrameKind
from probes.kernel.wire import (
    Address,
    Frame,
    FrameError,
    FrameReader,
    default_socket_dir,
    encode_frame,
    make_frame,
    resolve_address,
    socket_folder_problem,
)

CONNECT_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 5.0


class Refused(OSError):
    """The monitor turned the probe away, or what listens cannot be trusted (one line)."""


def warn(message: str) -> None:
    """One line to stderr, prefixed so it is clear where it comes from."""
    print(f"traintop: {message}", file=sys.stderr, flush=True)


def monitor_address(explicit: str | Address | None) -> Address | None:
    """The monitor's address for a probe (``watch(address=...)``, else
    ``$TRAINTOP_ADDRESS``, else the default), or None when none can work: said in one
    line on stderr, and the run trains unwatched. Never raises."""
    try:
        address = resolve_address(explicit)
    except ValueError as exc:
        warn(f"{exc}; the run trains unwatched (fix the address, or unset it for the default)")
        return None
    if address.scheme == "unix":
        problem = socket_folder_problem(address.path)
        if problem:
            warn(
                f"{problem}, so no monitor can listen at {address}; the run trains unwatched "
                "(create the folder, or leave the address out for the private default socket)"
            )
            return None
    return address


def command_token(address: Address | None, token: str | None) -> str | None:
    """What ``Control`` checks commands with: None when they need no signature (a Unix
    socket, or loopback with no token), else the token, or '' when one is needed and
    missing (then every command is refused)."""
    if address is None or not auth.uses_token(address, token):
        return None
    return token or ""


def missing_token(address: Address) -> str:
    """The one line said when token mode has no token: the run trains unwatched."""
    return (
        f"{address} is not loopback and TRAINTOP_TOKEN is not set: the run trains "
        "unwatched and refuses commands (set the same TRAINTOP_TOKEN for the run and "
        "the monitor, or forward a loopback port over SSH)"
    )


def refusal(address: Address | None, frame: Frame) -> str:
    """The line said when the monitor sends a ``refuse`` frame."""
    return f"the monitor at {address} refused: {frame.get('reason', 'no reason given')}"


def open_connection(address: Address, token: str | None) -> tuple[socket.socket, FrameReader]:
    """Connect to the monitor and, in token mode, pass the handshake both ways.

    Returns the socket (send timeout set) and the reader holding whatever the monitor
    sent past the handshake.

    Raises:
        Refused: the monitor refused, failed to prove it holds the token, or the
            socket (or its default folder) belongs to someone else.
        OSError: no monitor there, or the connection failed.
    """
    token_mode = auth.uses_token(address, token)
    if token_mode and not token:
        raise Refused(missing_token(address))  # before connecting: nothing may be sent
    sock = _open_socket(address)
    reader = FrameReader()
    try:
        if token_mode and token:
            _handshake(sock, reader, token, address)
        sock.settimeout(SEND_TIMEOUT_S)
    except BaseException:
        sock.close()
        raise
    return sock, reader


def _open_socket(address: Address) -> socket.socket:
    if address.scheme == "tcp":
        sock = socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    _check_private(address.path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(address.path)
    except OSError:
        sock.close()
        raise
    return sock


def _check_private(path: str) -> None:
    """Refuse a socket another user owns, or a default folder another user owns or can
    write to: a listener there could read the run and send it unsigned commands."""
    folder = os.path.dirname(path)
    try:
        if folder == default_socket_dir():
            info = os.stat(folder)
            if info.st_uid != os.getuid() or info.st_mode & 0o022:
                raise Refused(
                    f"{folder} belongs to uid {info.st_uid} or is writable by others; "
                    "not connecting to a monitor there"
                )
        owner = os.stat(path).st_uid
    except FileNotFoundError:
        return  # no monitor yet: connect fails as usual, and is retried
    if owner != os.getuid():
        raise Refused(
            f"unix:{path} belongs to uid {owner}, not to you; not connecting "
            "(start your own monitor there, or pick another address)"
        )


def _handshake(sock: socket.socket, reader: FrameReader, token: str, address: Address) -> None:
    """Answer the monitor's challenge and check its proof; nothing of the run is sent
    before the monitor has proven it holds the token."""
    sock.settimeout(CONNECT_TIMEOUT_S)
    challenge = _next_frame(sock, reader, "challenge", address)
    monitor_nonce = challenge.get("nonce")
    if not auth.is_nonce(monitor_nonce):
        raise Refused(f"the monitor at {address} sent a malformed challenge")
    own = auth.new_nonce()
    answer = auth.proof(token, "probe", str(monitor_nonce), own)
    sock.sendall(encode_frame(make_frame("answer", nonce=own, proof=answer)))
    welcome = _next_frame(sock, reader, "welcome", address)
    if not auth.check_proof(token, "monitor", own, monitor_nonce, welcome.get("proof")):
        raise Refused(
            f"the monitor at {address} did not prove it holds TRAINTOP_TOKEN (another "
            "token, or not your monitor); nothing was sent"
        )


def _next_frame(sock: socket.socket, reader: FrameReader, kind: str, address: Address) -> Frame:
    """The next frame from the monitor, which must be ``kind`` (a refusal is raised)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            data = None
        if data is None or time.monotonic() > deadline:
            raise Refused(
                f"the monitor at {address} sent no {kind} within {CONNECT_TIMEOUT_S:g} s: it "
                "runs without TRAINTOP_TOKEN or an older traintop; set the same token on both"
            )
        if not data:
            raise ConnectionError(f"the monitor at {address} closed the connection")
        items = reader.feed(data)
        if items:
            break
    # One frame at a time: the monitor says nothing more until it reads the next step
    # of the handshake (or the hello), so no frame is left behind in ``items``.
    item = items[0]
    if isinstance(item, FrameError):
        raise Refused(f"the monitor at {address} sent a bad frame: {item}")
    if item["kind"] == FrameKind.REFUSE:
        raise Refused(refusal(address, item))
    if item["kind"] != kind:
        raise Refused(f"the monitor at {address} sent {item['kind']!r}, not a {kind}")
    return item
