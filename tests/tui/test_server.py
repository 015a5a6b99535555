"""The monitor's socket server: handshake, refusals, permissions, addresses."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat

import pytest

from probes.kernel import auth
from probes.kernel.wire import Address, encode_frame, make_frame
from tests.frames import hello, step
from tests.handshake import answer_challenge, read_frame
from tests.waiting import until
from tui.monitor import Monitor
from tui.server import MonitorServer, ServerError


async def started(address: Address, token: str | None = None) -> tuple[MonitorServer, Monitor]:
    monitor = Monitor()
    server = MonitorServer(address, monitor, token=token)
    await server.start()
    return server, monitor


async def exchange(
    address: Address, frames: list[bytes], *, until_closed: bool = False
) -> list[dict]:
    """Send raw lines as a probe would; with ``until_closed``, read what the monitor
    answers until it closes the connection (a refusal), else close it at once."""
    if address.scheme == "unix":
        reader, writer = await asyncio.open_unix_connection(address.path)
    else:
        reader, writer = await asyncio.open_connection(address.host, address.port)
    for data in frames:
        writer.write(data)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10) if until_closed else b""
    writer.close()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


async def test_frames_reach_state_and_socket_is_private(socket_path: str) -> None:
    server, monitor = await started(Address("unix", path=socket_path))
    try:
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        await exchange(
            server.address, [encode_frame(hello()), encode_frame(step(0)), encode_frame(step(1))]
        )
        await until(
            lambda: "run-a" in monitor.state.runs and monitor.state.runs["run-a"].last_step == 1
        )
        run = monitor.state.runs["run-a"]
        assert run.name == "mlp" and run.layers == ["encoder.0", "encoder.2", "head"]
        await until(lambda: not run.connected)
    finally:
        await server.close()
    assert not os.path.exists(socket_path)


async def test_wrong_version_gets_a_clear_refusal(socket_path: str) -> None:
    server, monitor = await started(Address("unix", path=socket_path))
    try:
        future = {**hello(), "v": 2}
        replies = await exchange(server.address, [encode_frame(future)], until_closed=True)
        assert replies and replies[0]["kind"] == "refuse"
        assert "version 2" in replies[0]["reason"] and "version 1" in replies[0]["reason"]
        assert monitor.state.rejected_frames == 1
        assert monitor.state.runs == {}
    finally:
        await server.close()


async def test_first_frame_must_be_hello(socket_path: str) -> None:
    server, monitor = await started(Address("unix", path=socket_path))
    try:
        replies = await exchange(server.address, [encode_frame(step(0))], until_closed=True)
        assert replies[0]["kind"] == "refuse" and "hello" in replies[0]["reason"]
        assert monitor.state.runs == {}
    finally:
        await server.close()


async def test_malformed_and_oversized_frames_are_counted_and_skipped(socket_path: str) -> None:
    server, monitor = await started(Address("unix", path=socket_path))
    try:
        huge = b'{"v":1,"kind":"event","pad":"' + b"x" * (5 * 1024 * 1024) + b'"}\n'
        await exchange(
            server.address, [encode_frame(hello()), b"not json\n", huge, encode_frame(step(0))]
        )
        await until(
            lambda: (
                monitor.state.runs.get("run-a") is not None
                and monitor.state.runs["run-a"].last_step == 0
            )
        )
        assert monitor.state.rejected_frames == 2
    finally:
        await server.close()


async def test_second_monitor_on_same_socket_is_refused(socket_path: str) -> None:
    server, _ = await started(Address("unix", path=socket_path))
    try:
        with pytest.raises(ServerError, match="already listening"):
            await started(Address("unix", path=socket_path))
    finally:
        await server.close()


async def test_stale_socket_file_is_replaced(socket_path: str) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(socket_path)
    stale.close()  # the file stays, nobody listens
    server, monitor = await started(Address("unix", path=socket_path))
    try:
        await exchange(server.address, [encode_frame(hello()), encode_frame(step(0))])
        await until(lambda: "run-a" in monitor.state.runs)  # really listening there
    finally:
        await server.close()


async def test_path_that_is_not_a_socket_is_an_error(socket_path: str) -> None:
    with open(socket_path, "w") as handle:
        handle.write("precious")
    with pytest.raises(ServerError, match="not a socket"):
        await started(Address("unix", path=socket_path))
    with open(socket_path) as handle:
        assert handle.read() == "precious"  # nothing lost


async def test_tcp_loopback_and_ephemeral_port() -> None:
    server, monitor = await started(Address("tcp", host="127.0.0.1", port=0))
    try:
        bound = server.bound_address
        assert bound.port > 0
        await exchange(bound, [encode_frame(hello()), encode_frame(step(0))])
        await until(lambda: "run-a" in monitor.state.runs)
    finally:
        await server.close()


async def test_non_loopback_needs_a_token() -> None:
    with pytest.raises(ServerError, match="TRAINTOP_TOKEN"):
        await started(Address("tcp", host="0.0.0.0", port=0))


async def test_token_is_checked_before_anything_else() -> None:
    # A token puts loopback in token mode too: the test needs no other address.
    server, monitor = await started(Address("tcp", host="127.0.0.1", port=0), token="s3cret")
    target = server.bound_address
    try:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        await answer_challenge(reader, writer, "guess")
        writer.write(encode_frame(hello()) + encode_frame(step(0)))
        wrong = [
            json.loads(line) for line in (await asyncio.wait_for(reader.read(), 10)).splitlines()
        ]
        writer.close()
        assert wrong[0]["kind"] == "refuse" and "token" in wrong[0]["reason"]
        assert monitor.state.runs == {}
        reader, writer = await asyncio.open_connection(target.host, target.port)
        _, monitor_nonce, own = await answer_challenge(reader, writer, "s3cret")
        welcome = await read_frame(reader)
        assert auth.check_proof("s3cret", "monitor", own, monitor_nonce, welcome["proof"])
        writer.write(encode_frame(hello()) + encode_frame(step(0)))
        await writer.drain()
        await until(lambda: "run-a" in monitor.state.runs)
        writer.close()
    finally:
        await server.close()


def test_refuse_frame_is_a_monitor_kind() -> None:
    frame = make_frame("refuse", reason="x")
    assert frame["v"] == 1 and frame["kind"] == "refuse"
