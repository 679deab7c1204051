"""API tokens of a namespace (``engine.tokens``): create, list, revoke, verify; and
short-lived stream tokens that read one token stream.

A token is printed once, when made; the ``<ns>_auth`` bucket keeps only its keyed hash
(``fusee.runtime.api_tokens`` says why a fast keyed hash), with its scope, name, and
creation and expiry times. The first verify starts a watch of the bucket that loads
every entry and then follows every change: from then on a verify is answered from
memory (an unknown ID costs no NATS read), and a revoke lands in it as soon as the
watch delivers the delete. Only while the watch is not current (not started yet, no
bucket yet, the connection down) does a verify read the bucket. An open request can
end when its token goes (:meth:`Tokens.on_revoke`): the HTTP API ends open streams and
waits so.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec

from fusee.errors import ConfigError, ConnectionLost, InvalidArgument, Unauthorized, UnknownToken
from fusee.logs import get_logger
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
    from collections.abc import Awaitable

    from fusee._run import DurationLike
    from fusee.adapters.jetstream.auth import AuthBucket

__all__ = ("Tokens", "TokenInfo", "CreatedToken", "StreamAccess", "STREAM_TTL_MAX", "REFUSED")

log = get_logger()

REFUSED: Final = "unknown, revoked or invalid API token"
"""The one refusal of a token that names no entry or whose secret does not match: the
caller learns nothing about which IDs exist (the reason is logged at debug)."""

FOLLOW_WAIT: Final = 5.0
"""Seconds the verify that starts the watch waits for it to load every entry."""

FOLLOW_RETRY: Final = 30.0
"""Seconds before a watch that could not start is tried again."""

REFUSE_AFTER: Final = 0.2
"""Seconds a refused API token's check takes, whatever the reason: an ID the watch has
not delivered (yet: a token made a moment ago elsewhere) is waited for meanwhile, and a
wrong secret for a known ID takes as long, so the time tells nothing either."""

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
    """What a verified stream token may read: one run's one stream, until ``expires_at``
    (its own expiry, or its issuer's if sooner); ``issuer``: the API token that asked for
    it (its revoke ends it), if any."""

    run_id: str
    stream: str
    expires_at: datetime
    issuer: str | None = None


def _info(token_id: str, entry: _Entry) -> TokenInfo:
    created = _time(entry.created_at)
    assert created is not None
    return TokenInfo(
        token_id, check_scope(entry.scope), entry.name, created, _time(entry.expires_at)
    )


def _checked(token_id: str, value: bytes) -> _Entry | None:
    """The entry in ``value``, or None if it is not one this fusee can check (not its
    JSON, a scope it does not know: a newer fusee's, a hand edit): such a token is
    refused like an unknown one, never a 500."""
    try:
        entry = _decode(value)
        check_scope(entry.scope)
    except (msgspec.DecodeError, ValueError) as exc:
        log.debug("tokens.bad_entry", token_id=token_id, error=str(exc))
        return None
    return entry


class Tokens:
    """The API tokens of one namespace: ``engine.tokens``."""

    def __init__(self, bucket: AuthBucket, secret: bytes, namespace: str) -> None:
        self._bucket = bucket
        self._secret = secret
        self._namespace = namespace
        # every entry of the bucket, as the watch delivered them (None: unreadable)
        self._entries: dict[str, _Entry | None] = {}
        self._loaded = anyio.Event()  # the watch delivered every entry
        self._following: Callable[[], Awaitable[None]] | None = None
        self._follow_again_at = 0.0  # (monotonic) after a watch that could not start
        self._lock = anyio.Lock()
        # what to call when a token's entry changes or goes (see on_revoke)
        self._listeners: dict[str, dict[int, Callable[[], None]]] = {}
        # checks waiting for an ID the watch has not delivered (yet)
        self._arrivals: dict[str, anyio.Event] = {}
        self._next_listener = 0
        # what a secret is compared with when its ID names no entry: the same work
        self._no_hash = token_hash(secret, namespace, "0" * 12, "A" * 43)

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
                self._entries[token_id] = entry  # known here at once, before the watch says
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
        # seen here at once, before the watch delivers the delete
        self._entries.pop(token_id, None)
        self._gone(token_id)

    async def verify(self, token: str) -> TokenInfo:
        """The token's info, if it lets its holder in.

        Raises:
            Unauthorized: malformed, expired, or unknown, revoked or forged (its secret
                part does not hash to what the bucket holds): these three get one
                message, :data:`REFUSED` (which one is logged at debug).
            ConnectionLost: NATS did not answer (only asked while the watch of the
                bucket is not current).

        Example:
            ``info = await engine.tokens.verify(request_token)``
        """
        parsed = parse_token(token)
        refuse_at = anyio.current_time() + REFUSE_AFTER
        entry = await self._entry(parsed.id)
        if entry is None and self._current():
            entry = await self._arrival(parsed.id, refuse_at)
        # the hash is computed and compared whether or not the ID names an entry
        expected = token_hash(self._secret, self._namespace, parsed.id, parsed.secret)
        matches = secrets.compare_digest(expected, self._no_hash if entry is None else entry.hash)
        if entry is None or not matches:
            why = "no such entry (unknown or revoked)" if entry is None else "secret mismatch"
            log.debug("tokens.refused", token_id=parsed.id, reason=why)
            await anyio.sleep(max(0.0, refuse_at - anyio.current_time()))
            raise Unauthorized(REFUSED)
        info = _info(parsed.id, entry)
        if info.expired:
            raise Unauthorized("the API token has expired")
        return info

    def on_revoke(self, token_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once, when the entry of ``token_id`` goes (revoked) or
        changes, as the watch of the bucket sees it (at once if it is already gone).
        Returns the function that cancels the call. Without a current watch (no bucket
        yet, a NATS user without the right to watch) the call comes only from a revoke
        made by this process.

        Example:
            ``stop = engine.tokens.on_revoke(info.id, scope.cancel)``
        """
        number = self._next_listener
        self._next_listener += 1
        self._listeners.setdefault(token_id, {})[number] = callback

        def cancel() -> None:
            waiting = self._listeners.get(token_id)
            if waiting is not None:
                waiting.pop(number, None)
                if not waiting:
                    del self._listeners[token_id]

        if self._current() and self._entries.get(token_id) is None:
            self._gone(token_id)  # revoked between its check and now
        return cancel

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
        expires = _time(grant.expires_at)
        assert expires is not None
        if grant.issuer is not None:
            entry = await self._entry(grant.issuer)
            issuer = None if entry is None else _info(grant.issuer, entry)
            if issuer is None or issuer.expired:
                raise Unauthorized(
                    "the API token that asked for this stream token is revoked or expired"
                )
            if issuer.expires_at is not None:
                expires = min(expires, issuer.expires_at)
        return StreamAccess(grant.run_id, grant.stream, expires, grant.issuer)

    @staticmethod
    def is_stream_token(token: str) -> bool:
        """Whether ``token`` has a stream token's shape (not whether it is valid)."""
        return is_stream_token(token)

    async def close(self) -> None:
        """Stop watching the bucket (if this process verified a token)."""
        stop, self._following = self._following, None
        if stop is not None:
            await stop()

    # -- the entries, from the watch ------------------------------------------------------

    def _current(self) -> bool:
        return self._loaded.is_set() and self._bucket.connected

    async def _entry(self, token_id: str) -> _Entry | None:
        await self._follow()
        if self._current():
            return self._entries.get(token_id)
        # not current (no bucket yet, not loaded in time, NATS down): the bucket says
        value = await self._bucket.get(token_id)
        return None if value is None else _checked(token_id, value)

    async def _follow(self) -> None:
        if self._following is not None or time.monotonic() < self._follow_again_at:
            return
        async with self._lock:
            if self._following is None and time.monotonic() >= self._follow_again_at:
                try:
                    # None: no bucket yet; tried again at the next verify
                    self._following = await self._bucket.follow(self._changed, self._loaded.set)
                except ConnectionLost as exc:
                    # e.g. a NATS user without the right to watch the bucket: verify
                    # reads it each time, and a revoke ends no open request
                    self._follow_again_at = time.monotonic() + FOLLOW_RETRY
                    log.warning("tokens.watch_failed", error=str(exc), retry_in=FOLLOW_RETRY)
                    return
            if self._following is not None:
                with anyio.move_on_after(FOLLOW_WAIT):
                    await self._loaded.wait()

    async def _arrival(self, token_id: str, until: float) -> _Entry | None:
        """The entry of ``token_id`` if the watch delivers it before ``until``: a token
        made elsewhere a moment ago may be used before its entry reaches this process."""
        arrived = self._arrivals.setdefault(token_id, anyio.Event())
        with anyio.move_on_after(max(0.0, until - anyio.current_time())):
            await arrived.wait()
        if not arrived.is_set() and self._arrivals.get(token_id) is arrived:
            del self._arrivals[token_id]
        return self._entries.get(token_id)

    async def _changed(self, token_id: str, value: bytes | None) -> None:
        if value is None:
            self._entries.pop(token_id, None)
        else:
            self._entries[token_id] = _checked(token_id, value)
            arrived = self._arrivals.pop(token_id, None)
            if arrived is not None:
                arrived.set()
        self._gone(token_id)

    def _gone(self, token_id: str) -> None:
        for callback in list(self._listeners.pop(token_id, {}).values()):
            callback()


def _positive(value: DurationLike, what: str) -> float:
    try:
        seconds = parse_duration(value, what)
    except ConfigError as exc:
        raise InvalidArgument(str(exc)) from None
    if seconds <= 0:
        raise InvalidArgument(f"{what}={value!r}: must be more than 0")
    return seconds
