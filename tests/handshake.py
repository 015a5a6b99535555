"""The probe's side of the token handshake, by hand (for monitor-side tests)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from probes.kernel import auth
from probes.kernel.wire import encode_frame, make_frame

Frame = dict[str, Any]


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The next frame the monitor sends (within 10 s)."""
    line = await asyncio.wait_for(reader.readline(), 10)
    assert line, "the monitor closed the connection"
    return json.loads(line)


async def answer_challenge(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str
) -> tuple[Frame, str, str]:
    """Read the challenge and answer it with ``token``; return the answer frame sent,
    the monitor's nonce and this side's."""
    challenge = await read_frame(reader)
    assert challenge["kind"] == "challenge", challenge
    nonce = auth.new_nonce()
    answer = make_frame(
        "answer", nonce=nonce, proof=auth.proof(token, "probe", challenge["nonce"], nonce)
    )
    writer.write(encode_frame(answer))
    await writer.drain()
    return answer, challenge["nonce"], nonce
