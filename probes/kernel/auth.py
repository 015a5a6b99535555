"""Authentication by a shared token that never travels (stdlib only: both sides import it).

Token mode (``uses_token``) is for TCP: every non-loopback address, and loopback too
when ``TRAINTOP_TOKEN`` is set (other users of a machine can reach its loopback). A Unix
socket needs none: the monitor's socket is 0600 and the probe connects only to one
owned by its own user.

In token mode each end proves it holds the token by an HMAC-SHA256 over a fresh nonce
of the other end (a challenge-response), so a recorded answer is worth nothing on the
next connection; every command is then signed with the token (``command_signature``).
The proofs differ by role, so neither end can reflect the other's proof back to it.
Nothing here encrypts: the step records travel in clear (SSH forwarding when that
matters).
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Mapping
from hashlib import sha256
from typing import Any, Literal, Protocol

NONCE_BYTES = 16
_NONCE_CHARS = frozenset("0123456789abcdef")
Role = Literal["probe", "monitor"]


class Endpoint(Protocol):
    """What ``uses_token`` reads of an address (``probes.kernel.wire.Address``, which
    imports this module: a protocol keeps the two out of an import circle)."""

    @property
    def scheme(self) -> str: ...

    @property
    def is_loopback(self) -> bool: ...


def uses_token(address: Endpoint, token: str | None) -> bool:
    """Whether connections to ``address`` authenticate both ends with the token."""
    return address.scheme == "tcp" and (bool(token) or not address.is_loopback)


def new_nonce() -> str:
    """A fresh random challenge (hex, ``NONCE_BYTES`` bytes of entropy)."""
    return secrets.token_hex(NONCE_BYTES)


def is_nonce(value: object) -> bool:
    """True for a nonce of the right size and alphabet (what ``new_nonce`` makes)."""
    return (
        isinstance(value, str) and len(value) == 2 * NONCE_BYTES and _NONCE_CHARS.issuperset(value)
    )


def proof(token: str, role: Role, challenge: str, own_nonce: str) -> str:
    """The proof that ``role`` holds ``token``: an HMAC over the other end's
    ``challenge`` and this end's ``own_nonce``, labelled with the role.

    Example:
        the probe answers the monitor's nonce ``m`` with its own ``p`` and
        ``proof(token, "probe", m, p)``; the monitor then proves itself with
        ``proof(token, "monitor", p, m)``.
    """
    message = f"traintop-v1:{role}:{challenge}:{own_nonce}".encode()
    return hmac.new(token.encode(), message, sha256).hexdigest()


def check_proof(token: str, role: Role, challenge: str, own_nonce: object, offered: object) -> bool:
    """Whether ``offered`` is ``role``'s proof over these nonces (constant time)."""
    if not is_nonce(own_nonce) or not isinstance(offered, str):
        return False
    expected = proof(token, role, challenge, str(own_nonce))
    return hmac.compare_digest(offered.encode(), expected.encode())


def command_signature(
    token: str, run: str, command_id: int, command: str, args: Mapping[str, Any] | None = None
) -> str:
    """HMAC-SHA256 proving a command, its arguments included, comes from a monitor that
    holds the shared token (required by a probe in token mode)."""
    canonical = json.dumps(dict(args or {}), sort_keys=True, separators=(",", ":"))
    message = f"{run}:{command_id}:{command}:{canonical}".encode()
    return hmac.new(token.encode(), message, sha256).hexdigest()
