"""API tokens and stream tokens: their text, their hash, their signature. Pure code.

An API token is ``fusee_<id>_<secret>``: ``id`` names its entry in the namespace's
``<ns>_auth`` bucket (12 lowercase hex digits), ``secret`` is 32 random bytes in
base64url. The entry holds only a keyed hash of the token (HMAC-SHA256 under the
namespace's secret), so a copy of the bucket lets nobody in. A keyed hash, not a
password hash (bcrypt, argon2): a 256-bit random secret cannot be guessed however fast
each guess is, so a slow hash would only make every request slower (and an easy way to
load the API); the key means a copy of the bucket alone cannot even check a token.

A stream token lets its holder read one run's one token stream until it expires, and
nothing else::

    fusees_<base64url(run ID)>.<base64url(stream name)>.<expiry>.<issuer id>.<base64url(mac)>

``mac`` is HMAC-SHA256 over the namespace, the run, the stream, the expiry (Unix
seconds) and the ID of the API token that asked for it (``-`` for none), under the same
secret. Nothing is stored for it. The caller gives the random bytes and the clock:
no I/O, no clock, no randomness here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final, Literal

from fusee.errors import Unauthorized

__all__ = (
    "SCOPES",
    "Scope",
    "PREFIX",
    "STREAM_PREFIX",
    "ParsedToken",
    "StreamGrant",
    "check_scope",
    "covers",
    "token_text",
    "parse_token",
    "token_hash",
    "stream_token_text",
    "parse_stream_token",
    "is_stream_token",
    "ID_PATTERN",
)

Scope = Literal["read", "write", "admin"]
SCOPES: Final[tuple[Scope, ...]] = ("read", "write", "admin")  # each covers those before it
PREFIX: Final = "fusee_"
STREAM_PREFIX: Final = "fusees_"
SECRET_BYTES: Final = 32
ID_PATTERN: Final = re.compile(r"^[0-9a-f]{12}$")
_SECRET_PATTERN = re.compile(r"^[A-Za-z0-9_-]{43}$")  # 32 bytes, unpadded base64url


def check_scope(scope: object) -> Scope:
    """``scope`` if it is one of :data:`SCOPES`.

    Raises:
        ValueError: it is not (the message lists the scopes).
    """
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: must be one of {', '.join(SCOPES)}")
    return scope


def covers(held: Scope, needed: Scope) -> bool:
    """Whether a token of scope ``held`` may do what needs ``needed`` (read < write < admin)."""
    return SCOPES.index(held) >= SCOPES.index(needed)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    # only the one encoding _b64 makes, so one grant has one token string
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


@dataclass(frozen=True)
class ParsedToken:
    id: str
    secret: str


def token_text(token_id: str, secret: bytes) -> str:
    """The token of entry ``token_id`` with the random ``secret`` (32 bytes)."""
    return f"{PREFIX}{token_id}_{_b64(secret)}"


def parse_token(token: str) -> ParsedToken:
    """The ID and secret of an API token.

    Raises:
        Unauthorized: it is not an API token's shape (the message says so, never the token).
    """
    if not token.startswith(PREFIX):
        raise Unauthorized("not a fusee API token (they start with 'fusee_')")
    token_id, _, secret = token[len(PREFIX) :].partition("_")
    if not ID_PATTERN.match(token_id) or not _SECRET_PATTERN.match(secret):
        raise Unauthorized("malformed API token")
    return ParsedToken(token_id, secret)


def token_hash(key: bytes, namespace: str, token_id: str, secret: str) -> str:
    """What the bucket stores of a token: HMAC-SHA256 under the namespace's secret."""
    message = f"fusee.api-token\0{namespace}\0{token_id}\0{secret}".encode()
    return _b64(hmac.new(key, message, hashlib.sha256).digest())


@dataclass(frozen=True)
class StreamGrant:
    """What a stream token lets its holder read, until when, and who asked for it."""

    run_id: str
    stream: str
    expires_at: int
    issuer: str | None


def _stream_mac(key: bytes, namespace: str, grant: StreamGrant) -> bytes:
    message = (
        f"fusee.stream-token\0{namespace}\0{grant.run_id}\0{grant.stream}\0"
        f"{grant.expires_at}\0{grant.issuer or '-'}"
    )
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def stream_token_text(key: bytes, namespace: str, grant: StreamGrant) -> str:
    """The stream token of ``grant``, signed with the namespace's secret."""
    mac = _stream_mac(key, namespace, grant)
    run, stream = _b64(grant.run_id.encode()), _b64(grant.stream.encode())
    return f"{STREAM_PREFIX}{run}.{stream}.{grant.expires_at}.{grant.issuer or '-'}.{_b64(mac)}"


def is_stream_token(token: str) -> bool:
    return token.startswith(STREAM_PREFIX)


def parse_stream_token(key: bytes, namespace: str, token: str, *, now: float) -> StreamGrant:
    """The grant a stream token carries, once its signature and expiry are checked.

    Raises:
        Unauthorized: malformed, signed with another secret (forged, or of another
            namespace), or expired at ``now`` (Unix seconds).
    """
    parts = token.removeprefix(STREAM_PREFIX).split(".")
    try:
        if not is_stream_token(token) or len(parts) != 5:
            raise ValueError("not five parts")
        run, stream, expiry, issuer, mac = parts
        if not expiry.isdigit() or str(int(expiry)) != expiry:
            raise ValueError("expiry")
        if issuer != "-" and not ID_PATTERN.match(issuer):
            raise ValueError("issuer")
        grant = StreamGrant(
            _unb64(run).decode(),
            _unb64(stream).decode(),
            int(expiry),
            None if issuer == "-" else issuer,
        )
        given = _unb64(mac)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Unauthorized("malformed stream token") from None
    if not hmac.compare_digest(given, _stream_mac(key, namespace, grant)):
        raise Unauthorized("invalid stream token (not signed by this namespace)")
    if now >= grant.expires_at:
        raise Unauthorized("the stream token has expired")
    return grant
