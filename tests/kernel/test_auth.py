"""The token handshake: both ends prove they hold TRAINTOP_TOKEN, which never travels.

Every network test here stays on 127.0.0.1: a token set on loopback puts it in token
mode (``probes.kernel.auth.uses_token``), the seam that lets a test see what would
cross a network. ``TokenMonitor`` plays a monitor by hand and keeps every byte the
probe sends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import probes
from probes.kernel import auth
from probes.kernel.wire import Address, FrameReader, command_signature, encode_frame, make_frame
from probes.runtime.link import link
from probes.runtime.link.control import Control
from tests.handshake import answer_challenge, read_frame
from tests.waiting import until, wait_until
from tui.monitor import Monitor
from tui.server import MonitorServer

TOKEN = "correct-horse-battery-staple"
Frame = dict[str, Any]


# --- the crypto --------------------------------------------------------------------


def test_a_proof_is_bound_to_the_token_both_nonces_and_the_role() -> None:
    m, p = auth.new_nonce(), auth.new_nonce()
    good = auth.proof(TOKEN, "probe", m, p)
    assert auth.check_proof(TOKEN, "probe", m, p, good)
    assert not auth.check_proof("other", "probe", m, p, good)
    assert not auth.check_proof(TOKEN, "probe", auth.new_nonce(), p, good)  # another challenge
    assert not auth.check_proof(TOKEN, "probe", m, auth.new_nonce(), good)
    assert not auth.check_proof(TOKEN, "monitor", m, p, good)  # reflected to the other role
    assert not auth.check_proof(TOKEN, "probe", m, "", auth.proof(TOKEN, "probe", m, ""))
    assert not auth.check_proof(TOKEN, "probe", m, p, None)
    assert TOKEN not in good and TOKEN.encode().hex() not in good


def test_nonces_are_fresh_and_checked() -> None:
    nonces = {auth.new_nonce() for _ in range(100)}
    assert len(nonces) == 100 and all(auth.is_nonce(n) for n in nonces)
    for bad in ("", "00", "zz" * auth.NONCE_BYTES, 7, None, "A" * 2 * auth.NONCE_BYTES):
        assert not auth.is_nonce(bad)


def test_token_mode_is_tcp_off_loopback_or_with_a_token() -> None:
    unix = Address("unix", path="/x/m.sock")
    loopback = Address("tcp", host="127.0.0.1", port=7)
    remote = Address("tcp", host="10.0.0.5", port=7)  # never connected to
    assert not auth.uses_token(unix, TOKEN) and not auth.uses_token(loopback, None)
    assert auth.uses_token(loopback, TOKEN) and auth.uses_token(remote, None)
    assert link.command_token(unix, TOKEN) is None
    assert link.command_token(loopback, None) is None
    assert link.command_token(loopback, TOKEN) == TOKEN
    assert link.command_token(remote, None) == ""  # needed and missing: refuse all
    assert link.command_token(None, TOKEN) is None


def test_token_mode_without_a_token_refuses_every_command() -> None:
    sent: list[Frame] = []
    connected = threading.Event()
    connected.set()
    token = link.command_token(Address("tcp", host="10.0.0.5", port=7), None)
    control = Control(
        connected=connected, send=sent.append, scale_lr=None, grace_s=1, token=token, run_id="r"
    )
    unsigned = make_frame("command", id=1, command="guard", args={"on": True})
    signed_empty = {
        **unsigned,
        "id": 2,
        "auth": command_signature("", "r", 2, "guard", {"on": True}),
    }
    control.receive(unsigned)
    control.receive(signed_empty)
    control.boundary(0, flush=lambda: None)
    acks = [f for f in sent if f["kind"] == "ack"]
    assert [a["ok"] for a in acks] == [False, False]
    assert all("signature" in a["result"] for a in acks)
    assert not control.state.guard


def test_a_probe_off_loopback_without_a_token_trains_unwatched_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # "Not loopback" by the seam: the address stays 127.0.0.1, so nothing could leave.
    monkeypatch.setattr(Address, "is_loopback", property(lambda self: False))
    monkeypatch.delenv("TRAINTOP_TOKEN", raising=False)
    with listening() as server:
        port = server.getsockname()[1]
        model = nn.Linear(3, 1)
        with probes.watch(model, address=f"tcp://127.0.0.1:{port}") as probe:
            for _ in range(3):
                with probe.step():
                    model(torch.ones(2, 3)).sum().backward()
        assert probe.sender.address is None
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # it never even connected
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TRAINTOP_TOKEN is not set" in err
    assert "refuses commands" in err


# --- the monitor's side --------------------------------------------------------------


async def test_a_replayed_answer_is_refused() -> None:
    server, monitor = await token_server(TOKEN)
    target = server.bound_address
    try:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        answer, _, _ = await answer_challenge(reader, writer, TOKEN)
        assert (await read_frame(reader))["kind"] == "welcome"
        writer.close()
        # An eavesdropper replays that answer on a connection of its own.
        reader, writer = await asyncio.open_connection(target.host, target.port)
        challenge = await read_frame(reader)
        assert challenge["kind"] == "challenge"
        writer.write(encode_frame(answer) + encode_frame(hello_frame()))
        refusal = await read_frame(reader)
        writer.close()
        assert refusal["kind"] == "refuse" and "wrong token" in refusal["reason"]
        assert monitor.state.runs == {} and monitor.state.rejected_frames == 1
    finally:
        await server.close()


async def test_a_token_monitor_refuses_a_hello_that_skips_the_handshake() -> None:
    server, monitor = await token_server(TOKEN)
    target = server.bound_address
    try:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        assert (await read_frame(reader))["kind"] == "challenge"
        writer.write(encode_frame({**hello_frame(), "token": TOKEN}))  # a probe of old
        refusal = await read_frame(reader)
        writer.close()
        assert refusal["kind"] == "refuse" and "set the same token in the run" in refusal["reason"]
        assert monitor.state.runs == {}
    finally:
        await server.close()


async def test_a_wrong_token_in_the_run_is_one_line_and_the_run_trains(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server, monitor = await token_server(TOKEN)
    monkeypatch.setenv("TRAINTOP_TOKEN", "wrong")
    try:
        probe, steps = await asyncio.to_thread(train, server.bound_address, 40)
        await until(lambda: monitor.state.rejected_frames >= 1, "the refusal")
    finally:
        await server.close()
    assert steps == 40 and probe.step_index == 39
    assert monitor.state.runs == {}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused: wrong token" in err, err


async def test_a_token_in_the_run_only_is_one_line_and_the_monitor_gets_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monitor = Monitor()
    server = MonitorServer(Address("tcp", host="127.0.0.1", port=0), monitor)  # no token
    await server.start()
    monkeypatch.setenv("TRAINTOP_TOKEN", TOKEN)
    try:
        _, steps = await asyncio.to_thread(train, server.bound_address, 20)
    finally:
        await server.close()
    assert steps == 20 and monitor.state.runs == {}  # the probe never said hello
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sent no challenge" in err, err


async def test_the_real_monitor_and_probe_authenticate_and_commands_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, monitor = await token_server(TOKEN)
    monkeypatch.setenv("TRAINTOP_TOKEN", TOKEN)
    model = nn.Linear(3, 1)
    probe = probes.watch(model, address=str(server.bound_address))
    try:
        run = await until(lambda: next(iter(monitor.state.runs.values()), None), "the hello")
        assert "token" not in probe.sender._hello  # the hello it sends carries none
        assert run.info.name == probe.name  # ... and the monitor read that hello
        assert monitor.send_command(run.run_id, "guard", on=True) is None  # signed
        deadline = time.monotonic() + 10.0  # a loaded machine acts on commands late
        while not run.control.get("guard") and time.monotonic() < deadline:
            await asyncio.to_thread(step_once, probe, model)
        assert run.control.get("guard"), "the signed command was not obeyed"
    finally:
        await asyncio.to_thread(probe.close)
        await server.close()


# --- the probe's side, against a monitor played by hand -------------------------------


class TokenMonitor:
    """A monitor on 127.0.0.1 that runs the handshake with ``token`` and keeps every
    byte each probe sends. ``welcome`` picks its proof: ``"right"``, ``"wrong"`` (another
    token) or ``"replayed"`` (the first connection's proof, on every later one)."""

    def __init__(self, token: str, welcome: str = "right") -> None:
        self.token = token
        self.welcome = welcome
        self.received = bytearray()  # every byte from every probe
        self.frames: list[Frame] = []
        self.conns: list[socket.socket] = []
        self._first_proof: str | None = None
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.1)  # so that the accepting thread sees close()
        self._closed = threading.Event()
        self.address = f"tcp://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def send(self, frame: Frame) -> None:
        self.conns[-1].sendall(encode_frame(frame))

    def kinds(self, kind: str) -> list[Frame]:
        with self._lock:
            return [f for f in self.frames if f["kind"] == kind]

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        challenge = auth.new_nonce()
        conn.sendall(encode_frame(make_frame("challenge", nonce=challenge)))
        reader = FrameReader()
        answered = False
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.received += data
            for item in reader.feed(data):
                assert isinstance(item, dict), item
                with self._lock:
                    self.frames.append(item)
                if not answered and item["kind"] == "answer":
                    answered = True
                    conn.sendall(encode_frame(self._welcome(challenge, item["nonce"])))

    def _welcome(self, challenge: str, probe_nonce: str) -> Frame:
        token = "not-the-token" if self.welcome == "wrong" else self.token
        proof = auth.proof(token, "monitor", probe_nonce, challenge)
        if self.welcome == "replayed":
            self._first_proof = self._first_proof or proof
            proof = self._first_proof
        return make_frame("welcome", proof=proof)


@pytest.fixture
def token_monitor(monkeypatch: pytest.MonkeyPatch) -> Iterator[TokenMonitor]:
    monkeypatch.setenv("TRAINTOP_TOKEN", TOKEN)
    monitor = TokenMonitor(TOKEN)
    yield monitor
    monitor.close()


def test_the_token_never_travels_and_unsigned_commands_are_refused(
    token_monitor: TokenMonitor,
) -> None:
    model = nn.Linear(3, 1)
    probe = probes.watch(model, address=token_monitor.address)
    try:
        wait_until(lambda: token_monitor.kinds("hello"), "the hello")
        run_id = token_monitor.kinds("hello")[0]["run"]
        token_monitor.send(
            make_frame("command", id=1, run=run_id, command="guard", args={"on": True})
        )
        signature = command_signature(TOKEN, run_id, 2, "guard", {"on": False})
        signed = make_frame(
            "command", id=2, run=run_id, command="guard", args={"on": False}, auth=signature
        )
        signed_sent = False
        # Step until both commands are answered: by time, not by a count of steps, since
        # a loaded machine (CI's two cores) delivers a command many steps late.
        deadline = time.monotonic() + 10.0
        while len(token_monitor.kinds("ack")) < 2 and time.monotonic() < deadline:
            step_once(probe, model)
            if not signed_sent and token_monitor.kinds("ack"):
                signed_sent = True
                token_monitor.send(signed)
    finally:
        probe.close()
    wait_until(lambda: token_monitor.kinds("bye"), "the bye")
    unsigned_ack, signed_ack = token_monitor.kinds("ack")
    assert not unsigned_ack["ok"] and "signature" in unsigned_ack["result"]
    assert signed_ack["ok"] and signed_ack["state"]["guard"] is False
    sent = bytes(token_monitor.received)
    assert token_monitor.frames[0]["kind"] == "answer"  # nothing of the run before it
    assert "token" not in token_monitor.kinds("hello")[0]
    assert b'"kind":"step"' in sent  # the run did travel
    for form in (TOKEN.encode(), TOKEN.encode().hex().encode(), base64.b64encode(TOKEN.encode())):
        assert form not in sent


@pytest.mark.parametrize("welcome", ["wrong", "replayed"])
def test_a_monitor_that_cannot_prove_the_token_gets_nothing(
    welcome: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINTOP_TOKEN", TOKEN)
    monitor = TokenMonitor(TOKEN, welcome=welcome)
    try:
        address = link.monitor_address(monitor.address)
        assert address is not None
        if welcome == "replayed":  # the first connection, whose proof is replayed next
            sock, _ = link.open_connection(address, TOKEN)
            sock.close()
        with pytest.raises(link.Refused, match="did not prove"):
            link.open_connection(address, TOKEN)
        probe, steps = train(address, 20)  # and through watch(): one line, training on
        assert steps == 20 and probe.step_index == 19
        monitor.close()
    finally:
        monitor.close()
    assert {f["kind"] for f in monitor.frames} == {"answer"}  # no hello, no record
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not prove it holds TRAINTOP_TOKEN" in err, err


# --- helpers ---------------------------------------------------------------------------


async def token_server(token: str) -> tuple[MonitorServer, Monitor]:
    monitor = Monitor()
    server = MonitorServer(Address("tcp", host="127.0.0.1", port=0), monitor, token=token)
    monitor.token = token
    await server.start()
    return server, monitor


def hello_frame() -> Frame:
    return make_frame("hello", run="r", name="n", layers=[], param_counts=[], config={})


@contextlib.contextmanager
def listening() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.close()


def step_once(probe: Any, model: nn.Module) -> None:
    with probe.step():
        model(torch.ones(2, 3)).sum().backward()


def train(address: Address | str, steps: int) -> tuple[Any, int]:
    """Train a small model ``steps`` steps under a probe watching ``address``; closed."""
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = probes.watch(model, optimizer, address=address)
    done = 0
    for i in range(steps):
        with probe.step():
            optimizer.zero_grad()
            loss = model(torch.full((2, 3), float(i))).pow(2).mean()
            loss.backward()
            optimizer.step()
            probe.log(loss=loss)
        done += 1
    probe.close()
    return probe, done
