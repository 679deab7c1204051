"""Completion tokens: the unguessable part of a callback URL (human approval).

A token names one completion wait (a run and a position) and proves it was made by a
holder of the namespace's secret::

    <base64url(run ID)>.<pos>.<base64url(HMAC-SHA256)>

The MAC (all 256 bits) covers the namespace, the run ID, the sequence of the run's
``run.started`` (so a later run under the same ID gets other tokens), the position and
the wait's name, keyed by the namespace's secret (``config.secret`` in the work bucket).
Pure code: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from fusee.errors import InvalidId, InvalidToken
from fusee.runtime.ids import validate_id

__all__ = ("Completion", "completion_token", "completion_url", "parse_token", "mac_matches")

MAC_BYTES = 32
SECRET_MIN_BYTES = 32


@dataclass(frozen=True)
class Completion:
    """``cb``, what ``ctx.await_completion(ask=...)`` hands to ``ask``.

    Attributes:
        token: the completion token; ``engine.complete(token, value)`` completes the wait.
        url: ``<callback_base_url>/v1/completions/<token>``, to put in front of a human.
        name: the wait's name.
    """

    token: str
    url: str
    name: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """Decode unpadded base64url, accepting only the one encoding :func:`_b64` makes
    (the spare bits of the last character zero, no padding), so no two tokens name the
    same bytes."""
    if not text or any(c not in _B64_CHARS for c in text):
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not the canonical base64url encoding")
    return data


_B64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _mac(
    secret: bytes, namespace: str, run_id: str, started_seq: int, pos: int, name: str
) -> bytes:
    message = f"fusee.completion\0{namespace}\0{run_id}\0{started_seq}\0{pos}\0{name}"
    return hmac.new(secret, message.encode(), hashlib.sha256).digest()


def completion_token(
    secret: bytes, namespace: str, run_id: str, started_seq: int, pos: int, name: str
) -> str:
    """The token of the completion wait ``name`` at ``pos`` of run ``run_id``."""
    if len(secret) < SECRET_MIN_BYTES:
        raise InvalidToken(f"the namespace secret is {len(secret)} bytes, fewer than 32")
    mac = _mac(secret, namespace, run_id, started_seq, pos, name)
    return f"{_b64(run_id.encode())}.{pos}.{_b64(mac)}"


def completion_url(base_url: str, token: str) -> str:
    return f"{base_url.rstrip('/')}/v1/completions/{token}"


def parse_token(token: object) -> tuple[str, int, bytes]:
    """``(run ID, position, MAC)`` of a well-formed token.

    Raises:
        InvalidToken: the token is malformed.
    """
    if not isinstance(token, str) or len(token) > 2048:
        raise InvalidToken(f"malformed completion token: {_show(token)}")
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken(f"malformed completion token: {_show(token)} (want run.pos.mac)")
    run_part, pos_part, mac_part = parts
    try:
        run_id = validate_id(_unb64(run_part).decode(), "run ID")
        mac = _unb64(mac_part)
    except (ValueError, binascii.Error, UnicodeDecodeError, InvalidId):
        raise InvalidToken(f"malformed completion token: {_show(token)}") from None
    if (
        not pos_part.isascii()
        or not pos_part.isdigit()
        or len(pos_part) > 9
        or (pos_part.startswith("0") and pos_part != "0")  # one way to write a number
    ):
        raise InvalidToken(f"malformed completion token: {_show(token)} (bad position)")
    if len(mac) != MAC_BYTES:
        raise InvalidToken(f"malformed completion token: {_show(token)} (short MAC)")
    return run_id, int(pos_part), mac


def mac_matches(
    mac: bytes, secret: bytes, namespace: str, run_id: str, started_seq: int, pos: int, name: str
) -> bool:
    """Whether ``mac`` is the MAC of that wait (constant-time compare)."""
    return hmac.compare_digest(mac, _mac(secret, namespace, run_id, started_seq, pos, name))


def _show(token: object) -> str:
    text = repr(token)
    return text if len(text) <= 80 else text[:79] + "…"
