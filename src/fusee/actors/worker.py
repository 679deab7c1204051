"""A worker: owns partitions, runs the actors of the runs in them, fails over.

Liveness, not safety, is decided here. Run IDs hash into P partitions; each partition
has one owner, recorded in the work bucket (``owner.<p>``) and changed only by
compare-and-set. Workers announce themselves with heartbeats on core NATS and answer
pings; the owner a partition should have is the live worker that ranks highest for it
(rendezvous hashing), so adding a worker moves only its share. A worker that stops
heartbeating is pinged: no responders means its connection is gone (a dead process)
and its partitions are taken at once; no answer in time (a stopped process) is taken
as dead too. Safety never rests on any of this: every journal append is fenced, so a
worker that still believes it owns a partition is refused at its next write.

NATS being slow, restarting or away for a while is not a reason to stop: the store
raises ``ConnectionLost``, every loop here catches it, logs ``nats.unreachable`` once,
tries again with backoff and logs ``nats.reachable`` when an owner read answers again.
Only a fence (or the owner record naming another worker) makes it drop an actor.

An actor that crashes (an exception escapes ``actor.run()``: the actor's own code or
the store, never a handler's or a step's, which are journaled) is quarantined: it is
not activated again before a backoff (1 s doubling to 5 minutes) has passed, whatever
pokes it, and the reason is written where ``runs show`` and ``objects show`` read it.
A clean activation ends the quarantine; a worker that starts afresh tries at once.

Workers may serve different code. Each announces in its heartbeat the workflows and
object types it has. A partition's owner runs what it can; a run or key of a partition
whose owner lacks its code is handed to the live worker that has the code and ranks
highest for the partition (rendezvous hashing over those workers only), with a ``take``
message on core NATS, repeated at every reconcile while the run is active (a lost one,
a guest that died, a worker that joined with the code: the next round sorts it out). The
guest runs it as its own without owning the partition; the fence still guards every
append. With no live worker serving it, the run's index says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import structlog

from fusee.actors.core import ActorCore, Driver
from fusee.actors.limit_actor import LimitActor
from fusee.actors.object_actor import ObjectActor
from fusee.actors.ports import ClusterStore, Stored, SubjectLayout
from fusee.actors.registry import Registry
from fusee.actors.run_actor import RunActor
from fusee.actors.run_index import project_index
from fusee.actors.shared import serve_shared_call
from fusee.actors.starts import start_marker
from fusee.errors import CommitFailed, ConnectionLost, Evicted, FailedOver, Fenced
from fusee.logs import get_logger
from fusee.runtime.ids import unescape
from fusee.runtime.index import decode_info
from fusee.runtime.limits import RENEW_EVERY, RenewOp, core_subject, encode_core, parse_limit_id
from fusee.runtime.objects import parse_object_id
from fusee.runtime.parking import ParkingLot
from fusee.runtime.regions import epoch_order, region_lease, validate_lease

__all__ = ("Worker", "WorkerConfig", "new_worker_id")

log = get_logger()


# How long an idle object's marker lasts: a worker that dies just as an object goes idle
# leaves it to the next owner for this long (see Worker._actor_task).
IDLE_MARKER_TTL = 600.0
# How long a run that ended here is not activated again: its active marker's purge
# (a purge marker with a 1 s TTL) keeps the key listed until the server removes it.
ENDED_LISTED = 5.0

# While NATS does not answer: the first retry after this long, doubling up to the cap.
OUTAGE_BACKOFF = (0.25, 2.0)

# A guest (an actor run here for a partition owner that lacks its code) is a lease the
# owner renews with a `take` at each of its reconciles (every ``verify_every``): one not
# renewed for this many rounds is let go (the partition moved to a worker with the
# code, or the owner died), so two workers do not keep running it.
GUEST_LEASE_ROUNDS = 3

# An actor that crashed is activated again after this long, doubling up to the cap.
CRASH_BACKOFF = (1.0, 300.0)


def new_worker_id() -> str:
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:24]
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def rank(partition: int, worker: str) -> int:
    digest = hashlib.blake2b(f"{partition}:{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_for(partition: int, workers: set[str]) -> str:
    return max(workers, key=lambda w: rank(partition, w))


def capable_for(partition: int, workers: dict[str, frozenset[str]], code: str) -> str | None:
    """The worker that should run ``code`` (``"workflow:<name>"`` or ``"object:<type>"``)
    in ``partition``: the highest ranked of the ``workers`` (ID -> the code it serves)
    that serve it, or None when none does."""
    able = {w for w, serves in workers.items() if code in serves}
    return owner_for(partition, able) if able else None


def code_of(registry: Registry) -> frozenset[str]:
    """What a worker with ``registry`` serves, as announced in its heartbeat."""
    return frozenset(
        [f"workflow:{n}" for n in registry.names()]
        + [f"object:{n}" for n in registry.object_names()]
    )


def _any_partition(layout: SubjectLayout) -> str:
    """The wake subject of every partition: a wildcard in place of the last token (the
    partition, as :meth:`Worker._on_wake` reads it back)."""
    return layout.wake(0).rpartition(".")[0] + ".*"


@dataclass
class WorkerConfig:
    partitions: int = 16
    heartbeat: float = 0.2  # seconds between heartbeats
    suspect_after: float = 0.7  # silence after which a worker is pinged
    # How long a ping's answer may take before the worker is taken as dead (PING_TIMEOUT
    # too). A dead process answers at once (no responders), so this only times a frozen
    # or cut-off one; a live worker starved of CPU for a second (heartbeat gaps of
    # 1.2-1.35 s were seen at a load of 8 on 2 cores) must not be judged dead, or its
    # running steps are stopped and run again elsewhere.
    ping_timeout: float = 2.0
    verify_every: float = 2.0  # re-read partition owners and active runs this often
    drain_timeout: float = 5.0  # a released partition's steps get this long to commit
    # then an actor whose step's body has returned, its result not yet journaled (NATS
    # slow or away), gets this long more before it is cancelled: cancelled, the step
    # would run again in the partition's next owner
    commit_grace: float = 5.0
    # A regional namespace's worker appends only while it holds its region's lease,
    # renewed every lease/4 by a write only the JetStream meta quorum accepts: a home
    # cut off from its partner and the witness stops appending within this many
    # seconds, and an unplanned failover waits as long before it promotes the mirror
    # ($FUSEE_REGION_LEASE, the same for both; docs/operations.md)
    lease: float = field(default_factory=lambda: region_lease())
    # FUSEE_ALWAYS_REPLAY=1: evict every actor after each step (replay tests)
    always_replay: bool = field(
        default_factory=lambda: os.environ.get("FUSEE_ALWAYS_REPLAY", "") not in ("", "0")
    )


@dataclass
class _Quarantine:
    """An actor of ``partition`` that crashed ``crashes`` times in a row: not activated
    before ``until`` (anyio time)."""

    partition: int
    crashes: int = 0
    until: float = 0.0

    def crashed(self) -> float:
        """Count one more crash; the seconds until the actor may run again."""
        self.crashes += 1
        first, cap = CRASH_BACKOFF
        delay: float = min(first * 2.0 ** (self.crashes - 1), cap)
        self.until = anyio.current_time() + delay
        return delay


@dataclass
class _Slot:
    partition: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    evict: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    actor: ActorCore | None = None

    def poke(self, msg: Stored | None = None) -> None:
        """The run's inbox may hold something new (``msg``, when the inbox consumer
        delivered it): its actor reads it."""
        if self.actor is not None:
            if msg is not None:
                self.actor.push(msg)
            if self.actor.woken is not None:
                self.actor.woken.set()


class Worker:
    def __init__(
        self,
        store: ClusterStore,
        registry: Registry,
        *,
        namespace: str,
        clock: Callable[[], float],
        config: WorkerConfig | None = None,
        worker_id: str | None = None,
    ) -> None:
        # the JetStream adapter, seen through a port: the actors never import nats
        self.store = store
        self.registry = registry
        self.namespace = namespace
        self.clock = clock
        self.config = config or WorkerConfig()
        self.id = worker_id or new_worker_id()
        self.owned: dict[int, int] = {}
        self.members: dict[str, float] = {}
        self.actors: dict[str, _Slot] = {}
        self.unrunnable: set[str] = set()
        # peers' code (from their heartbeats), the code each unrunnable actor of an
        # owned partition needs (eid -> (partition, code)), the actors run here for a
        # partition owner that lacks their code (eid -> partition), and the runs whose
        # index says no live worker serves them
        self.serves: dict[str, frozenset[str]] = {}
        self.needs: dict[str, tuple[int, str]] = {}
        self.guests: dict[str, int] = {}
        self._guest_renewed: dict[str, float] = {}  # eid -> when its last take came
        self._unserved: set[str] = set()
        # eid -> quarantine of the actors that crashed (dropped by a clean activation)
        self.quarantined: dict[str, _Quarantine] = {}
        # the actors that left memory to wait for their inbox: runs that wait, objects
        # gone idle (brought back by a message, not by reconcile), and whether a wake
        # hint or an inbox message was dropped (the queue was full), so the next
        # reconcile reads their inboxes, since one may be for them
        self.lot = ParkingLot()
        # Runs this worker saw end, and when (anyio time): their purged marker stays
        # listed for its TTL's second, and a reconcile then would activate the run
        # again only to find it ended (and write its index entry and purge again).
        self._ended: dict[str, float] = {}
        self._releasing: set[int] = set()
        self._kick = anyio.Event()
        self._stopping = False
        self._superseded = False  # a worker of a later epoch was heard (logged once)
        self._lease_out = False  # the region lease ran out (logged once per lapse)
        validate_lease(self.config.lease)
        self._shared_unsubscribe: list[Callable[[], Awaitable[None]]] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._actors_tg: anyio.abc.TaskGroup | None = None
        self._actors_closed = anyio.Event()
        self._last_verify = 0.0
        self._verifications = 0
        # since when NATS has not answered (anyio time), None while it does
        self._outage_since: float | None = None
        send, receive = anyio.create_memory_object_stream[tuple[int, str, Stored | None]](10_000)
        self._wakes_in, self._wakes_out = send, receive
        self._queued = 0  # wake-ups sent to the wake loop and not handled yet

    @property
    def parked(self) -> dict[str, tuple[int, int]]:
        """``eid: (partition, the last inbox sequence it read)`` of the parked actors."""
        return self.lot.parked

    @property
    def superseded(self) -> bool:
        """Whether a worker of a later epoch was heard: the namespace failed over, and
        this worker claims nothing any more (:meth:`_stand_down`)."""
        return self._superseded

    # -- life cycle -------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; ``task_status.started()`` once partitions are claimed."""
        lay = self.store.layout
        with structlog.contextvars.bound_contextvars(worker=self.id):
            async with anyio.create_task_group() as tg:
                self._tg = tg
                unsubscribe = [
                    await self.store.subscribe_core(lay.ping(self.id), self._on_ping),
                    await self.store.subscribe_core(lay.take(self.id), self._on_take),
                    await self.store.subscribe_core(lay.heartbeat("*"), self._on_heartbeat),
                    await self.store.subscribe_core(_any_partition(lay), self._on_wake),
                    await self.store.subscribe_inbox(self._on_inbox),
                ]
                for name in self.registry.object_names():  # shared handlers, any worker
                    self._shared_unsubscribe.append(
                        await self.store.subscribe_core(
                            lay.shared_calls(name), self._on_shared, queue="fusee-shared"
                        )
                    )
                leased = False
                try:
                    await tg.start(self._host_actors)
                    if lay.regional:
                        # armed before the first claim: appends wait until it is held
                        self.store.hold_lease()
                        leased = True
                        if not await self.store.renew_lease(self.config.lease):
                            self._lease_lost()
                        tg.start_soon(self._lease_loop)
                    await self._publish_heartbeat()
                    tg.start_soon(self._heartbeat_loop)
                    tg.start_soon(self._wake_loop)
                    try:
                        # owners that did not answer are not pinged again per partition
                        await self._balance(gone=await self._discover())
                    except ConnectionLost as exc:
                        self._unreachable(exc)  # the balance loop tries again
                    log.info(
                        "worker.started",
                        partitions=sorted(self.owned),
                        workflows=self.registry.names(),
                        objects=self.registry.object_names(),
                    )
                    task_status.started()
                    await self._balance_loop()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._shutdown()
                        if leased:  # (its actors' last commits are done)
                            self.store.release_lease()
                        with anyio.move_on_after(1.0):  # NATS may be away
                            for unsub in [*unsubscribe, *self._shared_unsubscribe]:
                                await unsub()
                        # ends the wake loop (its receive side closes with the stream)
                        await self._wakes_in.aclose()

    async def _host_actors(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # Actors live in a shielded task group: stopping the worker (Ctrl-C, SIGTERM)
        # does not cancel a step mid-call. _shutdown lets each actor reach its next step
        # boundary (up to drain_timeout), then cancels what is left and ends this host.
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as actors:
                self._actors_tg = actors
                task_status.started()
                await self._actors_closed.wait()
                actors.cancel_scope.cancel()

    async def _shutdown(self) -> None:
        """Bounded whatever NATS's state: ``drain_timeout``, ``commit_grace`` when a
        finished step's result is still being journaled, and a second for the
        partitions to be handed over, then what is left is cancelled."""
        self._stopping = True
        try:
            await self._publish_heartbeat(bye=True)
            bound = self.config.drain_timeout + self.config.commit_grace + 1
            with anyio.move_on_after(bound):
                async with anyio.create_task_group() as tg:
                    for p in list(self.owned):
                        tg.start_soon(self._release, p)
                    tg.start_soon(self._release_guests)
        finally:
            for slot in list(self.actors.values()):
                slot.scope.cancel()
            self._actors_closed.set()
            log.info("worker.stopped")

    async def unfinished(self) -> list[str]:
        """The actors of this worker's partitions with work going on or queued: in
        memory, or marked active and neither parked (waiting for their inbox, idle) nor
        held back (unrunnable here, quarantined). Empty: everything it was given
        finished or waits."""
        marked = [e for _, e in await self.store.list_active(set(self.owned))]
        return sorted(
            {*self.actors}
            | {
                e
                for e in marked
                if not self.lot.is_parked(e)
                and e not in self.unrunnable
                and e not in self.quarantined
                and e not in self.needs
            }
        )

    # -- membership -------------------------------------------------------------------

    async def _on_ping(self, _subject: str, _data: bytes, reply: str | None) -> None:
        if reply:  # with its code: a peer that just started knows it before a heartbeat
            body = {
                "id": self.id,
                "serves": sorted(code_of(self.registry)),
                "epoch": self.store.layout.epoch,
            }
            await self.store.publish_core(reply, json.dumps(body).encode())

    def _failed_over(self, error: str) -> None:
        """A write of this worker's was refused for its epoch: the namespace failed
        over, as a later epoch's heartbeat says (:meth:`_epoch_of`)."""
        if not self._superseded:
            self._superseded = True
            self._kick.set()
            log.warning(
                "region.superseded", epoch=self.store.layout.epoch, error=error,
                hint="the namespace failed over: this worker claims no partition and "
                "its appends are refused; restart it against the new home "
                "(fusee region status)",
            )  # fmt: skip

    def _epoch_of(self, worker: str, body: Any) -> int:
        """How the epoch named in ``body`` (a heartbeat or a ping's answer) compares
        with this worker's: -1 earlier, 0 the same, 1 later. Core NATS crosses regions,
        so after a failover the old home's workers (a zombie woken, a region back) and
        the new home's hear each other; they are not peers (each would count the other
        in its rendezvous ranking and leave it partitions it never takes). A later one
        means this worker's epoch is over: it is superseded (:meth:`_balance`). A body
        without an epoch (a worker of an earlier version) is this epoch's."""
        theirs = body.get("epoch") if isinstance(body, dict) else None
        mine = self.store.layout.epoch
        order = epoch_order(theirs, mine)
        if order <= 0:
            return order
        if not self._superseded:
            self._superseded = True
            self._kick.set()
            log.warning(
                "region.superseded", epoch=mine, by_epoch=theirs, by_worker=worker,
                hint="the namespace failed over: this worker claims no partition and "
                "its appends are refused; restart it against the new home "
                "(fusee region status)",
            )  # fmt: skip
        return 1

    async def _on_heartbeat(self, subject: str, data: bytes, _reply: str | None) -> None:
        worker = subject.rsplit(".", 1)[-1]
        if worker == self.id:
            return
        try:
            body = json.loads(data)
            if self._epoch_of(worker, body) != 0:
                return  # not a peer
            bye = bool(body.get("bye"))
            # a worker of a version that does not say what it serves is never handed
            # anything: it only runs the partitions it owns
            serves = frozenset(str(c) for c in body.get("serves") or ())
        except (ValueError, AttributeError, TypeError):
            return
        if bye:
            self.members.pop(worker, None)
            self.serves.pop(worker, None)
            self._kick.set()
        else:
            new = worker not in self.members or self.serves.get(worker) != serves
            self.members[worker] = anyio.current_time()
            self.serves[worker] = serves
            if new:
                self._kick.set()
                self._last_verify = 0.0  # unrunnable runs may have a server now

    async def _publish_heartbeat(self, *, bye: bool = False) -> None:
        body = {
            "id": self.id,
            "partitions": sorted(self.owned),
            "bye": bye,
            "serves": sorted(code_of(self.registry)),
            "epoch": self.store.layout.epoch,
        }
        await self.store.publish_core(
            self.store.layout.heartbeat(self.id), json.dumps(body).encode()
        )

    async def _heartbeat_loop(self) -> None:
        last_renewal = 0.0
        while not self._stopping:
            await anyio.sleep(self.config.heartbeat)
            await self._publish_heartbeat()
            if anyio.current_time() - last_renewal >= RENEW_EVERY:
                last_renewal = anyio.current_time()
                await self._renew_permits()

    async def _lease_loop(self) -> None:
        """Renew the region lease every ``lease/4`` (more often while it fails), and
        say when it runs out (``region.lease_lost``: this worker's appends wait) and
        when it is held again (``region.lease_regained``). (The first renewal is
        ``run``'s.)"""
        lease = self.config.lease
        while not self._stopping:
            held = self.store.lease_until > time.monotonic()
            await anyio.sleep(lease / 4 if held else min(1.0, lease / 8))
            renewed = await self.store.renew_lease(lease)
            if renewed and self._lease_out:
                self._lease_out = False
                log.warning("region.lease_regained", lease_s=lease)
            elif not renewed and self.store.lease_until <= time.monotonic():
                self._lease_lost()

    def _lease_lost(self) -> None:
        if not self._lease_out:
            self._lease_out = True
            log.warning(
                "region.lease_lost", lease_s=self.config.lease,
                hint="this worker does not reach the JetStream meta quorum (its region "
                "cut off from the partner and the witness?): it appends nothing until it does",
            )  # fmt: skip

    async def _renew_permits(self) -> None:
        """The permits this worker's actors hold: renewed (core NATS) so their leases
        last while the attempts run; a worker that dies stops renewing, and the limit
        reclaims them when the lease runs out."""
        by_limit: dict[str, list[int]] = {}
        for slot in list(self.actors.values()):
            if slot.actor is not None:
                for permit in slot.actor.held:
                    by_limit.setdefault(permit.limit, []).append(permit.seq)
        for eid, seqs in by_limit.items():
            body = encode_core(RenewOp(self.id, seqs))
            await self.store.publish_core(core_subject(self.namespace, eid), body)

    async def _discover(self) -> set[str]:
        """Learn which owners of partitions are alive before claiming anything, so a
        joining worker takes its share and no more, and a dead owner's partitions are
        taken at once (a ping to a closed connection has no responders) instead of after
        a heartbeat timeout. Workers that own nothing show up with their heartbeats."""
        owners: set[str] = set()
        lost: list[ConnectionLost] = []

        async def read(p: int) -> None:
            try:
                current = await self.store.get_owner(p)
            except ConnectionLost as exc:  # raised below, not as an ExceptionGroup
                lost.append(exc)
                return
            if current is not None:
                owners.add(current[0])

        async with anyio.create_task_group() as tg:
            for p in range(self.config.partitions):
                tg.start_soon(read, p)
        if lost:
            raise lost[0]
        owners.discard(self.id)
        gone: set[str] = set()

        async def ping(worker: str) -> None:
            if not await self._alive(worker):
                gone.add(worker)

        async with anyio.create_task_group() as tg:
            for worker in owners:
                tg.start_soon(ping, worker)
        return gone

    async def _alive(self, worker: str) -> bool:
        """Whether ``worker`` answers a ping (a failed ping, NATS's fault or not, is a
        no: ``store.ping`` raises nothing for it)."""
        asked = anyio.current_time()
        answer = await self.store.ping(self.store.layout.ping(worker), self.config.ping_timeout)
        if answer is None:
            if self.members.get(worker, -math.inf) >= asked:
                return True  # it heartbeat while the ping went unanswered: alive
            self.members.pop(worker, None)
            self.serves.pop(worker, None)
            return False
        try:
            body = json.loads(answer)
            serves = body.get("serves")
        except (ValueError, AttributeError):
            body, serves = None, None
        epoch = self._epoch_of(worker, body)
        if epoch != 0:
            self.members.pop(worker, None)  # not a peer
            self.serves.pop(worker, None)
            # an old home's worker owns nothing here: its partitions are taken; a later
            # epoch's is the rightful owner of what it holds
            return epoch > 0
        self.members[worker] = anyio.current_time()
        if isinstance(serves, list):
            self.serves[worker] = frozenset(str(c) for c in serves)
        return True

    # -- partitions -------------------------------------------------------------------

    async def _balance_loop(self) -> None:
        backoff = 0.0
        while True:
            with anyio.move_on_after(backoff or self.config.heartbeat):
                await self._kick.wait()
            self._kick = anyio.Event()
            try:
                await self._balance()
            except ConnectionLost as exc:
                self._unreachable(exc)
                first, cap = OUTAGE_BACKOFF
                backoff = min(max(backoff * 2, first), cap)
            except FailedOver as exc:
                # a write into the work bucket refused for this worker's epoch (a
                # claim or a release reaching the new home's bucket): superseded
                self._failed_over(str(exc))
            else:
                backoff = 0.0

    def _unreachable(self, exc: ConnectionLost) -> None:
        """NATS did not answer: one log line when an outage begins, none per retry."""
        if self._outage_since is None:
            self._outage_since = anyio.current_time()
            log.warning("nats.unreachable", error=str(exc))

    def _reachable(self) -> None:
        if self._outage_since is None:
            return
        took = anyio.current_time() - self._outage_since
        self._outage_since = None
        log.warning("nats.reachable", after_s=round(took, 2))
        # no heartbeat reached us meanwhile: peers get a fresh start before any is
        # suspected (one that died meanwhile is found after suspect_after)
        now = anyio.current_time()
        for worker in self.members:
            self.members[worker] = now

    async def _balance(self, *, gone: set[str] | None = None) -> None:
        """Acquire the partitions this worker should own and release the others; peers
        silent too long are pinged first. ``gone``: peers already found not answering
        (by ``_discover``)."""
        if self._stopping:
            return
        if self._superseded:
            await self._stand_down()
            return
        if self._outage_since is not None:
            # back? The owner records answer first (ConnectionLost while still away),
            # before any peer is judged by a ping that could not be answered
            await self._verify()
            self._reachable()
            self._last_verify = anyio.current_time()
        now = anyio.current_time()
        gone = set() if gone is None else gone  # dead this round: not pinged per partition

        async def suspect(worker: str) -> None:
            if not await self._alive(worker):
                log.info("worker.gone", peer=worker)
                gone.add(worker)

        silent = [w for w, seen in self.members.items() if now - seen > self.config.suspect_after]
        if silent:  # pinged together: one frozen peer does not hold up the others' verdicts
            async with anyio.create_task_group() as tg:
                for worker in silent:
                    tg.start_soon(suspect, worker)
        live = set(self.members) | {self.id}
        for p in range(self.config.partitions):
            if self.superseded:
                return  # (heard meanwhile: the next round stands down)
            mine = owner_for(p, live) == self.id
            if mine and p not in self.owned and p not in self._releasing:
                await self._acquire(p, gone)
            elif not mine and p in self.owned and p not in self._releasing:
                assert self._tg is not None
                self._tg.start_soon(self._release, p)
        if now - self._last_verify >= self.config.verify_every:
            self._last_verify = now
            await self._verify()

    async def _stand_down(self) -> None:
        """The namespace failed over (a worker of a later epoch was heard): every
        partition and guest dropped here, without a write (the work bucket is the new
        home's now: a release by this worker's revisions could delete its owner
        records), and no more shared calls answered; its actors stop (cancelled: what
        they would append the epoch refuses)."""
        for p in list(self.owned):
            self._drop(p, reason="superseded: the namespace failed over")
        for eid in list(self.guests):
            self.guests.pop(eid, None)
            self._guest_renewed.pop(eid, None)
            slot = self.actors.get(eid)
            if slot is not None:
                slot.scope.cancel()
        unsubscribe, self._shared_unsubscribe = self._shared_unsubscribe, []
        for unsub in unsubscribe:
            with anyio.move_on_after(1.0):
                await unsub()

    async def _acquire(self, p: int, gone: set[str] | None = None) -> None:
        """Claim ``p`` unless a live worker holds it. ``gone``: workers that did not
        answer a ping this round (one that does not answer here joins them), whose
        partitions are taken without another: a frozen owner of 16 partitions is
        replaced after one ping, not 16."""
        gone = set() if gone is None else gone
        current = await self.store.get_owner(p)
        if current is None:
            revision = await self.store.claim_owner(p, self.id, None)
        else:
            holder, last = current
            if holder == self.id:
                revision = last
            else:
                if holder in self.members:
                    return  # alive: it hands the partition over when it sees us
                if holder not in gone:
                    if await self._alive(holder):
                        return  # (the same)
                    gone.add(holder)
                if self.superseded:
                    return  # (found out by that ping)
                revision = await self.store.claim_owner(p, self.id, last)
        if revision is None:
            return
        self.owned[p] = revision
        # runs this worker parked while it owned p before: what they wait for may have
        # come meanwhile, so they get a look again
        self.lot.drop_partition(p)
        log.debug("partition.acquired", partition=p, previous=current[0] if current else None)
        await self._reconcile({p})

    async def _release(self, p: int) -> None:
        """Hand ``p`` over: its actors stop at their next step boundary (or are
        cancelled after ``drain_timeout``), then the owner record is deleted."""
        revision = self.owned.pop(p, None)
        if revision is None:
            return
        self._forget_partition(p)
        self._releasing.add(p)
        try:
            await self._drain([s for s in self.actors.values() if s.partition == p])
            if not self._superseded:  # (the bucket is the new home's then: no write)
                await self._release_record(p, revision)
        finally:
            self._releasing.discard(p)
            self._kick.set()

    async def _release_guests(self) -> None:
        """The actors run for other partitions' owners stop at their next step boundary
        too (or are cancelled after ``drain_timeout``); their owners hand them on."""
        await self._drain([s for e, s in self.actors.items() if e in self.guests])

    async def _drain(self, slots: list[_Slot]) -> None:
        """Stop the actors of ``slots`` at their next step boundary (``drain_timeout``
        at most), then cancel them; but one whose step's body has returned and whose
        result is not journaled yet (its commit waits for NATS) is left ``commit_grace``
        more to commit it (logged ``drain.committing``): cancelled, the finished step
        would run again in the next owner."""
        for slot in slots:
            slot.evict = True
        with anyio.move_on_after(self.config.drain_timeout):
            for slot in slots:
                await slot.done.wait()
        finishing = [s for s in slots if s.actor is not None and s.actor.results_in_flight]
        for slot in slots:
            if slot not in finishing:
                slot.scope.cancel()
        if finishing:
            ids = sorted(unescape(s.actor.eid) for s in finishing if s.actor is not None)
            log.warning("drain.committing", run_ids=ids, seconds=self.config.commit_grace)
            with anyio.move_on_after(self.config.commit_grace):
                for slot in finishing:
                    await slot.done.wait()
            for slot in finishing:
                slot.scope.cancel()
        with anyio.CancelScope(shield=True):
            for slot in slots:
                await slot.done.wait()

    async def _release_record(self, p: int, revision: int) -> None:
        """Delete the owner record, trying again while NATS does not answer (the new
        owner waits for it: this worker still answers its pings). A stopping worker
        tries once, for a second at most: its record then names a worker whose pings
        nobody answers, whose partitions are taken at once."""
        delay, cap = OUTAGE_BACKOFF
        while not self._superseded:
            try:
                with anyio.fail_after(1.0 if self._stopping else None):
                    await self.store.release_owner(p, revision)
            except TimeoutError:
                return  # stopping, and NATS does not answer
            except FailedOver as exc:
                self._failed_over(str(exc))  # (the record is the new home's: left)
                return
            except ConnectionLost as exc:
                self._unreachable(exc)
                if self._stopping:
                    return
                await anyio.sleep(delay)
                delay = min(delay * 2, cap)
            else:
                log.debug("partition.released", partition=p)
                return

    def _forget_partition(self, p: int) -> None:
        # the next owner starts afresh (and so does this worker if p comes back):
        # quarantines, and the runs it could not run and handed over
        for eid in [e for e, q in self.quarantined.items() if q.partition == p]:
            del self.quarantined[eid]
        for eid in [e for e, (part, _) in self.needs.items() if part == p]:
            del self.needs[eid]
            self.unrunnable.discard(eid)
            self._unserved.discard(eid)

    def _drop(self, p: int, *, reason: str = "owned by another worker") -> None:
        """Another worker owns ``p`` now: stop its actors without touching the record."""
        if self.owned.pop(p, None) is None:
            return
        self._forget_partition(p)
        log.warning("partition.lost", partition=p, reason=reason)
        for slot in self.actors.values():
            if slot.partition == p:
                slot.scope.cancel()

    async def _verify(self) -> None:
        self._expire_guests()
        for p, revision in list(self.owned.items()):
            current = await self.store.get_owner(p)
            if current is None or current[0] != self.id:
                self._drop(p)
            elif current[1] != revision:
                self.owned[p] = current[1]
        if self.owned:
            self._verifications += 1
            # every 5th round (10 s) also pokes the running actors, in case a wake hint
            # was lost: a cancel in an inbox is then seen within that bound
            await self._reconcile(set(self.owned), poke=self._verifications % 5 == 0)

    async def _reconcile(self, partitions: set[int], *, poke: bool = False) -> None:
        listed = await self.store.list_active(partitions)
        for p, eid in listed:
            self._ensure_actor(p, eid, poke=poke)
        # forget parked actors whose marker is gone (an idle object's expired): a
        # message to them comes with a poke, which brings them back
        marked = {eid for _, eid in listed}
        self.lot.forget(partitions, marked)
        # runs and keys this worker lacks the code of: handed over again (the last take
        # may be lost, its guest gone, or a worker with the code may have joined)
        for eid, (p, _) in list(self.needs.items()):
            if p not in partitions:
                continue
            if eid in marked:
                await self._hand_over(eid)
            else:
                del self.needs[eid]  # it ended
                self.unrunnable.discard(eid)
                self._unserved.discard(eid)
        if self.lot.missed:
            # (``missed`` is cleared only once every parked inbox was read)
            parked, covered = self.lot.to_recheck({*self.owned, *self.guests.values()})
            self.lot.rechecked(await self._recheck_parked(parked), covered)

    async def _recheck_parked(self, parked: list[tuple[str, int, int]]) -> bool:
        """After a dropped hint: every parked actor with something new in its inbox
        comes back (one read each, as many at once as the limiter lets through).
        False when a read failed (the next reconcile tries again).

        Raises:
            ConnectionLost: NATS did not answer (the balance loop backs off).
        """
        limit = anyio.CapacityLimiter(32)
        lost: list[ConnectionLost] = []
        failed = False

        async def look(eid: str, p: int, seen: int) -> None:
            nonlocal failed
            try:
                async with limit:
                    news = await self.store.read_inbox(p, eid, seen, limit=1)
            except ConnectionLost as exc:  # raised below, not as an ExceptionGroup
                lost.append(exc)
                return
            except Exception:
                log.warning("worker.recheck_failed", run_id=unescape(eid), exc_info=True)
                failed = True
                return
            if self.lot.looked(eid, seen, bool(news)):
                self._ensure_actor(p, eid)

        async with anyio.create_task_group() as tg:
            for eid, p, seen in parked:
                if p in self.owned or eid in self.guests:
                    tg.start_soon(look, eid, p, seen)
        if lost:  # the next reconcile looks again (``missed`` stays set)
            raise lost[0]
        return not failed

    # -- actors -----------------------------------------------------------------------

    async def _on_wake(self, subject: str, data: bytes, _reply: str | None) -> None:
        part = subject.rsplit(".", 1)[-1]
        if part.isdigit() and not self._wake_now(int(part), data.decode(), None):
            self.lot.dropped()  # the next reconcile finds it, parked or not

    async def _on_shared(self, _subject: str, data: bytes, reply: str | None) -> None:
        # a shared handler call: answered concurrently, off the subscription's task
        if reply and self._tg is not None and not self._stopping:
            self._tg.start_soon(serve_shared_call, self.store, self.registry, data, reply)

    async def _on_inbox(self, partition: int, eid: str, msg: Stored | None) -> None:
        # a message was stored in a run's inbox (a signal, a cancel, a fired timer),
        # handed to its actor with the poke (None: a timer's schedule, not a message).
        # Every worker follows every inbox: another worker's partition is its owner's
        # (the wake loop would drop it too, after it took a slot of the queue).
        if not self._serves(partition, eid) and eid not in self.needs:
            return
        if not self._wake_now(partition, eid, msg):
            # a running actor may have missed this one, so every actor asks the server
            # at its next read; a parked one is looked at by the next reconcile
            self.lot.dropped()
            for slot in self.actors.values():
                if slot.actor is not None:
                    slot.actor.push_lost()

    def _wake_now(self, p: int, eid: str, msg: Stored | None) -> bool:
        """Hand a wake-up (an inbox message, a hint) for a running actor over at once
        when nothing is queued before it, else queue it behind what is: False when the
        queue is full (dropped).

        At once, in the subscription's callback, is what the wake loop would do with it
        one trip through the event loop later (``_wake`` does not await), and in the
        same order: the loop takes one item at a time and handles it before it takes the
        next, so with nothing queued (``_queued`` counts what was sent and not handled
        yet, an item in hand to the waiting loop too) nothing can be overtaken. Only for
        an actor that runs (a poke): one to start, or a hand-over, starts a task, and
        that is done from the wake loop, whose context the worker's tasks copy (the
        store's patience, the log's fields), not from a subscription's."""
        if self._queued == 0 and eid in self.actors and eid not in self.needs:
            self._wake(p, eid, msg)
            return True
        try:
            self._wakes_in.send_nowait((p, eid, msg))
        except anyio.WouldBlock:
            return False
        self._queued += 1
        return True

    async def _wake_loop(self) -> None:
        with self._wakes_out:  # closed when the loop ends (its send side closed)
            await self._wakes()

    async def _wakes(self) -> None:
        async for p, eid, msg in self._wakes_out:
            self._queued -= 1
            self._wake(p, eid, msg)

    def _wake(self, p: int, eid: str, msg: Stored | None) -> None:
        # a hint: something was sent to the run (a start, a cancel); a run this
        # worker could not run is handed on to a worker that can, else it gets
        # another look, since the message may end it
        if eid in self.needs and self._capable(eid) is not None:
            self._hand_over_soon(eid)
            return
        self.unrunnable.discard(eid)
        self.lot.wake(eid)
        self._ensure_actor(p, eid, poke=True, msg=msg)

    def _serves(self, p: int, eid: str) -> bool:
        """Whether this worker runs ``eid`` (of partition ``p``): it owns ``p``, or
        hosts ``eid`` as a guest."""
        return p in self.owned or eid in self.guests

    def _ensure_actor(
        self, p: int, eid: str, *, poke: bool = False, msg: Stored | None = None
    ) -> None:
        if self._stopping or eid in self.unrunnable or self.lot.is_parked(eid):
            return
        if not self._serves(p, eid):
            return
        running = self.actors.get(eid)
        if running is not None:
            if poke:
                running.poke(msg)
            return
        held = self.quarantined.get(eid)
        if held is not None and anyio.current_time() < held.until:
            return  # a message waits in its inbox; a reconcile after `until` brings it back
        if self._ended:
            # oldest first (insertion order): forget those listed long enough
            now = anyio.current_time()
            while self._ended and now - next(iter(self._ended.values())) > ENDED_LISTED:
                del self._ended[next(iter(self._ended))]
            if eid in self._ended:
                return
        named = parse_object_id(unescape(eid))
        if (
            named is not None
            and parse_limit_id(unescape(eid)) is None  # (every worker serves limits)
            and self.registry.get_object(named[0]) is None
        ):
            # a key of a type this worker lacks: handed over without an activation
            self.needs[eid] = (p, f"object:{named[0]}")
            self.unrunnable.add(eid)
            self._hand_over_soon(eid)
            return
        slot = _Slot(p)
        self.actors[eid] = slot
        assert self._actors_tg is not None
        self._actors_tg.start_soon(self._actor_task, slot, eid)

    async def _actor_task(self, slot: _Slot, eid: str) -> None:
        p = slot.partition
        again = False
        again_hand_over = False
        crash: BaseException | None = None
        try:
            with slot.scope:
                run_id = unescape(eid)
                core = ActorCore(
                    store=self.store,
                    namespace=self.namespace,
                    eid=eid,
                    run_id=run_id,
                    partition=p,
                    clock=self.clock,
                    always_replay=self.config.always_replay,
                    evict_requested=lambda: slot.evict,
                    partitions=self.config.partitions,
                )
                core.worker_id = self.id
                named = parse_object_id(run_id)
                limit = parse_limit_id(run_id)
                actor: Driver
                if limit is not None:
                    actor = LimitActor(name=limit, core=core, store=self.store)
                elif named is not None:
                    actor = ObjectActor(
                        object_type=named[0], key=named[1], registry=self.registry, core=core
                    )
                else:
                    actor = RunActor(registry=self.registry, core=core)
                # from here on the inbox consumer hands the actor its inbox messages
                # (before its first read: what came earlier, that read finds)
                core.pushes = True
                slot.actor = core
                outcome = await actor.run()
                self.quarantined.pop(eid, None)  # it ran cleanly: no longer suspect
                if outcome == "idle":
                    # An object with nothing queued: its marker becomes an idle one the
                    # server removes in IDLE_MARKER_TTL (if this worker dies before the
                    # re-read below, the next owner still sees it), then it parks.
                    await self.store.mark_idle(p, eid, IDLE_MARKER_TTL)
                if outcome in ("idle", "parked") or (outcome == "paused" and named is None):
                    # waits for its inbox (a parked run keeps its marker: a new owner
                    # activates it); this worker brings it back when a message arrives.
                    # A paused run too: a resume (or a cancel) stored while it was
                    # leaving went to an actor that no longer listens (an object that
                    # pauses, on a broken journal, leaves as before)
                    again = await self._park(slot, eid, core.left_at)
                    if again and outcome == "idle":
                        await self.store.mark_active(p, eid)
                elif outcome == "unrunnable":
                    self.unrunnable.add(eid)
                    if self.guests.pop(eid, None) is None:
                        started = core.history.started
                        if isinstance(actor, ObjectActor):
                            self.needs[eid] = (p, f"object:{actor.object_type}")
                            again_hand_over = True
                        elif started is not None:
                            self.needs[eid] = (p, f"workflow:{started.workflow}")
                            again_hand_over = True
                else:
                    self.guests.pop(eid, None)
                    if named is not None:  # (a run's driver removed its marker itself)
                        await self.store.clear_active(p, eid)
                    if outcome == "ended" and core.history.started is not None:
                        # (one with no journal may start now: not held back)
                        self._ended.pop(eid, None)  # (to the end: the order is by time)
                        self._ended[eid] = anyio.current_time()
        except Evicted:
            pass
        except CommitFailed as exc:
            # the store refused a record (out of storage, a record over the stream's
            # limit): its marker stays, and it is quarantined like a crash, with why
            log.error("actor.crashed", run_id=unescape(eid), error=str(exc))
            crash = exc
        except (Fenced, FailedOver):
            self.guests.pop(eid, None)  # another worker (of this epoch or the next) writes it now
            log.warning("actor.fenced", run_id=unescape(eid), partition=p)
            self._last_verify = 0.0  # re-read the owners now
            self._kick.set()
        except ConnectionLost as exc:
            # NATS is away: not the actor's fault. Its marker stays, so a reconcile
            # brings it back once the owner records answer again.
            log.info("actor.interrupted", run_id=unescape(eid), error=str(exc))
            self._unreachable(exc)
            self._kick.set()
        except Exception as exc:
            log.exception("actor.crashed", run_id=unescape(eid))
            crash = exc
        finally:
            if self.actors.get(eid) is slot:  # (a parked actor's slot may be taken again)
                del self.actors[eid]
            slot.done.set()
        if crash is not None:
            await self._quarantine(p, eid, crash)
        if again_hand_over:
            await self._hand_over(eid)
        if again:
            self._ensure_actor(p, eid)

    async def _park(self, slot: _Slot, eid: str, seen: int) -> bool:
        """The actor left memory to wait for its inbox. A message that came while it
        was leaving (after its last read, before it was parked) went to an actor that
        no longer listens: so it is parked first (a message from now on brings it back
        through the wake loop), then its inbox is read once more above ``seen``. True:
        something is there, and it must come back now."""
        if self.actors.get(eid) is slot:
            del self.actors[eid]
        self.lot.leave(eid, slot.partition, seen)
        try:
            news = await self.store.read_inbox(slot.partition, eid, seen, limit=1)
        except BaseException:
            self.lot.look_failed(eid)
            raise
        # still parked as left here (a wake did not bring it back meanwhile)
        return self.lot.looked(eid, seen, bool(news))

    # -- code this worker lacks ---------------------------------------------------------

    def _capable(self, eid: str) -> str | None:
        """The live peer that should run ``eid`` (whose code this worker lacks)."""
        p, code = self.needs[eid]
        live = {w: s for w, s in self.serves.items() if w in self.members}
        return capable_for(p, live, code)

    def _hand_over_soon(self, eid: str) -> None:
        if self._tg is not None and not self._stopping:
            self._tg.start_soon(self._hand_over, eid)

    async def _hand_over(self, eid: str) -> None:
        """Send ``eid`` to the live worker that has its code, or note in the run's
        index that none has (once, until one has)."""
        if eid not in self.needs or self._stopping:
            return
        p, code = self.needs[eid]
        target = self._capable(eid)
        kind, _, name = code.partition(":")
        if target is not None:
            body = json.dumps({"partition": p, "eid": eid, "from": self.id}).encode()
            await self.store.publish_core(self.store.layout.take(target), body)
            if eid in self._unserved and kind == "workflow":
                await self._note_index(eid, None)  # served now: the note goes
            if eid in self._unserved and kind == "object":
                # served now: the note goes (unless the marker changed since, e.g. the
                # guest already made it idle, which must keep its expiry)
                try:
                    with anyio.move_on_after(5.0):
                        await self.store.clear_note(p, eid, "unserved")
                except Exception:  # for operators; the next hand-over tries again
                    log.warning("actor.note_failed", run_id=unescape(eid), exc_info=True)
            self._unserved.discard(eid)
            return
        first = eid not in self._unserved
        if not first and kind != "object":
            return  # (a key's note is written again: a caller's marker may replace it)
        self._unserved.add(eid)
        what = "workflow" if kind == "workflow" else "object type"
        others = sorted(
            c.partition(":")[2]
            for w, s in self.serves.items()
            if w in self.members
            for c in s
            if c.startswith(f"{kind}:")
        )
        mine = self.registry.names() if kind == "workflow" else self.registry.object_names()
        have = ", ".join(sorted({*others, *mine})) or "none"
        reason = (
            f"no live worker serves {what} {name!r} (the {len(self.members) + 1} live "
            f"workers serve: {have}); it runs once a worker with it starts"
        )
        if kind == "workflow":
            log.warning("run.unserved", run_id=unescape(eid), workflow=name)
            await self._note_index(eid, reason)
        else:
            if first:
                log.warning("object.unserved", run_id=unescape(eid), object_type=name)
            elif await self._noted(p, eid, "unserved"):
                return  # still there: no write (a caller's marker may have replaced it)
            await self._note_marker(p, eid, {"unserved": reason})

    async def _on_take(self, _subject: str, data: bytes, _reply: str | None) -> None:
        """A partition's owner lacks the code of ``eid``: run it here."""
        try:
            body = json.loads(data)
            p, eid = int(body["partition"]), str(body["eid"])
        except (ValueError, KeyError, TypeError):
            return
        if self._stopping or self._superseded or not 0 <= p < self.config.partitions:
            return
        if eid not in self.guests:
            log.info("actor.taken", run_id=unescape(eid), partition=p, owner=body.get("from"))
            self.guests[eid] = p
            self.unrunnable.discard(eid)
            self.needs.pop(eid, None)
        self._guest_renewed[eid] = anyio.current_time()
        self._ensure_actor(p, eid)  # nothing when it runs or is parked here already

    def _expire_guests(self) -> None:
        """Let go of guests whose owner stopped renewing them: a parked one is
        forgotten, a running one stops at its next step boundary (its new owner has
        it; fencing keeps the two copies from both committing meanwhile)."""
        lease = GUEST_LEASE_ROUNDS * self.config.verify_every
        now = anyio.current_time()
        for eid in [e for e in self._guest_renewed if e not in self.guests]:
            del self._guest_renewed[eid]  # a guest that ended or was fenced
        for eid in [e for e in self.guests if now - self._guest_renewed.get(e, 0.0) > lease]:
            log.info("actor.guest_expired", run_id=unescape(eid))
            self.guests.pop(eid, None)
            self._guest_renewed.pop(eid, None)
            self.lot.wake(eid)  # (not parked any more: the guest is gone)
            slot = self.actors.get(eid)
            if slot is not None:
                slot.evict = True

    async def _quarantine(self, p: int, eid: str, exc: BaseException) -> None:
        """Hold a crashed actor back for a while, and say why where operators look:
        its active marker (``objects show``) and, for a run, its index entry's
        reason (``runs show``, ``runs list``)."""
        held = self.quarantined.setdefault(eid, _Quarantine(p))
        delay = held.crashed()
        error = f"{type(exc).__name__}: {exc}"
        reason = (
            f"the worker's actor crashed {held.crashes} time{'s' if held.crashes > 1 else ''} "
            f"in a row ({error}); it is tried again in {delay:g}s (worker {self.id})"
        )
        log.warning("actor.quarantined", run_id=unescape(eid), crashes=held.crashes, retry_in=delay)
        note = {"crashes": held.crashes, "error": error, "at": self.clock(), "retry_in": delay}
        note["worker"] = self.id
        await self._note_marker(p, eid, note)
        await self._note_index(eid, reason)

    async def _noted(self, p: int, eid: str, field: str) -> bool:
        """Whether the actor's active marker holds a note with ``field`` (False when it
        cannot be read: the note is written again)."""
        try:
            with anyio.move_on_after(5.0):
                note = await self.store.active_note(p, eid)
                return note is not None and field in note
        except Exception:  # noqa: BLE001 - unknown: written again
            return False
        return False

    async def _note_marker(self, p: int, eid: str, note: dict[str, Any]) -> None:
        """Write ``note`` in the actor's active marker (``objects show`` prints it)."""
        try:
            with anyio.move_on_after(5.0):
                await self.store.note_active(p, eid, json.dumps(note).encode())
        except Exception:  # for operators; the log has the reason too
            log.warning("actor.note_failed", run_id=unescape(eid), exc_info=True)

    async def _note_index(self, eid: str, reason: str | None) -> None:
        """Set a run's index entry to ``pending`` with ``reason`` (unless it ended): why
        nobody runs it, for ``runs show`` and ``runs list``; None: a worker runs it now,
        the note goes (``running``, written only over an entry with a reason). Objects
        have no entry, nor do limits."""
        actor_id = unescape(eid)
        if parse_object_id(actor_id) is not None or parse_limit_id(actor_id) is not None:
            return
        try:
            with anyio.move_on_after(5.0):
                last = await self.store.last_in_journal(eid)
                if last is None:
                    return
                current = await self.store.get_index_entry(eid)
                if current is not None and current[0]:
                    info = decode_info(current[0])
                elif reason is None:
                    return  # no entry, no note
                else:  # not indexed yet (it never parked): made from its first record
                    first = await self.store.first_in_journal(eid)
                    if first is None:
                        return
                    info = decode_info(start_marker(unescape(eid), first.data, now=self.clock()))
                if reason is None and info.reason is None:
                    return
                if not info.ended:
                    info.status, info.reason = ("pending", reason) if reason else ("running", None)
                    info.updated_at = self.clock()
                    # tagged with the journal's last record: an entry made from more of
                    # it (the run went on elsewhere) is left alone, and ``describe()``
                    # takes the note only while the journal has nothing newer
                    await project_index(self.store, eid, info, last.seq)
        except Exception:  # for operators; the log has the reason too
            log.warning("run.index_note_failed", run_id=unescape(eid), exc_info=True)
