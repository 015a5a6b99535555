"""The wire protocol: frames, the stream reader and addresses."""

from __future__ import annotations

import json
import math
import os

import pytest

from probes.kernel.schema.spec import FRAMES, FrameKind
from probes.kernel.wire import (
    ADDRESS_ENV,
    KINDS,
    MAX_FRAME_BYTES,
    MONITOR_KINDS,
    PROBE_KINDS,
    PROTOCOL_VERSION,
    Address,
    FrameError,
    FrameReader,
    VersionMismatch,
    decode_frame,
    default_socket_dir,
    encode_frame,
    make_frame,
    parse_address,
    resolve_address,
)

# --- frames ------------------------------------------------------------------------


def test_round_trip_keeps_fields() -> None:
    frame = make_frame("step", step=7, scalars={"loss": 0.25}, lr=[1e-3, 2e-3], tag="ü")
    data = encode_frame(frame)
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1
    assert decode_frame(data) == frame


def test_round_trip_non_finite_values() -> None:
    frame = make_frame(
        "step",
        step=1,
        scalars={"loss": math.nan, "up": math.inf, "down": -math.inf},
        grad_norms=[1.0, math.nan, None],
    )
    decoded = decode_frame(encode_frame(frame))
    assert math.isnan(decoded["scalars"]["loss"])
    assert math.isinf(decoded["scalars"]["up"]) and decoded["scalars"]["up"] > 0
    assert math.isinf(decoded["scalars"]["down"]) and decoded["scalars"]["down"] < 0
    assert decoded["grad_norms"][0] == 1.0
    assert math.isnan(decoded["grad_norms"][1])
    assert decoded["grad_norms"][2] is None


def test_decode_accepts_str() -> None:
    frame = make_frame("bye", run="r")
    assert decode_frame(encode_frame(frame).decode()) == frame


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_make_frame_sets_version_and_kind(kind: str) -> None:
    frame = make_frame(kind, run="r1")
    assert frame == {"v": PROTOCOL_VERSION, "kind": kind, "run": "r1"}


def test_every_frame_kind_is_one_sides_and_each_probe_frame_but_the_answer_has_a_spec() -> None:
    assert set(FrameKind) == PROBE_KINDS | MONITOR_KINDS
    assert not PROBE_KINDS & MONITOR_KINDS
    assert set(FRAMES) == PROBE_KINDS - {FrameKind.ANSWER}  # (read before the hello)


def test_a_frame_kind_travels_as_its_bare_string() -> None:
    frame = make_frame(FrameKind.EVENT, run="r")
    assert encode_frame(frame).startswith(b'{"v":1,"kind":"event",')
    assert decode_frame(encode_frame(frame))["kind"] == FrameKind.EVENT


def test_make_frame_rejects_unknown_kind() -> None:
    with pytest.raises(FrameError, match="nonsense"):
        make_frame("nonsense")


def test_encode_rejects_unencodable_value() -> None:
    with pytest.raises(FrameError):
        encode_frame({"v": PROTOCOL_VERSION, "kind": "event", "obj": object()})


def _assert_one_line(exc: BaseException) -> None:
    text = str(exc)
    assert text
    assert "\n" not in text


def test_encode_rejects_oversized_frame() -> None:
    frame = make_frame("event", blob="x" * MAX_FRAME_BYTES)
    with pytest.raises(FrameError) as info:
        encode_frame(frame)
    _assert_one_line(info.value)
    assert str(MAX_FRAME_BYTES) in str(info.value)


def test_encode_accepts_frame_at_the_limit() -> None:
    empty = encode_frame(make_frame("event", blob=""))
    frame = make_frame("event", blob="x" * (MAX_FRAME_BYTES - len(empty)))
    data = encode_frame(frame)
    assert len(data) == MAX_FRAME_BYTES
    frame["blob"] += "x"
    with pytest.raises(FrameError):
        encode_frame(frame)


def test_decode_rejects_oversized_frame() -> None:
    line = b'{"v":1,"kind":"event","blob":"' + b"x" * MAX_FRAME_BYTES + b'"}'
    with pytest.raises(FrameError) as info:
        decode_frame(line)
    assert not isinstance(info.value, VersionMismatch)
    _assert_one_line(info.value)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"not json at all", id="not-json"),
        pytest.param(b'{"v":1,"kind":"step"', id="truncated"),
        pytest.param(b'{"v":1,"kind":"step","s":"\xff\xfe"}', id="not-utf8"),
        pytest.param(b'[{"v":1,"kind":"step"}]', id="array"),
        pytest.param(b'"a string"', id="string"),
        pytest.param(b'{"kind":"step"}', id="missing-v"),
        pytest.param(b'{"v":1,"kind":"frobnicate"}', id="unknown-kind"),
        pytest.param(b'{"v":1}', id="missing-kind"),
        pytest.param(b"", id="empty"),
    ],
)
def test_decode_rejects_malformed(line: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode_frame(line)
    assert not isinstance(info.value, VersionMismatch)
    _assert_one_line(info.value)


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_decode_version_mismatch(version: object) -> None:
    line = json.dumps({"v": version, "kind": "hello"}).encode()
    with pytest.raises(VersionMismatch) as info:
        decode_frame(line)
    exc = info.value
    assert isinstance(exc, FrameError)
    assert exc.version == version
    message = str(exc)
    _assert_one_line(exc)
    assert repr(version) in message
    assert str(PROTOCOL_VERSION) in message


def test_version_mismatch_is_a_frame_error() -> None:
    assert issubclass(VersionMismatch, FrameError)
    assert issubclass(FrameError, ValueError)


# --- the stream reader ---------------------------------------------------------------


def _frames(count: int) -> list[dict]:
    return [make_frame("step", step=i, scalars={"loss": 1.0 / (i + 1)}) for i in range(count)]


def _stream(frames: list[dict]) -> bytes:
    return b"".join(encode_frame(f) for f in frames)


def test_reader_byte_by_byte() -> None:
    frames = _frames(5)
    frames.append(make_frame("step", step=5, scalars={"loss": math.nan}))
    reader = FrameReader()
    out: list = []
    for byte in _stream(frames):
        out.extend(reader.feed(bytes([byte])))
    assert len(out) == len(frames)
    assert out[:5] == frames[:5]
    assert math.isnan(out[5]["scalars"]["loss"])
    assert reader.pending_bytes == 0


@pytest.mark.parametrize("chunk", [2, 3, 7, 13, 64])
def test_reader_arbitrary_chunks(chunk: int) -> None:
    frames = _frames(20)
    data = _stream(frames)
    reader = FrameReader()
    out: list = []
    for start in range(0, len(data), chunk):
        out.extend(reader.feed(data[start : start + chunk]))
    assert out == frames
    assert reader.pending_bytes == 0


def test_reader_several_frames_in_one_chunk() -> None:
    frames = _frames(4)
    reader = FrameReader()
    assert reader.feed(_stream(frames)) == frames


def test_reader_holds_incomplete_line() -> None:
    data = encode_frame(make_frame("bye"))
    reader = FrameReader()
    assert reader.feed(data[:-1]) == []
    assert reader.pending_bytes == len(data) - 1
    assert reader.feed(b"\n") == [make_frame("bye")]
    assert reader.pending_bytes == 0


def test_reader_ignores_blank_lines() -> None:
    a, b = _frames(2)
    reader = FrameReader()
    out = reader.feed(b"\n\n" + encode_frame(a) + b"   \n\r\n\n" + encode_frame(b) + b"\n")
    assert out == [a, b]


def test_reader_bad_line_in_the_middle() -> None:
    a, b = _frames(2)
    future = b'{"v":99,"kind":"step"}\n'
    reader = FrameReader()
    out = reader.feed(encode_frame(a) + b"garbage{\n" + future + encode_frame(b))
    assert len(out) == 4
    assert out[0] == a
    assert isinstance(out[1], FrameError)
    assert not isinstance(out[1], VersionMismatch)
    assert isinstance(out[2], VersionMismatch)
    assert out[3] == b


SMALL = 64


def test_reader_oversized_line_in_one_chunk() -> None:
    before, after = make_frame("bye", run="a"), make_frame("bye", run="b")
    assert len(encode_frame(after)) <= SMALL
    reader = FrameReader(max_frame_bytes=SMALL)
    giant = b'{"v":1,"kind":"event","blob":"' + b"x" * (5 * SMALL) + b'"}\n'
    out = reader.feed(encode_frame(before) + giant + encode_frame(after))
    assert len(out) == 3
    assert out[0] == before
    assert isinstance(out[1], FrameError)
    _assert_one_line(out[1])
    assert out[2] == after
    assert reader.pending_bytes == 0


@pytest.mark.parametrize("chunk", [1, 5, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL])
def test_reader_oversized_line_over_many_chunks(chunk: int) -> None:
    after = make_frame("bye", run="b")
    # The tail of the giant line is itself a valid frame: the reader must not decode it.
    tail = encode_frame(make_frame("bye", run="tail"))
    giant = b"y" * (10 * SMALL) + tail
    data = giant + encode_frame(after)
    reader = FrameReader(max_frame_bytes=SMALL)
    out: list = []
    for start in range(0, len(data), chunk):
        out.extend(reader.feed(data[start : start + chunk]))
    errors = [x for x in out if isinstance(x, FrameError)]
    frames = [x for x in out if not isinstance(x, FrameError)]
    assert len(errors) == 1
    assert frames == [after]
    assert out[-1] == after
    assert reader.pending_bytes == 0


def test_reader_oversized_then_more_frames_bounded_memory() -> None:
    reader = FrameReader(max_frame_bytes=SMALL)
    for _ in range(100):
        reader.feed(b"z" * SMALL)
        assert reader.pending_bytes <= SMALL
    out = reader.feed(b"\n" + _stream(_frames(1)))
    assert out == _frames(1)


def test_reader_line_exactly_at_limit() -> None:
    frame = make_frame("bye", run="r")
    data = encode_frame(frame)
    assert FrameReader(max_frame_bytes=len(data)).feed(data) == [frame]
    out = FrameReader(max_frame_bytes=len(data) - 1).feed(data)
    assert len(out) == 1
    assert isinstance(out[0], FrameError)


# --- addresses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("unix:/x/y.sock", Address("unix", path="/x/y.sock")),
        ("/x/y.sock", Address("unix", path="/x/y.sock")),
        ("  /x/y.sock  ", Address("unix", path="/x/y.sock")),
        ("tcp://127.0.0.1:7007", Address("tcp", host="127.0.0.1", port=7007)),
        ("tcp://[::1]:7007", Address("tcp", host="::1", port=7007)),
        ("tcp://localhost:1", Address("tcp", host="localhost", port=1)),
        ("tcp://10.0.0.5:65535", Address("tcp", host="10.0.0.5", port=65535)),
    ],
)
def test_parse_address(text: str, expected: Address) -> None:
    assert parse_address(text) == expected


def test_parse_relative_unix_path_is_made_absolute() -> None:
    address = parse_address("unix:rel/m.sock")
    assert address.scheme == "unix"
    assert os.path.isabs(address.path)
    assert address.path.endswith(os.path.join("rel", "m.sock"))


@pytest.mark.parametrize(
    "text",
    [
        "tcp://host",
        "tcp://host:",
        "tcp://:7007",
        "tcp://h:99999",
        "tcp://h:65536",
        "tcp://h:-1",
        "tcp://h:port",
        "127.0.0.1:7007",
        "localhost:7007",
        "[::1]:7007",
        "http://x",
        "unix:",
        "",
        "   ",
    ],
)
def test_parse_address_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_address(text)


def test_bare_host_port_is_refused_with_the_fix_named() -> None:
    with pytest.raises(ValueError, match=r"tcp://127\.0\.0\.1:7007"):
        parse_address("127.0.0.1:7007")
    # a socket file whose name looks like HOST:PORT is still reachable, explicitly
    assert parse_address("unix:127.0.0.1:7007").scheme == "unix"
    assert parse_address("./run:1").scheme == "unix"


@pytest.mark.parametrize(
    ("text", "loopback"),
    [
        ("unix:/x/y.sock", True),
        ("tcp://127.0.0.1:7007", True),
        ("tcp://127.5.6.7:7007", True),
        ("tcp://[::1]:7007", True),
        ("tcp://localhost:7007", True),
        ("tcp://10.0.0.5:7007", False),
        ("tcp://0.0.0.0:7007", False),
        ("tcp://example.com:7007", False),
    ],
)
def test_is_loopback(text: str, loopback: bool) -> None:
    assert parse_address(text).is_loopback is loopback


@pytest.mark.parametrize(
    "address",
    [
        Address("unix", path="/x/y.sock"),
        Address("tcp", host="127.0.0.1", port=7007),
        Address("tcp", host="::1", port=7007),
        Address("tcp", host="localhost", port=1),
    ],
)
def test_str_round_trips(address: Address) -> None:
    assert parse_address(str(address)) == address


def test_str_forms() -> None:
    assert str(Address("unix", path="/a/b.sock")) == "unix:/a/b.sock"
    assert str(Address("tcp", host="::1", port=5)) == "tcp://[::1]:5"
    assert str(Address("tcp", host="h", port=5)) == "tcp://h:5"


def test_resolve_prefers_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDRESS_ENV, "tcp://127.0.0.1:9")
    assert resolve_address("unix:/e/x.sock") == Address("unix", path="/e/x.sock")
    given = Address("tcp", host="localhost", port=3)
    assert resolve_address(given) is given


def test_resolve_uses_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDRESS_ENV, "tcp://127.0.0.1:9")
    assert resolve_address() == Address("tcp", host="127.0.0.1", port=9)
    assert resolve_address(None) == Address("tcp", host="127.0.0.1", port=9)
    assert resolve_address("") == Address("tcp", host="127.0.0.1", port=9)


def test_resolve_bad_env_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDRESS_ENV, "http://nope")
    with pytest.raises(ValueError):
        resolve_address()


def test_resolve_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    address = resolve_address()
    assert address.scheme == "unix"
    assert address.path.endswith("monitor.sock")
    assert os.path.dirname(address.path) == default_socket_dir()
    assert address.is_loopback


def test_default_socket_dir_uses_runtime_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_socket_dir() == os.path.join(str(tmp_path), "traintop")
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.path.join(str(tmp_path), "missing"))
    assert default_socket_dir().endswith(f"traintop-{os.getuid()}")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_socket_dir().endswith(f"traintop-{os.getuid()}")
