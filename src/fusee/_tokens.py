"""API tokens of a namespace (``engine.tokens``): create, list, revoke, verify; and
short-lived stream tokens that read one token stream.

A token is printed once, when made; the ``<ns>_auth`` bucket keeps only its keyed hash
(``fusee.runtime.api_tokens`` says why a fast keyed hash), with its scope, name, and
creation and expiry times. Verifying reads the bucket once per token and keeps what it
read for :data:`CACHE_FOR` seconds; a watch of the bucket drops a revoked token from the
cache as soon as the delete lands, so a revoke takes effect at once (within
:data:`CACHE_FOR` if the watch missed it, say across a reconnect).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec

from fusee.errors import ConfigError, InvalidArgument, Unauthorized, UnknownToken
from fusee.runtime.api_tokens import (
    ID_PATTERN,
    SECRET_BYTES,
    Scope,
    StreamGrant,
    check_scope,
    is_stream_token,
    parse_stream_token,
    parse_token,
    stream_token_text,
    token_hash,
    token_text,
)
from fusee.runtime.durations import parse_duration
from fusee.runtime.ids import validate_id, validate_name

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from fusee._run import DurationLike
    from fusee.adapters.jetstream.auth import AuthBucket

__all__ = ("Tokens", "TokenInfo", "CreatedToken", "StreamAccess", "CACHE_FOR", "STREAM_TTL_MAX")

CACHE_FOR: Final = 10.0
"""Seconds a verified token's entry is used without reading the bucket again."""

TTL_MAX: Final = 3650 * 86400.0
"""The longest an API token lives, in seconds (10 years)."""

STREAM_TTL_MAX: Final = 3600.0
"""The longest a stream token lives, in seconds: they travel in URLs."""


class _Entry(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    hash: str
    scope: str
    name: str | None = None
    created_at: float
    expires_at: float | None = None


_decode = msgspec.json.Decoder(_Entry).decode


def iso(at: datetime | None) -> str | None:
    """``2026-12-02T04:56:24Z`` (UTC, to the second), or None."""
    return None if at is None else at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


@dataclass(frozen=True)
class TokenInfo:
    """What the namespace knows of a token (never the token itself).

    Attributes:
        id: its ID (what ``fusee tokens ls`` shows and ``revoke`` takes).
        scope: ``read``, ``write`` or ``admin``.
        name: the name it was given, if any.
        created_at: when it was made (UTC).
        expires_at: when it stops working (UTC), or None for never.
    """

    id: str
    scope: Scope
    name: str | None
    created_at: datetime
    expires_at: datetime | None

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at.timestamp() <= time.time()

    def to_json(self) -> dict[str, Any]:
        """As the HTTP API and ``fusee tokens ls --json`` show it (times in ISO 8601)."""
        return {
            "id": self.id,
            "scope": self.scope,
            "name": self.name,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "expired": self.expired,
        }


@dataclass(frozen=True)
class CreatedToken:
    """A token just made: ``token`` is shown this once, and stored nowhere."""

    id: str
    token: str
    scope: Scope
    expires_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """``{"token", "id", "scope", "expires_at"}`` (what ``--json`` prints)."""
        return {
            "token": self.token,
            "id": self.id,
            "scope": self.scope,
            "expires_at": iso(self.expires_at),
        }


@dataclass(frozen=True)
class StreamAccess:
    """What a verified stream token may read: one run's one stream, until ``expires_at``."""

    run_id: str
    stream: str
    expires_at: datetime


def _info(token_id: str, entry: _Entry) -> TokenInfo:
    created = _time(entry.created_at)
    assert created is not None
    return TokenInfo(
        token_id, check_scope(entry.scope), entry.name, created, _time(entry.expires_at)
    )


class Tokens:
    """The API tokens of one namespace: ``engine.tokens``."""

    def __init__(self, bucket: AuthBucket, secret: bytes, namespace: str) -> None:
        self._bucket = bucket
        self._secret = secret
        self._namespace = namespace
        self._cache: dict[str, tuple[float, _Entry | None]] = {}
        self._revoked: set[str] = set()
        self._following: Callable[[], Awaitable[None]] | None = None
        self._lock = anyio.Lock()

    async def create(
        self, scope: str, *, name: str | None = None, ttl: DurationLike | None = None
    ) -> CreatedToken:
        """Make a token of ``scope`` (``read`` < ``write`` < ``admin``), valid for ``ttl``
        (``"30d"``; None: until revoked). The token is in the result only: keep it.

        Raises:
            InvalidArgument: an unknown scope, a ``ttl`` that is not a positive duration,
                or a name that is not a valid name (empty, control characters, too long).

        Example:
            ``made = await engine.tokens.create("read", name="dashboard", ttl="30d")``
        """
        try:
            checked = check_scope(scope)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if name is not None:
            name = validate_name(name, "token name")
        now = time.time()
        expires = None
        if ttl is not None:
            seconds = _positive(ttl, "ttl")
            if seconds > TTL_MAX:
                raise InvalidArgument(f"ttl={ttl!r}: a token lives at most 10 years (3650d)")
            expires = now + seconds
        while True:
            token_id = secrets.token_hex(6)
            secret = secrets.token_bytes(SECRET_BYTES)
            token = token_text(token_id, secret)
            parsed = parse_token(token)
            entry = _Entry(
                hash=token_hash(self._secret, self._namespace, token_id, parsed.secret),
                scope=checked,
                name=name,
                created_at=now,
                expires_at=expires,
            )
            if await self._bucket.create(token_id, msgspec.json.encode(entry)):
                break  # else: an ID drawn twice (1 in 2**48 per token made); draw again
        return CreatedToken(token_id, token, checked, _time(expires))

    async def list(self) -> list[TokenInfo]:
        """Every token of the namespace (expired ones too), oldest first."""
        found = []
        for token_id, value in (await self._bucket.entries()).items():
            try:
                found.append(_info(token_id, _decode(value)))
            except (msgspec.DecodeError, ValueError):
                continue  # not an entry this fusee wrote: shown by no one, accepted by no one
        return sorted(found, key=lambda t: (t.created_at, t.id))

    async def revoke(self, token_id: str) -> None:
        """Revoke the token ``token_id``: refused from now on (by an API that watches the
        bucket, at once).

        Raises:
            UnknownToken: there is no token with that ID.
        """
        if not ID_PATTERN.match(token_id) or not await self._bucket.delete(token_id):
            raise UnknownToken(f"no token {token_id!r} in namespace {self._namespace!r}")
        self._revoked.add(token_id)
        self._cache.pop(token_id, None)

    async def verify(self, token: str) -> TokenInfo:
        """The token's info, if it lets its holder in.

        Raises:
            Unauthorized: malformed, unknown, revoked, expired, or forged (its secret part
                does not hash to what the bucket holds); the message says which.
            ConnectionLost: NATS did not answer.

        Example:
            ``info = await engine.tokens.verify(request_token)``
        """
        parsed = parse_token(token)
        entry = await self._entry(parsed.id)
        if entry is None:
            raise Unauthorized("unknown or revoked API token")
        expected = token_hash(self._secret, self._namespace, parsed.id, parsed.secret)
        if not secrets.compare_digest(expected, entry.hash):
            raise Unauthorized("invalid API token (its secret does not match)")
        info = _info(parsed.id, entry)
        if info.expired:
            raise Unauthorized("the API token has expired")
        return info

    def stream_token(
        self,
        run_id: str,
        stream: str,
        ttl: DurationLike = "5m",
        *,
        issued_by: str | None = None,
    ) -> str:
        """A token that reads the token stream ``stream`` of run ``run_id`` and nothing
        else, for ``ttl`` (at most an hour): for a browser's ``EventSource``, as
        ``?access_token=``. Signed with the namespace's secret, stored nowhere. With
        ``issued_by`` (an API token's ID) it stops working when that token is revoked.

        Raises:
            InvalidId: the run ID or stream name is not valid.
            InvalidArgument: ``ttl`` is not positive, or longer than an hour.

        Example:
            ``url = f"{base}/v1/runs/{id}/streams/reply?access_token={engine.tokens.stream_token(id, 'reply')}"``
        """
        run_id = validate_id(run_id)
        stream = validate_name(stream, "stream name")
        seconds = _positive(ttl, "ttl")
        if seconds > STREAM_TTL_MAX:
            raise InvalidArgument(f"ttl={ttl!r}: a stream token lives at most 1h")
        expires = int(time.time() + seconds)
        grant = StreamGrant(run_id, stream, expires, issued_by)
        return stream_token_text(self._secret, self._namespace, grant)

    async def verify_stream(self, token: str) -> StreamAccess:
        """What a stream token may read, if it is valid now.

        Raises:
            Unauthorized: malformed, forged, expired, or the API token that asked for it
                is revoked or expired.
        """
        grant = parse_stream_token(self._secret, self._namespace, token, now=time.time())
        if grant.issuer is not None:
            entry = await self._entry(grant.issuer)
            if entry is None or _info(grant.issuer, entry).expired:
                raise Unauthorized("the API token that asked for this stream token is revoked")
        expires = _time(grant.expires_at)
        assert expires is not None
        return StreamAccess(grant.run_id, grant.stream, expires)

    @staticmethod
    def is_stream_token(token: str) -> bool:
        """Whether ``token`` has a stream token's shape (not whether it is valid)."""
        return is_stream_token(token)

    async def close(self) -> None:
        """Stop watching the bucket (if this process verified a token)."""
        stop, self._following = self._following, None
        if stop is not None:
            await stop()

    # -- the cache ------------------------------------------------------------------------

    async def _entry(self, token_id: str) -> _Entry | None:
        if token_id in self._revoked:
            return None
        await self._follow()
        now = time.monotonic()
        cached = self._cache.get(token_id)
        if cached is not None and now - cached[0] < CACHE_FOR:
            return cached[1]
        value = await self._bucket.get(token_id)
        entry = None
        if value is not None:
            try:
                entry = _decode(value)
            except msgspec.DecodeError:
                entry = None
        if token_id in self._revoked:  # revoked while it was read
            return None
        if len(self._cache) > 10_000:  # unknown IDs sent on purpose must not fill memory
            self._cache.clear()
        self._cache[token_id] = (now, entry)
        return entry

    async def _follow(self) -> None:
        # Before the first read, so a revoke landing after that read is seen.
        if self._following is not None:
            return
        async with self._lock:
            if self._following is None:
                self._following = await self._bucket.follow(self._changed)

    async def _changed(self, token_id: str, value: bytes | None) -> None:
        if value is None:
            self._revoked.add(token_id)
        self._cache.pop(token_id, None)


def _positive(value: DurationLike, what: str) -> float:
    try:
        seconds = parse_duration(value, what)
    except ConfigError as exc:
        raise InvalidArgument(str(exc)) from None
    if seconds <= 0:
        raise InvalidArgument(f"{what}={value!r}: must be more than 0")
    return seconds
