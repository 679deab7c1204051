"""The JetStream adapter: the only code that speaks nats-py.

It writes the NATS layout (named in ``layout.py``, documented in
``docs/reference/nats-layout.md``), translates nats-py errors at the boundary
(``err_code 10071`` becomes :class:`fusee.errors.Fenced`), and wraps what nats-py 2.16
lacks (the subtree fence header; batched Direct Get is in ``direct.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    Placement,
    RawStreamMsg,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue

from fusee.actors.ports import NobodyListens
from fusee.adapters.jetstream.auth import AuthBucket
from fusee.adapters.jetstream.buckets import DESCRIPTIONS, BucketFence, open_bucket
from fusee.adapters.jetstream.commit import GroupCommitter, Message, Pending, publish_batch
from fusee.adapters.jetstream.credentials import Credentials, redact, url_method, url_user
from fusee.adapters.jetstream.direct import (
    CLIENT_PATIENCE,
    direct_batch,
    direct_last,
    direct_pages,
    drop_consumer,
    patience,
    publish_acked,
    publish_acked_once,
    retrying,
    retrying_for,
)
from fusee.adapters.jetstream.layout import (
    CURSOR,
    EPOCH,
    EXPECTED_SEQ,
    EXPECTED_STREAM,
    EXPECTED_SUBJECT,
    JOURNAL_SEQ,
    KIND,
    MSG_ID,
    WRONG_STREAM,
    Layout,
    StoredMsg,
)
from fusee.adapters.jetstream.permissions import inbox_prefix, permission_denied, role_for
from fusee.adapters.jetstream.regions import (
    MirrorLag,
    current_stream,
    ensure_mirror,
    find_layout,
    mirror_lag,
    pending_promotion,
)
from fusee.adapters.jetstream.tokens import DEFAULT_MAX_AGE, TokenStore
from fusee.adapters.jetstream.watch import JournalWatch
from fusee.errors import (
    ConfigError,
    ConnectionLost,
    FailedOver,
    Fenced,
    FuseeError,
    JournalGap,
    NotEncodable,
    PermissionDenied,
    StorageFull,
)
from fusee.logs import get_logger
from fusee.runtime.ids import escape, unescape
from fusee.runtime.inbox import TimerFired, encode_message
from fusee.runtime.index import info_or_none
from fusee.runtime.objects import state_key
from fusee.runtime.records import ValueRef
from fusee.runtime.regions import (
    RegionMeta,
    epoch_of_stream,
    epoch_order,
    epoch_stream,
    validate_region,
)

__all__ = (
    "NatsStore",
    "ConnectionLost",
    "NobodyListens",
    "StorageFull",
    "CLIENT_PATIENCE",
)

log = get_logger()

T = TypeVar("T")

# The longest a first connection may take: nats-py's connect_timeout (2 s) for each
# of its 4 tries and the waits between them, with room to spare.
CONNECT_DEADLINE = 10.0

IDLE_MARKER = b'{"idle":true}'  # an object's active marker while it is idle
# How long a client waits for a worker's ping answer before it counts the worker as
# gone: a worker's own patience with its peers (``WorkerConfig.ping_timeout``).
PING_TIMEOUT = 2.0
# The inbox consumer's idle heartbeat: nats-py recreates the ordered consumer once it
# missed two (a server restart, the consumer deleted); nats-py's own default.
INBOX_HEARTBEAT = 5.0
ROLLUP = "Nats-Rollup"  # "sub": the message replaces every earlier one on its subject
TTL = "Nats-TTL"  # seconds: the server removes the message then
MARKER_KIND = "run.active"  # a run's active marker (Layout.marker)
INDEX_KIND = "run.index"  # a run's index entry (Layout.index_entry)
UNMARKED_KIND = "run.inactive"  # its removal: replaces it, then expires
LISTED_KIND = "run.listed"  # a run's listing entry (Layout.listing)
LISTED_FROM = "config.listed_from"  # in the work bucket: see NatsStore.legacy_pages
PAUSED_LISTED = "config.paused_listed"  # in the work bucket: see NatsStore.list_old_pauses
# the read of the namespace's secret (NatsStore.load_secret), refused to the client role
SECRET_READ = "$JS.API.DIRECT.GET.{stream}.$KV.{bucket}.config.secret"
UNLISTED_KIND = "run.unlisted"  # a listing entry's removal: replaces it, then expires

# Room kept in every message for what is not the value: the record's other fields
# (links, name, the values ctx.now() took) and its headers. A value may be the
# server's max_payload less this (1,032,192 bytes with the default 1 MiB).
VALUE_HEADROOM = 16 * 1024

WRONG_LAST_SEQUENCE = 10071
# How often a connection pings its server, and how many unanswered pings drop it (then
# nats-py reconnects to another server of the list): a dead link is found in about
# PING_INTERVAL x (PINGS_OUT + 1) seconds. Measured in the global tier's partition
# drill (tests/chaos/test_global_tier.py): with nats-py's defaults (120 s, 2) a client
# on a server of the cut-off site waited minutes.
PING_INTERVAL = 5.0
PINGS_OUT = 2

# The same refusal without the sequence: an R3 leader with a write to the subject still
# in flight answers this to an expected-last-subject-sequence check (seen in CI: a
# state write retried through a follower while its first try was being stored)
WRONG_LAST_SEQUENCE_PENDING = 10164
WRONG_LAST = (WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_PENDING)
# JetStream's advisory of a stream's configuration changed (a failover's promotion)
STREAM_UPDATED = "$JS.EVENT.ADVISORY.STREAM.UPDATED"
# Tries of a paused run's conditional unmark (each refusal: the marker's subject changed)
MAX_UNMARK_TRIES = 5
BATCH_DUPLICATE = 10201

# What nats-py raises while the server is slow, restarting or unreachable: the
# operation may or may not have happened, and trying again later is the answer.
TRANSIENT: tuple[type[Exception], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionClosedError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


@contextlib.contextmanager
def lost_on_transient(what: str) -> Iterator[None]:
    """Map a transient nats-py error to :class:`fusee.errors.ConnectionLost` naming
    ``what`` was being done, so callers above the adapter see a fusee error."""
    try:
        yield
    except TRANSIENT as exc:
        raise ConnectionLost(f"{what}: NATS did not answer ({type(exc).__name__})") from None


# what a layout setup the server refused raises in nats-py (a denied request times out)
_SETUP_ERRORS: tuple[type[Exception], ...] = (*TRANSIENT, nats.js.errors.APIError)


class _Denied(Exception):
    """The server refused this connection a call (a permission violation)."""


def placement(layout: Layout) -> Placement | None:
    """Where the namespace's streams and buckets go: its home region's cluster, if any."""
    return Placement(cluster=layout.home) if layout.home else None


def journal_stream_config(
    layout: Layout, replicas: int, meta: RegionMeta | None = None
) -> StreamConfig:
    """The journal stream's configuration, as :meth:`NatsStore.ensure_layout` creates it
    (and a failover promotes a mirror to: ``meta`` is then the new home's)."""
    if meta is None and layout.home is not None:
        meta = RegionMeta(layout.home, layout.epoch)
    return StreamConfig(
        name=layout.stream,
        subjects=[f"{layout.namespace}.run.>", f"{layout.namespace}.in.>"],
        storage=StorageType.FILE,
        num_replicas=replicas,
        placement=placement(layout),
        metadata=meta.to_metadata() if meta is not None else None,
        allow_direct=True,
        allow_atomic=True,
        allow_msg_schedules=True,
        allow_msg_ttl=True,
        # markers, their removals and ended runs' index entries carry Nats-Rollup: sub;
        # without this a stream refuses them (10111). A rollup is a purge, so a stream
        # that allows it cannot deny purges (10052): nats-server 2.15 turns rollups on
        # and deny_purge off by itself for a stream with schedules, and says so nowhere
        allow_rollup_hdrs=True,
        deny_delete=True,
        deny_purge=False,
        duplicate_window=120.0,
    )


def values_stream_config(layout: Layout, replicas: int) -> StreamConfig:
    """The values stream's configuration, as :meth:`NatsStore.ensure_layout` creates it."""
    return StreamConfig(
        name=layout.values_stream,
        subjects=[f"{layout.namespace}.val.>"],
        storage=StorageType.FILE,
        num_replicas=replicas,
        placement=placement(layout),
        allow_direct=True,
        max_msgs_per_subject=1,  # a chunk written again replaces itself (same bytes)
    )


class NatsStore:
    """A connection to NATS, bound to one namespace."""

    def __init__(
        self,
        nc: Client,
        layout: Layout,
        *,
        replicas: int = 1,
        tokens_max_age: float = DEFAULT_MAX_AGE,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=5.0)
        self.layout = layout
        self.replicas = replicas
        self._runs: KeyValue | None = None
        self._work: KeyValue | None = None
        self._objects: KeyValue | None = None
        self.committer = GroupCommitter(nc, self._append_alone)
        # token streams (issue #5): the second stream of the namespace, <NS>_TOKENS
        self.tokens = TokenStore(nc, self.js, layout, replicas=replicas, max_age=tokens_max_age)
        # API tokens (issue 15): the <ns>_auth bucket, made by the first token (see auth.py)
        self.auth = AuthBucket(nc, self.js, layout, replicas=replicas)
        # callers waiting for results: one consumer for all of them (see watch.py)
        self.journal_watch = JournalWatch(nc, self.js, layout)
        self.journal_watch.stream_gone = self._watch_lost_its_stream
        # completions (issue 3): the namespace's secret (``config.secret`` in the work
        # bucket, read at connect) and the base of callback URLs
        self.completion_secret = b""
        self.callback_base_url = "http://127.0.0.1:8000"
        # the actors with a marker in the work bucket, per partition, as the last
        # listing of it found them, with those written here since: the end that just
        # landed reads that bucket for a marker to purge only when one may be there
        # (see _clear_old_marker)
        self._work_listed: dict[int, set[str]] = {}
        self._listed_upto: int | None = None  # config.listed_from, once read
        # subjects the server refused this connection (permission violations), with
        # its message: a denied request looks like a timeout to nats-py
        self.denied: dict[str, str] = {}
        # reads that end as soon as the server refuses their subject (``_unless_refused``)
        self._refusals: dict[str, anyio.CancelScope] = {}
        self.auth_method = "no credentials"  # how it authenticated, for messages
        # the journal stream has followers (R3): their Direct Gets may be behind the
        # leader's acks, so journal reads are checked against the leader's tail (see
        # read_journal): from the stream's config, read by ensure_layout or the first read
        self.replicated: bool | None = None
        # regions (runtime/regions.py): the region this process is in, the one holding
        # the mirror, and the namespace's partition count recorded in its stream's
        # metadata (carried across a failover)
        self.region: str | None = None
        self.partner: str | None = None
        self.recorded_partitions: int | None = None
        # a client follows its namespace to the epoch a failover makes (follow_epoch); a
        # process running a worker does not: its appends must stay fenced by their epoch
        self._follows = True
        self._following: asyncio.Task[None] | None = None
        self._recheck = False
        self._follow_pending = False  # the layout taken, the rest of the follow not done
        self._advisories: Any = None  # the subscription to the next epoch's promotion
        self._background: set[asyncio.Task[Any]] = set()
        # run after a follow (the engine's API tokens are keyed by the new secret)
        self.followed: list[Callable[[], Awaitable[None]]] = []
        # the self-fencing lease (renew_lease): a worker of a regional namespace appends
        # only before this time.monotonic() instant; math.inf: no lease (a client)
        self.lease_until = math.inf
        self._lease_renewed = anyio.Event()
        self._lease_waits_told = False
        self._lease_holders = 0

    @classmethod
    async def connect(
        cls,
        url: str | list[str],
        namespace: str,
        *,
        name: str = "fusee",
        replicas: int = 1,
        tokens_max_age: float = DEFAULT_MAX_AGE,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        credentials: Credentials | None = None,
        region: str | None = None,
        partner: str | None = None,
    ) -> NatsStore:
        """Connect to NATS at ``url`` with ``credentials`` (none by default).

        ``region``: the region (NATS cluster) this process is in; a namespace created
        by it has its home there. The namespace's epoch and home are read from its
        journal stream (see :func:`find_layout`). ``partner``: the region that holds a
        mirror of the journal (made by :meth:`ensure_mirror`).

        Raises:
            ConfigError: the server refused the credentials (naming the server and the
                method, never the secret), or a TLS file is not what it should be.
            ConnectionLost: no server answered (with nats-py's last error, e.g. a TLS
                handshake that failed).
        """
        if region is not None:  # checked before anything is opened
            region = validate_region(region)
            if partner is not None and validate_region(partner, "partner region") == region:
                raise ConfigError(f"partner region {partner!r}: it is this process's region")
        made: list[NatsStore] = []
        creds = credentials or Credentials()
        errors: list[Exception] = []  # what nats-py reported while connecting

        async def reconnected() -> None:
            for store in made:
                store.journal_watch.reconnected()
                store.epoch_may_have_moved()  # a failover while this process was away
                # read again whether the stream has followers: it may have been scaled
                # (R1 to R3) while this process ran; a scale with no reconnect is not
                # seen until the process restarts (docs/operations.md)
                store.replicated = None
                # which server of the cluster it is on now (no credentials: host and port)
                where = store.nc.connected_url
                server = f"{where.hostname}:{where.port}" if where is not None else None
                log.info("nats.reconnected", server=server)
            if on_reconnect is not None:
                await on_reconnect()

        async def on_error(exc: Exception) -> None:
            # nats-py reports every failed reconnect attempt here; reconnecting is
            # its job and the log line for it is the worker's. A permission violation
            # is the server refusing a publish or subscribe, which the caller otherwise
            # sees only as a timeout: kept and logged (see ``denied``).
            if not made:
                errors.append(exc)
                if isinstance(exc, ssl.SSLCertVerificationError):
                    fatal.set()  # (nats-py would wait on, see below)
            elif (subject := permission_denied(exc)) is not None:
                made[0].note_denied(subject, str(exc))

        options = creds.options()
        joined = url if isinstance(url, str) else ",".join(url)
        shown = redact(joined)
        # the method for messages: the credentials given, else those in the URL
        method = creds.method if creds.method != "no credentials" else None
        method = method or url_method(joined) or creds.method
        # replies come to an inbox of the user's own (``_INBOX.<user>``), which is all a
        # role of nats/accounts.conf may subscribe to (permissions.inbox_prefix)
        options["inbox_prefix"] = inbox_prefix(creds.user or url_user(joined))
        fatal = anyio.Event()
        nc: Client | None = None
        failed: BaseException | None = None

        async def give_up_on_fatal() -> None:
            await fatal.wait()
            tg.cancel_scope.cancel()

        # nats-py 2.16 never returns from a connect whose TLS handshake failed to verify
        # the server's certificate: that error ends it (and a deadline any other hang)
        async with anyio.create_task_group() as tg:
            tg.start_soon(give_up_on_fatal)
            try:
                with anyio.fail_after(CONNECT_DEADLINE):
                    nc = await nats.connect(
                        url,
                        name=name,
                        # a few tries for the first connection, so a wrong URL fails fast...
                        max_reconnect_attempts=3,
                        reconnect_time_wait=0.2,
                        connect_timeout=2,
                        allow_reconnect=True,
                        # a server cut off by a partition answers nothing and closes
                        # nothing: noticed after PINGS_OUT unanswered pings, not nats-py's
                        # 2 x 120 s, then the connection moves to another server
                        ping_interval=PING_INTERVAL,
                        max_outstanding_pings=PINGS_OUT,
                        reconnected_cb=reconnected,
                        error_cb=on_error,
                        **options,
                    )
            except (OSError, nats.errors.Error, TimeoutError) as exc:
                failed = exc
            tg.cancel_scope.cancel()
        if nc is None:
            refused = [e for e in errors if "authorization violation" in str(e).lower()]
            if refused:
                raise ConfigError(
                    f"NATS at {shown} refused the credentials ({method}): "
                    "authorization violation (a wrong user, password, token, key or "
                    "certificate, or one the server does not know)"
                )
            last = errors[-1] if errors else failed
            raise ConnectionLost(
                f"cannot connect to NATS at {shown} ({method}): {last or type(last).__name__}"
            )
        # ...and once connected, reconnect for as long as it takes (a server restart)
        nc.options["max_reconnect_attempts"] = -1
        layout = Layout(namespace)
        if region is not None:
            try:
                layout, meta = await find_layout(nc, namespace, region)
            except BaseException:
                await nc.close()
                raise
        store = cls(nc, layout, replicas=replicas, tokens_max_age=tokens_max_age)
        if region is not None:
            store.region, store.partner = region, partner
            store.recorded_partitions = meta.partitions
            try:
                await store._listen_for_promotion()
            except BaseException:
                await nc.close()
                raise
        store.auth_method = method
        made.append(store)
        return store

    # -- the self-fencing lease ------------------------------------------------------

    def hold_lease(self) -> None:
        """A worker of this process starts: from now on an append waits unless the
        lease is held (until the first renewal: at once)."""
        self._lease_holders += 1
        self.lease_until = min(self.lease_until, time.monotonic())

    def release_lease(self) -> None:
        """A worker of this process stopped: with none left, no lease is needed (the
        engine's own starts and writes go on)."""
        self._lease_holders -= 1
        if self._lease_holders <= 0:
            self._lease_holders = 0
            self.lease_until = math.inf
            self._wake_lease_waiters()

    async def renew_lease(self, lease: float) -> bool:
        """Prove that this process still reaches the quorum of the JetStream meta group,
        and hold the lease for ``lease`` seconds from the attempt if it does. The proof
        is a write only the meta quorum commits: an ephemeral consumer on the journal
        stream (1 s of inactivity removes it); reads prove nothing (a cut-off region
        serves ``STREAM.INFO`` and Direct Gets from its own copy). A meta leader that
        says the stream is gone (the namespace failed over) answered too: the epoch
        fences what this process appends then. Returns whether it was renewed (the
        lease held before lasts until ``lease_until`` either way)."""
        began = time.monotonic()
        config = ConsumerConfig(
            description="fusee: a worker's lease renewal (removed after 1 s)",
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            filter_subject=f"{self.layout.namespace}.in.x.lease.renewal",  # (never written)
            inactive_threshold=1.0,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            with anyio.fail_after(min(lease / 2, 5.0)):
                await self.js.add_consumer(self.layout.stream, config)
        except nats.js.errors.NotFoundError:
            pass  # the meta leader answered: the stream failed over
        except (TimeoutError, nats.errors.Error, OSError):
            return False
        self.lease_until = began + lease
        self._lease_waits_told = False
        self._wake_lease_waiters()
        return True

    def _wake_lease_waiters(self) -> None:
        """The appends waiting for the lease look again (:meth:`_await_lease`)."""
        self._lease_renewed.set()
        self._lease_renewed = anyio.Event()

    async def _commit(self, item: Pending) -> int:
        """``item`` through the group committer, once this process holds its lease (a
        worker of a regional namespace whose lease ran out waits for the next renewal,
        or raises ``ConnectionLost`` at the append's ``give_up``)."""
        if self._lease_holders:
            await self._await_lease(item)
        return await self.committer.append(item)

    async def _await_lease(self, item: Pending) -> None:
        """Return once this process holds its region lease; ``ConnectionLost`` at the
        item's ``give_up`` (nothing more sent)."""
        if self.lease_until > time.monotonic():
            return
        if not self._lease_waits_told:  # once per lapse
            self._lease_waits_told = True
            log.warning("region.lease_wait", run_id=unescape(item.eid), record=item.kind)
        with anyio.move_on_after(max(0.0, item.give_up - time.monotonic())):
            while self.lease_until <= time.monotonic():
                await self._lease_renewed.wait()
        if self.lease_until <= time.monotonic():
            raise ConnectionLost(
                f"{_record_of(item.kind, item.eid)}: this worker's region lease ran out "
                "(it does not reach the JetStream meta quorum: a partition?), and it was "
                "not sent while it was out (a try sent before may have landed: a retry "
                "with the same msg_id and fence finds out)"
            )

    # -- following a failover ------------------------------------------------------

    @property
    def follows_failover(self) -> bool:
        """Whether this process follows its namespace to the epoch a failover makes
        (:meth:`follow_epoch`): a client does; a process that runs a worker, or makes
        the failover, does not (set it to False before it appends anything)."""
        return self._follows

    @follows_failover.setter
    def follows_failover(self, value: bool) -> None:
        self._follows = value
        if not value and self._advisories is not None:
            sub, self._advisories = self._advisories, None
            task = asyncio.get_running_loop().create_task(sub.unsubscribe())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _listen_for_promotion(self) -> None:
        """Subscribe to the advisory of the next epoch's journal stream being updated
        (a failover promotes that mirror by a stream update)."""
        if self._advisories is not None:
            await self._advisories.unsubscribe()
            self._advisories = None
        if self._follows and self.layout.regional:
            nxt = epoch_stream(self.layout.namespace, self.layout.epoch + 1)
            self._advisories = await self.nc.subscribe(
                f"{STREAM_UPDATED}.{nxt}", cb=self._on_stream_updated
            )

    async def _on_stream_updated(self, _msg: Any) -> None:
        self.epoch_may_have_moved()

    def _watch_lost_its_stream(self) -> bool:
        """The result watch found no journal stream: whether to wait for this store to
        follow a failover (a client's; a worker's store never moves)."""
        self.epoch_may_have_moved()
        return self.layout.regional and self._follows and self.region is not None

    def epoch_may_have_moved(self) -> None:
        """Check in the background whether the namespace failed over, and follow it
        (:meth:`follow_epoch`): one check at a time, another after it when asked again
        meanwhile, and again with backoff while the check fails."""
        if not self.layout.regional or not self._follows or self.region is None:
            return
        self._recheck = True
        if self._following is None or self._following.done():
            self._following = asyncio.get_running_loop().create_task(self._follow_loop())

    async def _follow_loop(self) -> None:
        delay = 0.5
        while self._recheck and self._follows and not self.nc.is_closed:
            self._recheck = False
            try:
                await self.follow_epoch()
            except Exception as exc:  # noqa: BLE001 - logged, and tried again
                log.warning("region.follow_failed", error=f"{type(exc).__name__}: {exc}")
                self._recheck = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def follow_epoch(self) -> bool:
        """If the namespace failed over since this process connected (its journal is a
        later epoch's stream), take that epoch's layout and do what a connect there
        does: the streams and buckets made if missing (the new home's first process
        makes them), the new work bucket's secret read; the token streams and the
        result watch (whose waiters read again) follow, and the ``followed`` hooks run
        (the engine's API tokens). Returns whether it moved. A process running a
        worker never moves (``follows_failover`` is off): its actors' appends stay
        fenced by their epoch, and the worker is restarted against the new home."""
        if not self.layout.regional or not self._follows or self.region is None:
            return False
        if not self._follow_pending:
            # the meta group names the current stream (find_layout would ask the stream
            # itself, 5 s of patience when its region is lost): moved, then read it
            ns = self.layout.namespace
            current = await current_stream(self.nc, ns, self._setup_refused)
            epoch = epoch_of_stream(ns, current) if current is not None else None
            if epoch is None or epoch <= self.layout.epoch:
                return False
            layout, meta = await find_layout(self.nc, ns, self.region)
            if layout.epoch <= self.layout.epoch or not self._follows:
                return False
            before = self.layout
            self.layout = layout
            self._follow_pending = True
            self.recorded_partitions = meta.partitions
            self.tokens.follow(layout)
            self.auth.follow_epoch(layout)
            self.journal_watch.follow(layout)  # its waiters read again, from the new stream
            self.replicated = None
            self._work_listed, self._listed_upto = {}, None  # read from the old bucket
            log.warning(
                "region.followed", from_epoch=before.epoch, epoch=layout.epoch,
                from_home=before.home, home=layout.home, stream=layout.stream,
            )  # fmt: skip
        # what a connect in the new epoch does (tried again until it is done); hooks
        # may run again after a failure, so each must be idempotent
        try:
            await self.ensure_layout()
            if self.recorded_partitions is not None:
                partitions = str(self.recorded_partitions).encode()
                await self.init_config("config.partitions", partitions)
        except ConfigError as exc:  # these credentials may not make them: a worker will
            log.warning("region.follow_setup_refused", error=str(exc))
        if self.completion_secret:  # the promoted work bucket's (a new one's without its mirror)
            self.completion_secret = await self.load_secret()
        await self._listen_for_promotion()
        for hook in list(self.followed):
            await hook()
        self._follow_pending = False
        return True

    def note_denied(self, subject: str, message: str) -> None:
        """Remember that the server refused this connection ``subject`` (a permission
        violation it reports on the side), and log it once per subject (once per
        stream for a consumer's API call: each consumer has a name of its own)."""
        if subject.startswith("$js.api.consumer."):
            subject = subject.rpartition(".")[0]
        if (refused := self._refusals.pop(subject, None)) is not None:
            refused.cancel()
        if subject not in self.denied:
            self.denied[subject] = message
            # what a role is expected to be refused, and fusee does without: deleting an
            # ordered consumer (the server drops it when idle), an inbox trim, a wake
            # hint (the owner follows every inbox), the namespace's secret (a client's
            # connect asks; see load_secret); anything else is a misconfiguration
            lay = self.layout
            expected = (
                "$js.api.consumer.delete.",
                f"$js.api.stream.purge.{lay.stream}".lower(),
                lay.wake(0).rpartition(".")[0].lower() + ".",
                SECRET_READ.format(
                    stream=lay.kv_stream(lay.work_bucket), bucket=lay.work_bucket
                ).lower(),
                STREAM_UPDATED.lower(),  # a regional client's follow (no role has it yet)
            )
            level = log.debug if subject.startswith(expected) else log.warning
            level("nats.permission_denied", subject=subject, error=message)

    def refusal(self, *subjects: str) -> Callable[[], PermissionDenied | None]:
        """For ``retrying(refused=...)``: the error to raise at once when the server
        refused this connection a publish to one of ``subjects`` (a denied publish
        looks like a timeout to nats-py), naming the subject and the role it takes."""

        def check() -> PermissionDenied | None:
            for subject in subjects:
                if self.is_denied(subject):
                    role = role_for(self.layout.namespace, subject)
                    return PermissionDenied(
                        f"NATS refused these credentials ({self.auth_method}) a publish "
                        f"to {subject}: nothing was stored; it takes the {role} role of "
                        "nats/accounts.conf (see docs/reference/nats-permissions.md)"
                    )
            return None

        return check

    def _work_subject(self, key: str) -> str:
        return f"$KV.{self.layout.work_bucket}.{key}"

    def is_denied(self, subject: str) -> bool:
        """Whether the server refused this connection a publish to ``subject`` (the
        server's message lowercases it)."""
        return subject.lower() in self.denied

    @property
    def max_payload(self) -> int:
        """The server's message limit (``max_payload`` in its INFO), headers included."""
        return int(self.nc.max_payload)

    @property
    def max_value(self) -> int:
        """The largest value one record may carry: ``max_payload`` less
        ``VALUE_HEADROOM`` for the record around it."""
        return max(0, self.max_payload - VALUE_HEADROOM)

    def _check_fits(
        self, subject: str, data: bytes, headers: dict[str, str], what: str | Callable[[], str]
    ) -> None:
        """Refuse a message the server would refuse (it counts the headers too, and
        closes the connection of a client that sends one), before it is sent. ``what``
        may be a callable: called only when the message does not fit."""
        size = len(data) + len(subject) + 12 + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if size > self.max_payload:
            raise NotEncodable(
                f"{what() if callable(what) else what} would be a message of {size:,} "
                f"bytes, over the NATS server's max_payload of {self.max_payload:,} bytes"
            )

    async def close(self, timeout: float = 1.0) -> None:
        """Stop the committer, then drain the connection (flush what is sent, let
        subscriptions finish) for at most ``timeout`` seconds: with the server stalled
        or gone there is nothing to wait for, the connection is closed as it is (in a
        second at most)."""
        self._follows = False  # (a follow begun now would race the close)
        if self._following is not None and not self._following.done():
            self._following.cancel()
            await asyncio.wait([self._following], timeout=timeout)
        await self.committer.close()
        with anyio.move_on_after(timeout):
            await self.journal_watch.settled()
        with anyio.move_on_after(timeout):
            with contextlib.suppress(*TRANSIENT, nats.errors.ConnectionDrainingError):
                await self.nc.drain()
                return
        with anyio.move_on_after(1.0), contextlib.suppress(Exception):
            await self.nc.close()

    # -- layout -----------------------------------------------------------------------

    async def ensure_layout(self) -> None:
        """Create the stream and buckets if they are missing (idempotent).

        Raises:
            ConfigError: the server refused what this needed (a credential that may not
                create or update streams, and the namespace is new, or its token
                retention changed): named, with the way out.
        """
        try:
            await self._ensure_layout()
        except _SETUP_ERRORS:
            if (refused := self._setup_refused()) is not None:
                raise refused from None
            raise

    def _setup_refused(self) -> ConfigError | None:
        """For ``retrying(refused=...)`` while the layout is set up: once the server has
        refused this connection anything (a denied request looks like a timeout to
        nats-py), the error naming what it refused, instead of asking again."""
        if not self.denied:
            return None
        refused = ", ".join(sorted(self.denied))
        return ConfigError(
            f"namespace {self.layout.namespace!r}: the server refused these "
            f"credentials {refused} while setting up its streams and buckets; "
            "connect once with the admin credentials to create them (or to change "
            "token_retention), see docs/reference/nats-permissions.md"
        )

    async def _ensure_layout(self) -> None:
        lay, refused = self.layout, self._setup_refused
        config = journal_stream_config(lay, self.replicas)
        # Each call is tried again while NATS does not answer: a cluster that has just
        # elected its meta leader, or a loaded one, may take longer than one request's
        # 5 s to create an R3 stream (an add that did land is answered as such again).
        try:
            info = await retrying(self.js.stream_info, lay.stream, refused=refused)
            self.replicated = (info.config.num_replicas or 1) > 1
            self._check_home(info.config.metadata)
        except nats.js.errors.NotFoundError:
            if not lay.regional:
                await self._refuse_failed_over()
            self.replicated = self.replicas > 1
            try:
                await retrying(self.js.add_stream, config, refused=refused)
            except nats.js.errors.BadRequestError:  # a concurrent maker: whose home won?
                if lay.regional:
                    info = await retrying(self.js.stream_info, lay.stream, refused=refused)
                    self._check_home(info.config.metadata)
        values = values_stream_config(lay, self.replicas)
        try:
            await retrying(self.js.stream_info, lay.values_stream, refused=refused)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):
                await retrying(self.js.add_stream, values, refused=refused)
        self._runs = await self._bucket("runs")
        self._work = await self._bucket("work")
        self._objects = await self._bucket("objects")
        await self.tokens.ensure(refused)  # token streams: <NS>_TOKENS (see tokens.py)

    def _check_home(self, metadata: dict[str, str] | None) -> None:
        """The journal stream's recorded home must be the one this process writes for:
        a process without a region on a regional namespace would append without the
        epoch fence, and two first processes of different regions race to make it."""
        home = RegionMeta.from_metadata(metadata, self.layout.epoch).home
        if home == self.layout.home:
            return
        ns = self.layout.namespace
        if self.layout.home is None:
            raise ConfigError(
                f"namespace {ns!r} has regions (its home is {home!r}): connect with "
                "region= ($FUSEE_REGION for every fusee command, or fusee worker "
                "--region), so that its appends carry the epoch"
            )
        raise ConfigError(
            f"namespace {ns!r} was made with its home in {home!r} by another process at "
            f"the same time, not in {self.layout.home!r}: connect again"
        )

    async def _refuse_failed_over(self) -> None:
        """A process without a region found no stream ``<NS>``: unless the namespace is
        new, it failed over (its journal is a later epoch's stream), and this process
        must say so rather than make an empty ``<NS>`` beside it."""
        current = await current_stream(self.nc, self.layout.namespace, self._setup_refused)
        if current is None:  # (or it is failing over: a mirror waits for its promotion)
            current = await pending_promotion(self.nc, self.layout.namespace, self._setup_refused)
        if current is not None and current != self.layout.stream:
            raise ConfigError(
                f"namespace {self.layout.namespace!r} has regions: its journal is stream "
                f"{current} now (it failed over); connect with region= ($FUSEE_REGION "
                "for every fusee command, or fusee worker --region)"
            )

    async def ensure_mirror(self, partitions: int) -> None:
        """Make the partner region's mirrors of the namespace's streams and buckets, if
        this process names a partner and they are missing (``regions.ensure_mirror``)."""
        if self.partner is not None and self.partner != self.layout.home:
            await ensure_mirror(
                self.js, self.layout, self.partner, self.replicas, partitions,
                tokens=self.tokens.config(), refused=self._setup_refused,
            )  # fmt: skip

    async def mirror_lag(self) -> MirrorLag | None:
        """How far the journal's mirror is behind (None: the namespace has none)."""
        return await mirror_lag(self.js, self.layout)

    async def open_listings(self) -> None:
        """What a worker of this version does once before it serves: note where the
        final entries with a listing entry begin (:meth:`note_listed_from`), and list
        the runs an earlier version paused (:meth:`list_old_pauses`; a worker does that
        in the background, and tries again when it fails). Workers only: they write
        listing entries; a reader (``fusee runs list``) changes nothing stored."""
        await self.note_listed_from()
        await self.list_old_pauses()

    async def note_listed_from(self) -> None:
        """Set ``config.listed_from`` if it is not set: the stream's last sequence when a
        worker that writes listing entries first opened the namespace (see
        :meth:`legacy_pages`). Before such a worker ends a run."""
        if await self._config(LISTED_FROM) is None:
            await self.init_config(LISTED_FROM, str(await self._last_seq()).encode())

    async def list_old_pauses(self, *, page: int = 500) -> None:
        """List the runs an earlier version paused, once per namespace
        (``config.paused_listed`` once done; see :meth:`_list_old_pauses`), reading
        ``page`` entries of the ``<ns>_runs`` bucket at a time.

        Raises:
            FuseeError: NATS did not answer (``ConnectionLost``) or refused a read; a
                later call does it again from the start (it creates only the entries
                that are missing).
        """
        if await self._config(PAUSED_LISTED) is None:
            await self._list_old_pauses(page)
            await self.init_config(PAUSED_LISTED, b"1")

    async def _last_seq(self) -> int:
        """The journal stream's last sequence."""
        info = await retrying(self.js.stream_info, self.layout.stream, what="the stream's info")
        return int(info.state.last_seq)

    async def _list_old_pauses(self, page: int) -> None:
        """A listing entry for each run the ``<ns>_runs`` bucket holds as paused and
        that has no final entry: a pause of an earlier version has none, and a run
        nothing pokes is never activated to write it. The bucket is read a page at a
        time (one batched Direct Get of its stream, whose history is 1: a key's last
        value only; a key updated meanwhile moves ahead and is met again), and the
        final entries of a page's paused runs in one more (an earlier version's
        :meth:`end_run` left the bucket's entry as it was: an ended run may read paused
        there). Created only where none is (an expected last sequence of 0 on the
        listing's subject), so a newer pause's entry is never replaced; a listing of a
        run resumed since is found stale by its readers and pruned. Once per namespace
        (a worker that fails before it is done leaves it to a later try)."""
        bucket, prefix = (
            self.layout.kv_stream(self.layout.runs_bucket),
            f"$KV.{self.layout.runs_bucket}.",
        )
        with lost_on_transient("listing earlier pauses"):
            async for found in direct_pages(self.nc, bucket, prefix + ">", 1, page):
                paused: dict[str, bytes] = {}
                for msg in found:
                    info = info_or_none(msg.data) if msg.data else None
                    if info is not None and info.status == "paused":
                        paused[msg.subject[len(prefix) :]] = msg.data
                if not paused:
                    continue
                subjects = [self.layout.index_entry(eid) for eid in paused]
                for final in await direct_last(self.nc, self.layout.stream, subjects):
                    if final.data:
                        paused.pop(final.subject[len(self.layout.index_entry("")) :], None)
                for eid, value in paused.items():
                    listed = self._listed(eid, value, 0)
                    if listed is not None:
                        subject, data, headers = listed
                        await self._publish_expecting(subject, data, {**headers, EXPECTED_SEQ: "0"})

    async def _publish_expecting(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> int | None:
        """Publish a message whose headers expect a last sequence (``EXPECTED_SEQ``, of
        the subject or of ``EXPECTED_SUBJECT``): its stream sequence, or None when the
        expectation did not hold (nothing stored)."""
        try:
            ack = await self._retrying_in_epoch(
                lambda: f"the write of {subject}",
                self.js.publish,
                subject,
                data,
                5.0,
                None,
                headers,
                refused=self.refusal(subject),
            )
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code not in WRONG_LAST:
                raise
            return None
        return int(ack.seq)

    async def _bucket(self, kind: str) -> KeyValue:
        bucket = self.layout.bucket(kind)
        kv = await open_bucket(
            self.js, self.layout, bucket, create=True, replicas=self.replicas,
            description=DESCRIPTIONS[kind], refused=self._setup_refused,
            fence=BucketFence(
                lambda: self.layout.regional and not self._follows,
                lambda: self._epoch_over(f"a write to bucket {bucket}", self.layout.kv_stream(bucket)),
            ),
        )  # fmt: skip
        assert kv is not None
        return kv

    @property
    def runs(self) -> KeyValue:
        assert self._runs is not None, "ensure_layout() first"
        return self._runs

    @property
    def work(self) -> KeyValue:
        assert self._work is not None, "ensure_layout() first"
        return self._work

    # -- the journal ----------------------------------------------------------------

    async def append(
        self,
        eid: str,
        kind: str,
        data: bytes,
        *,
        fence: int,
        msg_id: str,
        unlist: str | None = None,
        rollup: bool = False,
    ) -> int:
        """Append one record under the actor's fence; returns its stream sequence.
        ``rollup``: it replaces the earlier records on its subject (``Nats-Rollup: sub``;
        the fence's subtree then ends at it, so the next append expects it as before).

        Under load, records of many actors share one atomic batch (see ``commit.py``).
        ``unlist``: the run's workflow, whose paused listing entry goes in the same
        write (``run.resumed``: the run is not paused any more).

        Raises:
            Fenced: another writer appended since ``fence``.
        """
        headers = self._fenced_headers(eid, kind, fence, msg_id)
        if rollup:
            headers[ROLLUP] = "sub"
        subject = self.layout.record(eid, kind)
        self._check_fits(subject, data, headers, lambda: _record_of(kind, eid))
        give_up = time.monotonic() + patience()
        riders = () if unlist is None else (self._unlisted("paused", unlist, eid),)
        item = Pending(subject, data, headers, eid, fence, msg_id, kind, give_up, riders=riders)
        return await self._commit(item)

    async def start_run(
        self, eid: str, kind: str, data: bytes, *, partition: int, marker: bytes, msg_id: str
    ) -> int:
        """Append a run's first record (fence 0: create-if-absent) and its active marker
        (``Layout.marker``, holding ``marker``) in one atomic batch: the run exists with
        its marker or not at all. Under load it shares a group commit's batch.

        Raises:
            Fenced: the run exists.
        """
        headers = self._fenced_headers(eid, kind, 0, msg_id)
        subject = self.layout.record(eid, kind)
        self._check_fits(subject, data, headers, lambda: _record_of(kind, eid))
        rider = (self.layout.marker(partition, eid), marker, {KIND: MARKER_KIND, ROLLUP: "sub"})
        give_up = time.monotonic() + patience()
        item = Pending(subject, data, headers, eid, 0, msg_id, kind, give_up, riders=(rider,))
        return await self._commit(item)

    # Store calls made in this context retry for this long (see ``direct.retrying_for``).
    retrying_for = staticmethod(retrying_for)

    def _fenced_headers(self, eid: str, kind: str, fence: int, msg_id: str) -> dict[str, str]:
        headers = {
            KIND: kind,
            EXPECTED_SEQ: str(fence),
            EXPECTED_SUBJECT: self.layout.tree(eid),
            MSG_ID: msg_id,
        }
        if self.layout.regional:
            # the epoch fence: only this epoch's journal stream may store the record
            # (a writer of an earlier epoch gets 10060 from the promoted one)
            headers[EXPECTED_STREAM] = self.layout.stream
            headers[EPOCH] = str(self.layout.epoch)
        return headers

    def _in_epoch(self, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` of a write into the journal stream outside a run's fence (an
        inbox message, a timer, a marker or its removal, an index or listing entry),
        naming this epoch's stream when this process does not follow a failover (a
        worker's): an earlier epoch's write that reaches the new home through the
        gateways is refused (10060, raised as :class:`FailedOver`, or :class:`Fenced` for
        one that goes through the committer) instead of stored there, as a fenced
        append is. A client's go wherever the namespace lives now."""
        if self.layout.regional and not self._follows:
            headers[EXPECTED_STREAM] = self.layout.stream
        return headers

    def _in_bucket_epoch(self, headers: dict[str, str], bucket: str) -> dict[str, str]:
        """``headers`` of a write into ``bucket`` made without its KV client (a state
        projection, a run's index entry), naming the bucket's stream of this epoch as
        :meth:`_in_epoch` does the journal's (``buckets.BucketFence``)."""
        if self.layout.regional and not self._follows:
            headers[EXPECTED_STREAM] = self.layout.kv_stream(bucket)
        return headers

    def _epoch_over(self, what: str, stream: str | None = None, epoch: str | None = None) -> str:
        """What to say of a write the server refused because its stream is no longer
        this epoch's (10060); a following process checks where the namespace went."""
        self.epoch_may_have_moved()  # a client follows (a worker's store does not)
        return (
            f"{what}: epoch {epoch or self.layout.epoch} of namespace "
            f"{self.layout.namespace!r} is over (its stream is no longer "
            f"{stream or self.layout.stream}: the namespace failed over to another region)"
        )

    async def _retrying_in_epoch(
        self,
        told: str | Callable[[], str],
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """``retrying(fn, *args, **kwargs)``, a write into one of this epoch's streams
        (``told``: what it writes, or a function that says it, called for an error
        only), with a refusal for the epoch (10060) raised as :class:`FailedOver` (an
        actor's stops on it as on a fence; a caller of the engine's API gets an error)."""
        stream = kwargs.pop("stream", None)  # the stream it names, if not the journal's
        try:
            return await retrying(fn, *args, **kwargs)
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_STREAM and self.layout.regional:
                what = told if isinstance(told, str) else told()
                raise FailedOver(self._epoch_over(what, stream)) from None
            raise

    async def _append_alone(self, item: Pending) -> int:
        """:meth:`_append_once`, each try sent only while this process holds its region
        lease (a worker's, see :meth:`renew_lease`): tries that would go on after the
        lease ends stop there, wait for the next renewal, and go on with the same
        ``msg_id`` and fence (dedupe or the read-back tells a landed earlier try). So at
        most one try, sent before the lease ended, lands after it."""
        while True:
            if self._lease_holders:
                await self._await_lease(item)
                bound = min(item.give_up, self.lease_until)
            else:
                bound = item.give_up
            try:
                return await self._append_once(item, bound)
            except ConnectionLost:
                now = time.monotonic()
                if self._lease_holders and self.lease_until <= now < item.give_up:
                    continue  # the lease ran out during the tries
                raise

    async def _append_once(self, item: Pending, give_up: float) -> int:
        """Append one record (``item``: its message, prepared by :meth:`append`) under
        the actor's fence; returns its stream sequence.

        Its ``fence`` is the last sequence the writer saw under ``<ns>.run.<id>.>`` (0: the
        journal must not exist yet). A retry after a lost reply carries the same
        ``msg_id``: when the server refuses it (10071 on R1, 10201 for batches), the
        last record tells whether this write landed or another writer's did. Retries
        stop at ``give_up`` (a ``time.monotonic()`` instant; ``math.inf``: never).

        A batch refused for the batches in flight (10176: nothing stored) is tried
        again like a lost reply, with a new batch id and the same ``msg_id`` and fence.

        Raises:
            Fenced: another writer appended since ``fence``.
            StorageFull: the server has no storage left (nothing was stored).
            ConnectionLost: NATS did not answer until ``give_up`` (the record may have
                landed: a retry with the same ``msg_id`` and fence finds out), or
                refused the batch for the batches in flight until then (nothing stored).
            FuseeError: NATS refused the write for another reason (nothing stored).
        """
        eid, fence, msg_id = item.eid, item.fence, item.msg_id
        try:
            # The server down or electing a leader: the same msg_id and fence again;
            # dedupe or the read-back below sorts it out.
            if item.riders:  # with its riders, in one atomic batch: both or neither
                messages: list[Message] = [(item.subject, item.data, item.headers)]
                messages.extend(item.riders)
                seq = await retrying(
                    publish_batch,
                    self.nc,
                    messages,
                    2.0,
                    self.committer.in_flight,
                    what=lambda: _record_of(item.kind, eid),
                    give_up=give_up,
                    refused=self.refusal(*(m[0] for m in messages)),
                )
                return seq - len(item.riders)
            seq = await retrying(
                publish_acked,
                self.nc,
                item.subject,
                item.data,
                item.headers,
                2.0,
                what=lambda: _record_of(item.kind, eid),
                give_up=give_up,
                refused=self.refusal(item.subject),
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_STREAM and self.layout.regional:
                raise Fenced(
                    self._epoch_over(
                        f"journal of {eid}",
                        item.headers.get(EXPECTED_STREAM),
                        item.headers.get(EPOCH),
                    )
                ) from None
            if exc.err_code not in (*WRONG_LAST, BATCH_DUPLICATE):
                # not a fence, not for now (``retrying`` retries those): a refusal
                # that stored nothing, named as fusee's
                raise FuseeError(
                    f"NATS refused {_record_of(item.kind, eid)}: err_code {exc.err_code} "
                    f"{exc.description or type(exc).__name__}; nothing was stored"
                ) from exc
            with self.retrying_for(max(0.0, give_up - time.monotonic())):
                last = await self.last_in_journal(eid)  # as patient as the append
            if last is not None and last.headers.get(MSG_ID) == msg_id:
                return last.seq  # our earlier try landed; its reply was lost
            raise Fenced(f"journal of {eid} moved past sequence {fence}") from None
        return seq  # a duplicate ack names the original, which is ours

    # -- values stored out of line ----------------------------------------------------

    async def put_value(self, eid: str, data: bytes) -> ValueRef:
        """Store ``data`` (a step's result too large for a record) in the values stream,
        in chunks of ``max_value`` bytes, one subject each, named by its digest: a
        retry, or another writer of the same value, writes the same bytes again."""
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        size = max(1, self.max_value)
        chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
        for i, chunk in enumerate(chunks):
            subject = self.layout.value(eid, digest, i)
            self._check_fits(subject, chunk, {}, f"chunk {i} of a value of {unescape(eid)!r}")
            await self._retrying_in_epoch(
                lambda: f"a value of {unescape(eid)!r}",
                self.js.publish,
                subject,
                chunk,
                5.0,
                self.layout.values_stream,
            )
        return ValueRef(run=eid, digest=digest, size=len(data), chunks=len(chunks))

    async def get_value(self, ref: ValueRef) -> bytes:
        """The bytes of a value stored out of line, checked against its reference."""
        parts: list[bytes] = []
        for i in range(ref.chunks):
            subject = self.layout.value(ref.run, ref.digest, i)
            raw: RawStreamMsg | None
            try:
                raw = await retrying(self.js.get_last_msg, self.layout.values_stream, subject, True)
            except nats.js.errors.NotFoundError:
                raw = None
            if raw is None:
                # the replica that answered may not hold it yet (R3: a quorum is the
                # leader and one follower): ask the leader before calling it missing
                raw = await self._leader_value(subject)
            if raw is None:
                raise JournalGap(
                    f"run {unescape(ref.run)!r}: chunk {i} of the value {ref.digest} "
                    f"({ref.size:,} bytes, stored out of line) is missing"
                ) from None
            parts.append(raw.data or b"")
        data = b"".join(parts)
        if len(data) != ref.size or hashlib.blake2b(data, digest_size=16).hexdigest() != ref.digest:
            raise JournalGap(
                f"run {unescape(ref.run)!r}: the value {ref.digest} stored out of line is "
                f"not the one the journal names ({len(data):,} bytes, not {ref.size:,})"
            )
        return data

    async def _leader_value(self, subject: str) -> RawStreamMsg | None:
        try:
            return await retrying(self.js.get_last_msg, self.layout.values_stream, subject, False)
        except nats.js.errors.NotFoundError:
            return None

    async def read_inbox(
        self, partition: int, eid: str, after: int = 0, *, limit: int = 0
    ) -> list[StoredMsg]:
        """What others sent the run (signals, cancels, invocations, fired timers), above
        sequence ``after``: all of it, or the first ``limit`` messages; on R3 too, every
        message acknowledged before the call is in it (checked against the leader)."""
        return await self._read_checked(
            self.layout.inbox(partition, eid), after + 1, limit, f"the inbox of {unescape(eid)!r}"
        )

    async def purge_inbox(self, partition: int, eid: str, below: int) -> None:
        """Remove the inbox messages of ``eid`` under sequence ``below`` (a subject
        purge of ``<ns>.in.<p>.<eid>`` only: the marker ``….a`` and timers ``….t<pos>``
        are other subjects; the journal stream allows purges, see
        ``journal_stream_config``).

        A trim, not needed for correctness: with a credential that may not purge (the
        worker role of ``nats/accounts.conf``) the server refuses it, which nats-py sees
        as a timeout; from the refusal on this connection skips every trim (the inbox
        keeps what an admin may purge, see docs/reference/nats-permissions.md)."""
        api = f"$JS.API.STREAM.PURGE.{self.layout.stream}"

        async def purge() -> None:
            if self.is_denied(api):
                raise _Denied
            await self.js.purge_stream(self.layout.stream, below, self.layout.inbox(partition, eid))

        with contextlib.suppress(_Denied):
            await retrying(purge, what=lambda: f"purging the inbox of {unescape(eid)!r}")

    async def send_inbox(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int:
        """Store a message in the run's inbox (outside its fence); returns its sequence.
        A ``msg_id`` makes a retry within the dedupe window (2 min) store nothing new."""
        return await self._publish_inbox(partition, eid, kind, body, msg_id)

    async def send_inbox_once(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str
    ) -> tuple[int, bool]:
        """Like :meth:`send_inbox`, and says whether the server took it for a duplicate of
        an earlier message with ``msg_id`` (then the sequence is the earlier one's)."""
        subject, headers, what = self._inbox_message(partition, eid, kind, body, msg_id)
        return await self._retrying_in_epoch(
            what,
            publish_acked_once,
            self.nc,
            subject,
            body,
            headers,
            5.0,
            what=what,
            refused=self.refusal(subject),
        )

    async def send_unless_ended(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int | None:
        """Store a message in the run's inbox unless the run has ended: the publish
        expects nothing on the run's ``.end`` subject (``Layout.ends``), so the server
        checks it in the same write. Returns the message's sequence, or None when the
        run had ended (nothing stored). A journal of an earlier version has its end
        record on ``.j``, which this does not see."""
        try:
            return await self._publish_inbox(partition, eid, kind, body, msg_id, unless_ended=True)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code not in WRONG_LAST:
                raise
            return None

    def _inbox_message(
        self,
        partition: int,
        eid: str,
        kind: str,
        body: bytes,
        msg_id: str | None,
        *,
        unless_ended: bool = False,
    ) -> tuple[str, dict[str, str], Callable[[], str]]:
        """The subject, headers and description of a message to the run's inbox (the
        description made only for an error: unescaping an ID costs µs)."""
        headers = self._in_epoch({KIND: kind})
        if msg_id is not None:
            headers[MSG_ID] = msg_id
        if unless_ended:
            headers[EXPECTED_SEQ], headers[EXPECTED_SUBJECT] = "0", self.layout.ends(eid)
        subject = self.layout.inbox(partition, eid)

        def what() -> str:
            return f"the {kind} message to {unescape(eid)!r}"

        self._check_fits(subject, body, headers, what)
        return subject, headers, what

    async def _publish_inbox(
        self,
        partition: int,
        eid: str,
        kind: str,
        body: bytes,
        msg_id: str | None,
        *,
        unless_ended: bool = False,
    ) -> int:
        # the ack comes on the connection's reply subscription (``publish_acked``), as a
        # step commit's does: a signal's own path costs a loop trip and a PubAck less
        subject, headers, what = self._inbox_message(
            partition, eid, kind, body, msg_id, unless_ended=unless_ended
        )
        return await self._retrying_in_epoch(
            what,
            publish_acked,
            self.nc,
            subject,
            body,
            headers,
            5.0,
            what=what,
            refused=self.refusal(subject),
        )

    async def init_config(self, key: str, value: bytes) -> bytes:
        """The namespace setting ``key`` (in the work bucket), stored as ``value`` by the
        first client that asks: ``create`` lets concurrent first clients agree."""
        entry = await self._config(key)
        if entry is None:
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await retrying(self.work.create, key, value)
            # as the bucket's leader has it: on R3 a follower may not hold yet what was
            # just created (the cluster drill's worker read "vanished" so)
            entry = await self._config(key, leader=True)
        if entry is None:  # pragma: no cover - created above, and the bucket keeps it
            raise FuseeError(f"{key} in {self.layout.work_bucket} vanished as it was made")
        return entry

    async def _config(self, key: str, *, leader: bool = False) -> bytes | None:
        if not leader:
            try:
                entry = await retrying(self.work.get, key)
            except nats.js.errors.KeyNotFoundError:
                return None
            return entry.value or b""
        bucket = self.layout.work_bucket
        try:
            raw = await retrying(
                self.js.get_last_msg, self.layout.kv_stream(bucket), f"$KV.{bucket}.{key}", False
            )
        except nats.js.errors.NotFoundError:
            return None
        if dict(raw.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return raw.data or b""

    async def load_secret(self, key: str = "config.secret") -> bytes:
        """The namespace's secret (32 random bytes, base64url in the work bucket), made by
        the first client that asks: ``create`` lets concurrent first clients agree.

        Credentials that may not read it (the client role: nats/accounts.conf) get
        ``b""`` as soon as the server refuses the read, not after its timeout; what
        needs the secret then says so (``Engine``)."""
        bucket = self.layout.work_bucket
        stream = self.layout.kv_stream(bucket)
        subject = f"$JS.API.DIRECT.GET.{stream}.$KV.{bucket}.{key}"  # (SECRET_READ's)
        try:
            entry = await self._unless_refused(subject, self.work.get, key)
        except nats.js.errors.KeyNotFoundError:
            fresh = base64.urlsafe_b64encode(secrets.token_bytes(32))
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await self.work.create(key, fresh)
            made = await self._config(key, leader=True)  # (a follower may lag: see above)
            if made is None:  # pragma: no cover - created above, and the bucket keeps it
                raise FuseeError(f"{key} in {bucket} vanished as it was made") from None
            value = base64.urlsafe_b64decode(made)
        else:
            if entry is None:
                return b""
            value = base64.urlsafe_b64decode(entry.value or b"")
        if len(value) < 32:
            raise FuseeError(f"{key} in {bucket} holds fewer than 32 bytes")
        return value

    async def _unless_refused(
        self, subject: str, fn: Callable[..., Awaitable[Any]], *args: Any
    ) -> Any:
        """``fn(*args)``, a read whose request goes to ``subject``, or None once the
        server refuses this connection that subject (nats-py would wait out its
        timeout: a refusal is reported on the side, see ``note_denied``)."""
        low = subject.lower()
        if low in self.denied:
            return None
        with anyio.CancelScope() as refused:  # (cancelled by note_denied)
            self._refusals[low] = refused
            try:
                return await fn(*args)
            finally:
                self._refusals.pop(low, None)
        return None

    async def schedule_timer(
        self, eid: str, partition: int, pos: int, until: float, *, start: int = 0
    ) -> None:
        """A durable timer: a message schedule on ``<ns>.in.<p>.<eid>.t<pos>`` whose message
        lands in the run's inbox at ``until``. Publishing it again replaces it. ``start``
        is the sequence that names the waiting generation (``History.started_seq``).

        It sits outside the run's fenced subtree on purpose: the server writes to the
        schedule's subject when it fires, which would move the owner's fence. Unfenced is
        safe: only a writer whose ``wait.started`` landed under the fence schedules, with
        the journaled time, and a timer only says "the time of wait <pos> has come".
        """
        lay = self.layout
        at = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        headers = self._in_epoch(
            {
                KIND: "timer",
                "Fusee-Pos": str(pos),
                "Nats-Schedule": f"@at {at}",
                "Nats-Schedule-Target": lay.inbox(partition, eid),
            }
        )
        # "start" names the generation (or object invocation) whose wait set it
        body = encode_message(TimerFired(pos=pos, start=start))
        subject = f"{lay.inbox(partition, eid)}.t{pos}"
        await self._retrying_in_epoch(
            lambda: f"the timer of wait {pos} of {unescape(eid)!r}",
            self.js.publish,
            subject,
            body,
            5.0,
            None,
            headers,
            refused=self.refusal(subject),
        )

    async def subscribe_inbox(
        self,
        handler: Callable[[int, str, StoredMsg | None], Awaitable[None]],
        *,
        heartbeat: float = INBOX_HEARTBEAT,
    ) -> Callable[[], Awaitable[None]]:
        """Call ``handler(partition, eid, msg)`` for every message stored in any run's
        inbox from now on (signals, cancels, invocations, fired timers), in stream order:
        how a worker learns that a run it evicted has something to read, and hands a
        running actor its messages without a read. ``msg`` is None for a timer's
        schedule (``<inbox>.t<pos>``), which is not an inbox message. An ordered
        consumer: no gap, no duplicate, also across reconnects.

        nats-py recreates the consumer after the last message it delivered, from
        sequence 1 when it delivered none (every inbox message ever stored, again). So
        the stream's last sequence is read first (the floor: nothing at or below it is
        handed, also after a reset; a read finds it), and the consumer starts with the
        last message stored under ``<ns>.in.>`` (``DeliverPolicy.LAST``: delivered at
        once, where a reset resumes after; a marker, an index entry or a timer's
        schedule as well as an inbox message). Of the messages stored between that read
        and the consumer's creation, the last one is handed (it is above the floor),
        the others are not. A reset before that first delivery still resumes from
        sequence 1: the floor drops the old messages, but the server sends them."""
        prefix = f"{self.layout.namespace}.in."
        floor = await self._last_seq()

        async def on_msg(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            if seq <= floor:
                return  # stored before the subscription: a read finds it
            part, _, rest = msg.subject[len(prefix) :].partition(".")
            eid, dot, tail = rest.partition(".")
            if not part.isdigit() or not eid or tail == "a":
                return  # (a run's active marker: not a message, and its start woke the owner)
            stored = None
            if not dot:
                stored = StoredMsg(seq, msg.subject, msg.data, dict(msg.headers or {}))
            await handler(int(part), eid, stored)

        sub = await self.js.subscribe(
            f"{prefix}>",
            ordered_consumer=True,
            cb=on_msg,
            stream=self.layout.stream,
            # the last one stored (dropped: below the floor), then every new one
            deliver_policy=DeliverPolicy.LAST,
            idle_heartbeat=heartbeat,
        )

        async def unsubscribe() -> None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

        return unsubscribe

    # A journal is read as the run's whole tree: its ``.j`` subject and, since end records
    # have their own (``Layout.ends``), its ``.end`` subject, in stream order.

    #
    # On a replicated stream a Direct Get is answered by any replica, the local one
    # first, and a follower may not hold yet what the leader acknowledged (a quorum is
    # the leader and one follower: the third may be behind; 178 of 3,200 reads right
    # after an ack, tests/integration/test_r3.py). A replica holds a prefix of the
    # stream, so what it returns is a prefix of the answer: it is complete once it
    # reaches the journal's last record, which the leader names (``_leader_last``, one
    # request the leader answers). Then a writer's load sees every record it or another
    # writer was acknowledged, and its fence is the real one.

    async def read_journal(self, eid: str, after: int = 0) -> list[StoredMsg]:
        """Every record of the run's journal with a sequence above ``after``, in order,
        including every record acknowledged before the call (also on R3)."""
        return await self._read_checked(
            self.layout.tree(eid), after + 1, 0, f"the journal of {unescape(eid)!r}"
        )

    async def last_in_journal(self, eid: str) -> StoredMsg | None:
        """The journal's last record, as the leader has it on R3 (what a writer's
        read-back after a refused append and a fence must see)."""
        if await self._replicated():
            return await self._leader_last(self.layout.tree(eid))
        return await retrying(self._last_msg, self.layout.tree(eid), True)

    async def first_in_journal(self, eid: str) -> StoredMsg | None:
        return await self.journal_at(eid, 1)

    async def journal_at(self, eid: str, seq: int) -> StoredMsg | None:
        """The first record of the run's journal at or after sequence ``seq``."""
        found = await self._read_checked(
            self.layout.tree(eid), seq, 1, f"the journal of {unescape(eid)!r}"
        )
        return found[0] if found else None

    async def _read_checked(
        self, subject: str, start: int, limit: int, what: str
    ) -> list[StoredMsg]:
        """The messages on ``subject`` of the journal stream from sequence ``start``
        (the first ``limit``, 0: all) by Direct Get, read again on R3 until they reach
        the subject's last message as the leader has it. A read of ``limit`` messages is
        whole as it is; any other costs one leader request there (none on R1)."""
        stream = self.layout.stream
        found = await direct_batch(self.nc, stream, subject, start, limit=limit)
        if (limit and len(found) >= limit) or not await self._replicated():
            return found
        last = await self._leader_last(subject)
        catching_up = _CatchUp(what)
        while last is not None and last.seq > (found[-1].seq if found else start - 1):
            await catching_up.wait()  # the replica catches up within milliseconds
            more = limit - len(found) if limit else 0
            found += await direct_batch(
                self.nc, stream, subject, found[-1].seq + 1 if found else start, limit=more
            )
            if limit and len(found) >= limit:
                break
        return found

    async def _replicated(self) -> bool:
        if self.replicated is None:
            try:
                info = await retrying(self.js.stream_info, self.layout.stream)
            except nats.js.errors.NotFoundError:
                return False  # nothing to read yet; asked again next time
            self.replicated = (info.config.num_replicas or 1) > 1
        return self.replicated

    async def _leader_last(self, subject: str) -> StoredMsg | None:
        """The last message on ``subject`` as the stream's leader has it
        (``$JS.API.STREAM.MSG.GET``, which only the leader answers)."""
        return await retrying(self._last_msg, subject, False)

    async def _direct_last(self, subject: str) -> StoredMsg | None:
        return await self._last_msg(subject, True)

    async def _last_msg(self, subject: str, direct: bool) -> StoredMsg | None:
        try:
            raw = await self.js.get_last_msg(self.layout.stream, subject, direct=direct)
        except nats.js.errors.NotFoundError:
            return None
        headers = dict(raw.headers or {})
        return StoredMsg(raw.seq or 0, raw.subject or subject, raw.data or b"", headers)

    # -- keyed objects: the state projection -----------------------------------------

    @property
    def objects(self) -> KeyValue:
        assert self._objects is not None, "ensure_layout() first"
        return self._objects

    def _state_subject(self, object_type: str, key: str) -> str:
        return f"$KV.{self.layout.objects_bucket}.{state_key(object_type, key)}"

    async def get_state(
        self, object_type: str, key: str, *, leader: bool = False
    ) -> tuple[bytes, int, int] | None:
        """The object's state as projected: ``(JSON, journal sequence, KV revision)``.
        A value without the journal header (written by hand) has sequence 0.
        ``leader``: as the bucket's leader has it (any replica answers otherwise)."""
        found = await self.get_state_msg(object_type, key, leader=leader)
        if found is None:
            return None
        try:
            seq = int(found.headers.get(JOURNAL_SEQ, "0"))
        except ValueError:
            seq = 0
        return found.data, seq, found.seq

    async def get_state_msg(
        self, object_type: str, key: str, *, leader: bool = False
    ) -> StoredMsg | None:
        """The projection's last message; ``leader``: as the bucket's leader has it (any
        replica answers otherwise, which on R3 may be a write behind)."""
        subject = self._state_subject(object_type, key)
        try:
            raw = await retrying(
                self.js.get_last_msg,
                self.layout.kv_stream(self.layout.objects_bucket),
                subject,
                not leader,
            )
        except nats.js.errors.NotFoundError:
            return None
        headers = dict(raw.headers or {})
        if headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return StoredMsg(raw.seq or 0, subject, raw.data or b"", headers)

    async def put_state(
        self, object_type: str, key: str, data: bytes, *, journal_seq: int, cursor: int, last: int
    ) -> int | None:
        """Write the projection, compare-and-set on its revision ``last`` (0: absent),
        tagged with the journal record it was made at. None: another writer moved it."""
        bucket = self.layout.objects_bucket
        headers = self._in_bucket_epoch(
            {JOURNAL_SEQ: str(journal_seq), CURSOR: str(cursor), EXPECTED_SEQ: str(last)}, bucket
        )
        subject = self._state_subject(object_type, key)
        self._check_fits(subject, data, headers, f"the state of {object_type}/{key}")
        try:
            ack = await self._retrying_in_epoch(
                lambda: f"the state of {object_type}/{key}",
                self.js.publish, subject, data, 5.0, None, headers,
                stream=self.layout.kv_stream(bucket),
            )  # fmt: skip
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code not in WRONG_LAST:
                raise
            # a lost reply to our own write looks the same: read it back, from the
            # leader (a follower may not hold our landed write yet: a spurious Fenced)
            found = await self.get_state_msg(object_type, key, leader=True)
            if found is not None and found.headers.get(JOURNAL_SEQ) == str(journal_seq):
                return found.seq
            return None
        return ack.seq

    async def list_states(self, object_type: str) -> list[tuple[str, StoredMsg]]:
        """Every key of ``object_type`` with a state, and its projection."""
        prefix = f"{escape(object_type)}."
        found = await self._kv_list(self.layout.objects_bucket, self.objects, f"{prefix}>")
        return [
            (unescape(k[len(prefix) :]), StoredMsg(rev, k, value, {}))
            for k, (rev, value) in found.items()
        ]

    async def list_object_types(self) -> list[str]:
        """Every object type with a key in the objects bucket (one that has, or had,
        state), sorted: the bucket's subjects, from its stream's info (no value read)."""
        bucket = self.layout.objects_bucket
        prefix = f"$KV.{bucket}."
        with lost_on_transient(f"listing {bucket}"):
            info = await retrying(self.js.stream_info, self.layout.kv_stream(bucket), prefix + ">")
        subjects = info.state.subjects or {}
        return sorted({unescape(s[len(prefix) :].split(".", 1)[0]) for s in subjects})

    async def _kv_list(
        self, bucket: str, kv: KeyValue, keys: str, *, watch: bool = True
    ) -> dict[str, tuple[int, bytes]]:
        """Every key of ``kv`` under the filter ``keys`` with its latest value (not
        empty) and revision, each key once.

        A KV watcher alone is not enough while keys change: a key updated as it delivers
        the initial values can come twice (kept once, the latest), or not at all (its
        older value is no longer the last one, and the watcher says it is done before
        the update). So the keys the stream lists that the watcher did not deliver are
        read one by one (Direct Get, 32 at a time). ``watch=False``: every key is read
        that way (a few keys; no consumer, which the client role may not make on the
        work bucket: it would reach ``config.secret``)."""
        out: dict[str, tuple[int, bytes]] = {}
        with lost_on_transient(f"listing {bucket}"):
            if watch:
                watcher = await kv.watch(keys, ignore_deletes=True)
                try:
                    async for entry in watcher:
                        if entry is None:
                            break
                        if entry.value:
                            out[entry.key] = (entry.revision or 0, entry.value)
                finally:
                    await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py is untyped
            subject_prefix = f"$KV.{bucket}."
            info = await retrying(
                self.js.stream_info, self.layout.kv_stream(bucket), subject_prefix + keys
            )
        missing = [
            s[len(subject_prefix) :]
            for s in info.state.subjects or {}
            if s[len(subject_prefix) :] not in out
        ]
        limit = anyio.CapacityLimiter(32)
        failed: list[Exception] = []

        async def read(key: str) -> None:
            async with limit:
                try:
                    raw = await retrying(
                        self.js.get_last_msg,
                        self.layout.kv_stream(bucket),
                        subject_prefix + key,
                        True,
                    )
                except nats.js.errors.NotFoundError:
                    return
                except Exception as exc:  # noqa: BLE001 - raised below, not as an ExceptionGroup
                    failed.append(exc)
                    return
            headers = dict(raw.headers or {})
            if headers.get("KV-Operation") not in ("DEL", "PURGE") and raw.data:
                out[key] = (raw.seq or 0, raw.data)

        async with anyio.create_task_group() as tg:
            for key in missing:
                tg.start_soon(read, key)
        if failed:
            raise failed[0]
        return out

    # -- limits (config for listings in the work bucket; state in the limit's journal)

    async def put_limit(self, key: str, value: bytes) -> None:
        await retrying(self.work.put, key, value, refused=self.refusal(self._work_subject(key)))

    async def get_limit(self, key: str) -> bytes | None:
        return await self._config(key)

    async def list_limits(self) -> dict[str, bytes]:
        """Every limit's config, by its work-bucket key (``limit.<eid>``)."""
        # key by key: limits are few, and a client may read the work bucket only so
        found = await self._kv_list(self.layout.work_bucket, self.work, "limit.*", watch=False)
        return {k: v for k, (_, v) in found.items()}

    async def ensure_active(self, partition: int, eid: str) -> None:
        """Make sure the actor has an active marker (a caller that queued work for an
        object that may have gone idle: no marker, or an idle one), then hint its owner."""
        try:
            with lost_on_transient("reading an active marker"):
                entry = await self.work.get(Layout.active_key(partition, eid))
        except nats.js.errors.KeyNotFoundError:
            entry = None
        if entry is None or entry.value == IDLE_MARKER:
            await self.mark_active(partition, eid)
            return
        await self.wake(partition, eid)

    async def note_active(self, partition: int, eid: str, note: bytes) -> None:
        """Put ``note`` (a JSON object: why no worker runs the actor now, or ``{}``) as
        the actor's active marker: it stays active, and ``objects show`` reads it."""
        self._in_work(partition, eid)
        with lost_on_transient("writing a note in an active marker"):
            key = Layout.active_key(partition, eid)
            await retrying(self.work.put, key, note, refused=self.refusal(self._work_subject(key)))

    async def clear_note(self, partition: int, eid: str, field: str) -> None:
        """Replace the actor's active marker with ``{}`` if it still holds a note with
        ``field``, by compare-and-set: a marker written since (an idle one, another
        note) is left as it is."""
        key = Layout.active_key(partition, eid)
        with lost_on_transient("clearing a note in an active marker"):
            try:
                entry = await self.work.get(key)
            except nats.js.errors.KeyNotFoundError:
                return
            try:
                note = json.loads(entry.value or b"{}")
            except ValueError:
                return
            if not isinstance(note, dict) or field not in note:
                return
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await self.work.update(key, b"{}", last=entry.revision)

    async def active_note(self, partition: int, eid: str) -> dict[str, Any] | None:
        """The JSON object an actor's active marker holds (``{}``, an idle marker, a
        crash note), or None without a marker."""
        try:
            with lost_on_transient("reading an active marker"):
                entry = await self.work.get(Layout.active_key(partition, eid))
        except nats.js.errors.KeyNotFoundError:
            return None
        try:
            value = json.loads(entry.value or b"{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def mark_idle(self, partition: int, eid: str, ttl: float) -> None:
        """Replace the actor's active marker with an idle one that the server removes
        after ``ttl`` seconds (a per-message TTL): until then a new owner still looks
        at the actor, in case something came just as it went idle."""
        self._in_work(partition, eid)
        subject = self._work_subject(Layout.active_key(partition, eid))
        bucket = self.layout.work_bucket
        await self._retrying_in_epoch(
            lambda: f"the idle marker of {unescape(eid)!r}",
            self._publish_ttl, subject, IDLE_MARKER, ttl, self._in_bucket_epoch({}, bucket),
            refused=self.refusal(subject), stream=self.layout.kv_stream(bucket),
        )  # fmt: skip

    async def _publish_ttl(
        self, subject: str, data: bytes, ttl: float, headers: dict[str, str]
    ) -> None:
        await self.js.publish(subject, data, timeout=5.0, headers=headers or None, msg_ttl=ttl)

    # -- run index and active markers ------------------------------------------------

    async def get_index_entry(
        self, eid: str, *, leader: bool = False
    ) -> tuple[bytes, int, int] | None:
        """The run's index entry as stored: ``(value, journal sequence, revision)``.

        An ended run's entry is in the journal stream (``Layout.index_entry``, written
        by :meth:`end_run`) and is final: it is returned (revision 0) whatever the
        ``<ns>_runs`` bucket holds. Otherwise the bucket's entry (a parked or paused
        run's, a note, a run of an older fusee), with its KV revision for the next
        compare-and-set. A delete marker has an empty value; an entry without the
        journal tag (written by an older fusee) has sequence 0. ``leader``: as the
        streams' leaders have it (any replica answers otherwise)."""
        final = await self.get_final_entry(eid, leader=leader)
        if final is not None:
            return final[0], final[1], 0
        subject = f"$KV.{self.layout.runs_bucket}.{eid}"
        try:
            raw = await retrying(
                self.js.get_last_msg,
                self.layout.kv_stream(self.layout.runs_bucket),
                subject,
                not leader,
            )
        except nats.js.errors.NotFoundError:
            return None
        headers = dict(raw.headers or {})
        if headers.get("KV-Operation") in ("DEL", "PURGE"):
            return b"", 0, raw.seq or 0
        return raw.data or b"", _journal_seq(headers), raw.seq or 0

    async def get_final_entry(self, eid: str, *, leader: bool = False) -> tuple[bytes, int] | None:
        """An ended run's final entry (``Layout.index_entry``, in the journal stream):
        ``(value, journal sequence)``, or None; the ``<ns>_runs`` bucket is not read."""
        subject = self.layout.index_entry(eid)
        if leader:
            msg = await self._leader_last(subject)
        else:
            msg = await retrying(self._direct_last, subject)
        if msg is not None and msg.data:
            return msg.data, _journal_seq(msg.headers)
        return None

    async def put_index(self, eid: str, value: bytes, *, journal_seq: int, last: int) -> int | None:
        """Write the run's index entry in the ``<ns>_runs`` bucket, compare-and-set on
        its revision ``last`` (0: absent), tagged with the journal record it reflects.
        None: it moved meanwhile. (An ended run's goes to the stream: :meth:`end_run`.)"""
        bucket = self.layout.runs_bucket
        headers = self._in_bucket_epoch(
            {JOURNAL_SEQ: str(journal_seq), EXPECTED_SEQ: str(last)}, bucket
        )
        return await self._publish_expecting(f"$KV.{bucket}.{eid}", value, headers)

    async def end_run(
        self, partition: int, eid: str, value: bytes, *, journal_seq: int, fresh: bool = False
    ) -> None:
        """An ended run's index entry, in the journal stream (``Layout.index_entry``), and
        the removal of its active marker, in one write (alone, or in a group commit's
        batch under load). Not compare-and-set: an entry made from a journal's end is
        final (no record comes after it) and read before the bucket's, and a writer
        that read less compares and sets there, so it cannot replace this one.

        ``fresh`` (the end just landed, this activation wrote it): a marker in the work
        bucket is looked for only if this store's last listing of the partition holds
        one (see :meth:`_clear_old_marker`); else (an ended run activated again, whose
        final entry its worker did not live to write) the bucket is always read."""
        give_up = time.monotonic() + patience()
        tombstone = self._unmarked(partition, eid)
        headers = self._in_epoch({KIND: INDEX_KIND, JOURNAL_SEQ: str(journal_seq), ROLLUP: "sub"})
        riders: tuple[Message, ...] = (tombstone,)
        if (listed := self._listed(eid, value, journal_seq)) is not None:
            riders = (listed, tombstone)  # the listing entry rides the same batch
        item = Pending(
            self.layout.index_entry(eid),
            value,
            headers,
            eid,
            0,
            "",
            INDEX_KIND,
            give_up,
            riders=riders,
        )
        await self._commit(item)
        await self._clear_old_marker(partition, eid, listed_only=fresh)

    async def get_index(self, eid: str) -> bytes | None:
        entry = await self.get_index_entry(eid)
        return (entry[0] or None) if entry is not None else None

    async def list_index(self) -> list[tuple[str, bytes]]:
        """Every run's index entry, each run once: an ended run's from the journal
        stream, the others' from the ``<ns>_runs`` bucket (see :meth:`_kv_list`)."""
        found = await self._kv_list(self.layout.runs_bucket, self.runs, ">")
        out = {key: value for key, (_, value) in found.items()}
        prefix = len(self.layout.index_entry(""))
        with lost_on_transient("listing the run index"):
            entries = await direct_batch(self.nc, self.layout.stream, self.layout.index_entries, 1)
        for msg in entries:
            if msg.data and msg.headers.get(KIND) == INDEX_KIND:
                out[msg.subject[prefix:]] = msg.data
        return list(out.items())

    async def listed_pages(
        self, status: str | None, workflow: str | None, *, page: int = 500
    ) -> AsyncIterator[list[tuple[str, bytes, int]]]:
        """The listing entries of ``status`` and ``workflow`` (None: any), a page at a
        time: ``(eid, value, stream sequence)``. Ended runs' are final; a paused run's
        may be stale (resumed by a worker of an earlier version, or listed again by
        :meth:`list_old_pauses`: the caller checks the run's entry and prunes it,
        :meth:`unlist`)."""
        with lost_on_transient("listing the run index"):
            async for found in direct_pages(
                self.nc, self.layout.stream, self.layout.listings(status, workflow), 1, page
            ):
                yield self._listing_entries(found)

    def _listing_entries(self, found: list[StoredMsg]) -> list[tuple[str, bytes, int]]:
        out = []
        for msg in found:
            named = self.layout.parse_listing(msg.subject)
            if msg.data and named is not None and msg.headers.get(KIND) == LISTED_KIND:
                out.append((named[2], msg.data, msg.seq))
        return out

    async def listed_page(
        self, status: str | None, workflow: str | None, *, start: int, page: int
    ) -> tuple[list[tuple[str, bytes, int]], int | None]:
        """One page of :meth:`listed_pages` from stream sequence ``start``, and where the
        next page starts (None: this was the last): for a reader that pages across
        requests (the HTTP API's cursor)."""
        subject = self.layout.listings(status, workflow)
        found, after = await self._one_page(subject, start, page, "listing the run index")
        return self._listing_entries(found), after

    async def _one_page(
        self, subject: str, start: int, page: int, what: str
    ) -> tuple[list[StoredMsg], int | None]:
        with lost_on_transient(what):
            async for found in direct_pages(self.nc, self.layout.stream, subject, start, page):
                return found, (found[-1].seq + 1 if len(found) >= page else None)
        return [], None

    async def count_listed(self, status: str, workflow: str | None) -> int:
        """How many runs the listing entries of ``status`` and ``workflow`` (None: any)
        name, without reading them: the pending count of an ephemeral consumer that
        would deliver the last message of each subject (two requests, whatever the
        count). An upper bound for ``paused``: a stale entry, or a removal in the second
        before it expires, counts too.

        Raises:
            ConnectionLost: NATS did not answer.
            FuseeError: NATS refused the consumer (nothing was made).
        """
        config = ConsumerConfig(
            filter_subject=self.layout.listings(status, workflow),
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=5.0,  # gone by itself if the delete below is lost
        )
        with lost_on_transient("counting the run index"):
            try:
                info = await retrying(
                    self.js.add_consumer, self.layout.stream, config, what="a counting consumer"
                )
            except nats.js.errors.APIError as exc:
                raise FuseeError(f"NATS refused a counting consumer: {exc}") from exc
        await drop_consumer(self.nc, self.layout.stream, info.name)
        return int(info.num_pending or 0)

    def _unlisted(self, status: str, workflow: str, eid: str) -> Message:
        """The removal of a run's listing entry: replaces it, then expires."""
        headers = self._in_epoch({KIND: UNLISTED_KIND, ROLLUP: "sub", TTL: "1"})
        return self.layout.listing(status, workflow, eid), b"", headers

    async def unlist(self, status: str, workflow: str, eid: str, seq: int) -> bool:
        """Remove the run's listing entry under ``status`` if it is still the one stored
        at ``seq`` (one a reader found stale); False when a newer one replaced it (the
        run paused again: that one stays)."""
        subject, data, headers = self._unlisted(status, workflow, eid)
        headers = {**headers, EXPECTED_SEQ: str(seq)}
        return await self._publish_expecting(subject, data, headers) is not None

    async def legacy_pages(self, *, page: int = 500) -> AsyncIterator[list[tuple[str, bytes]]]:
        """The final entries of ended runs a previous fusee wrote (``<ns>.in.x.<eid>``
        without a listing entry): those stored before this store's namespace was first
        opened by a worker that writes listing entries (``config.listed_from``; none
        yet: every final entry stored before this listing began). A page at a time,
        ``(eid, value)``."""
        upto = await self._listed_from()
        if upto <= 0:
            return
        prefix = len(self.layout.index_entry(""))
        with lost_on_transient("listing the run index"):
            async for found in direct_pages(
                self.nc, self.layout.stream, self.layout.index_entries, 1, page
            ):
                out = [
                    (msg.subject[prefix:], msg.data)
                    for msg in found
                    if msg.seq <= upto and msg.data and msg.headers.get(KIND) == INDEX_KIND
                ]
                if out:
                    yield out
                if found[-1].seq > upto:
                    return

    async def _listed_from(self) -> int:
        """The stream's last sequence when a worker writing listing entries first
        opened the namespace (every final entry above it has one). Before one did, the
        stream's last sequence now, read before the setting (no such worker had written
        anything up to then); remembered once the setting is there."""
        if self._listed_upto is not None:
            return self._listed_upto
        raw = await self._config(LISTED_FROM)
        if raw is None:
            last = await self._last_seq()
            raw = await self._config(LISTED_FROM)
            if raw is None:
                return last
        self._listed_upto = int(raw) if raw.isdigit() else 0
        return self._listed_upto

    async def mark_active(self, partition: int, eid: str) -> None:
        self._in_work(partition, eid)
        key = Layout.active_key(partition, eid)
        await retrying(self.work.put, key, b"{}", refused=self.refusal(self._work_subject(key)))
        await self.wake(partition, eid)

    async def wake(self, partition: int, eid: str) -> None:
        """Tell the partition's owner (core NATS, a hint) that the run has news."""
        subject = self.layout.wake(partition)
        if self.is_denied(subject):  # (the client role: the owner follows every inbox)
            return
        with contextlib.suppress(*TRANSIENT):
            await self.nc.publish(subject, eid.encode())

    async def clear_active(self, partition: int, eid: str) -> None:
        # A purge marker with a TTL: the key's subject disappears from the bucket a
        # second later, so the list of active runs does not grow with finished ones.
        await retrying(self.work.purge, Layout.active_key(partition, eid), 1)

    async def mark_run_active(self, partition: int, eid: str, marker: bytes) -> None:
        """Write a run's active marker (``Layout.marker``, one message a subject) on its
        own, then hint its owner: a start whose marker could not ride its first record
        (a regenerated run's copies come first), or one a starter that died left out."""
        headers = self._in_epoch({KIND: MARKER_KIND, ROLLUP: "sub"})
        subject = self.layout.marker(partition, eid)
        await self._retrying_in_epoch(
            lambda: f"the active marker of {unescape(eid)!r}",
            self.js.publish,
            subject,
            marker,
            5.0,
            None,
            headers,
            refused=self.refusal(subject),
        )
        await self.wake(partition, eid)

    def _listed(self, eid: str, value: bytes, journal_seq: int) -> Message | None:
        """The listing entry of the run whose index entry is ``value``
        (:meth:`Layout.listing`), or None when the value is not fusee's."""
        if (info := info_or_none(value)) is None:
            return None
        headers = self._in_epoch({KIND: LISTED_KIND, JOURNAL_SEQ: str(journal_seq), ROLLUP: "sub"})
        return self.layout.listing(info.status, info.workflow, eid), value, headers

    async def clear_run_active(
        self, partition: int, eid: str, *, listed: bytes | None = None, seen: int | None = None
    ) -> bool:
        """Remove a run's active marker: a message that replaces it (a rollup) and that
        the server removes a second later (its TTL), so the subject leaves the stream
        and the list of active runs does not grow with ended ones (:meth:`end_run`
        does this with the end's index entry). Appended like a record: under load it
        rides a group commit's batch. A marker in the work bucket (an older fusee's,
        or a crash note) is purged too: the bucket is read for it each time (this runs
        for an ended run activated again, a pause, an indexed run with no journal:
        never on a fresh end's path); without one nothing more is written.

        ``seen`` (a paused run leaving, which read its inbox up to this sequence): the
        marker is removed only if nothing came to the inbox above ``seen`` and no
        marker was written since it was read (see :meth:`_leave_paused`); False when
        it stays (a cancel or a resume came while it left: its owner activates it)."""
        riders: tuple[Message, ...] = ()
        if listed is not None and (entry := self._listed(eid, listed, 0)) is not None:
            riders = (entry,)  # a paused run's listing entry, in the same batch
        if seen is not None:
            if not await self._leave_paused(partition, eid, seen, riders):
                return False
        else:
            subject, data, headers = self._unmarked(partition, eid)
            give_up = time.monotonic() + patience()
            await self._commit(
                Pending(subject, data, headers, eid, 0, "", UNMARKED_KIND, give_up, riders=riders)
            )
        await self._clear_old_marker(partition, eid)
        return True

    async def _leave_paused(
        self, partition: int, eid: str, seen: int, riders: tuple[Message, ...]
    ) -> bool:
        """Remove a paused run's marker unless a cancel or a resume came while it left.
        Both store their message in the inbox, then write the marker. The marker is
        read first, then the inbox's last sequence: a message stored before the marker
        was read is above ``seen`` (it stays); the removal expects the marker it read
        (``Nats-Expected-Last-Subject-Sequence``), so a marker written after that read
        refuses it (it stays). A removal refused for another change (the earlier
        removal's tombstone expired) reads both again."""
        subject = self.layout.marker(partition, eid)
        for attempt in range(MAX_UNMARK_TRIES):
            marker = await retrying(self._direct_last, subject)
            if attempt and marker is not None and marker.headers.get(KIND) == MARKER_KIND:
                return False  # written after the first read: a cancel's, a resume's
            last = await retrying(self._direct_last, self.layout.inbox(partition, eid))
            if last is not None and last.seq > seen:
                return False  # a message the activation did not read: its owner reads it
            _, data, headers = self._unmarked(partition, eid)
            headers = {**headers, EXPECTED_SEQ: str(marker.seq if marker is not None else 0)}
            what = f"the removal of the marker of {unescape(eid)!r}"
            try:
                if riders:
                    await self._retrying_in_epoch(
                        what,
                        publish_batch,
                        self.nc,
                        [(subject, data, headers), *riders],
                        2.0,
                        self.committer.in_flight,
                        what=what,
                        refused=self.refusal(subject, *(r[0] for r in riders)),
                    )
                else:
                    await self._retrying_in_epoch(
                        what,
                        publish_acked,
                        self.nc,
                        subject,
                        data,
                        headers,
                        2.0,
                        what=what,
                        refused=self.refusal(subject),
                    )
            except nats.js.errors.APIError as exc:  # (FailedOver: not an APIError)
                if exc.err_code not in WRONG_LAST:
                    raise
                continue
            return True
        return False  # (changed under it each time: left to its owner)

    async def clear_unstarted(self, partition: int, eid: str) -> None:
        """Remove the active marker of a run that has no journal (an actor poked by a
        message to a run not started yet), unless its journal exists by now: the
        removal expects nothing under ``<ns>.run.<eid>.>``, so a start that landed
        meanwhile (its marker rode it) keeps its marker."""
        subject, data, headers = self._unmarked(partition, eid)
        headers = {**headers, EXPECTED_SEQ: "0", EXPECTED_SUBJECT: self.layout.tree(eid)}
        if await self._publish_expecting(subject, data, headers) is None:
            return  # it started: its marker stays
        await self._clear_old_marker(partition, eid)

    def _unmarked(self, partition: int, eid: str) -> Message:
        headers = self._in_epoch({KIND: UNMARKED_KIND, ROLLUP: "sub", TTL: "1"})
        return self.layout.marker(partition, eid), b"", headers

    def _in_work(self, partition: int, eid: str) -> None:
        """A marker of ``eid`` is written in the work bucket (before it is: a listing
        that answers meanwhile may not hold it)."""
        listed = self._work_listed.get(partition)
        if listed is not None:
            listed.add(eid)

    async def _clear_old_marker(
        self, partition: int, eid: str, *, listed_only: bool = False
    ) -> None:
        """Purge a run's marker in the work bucket (an older fusee's, a crash or an
        unserved note), if there is one.

        ``listed_only`` (a fresh end's write, :meth:`end_run`): not read when the last
        listing of the partition by this store found none and none was written here
        since (every end would read it else). That listing may be old (a partition
        this worker owned once, an engine's ``list_objects``): a marker another process
        wrote after it stays, until its partition's owner lists it and activates the
        ended run, whose marker's removal (:meth:`clear_run_active`) always reads."""
        listed = self._work_listed.get(partition)
        if listed_only and listed is not None and eid not in listed:
            return
        key = Layout.active_key(partition, eid)
        try:
            with lost_on_transient("reading an active marker"):
                await retrying(self.work.get, key)
        except nats.js.errors.KeyNotFoundError:
            return
        await self.clear_active(partition, eid)

    async def run_markers(self) -> dict[str, bytes]:
        """Every run's active marker in the journal stream: escaped ID -> what it holds
        (the run's index entry as its starter made it)."""
        with lost_on_transient("reading the active markers"):
            found = await direct_batch(self.nc, self.layout.stream, self.layout.markers, 1)
        out: dict[str, bytes] = {}
        for msg in found:
            if msg.headers.get(KIND) == MARKER_KIND and (
                named := self.layout.parse_marker(msg.subject)
            ):
                out[named[1]] = msg.data
        return out

    async def marker_pages(self, *, page: int = 500) -> AsyncIterator[list[tuple[str, bytes]]]:
        """Every run's active marker in the journal stream, a page at a time:
        ``(escaped ID, what it holds)`` (the run's index entry as its starter made it)."""
        with lost_on_transient("reading the active markers"):
            async for found in direct_pages(
                self.nc, self.layout.stream, self.layout.markers, 1, page
            ):
                yield self._marker_entries(found)

    def _marker_entries(self, found: list[StoredMsg]) -> list[tuple[str, bytes]]:
        return [
            (named[1], msg.data)
            for msg in found
            if msg.headers.get(KIND) == MARKER_KIND
            and (named := self.layout.parse_marker(msg.subject))
        ]

    async def marker_page(
        self, *, start: int, page: int
    ) -> tuple[list[tuple[str, bytes]], int | None]:
        """One page of :meth:`marker_pages` from stream sequence ``start``, and where the
        next starts (None: this was the last)."""
        found, after = await self._one_page(
            self.layout.markers, start, page, "reading the active markers"
        )
        return self._marker_entries(found), after

    async def has_run_marker(self, partition: int, eid: str, *, leader: bool = False) -> bool:
        """Whether the run has an active marker in the journal stream (one read; as the
        leader has it with ``leader``)."""
        subject = self.layout.marker(partition, eid)
        if leader:
            msg = await self._leader_last(subject)
        else:
            msg = await retrying(self._direct_last, subject)
        return msg is not None and msg.headers.get(KIND) == MARKER_KIND

    async def _marker_subjects(self) -> list[tuple[int, str]]:
        """``(partition, eid)`` of every run's active marker in the journal stream (a
        removed one lingers for its second).

        Raises:
            ConnectionLost: NATS did not answer, or the journal stream is not in this
                cluster (an old home back after a failover moved it: a worker rides it
                out, its actors are fenced at their next append, instead of crashing).
        """
        try:
            with lost_on_transient("listing the active runs"):
                info = await retrying(self.js.stream_info, self.layout.stream, self.layout.markers)
        except nats.js.errors.NotFoundError as exc:
            raise ConnectionLost(
                f"the journal stream {self.layout.stream!r} is not in this cluster (a "
                f"failover may have moved the namespace: fusee region status)"
            ) from exc
        return [
            named
            for subject in info.state.subjects or {}
            if (named := self.layout.parse_marker(subject)) is not None
        ]

    async def list_active(self, partitions: set[int]) -> list[tuple[int, str]]:
        """Active runs and keys of ``partitions``: the runs' markers in the journal stream
        and the markers in the work bucket (keys, crash notes, runs of an older fusee).
        A run ended less than a second ago may show.

        Raises:
            ConnectionLost: NATS did not answer, or a stream listed is not in this
                cluster (see :meth:`_marker_subjects`).
        """
        prefix = f"$KV.{self.layout.work_bucket}.active."
        stream = self.layout.kv_stream(self.layout.work_bucket)
        try:
            with lost_on_transient("listing the active runs"):
                info = await retrying(self.js.stream_info, stream, prefix + ">")
        except nats.js.errors.NotFoundError as exc:
            if not self.layout.regional:
                raise
            # (the old home's, deleted by a failover: ridden out as the journal's is)
            raise ConnectionLost(
                f"the work bucket's stream {stream!r} is not in this cluster (a failover "
                f"may have moved the namespace: fusee region status)"
            ) from exc
        out: dict[tuple[int, str], None] = {}
        in_work: dict[int, set[str]] = {p: set() for p in partitions}
        for subject in info.state.subjects or {}:
            part, _, eid = subject[len(prefix) :].partition(".")
            if part.isdigit() and int(part) in partitions:
                out[int(part), eid] = None
                in_work[int(part)].add(eid)
        self._work_listed.update(in_work)
        for p, eid in await self._marker_subjects():
            if p in partitions:
                out[p, eid] = None
        return list(out)

    # -- partition owners -------------------------------------------------------------

    async def get_owner(self, partition: int) -> tuple[str, int] | None:
        try:
            with lost_on_transient(f"reading the owner of partition {partition}"):
                entry = await self.work.get(Layout.owner_key(partition))
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return entry.value.decode(), entry.revision or 0

    async def claim_owner(self, partition: int, worker: str, last: int | None) -> int | None:
        """Take ``partition`` for ``worker`` if its owner record is still at ``last``
        (None: no owner). Returns the new revision, or None when someone else moved first."""
        key = Layout.owner_key(partition)
        try:
            with lost_on_transient(f"claiming partition {partition}"):
                return await self._claim(key, worker, last)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def _claim(self, key: str, worker: str, last: int | None) -> int | None:
        if last is None:
            try:
                return await self.work.create(key, worker.encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                # create() fails on a deleted key too; it can be updated from the
                # revision of its delete marker
                return None
        return await self.work.update(key, worker.encode(), last=last)

    async def release_owner(self, partition: int, revision: int) -> None:
        with (
            contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError),
            lost_on_transient(f"releasing partition {partition}"),
        ):
            await self.work.delete(Layout.owner_key(partition), last=revision)

    # -- core NATS: membership and wake-ups ------------------------------------------

    async def subscribe_core(
        self,
        subject: str,
        handler: Callable[[str, bytes, str | None], Awaitable[None]],
        *,
        queue: str = "",
    ) -> Callable[[], Awaitable[None]]:
        """Subscribe ``handler(subject, data, reply)``; returns the unsubscribe call."""

        async def cb(msg: Msg) -> None:
            await handler(msg.subject, msg.data, msg.reply or None)

        sub = await self.nc.subscribe(subject, queue=queue, cb=cb)

        async def unsubscribe() -> None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

        return unsubscribe

    def reply_prefix(self) -> str:
        """A new prefix of reply subjects under the connection's inbox prefix
        (``permissions.inbox_prefix``: ``_INBOX.<user>`` for a named user)."""
        return self.nc.new_inbox()

    async def publish_core(self, subject: str, data: bytes) -> None:
        self._check_fits(subject, data, {}, f"the message on {subject}")
        with contextlib.suppress(*TRANSIENT):
            await self.nc.publish(subject, data)

    async def request_core(self, subject: str, data: bytes, timeout: float) -> bytes | None:
        """Request/reply on core NATS: the reply, or None when no answer came in time.

        Raises:
            NobodyListens: no subscriber at all (no worker serves the subject).
            NotEncodable: the request is over the server's max_payload.
            ConnectionLost: the connection is closed or reconnecting.
        """
        self._check_fits(subject, data, {}, f"the request on {subject}")
        with lost_on_transient(f"the request on {subject}"):
            try:
                msg = await self.nc.request(subject, data, timeout=timeout)
            except nats.errors.NoRespondersError:
                raise NobodyListens(subject) from None
            except nats.errors.TimeoutError:
                return None
        return msg.data

    async def owner_alive(self, partition: int, *, timeout: float = PING_TIMEOUT) -> bool:
        """Whether ``partition`` has an owner that answers its ping: a run there runs
        (or will at once). An owner record outlives a worker killed outright (nothing
        deletes it until another worker takes the partition), so the record alone says
        nothing when every worker is gone. ``timeout``: a worker's own patience with a
        peer's ping, so a worker its peers count as alive is alive here too."""
        return partition in await self.live_partitions({partition}, timeout=timeout)

    async def live_partitions(
        self, partitions: set[int], *, timeout: float = PING_TIMEOUT
    ) -> set[int]:
        """Those of ``partitions`` whose owner answers its ping (see :meth:`owner_alive`):
        the owner records read and each distinct owner pinged once, concurrently."""
        owners: dict[int, str] = {}
        lost: list[ConnectionLost] = []  # raised as itself, not in an ExceptionGroup

        async def read(p: int) -> None:
            try:
                found = await self.get_owner(p)
            except ConnectionLost as exc:
                lost.append(exc)
                return
            if found is not None:
                owners[p] = found[0]

        async with anyio.create_task_group() as tg:
            for p in partitions:
                tg.start_soon(read, p)
        if lost:
            raise lost[0]
        alive: dict[str, bool] = {}

        async def ping(worker: str) -> None:
            answer = await self.ping(self.layout.ping(worker), timeout)
            alive[worker] = answer is not None and _of_epoch(answer, self.layout.epoch)

        async with anyio.create_task_group() as tg:
            for worker in set(owners.values()):
                tg.start_soon(ping, worker)
        return {p for p, worker in owners.items() if alive[worker]}

    async def ping(self, subject: str, timeout: float) -> bytes | None:
        """Request/reply on core NATS: the reply, or None when nobody listens (a worker
        whose connection is gone) or nobody answers in time (a stopped process)."""
        try:
            msg = await self.nc.request(subject, b"", timeout=timeout)
        except TRANSIENT:
            return None
        return msg.data


def _of_epoch(answer: bytes, epoch: int) -> bool:
    """Whether a worker's ping answer comes from ``epoch`` or a later one, as a worker
    judges its peers (core NATS crosses regions: an old home's worker answers too, and
    runs nothing here; a later epoch's owns what it holds). An answer without an epoch
    (a worker of an earlier version) is taken as this epoch's."""
    try:
        theirs = json.loads(answer).get("epoch")
    except (ValueError, AttributeError):
        return True
    return epoch_order(theirs, epoch) >= 0


def _journal_seq(headers: dict[str, str]) -> int:
    try:
        return int(headers.get(JOURNAL_SEQ, "0"))
    except ValueError:
        return 0


def _record_of(kind: str, eid: str) -> str:
    # made only for an error: unescaping an ID costs µs, a commit has none to spare
    return f"the {kind} record of {unescape(eid)!r}"


class _CatchUp:
    """The waits of a read for a replica that is behind the leader: 1 ms, doubling to
    100 ms, for as long as the call's patience (``direct.patience``) allows."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.delay = 0.001
        self.give_up = time.monotonic() + patience()

    async def wait(self) -> None:
        if time.monotonic() + self.delay > self.give_up:
            raise ConnectionLost(
                f"the replica answering reads of {self.what} stayed behind the stream's "
                f"leader (NATS Direct Get); try again"
            )
        await anyio.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.1)
