"""The run log: received frames, one per line, as written by ``traintop --record``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from probes.kernel.schema.spec import FrameKind
from probes.kernel.wire import (
    MAX_FRAME_BYTES,
    Frame,
    FrameError,
    FrameReader,
    VersionMismatch,
    decode_frame,
    encode_frame,
)

CHUNK = 1 << 20


class RunLogWriter:
    """Append frames to a file, one per line, flushed as they come (nothing lost)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._file: BinaryIO | None = open(path, "ab")  # noqa: SIM115 (kept open)
        except OSError as exc:
            raise OSError(f"cannot record to {path}: {exc.strerror}") from None

    def write(self, frame: Frame) -> None:
        if self._file is None:
            return
        self._file.write(encode_frame(frame))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_run_log(path: str) -> Iterator[Frame | FrameError]:
    """Frames of a run log, in order; a bad line yields a ``FrameError`` in its place.

    Raises:
        OSError: the file cannot be read (with a one-line message).
    """
    reader = FrameReader()
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise OSError(f"cannot read run log {path}: {exc.strerror}") from None
    with handle:
        while chunk := handle.read(CHUNK):
            yield from reader.feed(chunk)
        if reader.pending_bytes:
            yield from reader.feed(b"\n")  # a last line without its newline


def check_run_log(path: str) -> None:
    """Refuse, before anything is shown, a file that is not a run log: ``--record``
    writes the hello of a run before any other frame of it, so a run log opens with one.

    Raises:
        OSError: the file is missing or cannot be read.
        ValueError: it is empty, or its first line is not a hello frame (one line
            that names the file).
    """
    try:
        with open(path, "rb") as handle:
            line = handle.readline(MAX_FRAME_BYTES + 1)
            while line and not line.strip():
                line = handle.readline(MAX_FRAME_BYTES + 1)
    except FileNotFoundError:
        raise OSError(f"no run log at {path}") from None
    except OSError as exc:
        raise OSError(f"cannot read run log {path}: {exc.strerror}") from None
    if not line:
        raise ValueError(f"{path} is empty: not a run log (traintop --record FILE writes one)")
    try:
        frame = decode_frame(line)
    except VersionMismatch as exc:
        raise ValueError(f"{path}: {exc}") from None
    except FrameError:
        raise ValueError(
            f"{path} is not a run log: its first line is not a traintop frame "
            "(traintop --record FILE writes one)"
        ) from None
    if frame["kind"] != FrameKind.HELLO:
        raise ValueError(
            f"{path} is not a run log: it opens with a {frame['kind']} frame, not a run's hello"
        )
