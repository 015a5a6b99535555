"""The run log: received frames, one per line, as written by ``traintop --record``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from probes.wire import Frame, FrameError, FrameReader, encode_frame

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
