"""The engine: a connection to NATS in one namespace, to start runs, read them, serve them."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextvars import Token
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from fusee._bulk import CONCURRENCY, PAGE, OnRun, bulk, iter_runs, runs_page
from fusee._client import Answered, Client, Replies, enter_client, leave_client
from fusee._limits import LimitInfo, get_limit, list_limits, set_limit, update_limit
from fusee._objects import ObjectKey, ObjectType
from fusee._run import ENDED, DurationLike, Run
from fusee._tokens import Tokens
from fusee.actors.context import COMPENSATE
from fusee.actors.object_state import current_state
from fusee.actors.ports import scheduled_by
from fusee.actors.registry import REGISTRY, Registry, Workflow
from fusee.actors.starts import start_marker, start_or_attach
from fusee.actors.worker import Worker, WorkerConfig
from fusee.adapters.jetstream.credentials import Credentials, redact
from fusee.adapters.jetstream.regions import MirrorLag
from fusee.adapters.jetstream.server import EmbeddedServer, ensure_server
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import (
    ConfigError,
    Fenced,
    FuseeError,
    InvalidArgument,
    InvalidToken,
    JournalGap,
    PermissionDenied,
    RunExists,
    RunNotFound,
)
from fusee.logs import get_logger
from fusee.runtime.bulk import BulkSummary, RunFilter, TimeLike, make_filter
from fusee.runtime.codec import canonical, decode_value
from fusee.runtime.completions import completion_token, mac_matches, parse_token
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.history import History, load_journal
from fusee.runtime.ids import (
    escape,
    partition_of,
    unescape,
    validate_id,
    validate_name,
    validate_namespace,
)
from fusee.runtime.inbox import Completion, decode_message, encode_message
from fusee.runtime.index import RunInfo, decode_info
from fusee.runtime.objects import State, check_run_id, decode_state, object_id, parse_object_id
from fusee.runtime.records import (
    TERMINAL,
    AnyRecord,
    RunStarted,
    WaitStarted,
    decode_record,
    encode_record,
    kind_of,
)
from fusee.runtime.records import RunPaused as RunPausedRecord
from fusee.runtime.records import StepFailed as StepFailedRecord
from fusee.runtime.regions import epoch_order
from fusee.runtime.reuse import reusable

__all__ = ("Engine", "CompletionInfo", "connect")

log = get_logger()


async def connect(
    url: str | Sequence[str] | None = None,
    *,
    namespace: str = "fusee",
    store_dir: str | os.PathLike[str] | None = None,
    partitions: int | None = None,
    replicas: int | None = None,
    token_retention: DurationLike = "7d",
    callback_base_url: str = "http://127.0.0.1:8000",
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    nkey_seed: str | os.PathLike[str] | None = None,
    creds: str | os.PathLike[str] | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    region: str | None = None,
    partner: str | None = None,
) -> Engine:
    """Connect to NATS and make sure the namespace's stream and buckets exist.

    ``url`` is one NATS URL, several separated by commas, or a list of them (the
    servers of one cluster: the client connects to one and moves to another when it
    goes away). With no ``url`` (and no ``$FUSEE_NATS_URL``, which takes the same
    comma-separated form) an embedded nats-server is started, with JetStream in
    ``store_dir`` (default ``.fusee/``), or the one already running for that store is
    reused.

    ``replicas`` is how many servers hold each stream and bucket the namespace creates
    (3 on a 3-node cluster: one may go down with nothing lost; default
    ``$FUSEE_REPLICAS``, else 1); existing ones keep theirs.

    ``region`` (default ``$FUSEE_REGION``) is the region this process is in: the name
    of its NATS cluster in a supercluster of regions (``nats/region-*.conf``). A
    namespace first opened with a region has its home there: its streams and buckets
    are placed in that cluster, and every journal append names the namespace's epoch
    (a writer of an epoch a failover ended is refused). ``partner`` (default
    ``$FUSEE_PARTNER_REGION``) is the region that keeps a mirror of the journal, made
    if missing (``engine.mirror_lag()`` says how far behind it is). A worker serves a
    namespace only in its home region. See docs/operations.md, "Two regions".

    ``token_retention`` is how long token streams are kept after they were written
    (readers can replay a finished run's stream until then); changing it updates the
    namespace's tokens stream.

    ``callback_base_url`` is where completion URLs point
    (``<callback_base_url>/v1/completions/<token>``, see ``ctx.await_completion``).

    NATS credentials (one way at a time; with a url, each defaults to its environment
    variable):
    ``user`` and ``password`` (``$FUSEE_NATS_USER``, ``$FUSEE_NATS_PASSWORD``), ``token``
    (``$FUSEE_NATS_TOKEN``), ``nkey_seed`` (a seed file's path or the seed ``"SU..."``,
    ``$FUSEE_NATS_NKEY``), ``creds`` (a ``.creds`` file, ``$FUSEE_NATS_CREDS``); TLS with
    any of them: ``tls_ca`` (a CA bundle), ``tls_cert`` and ``tls_key`` (a client
    certificate and its key; ``$FUSEE_TLS_CA``, ``$FUSEE_TLS_CERT``, ``$FUSEE_TLS_KEY``).
    The roles a server can give them: ``nats/accounts.conf``.

    Raises:
        ConfigError: a credential file that does not exist, two ways to authenticate,
            credentials without a ``url``, or a server that refused the credentials
            (naming the server and the way, never the secret); a ``region`` or
            ``partner`` that is not a cluster's name, ``partner`` without ``region``,
            a region given for a namespace made without one, or none for a
            namespace with regions.
        ConnectionLost: no NATS server answered at ``url``.
        InvalidArgument: ``url`` is not a URL or a list of them, or one of them is
            empty; ``replicas`` is not 1 to 5.

    Example:
        ``engine = await fusee.connect(["nats://n1:4222", "nats://n2:4222"], replicas=3)``
    """
    namespace = validate_namespace(namespace)
    urls = nats_urls(url or os.environ.get("FUSEE_NATS_URL") or None)
    replicas = _replicas(replicas)
    region = region or os.environ.get("FUSEE_REGION") or None
    partner = partner or os.environ.get("FUSEE_PARTNER_REGION") or None
    if partner is not None and region is None:
        raise ConfigError(
            f"partner={partner!r} without region=: the partner region mirrors a home "
            "region's journal (set region=, or $FUSEE_REGION)"
        )
    given = {
        "user": user,
        "password": password,
        "token": token,
        "nkey_seed": nkey_seed,
        "creds": creds,
        "tls_ca": tls_ca,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
    }
    if not urls and any(v is not None for v in given.values()):
        named = ", ".join(k for k, v in given.items() if v is not None)
        raise ConfigError(
            f"NATS credentials ({named}) without a url: the embedded server (no url) takes "
            "none; pass url= (or set $FUSEE_NATS_URL)"
        )

    def env(name: str) -> str | None:
        # the variables apply to a server named by a url only (the embedded one has no auth)
        return os.environ.get(name) if urls else None

    credentials = Credentials.make(
        user=user or env("FUSEE_NATS_USER") or None,
        password=password or env("FUSEE_NATS_PASSWORD") or None,
        token=token or env("FUSEE_NATS_TOKEN") or None,
        nkey_seed=nkey_seed or env("FUSEE_NATS_NKEY") or None,
        creds=creds or env("FUSEE_NATS_CREDS") or None,
        tls_ca=tls_ca or env("FUSEE_TLS_CA") or None,
        tls_cert=tls_cert or env("FUSEE_TLS_CERT") or None,
        tls_key=tls_key or env("FUSEE_TLS_KEY") or None,
    )
    server: EmbeddedServer | None = None
    if not urls:
        embedded, server = await ensure_server(
            Path(store_dir or os.environ.get("FUSEE_STORE", ".fusee"))
        )
        urls = [embedded]
    try:
        retention = parse_duration(token_retention, "token_retention")
        if retention <= 0:
            raise InvalidArgument(f"token_retention={token_retention!r}: must be positive")
        store = await NatsStore.connect(
            urls,
            namespace,
            replicas=replicas,
            tokens_max_age=retention,
            credentials=credentials,
            region=region,
            partner=partner,
        )
    except BaseException:
        if server is not None:
            server.stop()
        raise
    try:
        await store.ensure_layout()
        count = await _partition_count(store, partitions)
        await store.ensure_mirror(count)
        store.completion_secret = await store.load_secret()
        store.callback_base_url = _base_url(callback_base_url)
    except BaseException:
        await store.close()
        if server is not None:
            server.stop()
        raise
    # (redacted: a password or token in the URL stays out of reprs, logs and hints)
    return Engine(store, url=redact(",".join(urls)), server=server, partitions=count)


def _replicas(wanted: int | None) -> int:
    if wanted is None:
        env = os.environ.get("FUSEE_REPLICAS", "").strip()
        if not env:
            return 1
        try:
            wanted = int(env)
        except ValueError:
            raise InvalidArgument(f"$FUSEE_REPLICAS={env!r}: must be an int from 1 to 5") from None
    if isinstance(wanted, bool) or not isinstance(wanted, int) or not 1 <= wanted <= 5:
        # JetStream's own bound: a stream has 1 to 5 replicas
        raise InvalidArgument(f"replicas={wanted!r}: must be an int from 1 to 5")
    return wanted


def nats_urls(url: object) -> list[str]:
    """The server URLs ``url`` names: one URL, several separated by commas, or a list
    of them (``[]`` for ``None`` or ``""``: the embedded server).

    Raises:
        InvalidArgument: ``url`` is not a string or a list of strings, or names an
            empty URL (``"nats://a:4222,,nats://b:4222"``).
    """
    if url is None or (isinstance(url, str) and not url.strip()):
        return []
    parts = url.split(",") if isinstance(url, str) else url
    if not isinstance(parts, Sequence) or isinstance(parts, bytes | bytearray):
        raise InvalidArgument(f"url={url!r}: must be a NATS URL, or a list of them")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str) or not part.strip():
            raise InvalidArgument(
                f"url={url!r}: every URL must be a non-empty string "
                f"(like nats://127.0.0.1:4222), not {part!r}"
            )
        out.append(part.strip())
    if not out:
        raise InvalidArgument(f"url={url!r}: names no server")
    return out


async def _partition_count(store: NatsStore, wanted: int | None) -> int:
    """The namespace's partition count: fixed when the namespace is created, because
    every client must hash run IDs the same way."""
    key = "config.partitions"
    if wanted is not None and (
        isinstance(wanted, bool) or not isinstance(wanted, int) or not 1 <= wanted <= 4096
    ):
        raise InvalidArgument(f"partitions={wanted!r}: must be an int from 1 to 4096")
    # a new namespace stores it; an error reading it (NATS away) surfaces as itself
    # (after a failover the work bucket is new: the count the stream recorded is kept)
    default = wanted or store.recorded_partitions or 16
    value = await store.init_config(key, str(default).encode())
    try:
        stored = int(value)
    except ValueError:
        stored = 0
    if not 1 <= stored <= 4096:
        raise FuseeError(
            f"{key} in bucket {store.layout.work_bucket} holds {value!r}, not a partition "
            f"count from 1 to 4096: the namespace {store.layout.namespace!r} is damaged"
        )
    if wanted is not None and wanted != stored:
        raise InvalidArgument(
            f"partitions={wanted}: namespace {store.layout.namespace!r} was created with "
            f"{stored} partitions, and that cannot change"
        )
    return stored


def _base_url(url: object) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidArgument(f"callback_base_url={url!r}: must be an http(s) URL")
    return url.rstrip("/")


class Engine:
    """Starts runs, reads them, and (as a worker) executes them."""

    def __init__(
        self, store: NatsStore, *, url: str, server: EmbeddedServer | None, partitions: int
    ) -> None:
        self.store = store
        self.url = url
        self.server = server
        self.partitions = partitions
        self.namespace = store.layout.namespace
        # what the object handles of this engine share (``fusee._client.Client``)
        self.replies = Replies(store)
        self.answered = Answered()
        self._entered: list[Token[Client | None]] = []  # one per enclosing ``async with``
        self._tokens: Tokens | None = None
        store.followed.append(self._followed)  # a failover this client followed

    @property
    def tokens(self) -> Tokens:
        """The namespace's API tokens: ``create``, ``list``, ``revoke``, ``verify``, and
        ``stream_token`` for one token stream (see ``docs/security.md``).

        Example:
            ``made = await engine.tokens.create("read", name="dashboard")``
        """
        if self._tokens is None:
            self._tokens = Tokens(self.store.auth, self._secret("API tokens"), self.namespace)
        return self._tokens

    async def _followed(self) -> None:
        """The store took a later epoch's layout: the API tokens are the new home's
        (keyed by its secret, watched in its ``<ns>_auth``), made again at first use."""
        tokens, self._tokens = self._tokens, None
        if tokens is not None:
            await tokens.close()

    def _secret(self, what: str) -> bytes:
        """The namespace's secret, which ``what`` is keyed by.

        Raises:
            PermissionDenied: these NATS credentials may not read it (the client role).
        """
        if not self.store.completion_secret:
            raise PermissionDenied(
                f"{what} are keyed by the namespace's secret (config.secret in the "
                f"{self.store.layout.work_bucket} bucket), which these NATS credentials "
                f"({self.store.auth_method}) may not read: it takes the worker role of "
                "nats/accounts.conf (see docs/reference/nats-permissions.md)"
            )
        return self.store.completion_secret

    def object(self, obj: ObjectType | str, key: str) -> ObjectKey:
        """The object ``key`` of type ``obj`` (an ``fusee.object`` or its name), on
        this engine.

        Example:
            ``await engine.object(chats, "user-7").call("say", "hi")``
        """
        return ObjectKey(obj, key, self)

    async def object_types(self) -> list[str]:
        """The object types that have (or had) a key with state in this namespace, sorted
        (what ``GET /v1/objects`` and the web UI's Objects page list).

        Example:
            ``await engine.object_types()`` -> ``["cart", "chat"]``
        """
        return await self.store.list_object_types()

    async def list_objects(self, obj: ObjectType | str) -> list[tuple[str, dict[str, Any]]]:
        """Every key of an object type that has state, with its state, sorted by key:
        every change a caller was answered for is in it.

        The KV projections list the keys; a key active in the last ``IDLE_MARKER_TTL``
        (its marker in the work bucket) may have invocations its projection does not
        hold yet (written after the reply), so its journal is folded past it."""
        name = obj.name if isinstance(obj, ObjectType) else validate_name(obj, "object type")
        object_id(name, "k")
        states: dict[str, State] = {}
        for key, msg in await self.store.list_states(name):
            try:
                states[key] = decode_state(msg.data)
            except InvalidArgument:
                states[key] = {}  # unreadable (written by hand): rebuilt from the journal
        recent = set()
        for _, eid in await self.store.list_active(set(range(self.partitions))):
            named = parse_object_id(unescape(eid))
            if named is not None and named[0] == name:
                recent.add(named[1])
        limit = anyio.CapacityLimiter(64)

        failed: list[Exception] = []

        async def refresh(key: str) -> None:
            try:
                async with limit:
                    states[key] = await current_state(self.store, name, key)
            except Exception as exc:  # noqa: BLE001 - raised below, not as an ExceptionGroup
                failed.append(exc)

        projected = set(states)
        async with anyio.create_task_group() as tg:
            for key in recent:
                tg.start_soon(refresh, key)
        if failed:
            raise failed[0]
        return sorted(
            (key, {k: msgspec.json.decode(v) for k, v in state.items()})
            for key, state in states.items()
            if state or key in projected
        )

    async def limit(
        self,
        name: str,
        *,
        per_second: float | None = None,
        burst: int | None = None,
        concurrent: int | None = None,
    ) -> None:
        """Set (or change, at run time) limit ``name``: steps with ``limit=name`` take
        a permit before each attempt. ``per_second``: a token bucket of ``burst``
        tokens (default: one second's worth) refilled at that rate; ``concurrent``:
        attempts in flight at once. Stored in NATS, shared by every worker.

        Raises:
            InvalidId: ``name`` is not a valid name.
            InvalidArgument: a rate or count that is not positive (nothing is stored).

        Example:
            ``await engine.limit("openai", per_second=50, concurrent=20)``
        """
        await set_limit(self.store, self.partitions, name, per_second, burst, concurrent)

    async def update_limit(self, name: str, **changes: float | int | None) -> LimitInfo:
        """Change some fields of limit ``name`` (``per_second``, ``burst``,
        ``concurrent``); the others keep their value (``engine.limit()`` replaces the
        whole config). ``None`` removes the rate or the cap (a burst: back to its
        default); a new rate without a burst gets its default burst. A limit not set
        yet is set from the fields given. Answers the limit as it is then.

        Raises:
            InvalidId: ``name`` is not a valid name.
            InvalidArgument: an unknown field, or a config that is not valid (a
                negative rate, a burst without a rate...); nothing is stored.

        Example:
            ``await engine.update_limit("openai", per_second=20)``
        """
        return await update_limit(self.store, self.partitions, name, changes)

    async def limits(self) -> list[LimitInfo]:
        """Every limit: its config, holders, and waiters per fairness key."""
        return await list_limits(self.store, self.partitions)

    async def get_limit(self, name: str) -> LimitInfo:
        """Limit ``name``: its config, holders, and waiters per fairness key.

        Raises:
            InvalidId: ``name`` is not a valid name.
            UnknownLimit: no limit ``name`` was set.
        """
        return await get_limit(self.store, self.partitions, name)

    async def live_workers(self, *, listen: float = 0.5) -> dict[str, list[str]]:
        """The workers of this namespace alive now, each with the code it serves
        (``workflow:<name>``, ``object:<type>``), from the heartbeats they send every
        0.2 s: heard for ``listen`` seconds. Workers of another epoch (an old home's,
        after a failover) are not listed.

        Example:
            ``any("object:chat" in s for s in (await engine.live_workers()).values())``
        """
        heard: dict[str, list[str]] = {}

        async def on_beat(_subject: str, data: bytes, _reply: str | None) -> None:
            try:
                body = msgspec.json.decode(data)
            except msgspec.DecodeError:
                return
            if isinstance(body, dict) and isinstance(body.get("id"), str):
                if epoch_order(body.get("epoch"), self.store.layout.epoch) != 0:
                    return  # another epoch's worker, heard across regions: not a peer
                if body.get("bye"):
                    heard.pop(body["id"], None)
                else:
                    serves = body.get("serves")
                    heard[body["id"]] = sorted(serves) if isinstance(serves, list) else []

        unsubscribe = await self.store.subscribe_core(self.store.layout.heartbeat("*"), on_beat)
        try:
            await anyio.sleep(listen)
        finally:
            await unsubscribe()
        return heard

    async def __aenter__(self) -> Engine:
        """Within the block, object keys made without ``engine=`` use this engine
        (``chats.key("user-7")``; see ``ObjectKey``)."""
        self._entered.append(enter_client(self))
        return self

    async def __aexit__(self, *exc: builtins.object) -> None:
        if self._entered:
            leave_client(self._entered.pop())
        with anyio.CancelScope(shield=True):  # a cancelled block still closes
            await self.close()

    async def close(self) -> None:
        """Close the connection, and stop the embedded server if this engine started it."""
        if self._tokens is not None:
            await self._tokens.close()
        await self.store.close()
        if self.server is not None:
            await anyio.to_thread.run_sync(self.server.stop)
            self.server = None

    # -- runs ---------------------------------------------------------------------

    async def start(
        self,
        workflow: Workflow[Any] | str,
        run_id: str,
        arg: Any = None,
        *,
        timeout: DurationLike | None = None,
        from_run: str | None = None,
        upto: int | None = None,
    ) -> Run:
        """Start ``workflow`` as run ``run_id`` with input ``arg``; idempotent by ID.

        Starting the same run again (same workflow, same input) returns it. Returns
        once the start is stored: from then on the run will execute, even if this
        process dies.

        ``from_run`` (interrupt and regenerate): the ID of an ended (or paused) run of
        the same workflow whose history the new run starts from. The old run's finished
        calls (completed steps, ended waits) from its first call up to the first one that
        did not finish (or up to call ``upto``) are copied into the new run's journal,
        so its replay returns their results and runs the rest: pass the same input, and
        the code calls the same steps in the same order up to there. The old run stays
        as it was.

        Raises:
            RunExists: a run with this ID exists with another workflow or input.
            InvalidId: the ID cannot be stored.
            NotEncodable: the input is not JSON-encodable.
            RunNotFound: no run ``from_run``.
            InvalidArgument: ``from_run`` has not ended, or is of another workflow.

        Example:
            ``run = await engine.start(agent, "support-42", "Where is my order?", timeout="15m")``
        """
        name = (
            workflow.name
            if isinstance(workflow, Workflow)
            else validate_name(workflow, "workflow name")
        )
        run_id = check_run_id(validate_id(run_id, "run ID"))
        seconds = parse_duration(timeout, "timeout") if timeout is not None else None
        if seconds is not None and seconds <= 0:
            raise InvalidArgument(f"timeout={timeout!r}: a run's timeout must be positive")
        data = canonical(arg, f"the input of run {run_id!r}", limit=self.store.max_value)
        eid = escape(run_id)
        partition = partition_of(run_id, self.partitions)
        reused = await self._reusable(name, from_run, upto) if from_run is not None else []
        record = RunStarted(
            workflow=name,
            input=msgspec.Raw(data),
            started_at=time.time(),
            timeout=seconds,
            partition=partition,
            from_run=from_run if from_run is not None else msgspec.UNSET,
        )

        async def attach() -> None:
            await self._existing(run_id, eid, name, data, seconds, upto)

        async def copy(history: History) -> None:
            # The copies land before the run is marked active, so no worker runs it
            # without them; a retried start finishes the copy of a starter that died.
            await self._append_copies(eid, history, reused, 0)

        now = time.time()
        created = await start_or_attach(
            self.store,
            run_id,
            record,
            now=now,
            attach=attach,
            # (a run of its own: its marker rides its first record)
            before_active=copy if from_run is not None else None,
        )
        if created:
            log.debug("run.submitted", run_id=run_id, workflow=name)
        run = Run(self, run_id, exists=True)
        run.created = created
        return run

    async def _reusable(self, name: str, from_run: str, upto: int | None) -> list[AnyRecord]:
        """The records of ended run ``from_run`` that a new run of ``name`` reuses."""
        from_run = validate_id(from_run, "from_run")
        if upto is not None and (isinstance(upto, bool) or not isinstance(upto, int) or upto < 0):
            raise InvalidArgument(f"upto={upto!r}: a call position, an int >= 0")
        messages = await self.store.read_journal(escape(from_run))
        if not messages:
            raise RunNotFound(f"no run {from_run!r} in namespace {self.namespace!r}")
        try:
            # (read as every reader does: a break a forced resume accepted is taken)
            records = load_journal(
                History(from_run),
                [(m.seq, m.data) for m in messages],
                scheduled=scheduled_by(messages),
            )
        except JournalGap as gap:
            raise InvalidArgument(
                f"from_run={from_run!r}: its journal's chain is broken ({gap}); resume it "
                f"with force=True first, or regenerate from another run"
            ) from None
        if not isinstance(records[-1], (*TERMINAL, RunPausedRecord)):
            raise InvalidArgument(
                f"from_run={from_run!r}: the run has not ended; cancel it first "
                f"(engine.run({from_run!r}).cancel(...)) and wait for it to end"
            )
        started = [r for r in records if isinstance(r, RunStarted)][-1]
        if started.workflow != name:
            raise InvalidArgument(
                f"from_run={from_run!r}: that run is of workflow {started.workflow!r}, not {name!r}"
            )
        return reusable(records, upto, stop_prefix=COMPENSATE)

    async def _append_copies(
        self, eid: str, history: History, reused: list[AnyRecord], done: int
    ) -> None:
        """Append ``reused[done:]`` after the run's last record, linked into its chain."""
        for i in range(done, len(reused)):
            prev, prev_hash = history.link()
            copy = msgspec.structs.replace(reused[i], prev=prev, prev_hash=prev_hash)
            blob = encode_record(copy)
            msg_id = f"{eid}:reuse:{history.started_seq}:{i}"
            at = await self.store.append(eid, kind_of(copy), blob, fence=prev, msg_id=msg_id)
            history.add(at, copy, blob)

    async def _finish_copies(self, run_id: str, eid: str, upto: int | None) -> None:
        """A regenerated run whose starter died while copying: copy the rest. Only when
        the journal holds exactly a prefix of the copies (nothing ran it yet)."""
        history = History(run_id)
        try:
            messages = await self.store.read_journal(eid)
            records = load_journal(
                history, [(m.seq, m.data) for m in messages], scheduled=scheduled_by(messages)
            )
        except JournalGap:
            return  # (broken: not a prefix of the copies; its worker pauses it)
        started = history.started
        if started is None or not isinstance(started.from_run, str) or history.generation > 1:
            return
        reused = await self._reusable(started.workflow, started.from_run, upto)
        have, want = (
            [msgspec.structs.replace(r, prev=0, prev_hash="") for r in rs]
            for rs in (records[1:], reused)
        )
        if len(have) < len(want) and have == want[: len(have)]:
            with contextlib.suppress(Fenced):  # another retried start got there first
                await self._append_copies(eid, history, reused, len(have))

    async def _existing(
        self,
        run_id: str,
        eid: str,
        name: str,
        data: bytes,
        timeout: float | None,
        upto: int | None = None,
    ) -> Run:
        first = await self.store.first_in_journal(eid)
        if first is None:  # pragma: no cover - the fence said there was one
            raise RunExists(f"run {run_id!r} exists but its journal cannot be read")
        started = decode_record(first.data)
        assert isinstance(started, RunStarted)
        if started.workflow != name:
            raise RunExists(
                f"run {run_id!r} exists with workflow {started.workflow!r}, not {name!r}"
            )
        if started.timeout != timeout:
            raise RunExists(
                f"run {run_id!r} exists with timeout "
                f"{format_duration(started.timeout) if started.timeout else 'none'}, "
                f"not {format_duration(timeout) if timeout else 'none'}"
            )
        if bytes(started.input) != data:
            raise RunExists(
                f"run {run_id!r} exists with another input: {_clip(bytes(started.input))} "
                f"(this start: {_clip(data)})"
            )
        last = await self.store.last_in_journal(eid)
        if last is not None and last.headers.get("Fusee-Kind") not in (*ENDED, "run.paused"):
            # A start whose marker write was lost (the starter died): restore it.
            if isinstance(started.from_run, str):
                await self._finish_copies(run_id, eid, upto)
            marker = start_marker(run_id, first.data, now=started.started_at)
            await self.store.mark_run_active(started.partition, eid, marker)
        return Run(self, run_id, exists=True)

    def run(self, run_id: str) -> Run:
        """A handle on run ``run_id`` (no I/O until it is used)."""
        return Run(self, check_run_id(validate_id(run_id, "run ID")))

    async def complete(self, token: str, value: Any = None) -> bool:
        """Complete the ``ctx.await_completion`` wait that ``token`` names with ``value``
        (the wait returns it); durable once it returns.

        Returns True when this call stored the completion, False when the same value
        was already given (a retry, or a second click): completing twice is idempotent.

        Raises:
            InvalidToken: the token is malformed or forged, names no completion wait of
                this namespace, or can no longer be used: its wait timed out or its run
                ended ("expired"), or it was completed with another value ("already used").
            NotEncodable: the value is not JSON-encodable.

        Example:
            ``await engine.complete(token, {"approved": False, "reason": "too much"})``
        """
        run_id, pos, history, wait = await self._completion_wait(token)
        data = canonical(value, "the value of a completion", limit=self.store.max_value)
        eid = escape(run_id)
        what = f"completion {wait.name!r} of run {run_id!r}"
        done = history.waited.get(pos)
        if done is not None:
            if done.timed_out:
                raise InvalidToken(f"{what} has expired: its wait timed out", spent=True)
            if canonical(decode_value(bytes(done.value)), "") == data:
                return False
            raise InvalidToken(
                f"{what} was already used: it was completed with another value", spent=True
            )
        expired = _expired(history, pos, wait.name)
        if expired is not None:
            raise InvalidToken(f"{what} has expired: {expired}", spent=True)
        assert history.started is not None
        partition = history.started.partition
        body = encode_message(
            Completion(pos=pos, start=history.started_seq, value=msgspec.Raw(data))
        )
        # one message per wait: a second complete within the dedupe window stores nothing
        msg_id = f"{eid}:completion:{history.started_seq}:{pos}"
        seq, duplicate = await self.store.send_inbox_once(
            partition, eid, "completion", body, msg_id=msg_id
        )
        # The run takes the first completion of the wait in its inbox (past the dedupe
        # window an earlier one may be there still, not yet taken): is it this one?
        first_seq, first = (await self._completions(partition, eid, history, pos))[0]
        if first_seq == seq and not duplicate:
            await self.store.wake(partition, eid)
            return True
        if first == data:
            return False
        raise InvalidToken(
            f"{what} was already used: it was completed with another value", spent=True
        )

    async def complete_wait(self, run_id: str, pos: int, value: Any = None) -> bool:
        """Complete the ``ctx.await_completion`` wait at position ``pos`` of run
        ``run_id`` with ``value``, as its token would (:meth:`complete`): for an operator
        who holds an API token but not the callback URL (the web UI's approve button).

        Returns True when this call stored the completion, False when the same value
        was already given.

        Raises:
            RunNotFound: no run ``run_id``.
            InvalidToken: the run has no completion wait at ``pos``, or the wait can no
                longer be completed (``spent``; see :meth:`complete`).

        Example:
            ``await engine.complete_wait("support-42", 3, True)``
        """
        run_id = check_run_id(validate_id(run_id, "run ID"))
        history = History(run_id)
        journal = await self.store.read_journal(escape(run_id))
        load_journal(history, [(m.seq, m.data) for m in journal])
        if history.started is None:
            raise RunNotFound(f"no run {run_id!r} in namespace {self.namespace!r}")
        wait = history.waits.get(pos)
        if wait is None or wait.wait != "completion":
            raise InvalidToken(
                f"run {run_id!r} has no completion wait at position {pos} "
                "(its journal's wait.started records with wait 'completion' name them)"
            )
        token = completion_token(
            self.store.completion_secret,
            self.namespace,
            run_id,
            history.started_seq,
            pos,
            wait.name,
        )
        return await self.complete(token, value)

    async def completion(self, token: str) -> CompletionInfo:
        """What the ``ctx.await_completion`` wait that ``token`` names asks for, and
        whether it still waits (what ``GET /v1/completions/<token>`` shows a person).

        Raises:
            InvalidToken: the token is malformed or forged, or names no completion wait
                of this namespace.
        """
        run_id, pos, history, wait = await self._completion_wait(token)
        assert history.started is not None
        info = CompletionInfo(
            run_id=run_id,
            workflow=history.started.workflow,
            name=wait.name,
            status="waiting",
            until=wait.until,
        )
        done = history.waited.get(pos)
        if done is not None and done.timed_out:
            info.status, info.reason = "expired", "its wait timed out"
        elif done is not None:
            info.status, info.value = "completed", decode_value(bytes(done.value))
        elif (expired := _expired(history, pos, wait.name)) is not None:
            info.status, info.reason = "expired", expired
        return info

    async def _completion_wait(self, token: str) -> tuple[str, int, History, WaitStarted]:
        """The run, position, journal and wait a completion token names, its MAC checked."""
        run_id, pos, mac = parse_token(token)
        secret = self._secret("completion tokens")
        history = History(run_id)
        journal = await self.store.read_journal(escape(run_id))
        load_journal(history, [(m.seq, m.data) for m in journal], scheduled=scheduled_by(journal))
        wait = history.waits.get(pos)
        if history.started is None or wait is None or wait.wait != "completion":
            raise InvalidToken(
                f"completion token for run {run_id!r} position {pos}: no such completion wait "
                f"in namespace {self.namespace!r} (forged, or for another namespace)"
            )
        if not mac_matches(
            mac,
            secret,
            self.namespace,
            run_id,
            history.started_seq,
            pos,
            wait.name,
        ):
            raise InvalidToken(
                f"completion token for run {run_id!r} position {pos}: forged (its MAC does "
                f"not match)"
            )
        return run_id, pos, history, wait

    async def _completions(
        self, partition: int, eid: str, history: History, pos: int
    ) -> list[tuple[int, bytes]]:
        """``(sequence, value)`` of the completions stored in the run's inbox for the wait
        at ``pos``, oldest first (values as canonical JSON)."""
        out = []
        for msg in await self.store.read_inbox(partition, eid):
            body = decode_message(msg.data)
            if (
                isinstance(body, Completion)
                and body.pos == pos
                and body.start == history.started_seq
            ):
                out.append((msg.seq, canonical(body.value, "")))
        return out

    async def list_runs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        id_prefix: str | None = None,
    ) -> list[RunInfo]:
        """Every run in the namespace, newest first: the run index, and the runs not in
        it yet (started, never parked, not ended) from their active markers, ``running``
        when their partition's owner answers its ping, else ``pending``.

        With a filter, only the runs it matches, read from the parts of the index that
        hold them (a status and a workflow are subject filters: other runs are not
        read; see :meth:`runs`). ``since``/``until``: start times, a duration back from
        now (``"1h"``) or an ISO 8601 time.

        Raises:
            ConfigError: an unknown status, a bad time, ``until`` not after ``since``.
        """
        if (status, workflow, since, until, id_prefix) != (None,) * 5:
            f = self._filter(status, workflow, since, until, id_prefix)
            out = [info async for found in iter_runs(self, f) for info in found]
            return sorted(out, key=lambda i: i.created_at, reverse=True)
        infos = {key: decode_info(value) for key, value in await self.store.list_index()}
        unindexed: list[RunInfo] = []
        for eid, value in (await self.store.run_markers()).items():
            if eid in infos:
                continue
            try:
                info = decode_info(value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # not written by fusee: nothing to show
            infos[eid] = info
            unindexed.append(info)
        if unindexed:
            # each partition's owner record read, and each owner pinged once, all at once
            # (a frozen owner costs one ping's patience, not one per partition)
            live = await self.store.live_partitions({i.partition for i in unindexed})
            for info in unindexed:
                if info.partition in live:
                    info.status = "running"
        return sorted(infos.values(), key=lambda i: i.created_at, reverse=True)

    async def runs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        id_prefix: str | None = None,
        page: int = PAGE,
    ) -> AsyncGenerator[list[RunInfo], None]:
        """The runs the filter matches, a page of at most about ``page`` at a time, never
        all in memory: ended runs from their listing entries
        (``<ns>.in.x.<status>.<workflow>.<eid>``), paused runs from theirs, the others
        from their active markers (see "The run index is a projection"). Each run once
        (the IDs of the runs not ended yielded so far are kept); newest first within a
        page only, and without a ``status`` the pages come by source: the runs not
        ended, the paused, then each ended status.

        Raises:
            ConfigError: an unknown status, a bad time, ``until`` not after ``since``.

        Example:
            ``async for page in engine.runs(status="failed", workflow="support"): ...``
        """
        f = self._filter(status, workflow, since, until, id_prefix)
        async for found in iter_runs(self, f, page=page):
            yield found

    async def runs_page(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        id_prefix: str | None = None,
        after: tuple[int, int] | None = None,
        page: int = 100,
    ) -> tuple[list[RunInfo], tuple[int, int] | None]:
        """One page of :meth:`runs` for a reader that pages across calls (the HTTP API's
        ``GET /v1/runs`` cursor): the runs the filter matches among at most ``page``
        index entries read from position ``after`` (None: the start), and the position
        of the next page (None: none). A page can hold fewer runs than ``page``, or
        none, and still have a next one; each call reads one page of the index.

        Raises:
            ConfigError: an unknown status, a bad time, ``until`` not after ``since``.
        """
        f = self._filter(status, workflow, since, until, id_prefix)
        stage, start = after if after is not None else (0, 1)
        return await runs_page(self, f, stage=stage, start=start, page=page)

    async def count_paused(self, *, workflow: str | None = None) -> int | None:
        """How many paused runs of ``workflow`` (None: of all) the index lists, counted
        without reading them (two requests, whatever the count): at most that many
        are paused (a stale listing, or one removed in the second before it expires,
        counts too). Best effort: None when NATS cannot count now (nothing raised).

        Example:
            ``await engine.count_paused(workflow="support")``
        """
        if workflow is not None and (not isinstance(workflow, str) or not workflow):
            raise ConfigError(f"workflow={workflow!r}: must be a non-empty string")
        try:
            return await self.store.count_listed("paused", workflow)
        except FuseeError:  # ConnectionLost among them
            return None

    async def bulk_cancel(
        self,
        *,
        reason: str = "cancelled",
        status: str | None = None,
        workflow: str | None = None,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        id_prefix: str | None = None,
        dry_run: bool = False,
        concurrency: int = CONCURRENCY,
        on_run: OnRun | None = None,
    ) -> BulkSummary:
        """Cancel every run that has not ended and that the filter matches, paging
        through the index, ``concurrency`` cancels in flight. Safe to run again after an
        interruption: a run cancelled by the first pass has ended and is not listed (or
        its cancel returns False: counted as skipped). The summary's ``done`` counts the
        cancels sent (stored in each run's inbox), not taken: each run ends when its
        worker reads it (see :class:`fusee.BulkSummary`). ``dry_run``: each run is asked what the
        pass would do (``Run.cancel(dry_run=True)``) and counted the same way, nothing is
        written; ``on_run(info, what)`` is called for each run (``"would"``: a dry run's
        done).

        Raises:
            ConfigError: bad filter (before anything is done), an ended status.

        Example:
            ``await engine.bulk_cancel(workflow="support", status="running", since="1h",
            reason="bad deploy")``
        """
        return await bulk(
            self,
            "cancel",
            self._filter(status, workflow, since, until, id_prefix),
            reason=reason,
            dry_run=dry_run,
            concurrency=concurrency,
            on_run=on_run,
        )

    async def bulk_resume(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        id_prefix: str | None = None,
        dry_run: bool = False,
        concurrency: int = CONCURRENCY,
        on_run: OnRun | None = None,
    ) -> BulkSummary:
        """Resume every paused run the filter matches (``Run.resume()`` each), as
        :meth:`bulk_cancel` does: a run resumed by an interrupted pass is not listed
        (its marker is back), or not paused any more (skipped), or its resume is the
        same message again (deduplicated). ``done`` counts the resumes sent, not taken
        (the run journals ``run.resumed`` when its worker reads it); a run paused on a
        broken journal chain is failed (it needs ``resume(force=True)``), by a dry run too
        (each run asked as ``Run.resume(dry_run=True)``, nothing written).

        Raises:
            ConfigError: bad filter, a status other than ``paused``.
        """
        return await bulk(
            self,
            "resume",
            self._filter(status, workflow, since, until, id_prefix),
            dry_run=dry_run,
            concurrency=concurrency,
            on_run=on_run,
        )

    @staticmethod
    def _filter(
        status: str | None,
        workflow: str | None,
        since: TimeLike | None,
        until: TimeLike | None,
        id_prefix: str | None,
    ) -> RunFilter:
        return make_filter(
            status=status,
            workflow=workflow,
            since=since,
            until=until,
            id_prefix=id_prefix,
            now=time.time(),
        )

    # -- serving ------------------------------------------------------------------

    def _worker(
        self, *, registry: Registry | None = None, config: WorkerConfig | None = None
    ) -> Worker:
        cfg = config or WorkerConfig(partitions=self.partitions)
        cfg.partitions = self.partitions
        return Worker(
            self.store,
            registry or REGISTRY,
            namespace=self.namespace,
            clock=time.time,
            config=cfg,
        )

    async def mirror_lag(self) -> MirrorLag | None:
        """How far the partner region's mirror of the namespace's journal is behind it:
        records a failover now would lose at most (``behind``), with the mirror's own
        ``lag``; None when the namespace has no mirror (see ``connect(partner=)``).

        Example:
            ``lag = await engine.mirror_lag(); print(lag.behind if lag else "no mirror")``
        """
        return await self.store.mirror_lag()

    def _check_home(self) -> None:
        """A worker executes a regional namespace's runs only in its home region (its
        appends would cross regions, and a failover moves the home away from it).
        From here this process never follows a failover: its workers' appends stay
        fenced by the epoch they start in."""
        store = self.store
        store.follows_failover = False
        if store.region is not None and store.layout.home != store.region:
            raise ConfigError(
                f"namespace {self.namespace!r} has its home in region "
                f"{store.layout.home!r} (epoch {store.layout.epoch}); this worker is in "
                f"{store.region!r}: start it there, or after `fusee region failover --to "
                f"{store.region}`"
            )

    async def serve(self, *, registry: Registry | None = None) -> None:
        """Execute runs until cancelled (Ctrl-C, SIGTERM): a worker in the foreground.

        Raises:
            ConfigError: a regional namespace whose home is not this engine's region.

        Example:
            ``await engine.serve()``
        """
        self._check_home()
        with self.store.retrying_for(math.inf):  # actors ride out a NATS outage
            async with anyio.create_task_group() as tg:
                await self._open_listings(tg)
                await self._worker(registry=registry).run()
                tg.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def worker(
        self, *, registry: Registry | None = None, config: WorkerConfig | None = None
    ) -> AsyncIterator[Worker]:
        """Execute runs in the background while the block runs.

        Example:
            ``async with engine.worker(): print(await engine.run("r1").result())``
        """
        self._check_home()
        w = self._worker(registry=registry, config=config)
        async with anyio.create_task_group() as tg:
            # the worker's tasks copy this context: its actors ride out a NATS outage,
            # while this engine's own calls keep the client's bounded retries
            with self.store.retrying_for(math.inf):
                await self._open_listings(tg)
                await tg.start(w.run)
            try:
                yield w
            finally:
                tg.cancel_scope.cancel()

    async def _open_listings(self, tg: anyio.abc.TaskGroup) -> None:
        """A worker's part of the listings before it serves (a reader's is none: see
        ``NatsStore.open_listings``): ``config.listed_from`` now, and the listing of an
        earlier version's pauses in ``tg``, in the background (a namespace's whole
        ``<ns>_runs`` bucket, a page at a time: nothing the worker serves waits for
        it), tried again while it fails."""
        await self.store.note_listed_from()
        tg.start_soon(self._list_old_pauses)

    async def _list_old_pauses(self) -> None:
        delay = 1.0
        while True:
            try:
                await self.store.list_old_pauses()
                return
            except FuseeError as exc:  # ConnectionLost among them
                log.warning(
                    "old_pauses_not_listed",
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in=delay,
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, 60.0)


def _expired(history: History, pos: int, name: str) -> str | None:
    """Why the completion wait at ``pos`` can no longer be completed (not done yet)."""
    if history.ended:
        return "the run ended while it waited"
    asked = history.outcomes.get(pos + 1)
    if isinstance(asked, StepFailedRecord) and asked.name == f"ask/{name}":
        return "its ask step failed, so it never waited"
    return None


@dataclasses.dataclass
class CompletionInfo:
    """A completion wait, as its token shows it (``Engine.completion``).

    Attributes:
        status: ``waiting``, ``completed`` (``value`` is what it got) or ``expired``
            (``reason`` says why).
        until: when it times out (epoch seconds), if it does.
    """

    run_id: str
    workflow: str
    name: str
    status: str
    until: float | None = None
    value: Any = None
    reason: str | None = None


def _clip(data: bytes, n: int = 80) -> str:
    text = data.decode(errors="replace")
    return text if len(text) <= n else text[: n - 1] + "…"
