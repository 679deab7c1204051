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
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import structlog

from fusee._logging import get_logger
from fusee.actors.object_actor import ObjectActor
from fusee.actors.ports import ClusterStore, Stored, SubjectLayout
from fusee.actors.registry import Registry
from fusee.actors.run_actor import RunActor
from fusee.actors.shared import serve_shared_call
from fusee.errors import CommitFailed, Evicted, Fenced
from fusee.runtime.ids import unescape
from fusee.runtime.objects import parse_object_id

__all__ = ("Worker", "WorkerConfig", "new_worker_id")

log = get_logger()


# How long an idle object's marker lasts: a worker that dies just as an object goes idle
# leaves it to the next owner for this long (see Worker._actor_task).
IDLE_MARKER_TTL = 600.0


def new_worker_id() -> str:
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:24]
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def rank(partition: int, worker: str) -> int:
    digest = hashlib.blake2b(f"{partition}:{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_for(partition: int, workers: set[str]) -> str:
    return max(workers, key=lambda w: rank(partition, w))


def _any_partition(layout: SubjectLayout) -> str:
    """The wake subject of every partition: a wildcard in place of the last token (the
    partition, as :meth:`Worker._on_wake` reads it back)."""
    return layout.wake(0).rpartition(".")[0] + ".*"


@dataclass
class WorkerConfig:
    partitions: int = 16
    heartbeat: float = 0.2  # seconds between heartbeats
    suspect_after: float = 0.7  # silence after which a worker is pinged
    ping_timeout: float = 0.5  # no answer in this long: taken as dead
    verify_every: float = 2.0  # re-read partition owners and active runs this often
    drain_timeout: float = 5.0  # a released partition's steps get this long to commit
    # FUSEE_ALWAYS_REPLAY=1: evict every actor after each step (replay tests)
    always_replay: bool = field(
        default_factory=lambda: os.environ.get("FUSEE_ALWAYS_REPLAY", "") not in ("", "0")
    )


@dataclass
class _Slot:
    partition: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    evict: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    actor: RunActor | None = None

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
        # eid -> (partition, the last inbox sequence it read) of the actors that left
        # memory to wait for their inbox: runs that wait, objects gone idle (brought back
        # by a message, not by reconcile)
        self.parked: dict[str, tuple[int, int]] = {}
        # a wake hint or an inbox message was dropped (the queue was full): the next
        # reconcile reads the inboxes of the parked actors, since one may be for them
        self._missed = False
        self._releasing: set[int] = set()
        self._kick = anyio.Event()
        self._stopping = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._actors_tg: anyio.abc.TaskGroup | None = None
        self._actors_closed = anyio.Event()
        self._last_verify = 0.0
        self._verifications = 0
        send, receive = anyio.create_memory_object_stream[tuple[int, str, Stored | None]](10_000)
        self._wakes_in, self._wakes_out = send, receive

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
                    await self.store.subscribe_core(lay.heartbeat("*"), self._on_heartbeat),
                    await self.store.subscribe_core(_any_partition(lay), self._on_wake),
                    await self.store.subscribe_inbox(self._on_inbox),
                ]
                for name in self.registry.object_names():  # shared handlers, any worker
                    unsubscribe.append(
                        await self.store.subscribe_core(
                            lay.shared_calls(name), self._on_shared, queue="fusee-shared"
                        )
                    )
                try:
                    await tg.start(self._host_actors)
                    await self._publish_heartbeat()
                    tg.start_soon(self._heartbeat_loop)
                    tg.start_soon(self._wake_loop)
                    await self._discover()
                    await self._balance()
                    log.info(
                        "worker.started",
                        partitions=sorted(self.owned),
                        workflows=self.registry.names(),
                    )
                    task_status.started()
                    await self._balance_loop()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._shutdown()
                        for unsub in unsubscribe:
                            await unsub()
                        await self._wakes_in.aclose()
                        await self._wakes_out.aclose()

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
        self._stopping = True
        await self._publish_heartbeat(bye=True)
        with anyio.move_on_after(self.config.drain_timeout + 1):
            async with anyio.create_task_group() as tg:
                for p in list(self.owned):
                    tg.start_soon(self._release, p)
        for slot in list(self.actors.values()):
            slot.scope.cancel()
        self._actors_closed.set()
        log.info("worker.stopped")

    # -- membership -------------------------------------------------------------------

    async def _on_ping(self, _subject: str, _data: bytes, reply: str | None) -> None:
        if reply:
            await self.store.publish_core(reply, json.dumps({"id": self.id}).encode())

    async def _on_heartbeat(self, subject: str, data: bytes, _reply: str | None) -> None:
        worker = subject.rsplit(".", 1)[-1]
        if worker == self.id:
            return
        try:
            bye = bool(json.loads(data).get("bye"))
        except (ValueError, AttributeError):
            return
        if bye:
            self.members.pop(worker, None)
            self._kick.set()
        else:
            new = worker not in self.members
            self.members[worker] = anyio.current_time()
            if new:
                self._kick.set()

    async def _publish_heartbeat(self, *, bye: bool = False) -> None:
        body = {"id": self.id, "partitions": sorted(self.owned), "bye": bye}
        await self.store.publish_core(
            self.store.layout.heartbeat(self.id), json.dumps(body).encode()
        )

    async def _heartbeat_loop(self) -> None:
        while not self._stopping:
            await anyio.sleep(self.config.heartbeat)
            await self._publish_heartbeat()

    async def _discover(self) -> None:
        """Learn which owners of partitions are alive before claiming anything, so a
        joining worker takes its share and no more, and a dead owner's partitions are
        taken at once (a ping to a closed connection has no responders) instead of after
        a heartbeat timeout. Workers that own nothing show up with their heartbeats."""
        owners: set[str] = set()

        async def read(p: int) -> None:
            current = await self.store.get_owner(p)
            if current is not None:
                owners.add(current[0])

        async with anyio.create_task_group() as tg:
            for p in range(self.config.partitions):
                tg.start_soon(read, p)
        owners.discard(self.id)
        async with anyio.create_task_group() as tg:
            for worker in owners:
                tg.start_soon(self._alive, worker)

    async def _alive(self, worker: str) -> bool:
        answer = await self.store.ping(self.store.layout.ping(worker), self.config.ping_timeout)
        if answer is None:
            self.members.pop(worker, None)
            return False
        self.members[worker] = anyio.current_time()
        return True

    # -- partitions -------------------------------------------------------------------

    async def _balance_loop(self) -> None:
        while True:
            with anyio.move_on_after(self.config.heartbeat):
                await self._kick.wait()
            self._kick = anyio.Event()
            await self._balance()

    async def _balance(self) -> None:
        if self._stopping:
            return
        now = anyio.current_time()
        for worker, seen in list(self.members.items()):
            if now - seen > self.config.suspect_after and not await self._alive(worker):
                log.info("worker.gone", peer=worker)
        live = set(self.members) | {self.id}
        for p in range(self.config.partitions):
            mine = owner_for(p, live) == self.id
            if mine and p not in self.owned and p not in self._releasing:
                await self._acquire(p)
            elif not mine and p in self.owned and p not in self._releasing:
                assert self._tg is not None
                self._tg.start_soon(self._release, p)
        if now - self._last_verify >= self.config.verify_every:
            self._last_verify = now
            await self._verify()

    async def _acquire(self, p: int) -> None:
        current = await self.store.get_owner(p)
        if current is None:
            revision = await self.store.claim_owner(p, self.id, None)
        else:
            holder, last = current
            if holder == self.id:
                revision = last
            elif holder in self.members or await self._alive(holder):
                return  # alive: it hands the partition over when it sees us
            else:
                revision = await self.store.claim_owner(p, self.id, last)
        if revision is None:
            return
        self.owned[p] = revision
        # runs this worker parked while it owned p before: what they wait for may have
        # come meanwhile, so they get a look again
        for eid in [e for e, (part, _) in self.parked.items() if part == p]:
            del self.parked[eid]
        log.debug("partition.acquired", partition=p, previous=current[0] if current else None)
        await self._reconcile({p})

    async def _release(self, p: int) -> None:
        """Hand ``p`` over: its actors stop at their next step boundary (or are
        cancelled after ``drain_timeout``), then the owner record is deleted."""
        revision = self.owned.pop(p, None)
        if revision is None:
            return
        self._releasing.add(p)
        try:
            slots = [s for s in self.actors.values() if s.partition == p]
            for slot in slots:
                slot.evict = True
            with anyio.move_on_after(self.config.drain_timeout):
                for slot in slots:
                    await slot.done.wait()
            for slot in slots:
                slot.scope.cancel()
                with anyio.CancelScope(shield=True):
                    await slot.done.wait()
            await self.store.release_owner(p, revision)
            log.debug("partition.released", partition=p)
        finally:
            self._releasing.discard(p)
            self._kick.set()

    def _drop(self, p: int) -> None:
        """Another worker owns ``p`` now: stop its actors without touching the record."""
        if self.owned.pop(p, None) is None:
            return
        log.warning("partition.lost", partition=p)
        for slot in self.actors.values():
            if slot.partition == p:
                slot.scope.cancel()

    async def _verify(self) -> None:
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
        for eid in [
            e for e, (part, _) in self.parked.items() if part in partitions and e not in marked
        ]:
            del self.parked[eid]
        if self._missed:
            self._missed = False
            await self._recheck_parked()

    async def _recheck_parked(self) -> None:
        """After a dropped hint: every parked actor with something new in its inbox
        comes back (one read each, as many at once as the limiter lets through)."""
        limit = anyio.CapacityLimiter(32)

        async def look(eid: str, p: int, seen: int) -> None:
            async with limit:
                news = await self.store.read_inbox(p, eid, seen, limit=1)
            if news and self.parked.get(eid, (p, -1))[1] == seen:
                del self.parked[eid]
                self._ensure_actor(p, eid)

        async with anyio.create_task_group() as tg:
            for eid, (p, seen) in list(self.parked.items()):
                if p in self.owned:
                    tg.start_soon(look, eid, p, seen)

    # -- actors -----------------------------------------------------------------------

    async def _on_wake(self, subject: str, data: bytes, _reply: str | None) -> None:
        part = subject.rsplit(".", 1)[-1]
        if part.isdigit():
            try:
                self._wakes_in.send_nowait((int(part), data.decode(), None))
            except anyio.WouldBlock:
                self._missed = True  # the next reconcile finds it, parked or not

    async def _on_shared(self, _subject: str, data: bytes, reply: str | None) -> None:
        # a shared handler call: answered concurrently, off the subscription's task
        if reply and self._tg is not None and not self._stopping:
            self._tg.start_soon(serve_shared_call, self.store, self.registry, data, reply)

    async def _on_inbox(self, partition: int, eid: str, msg: Stored | None) -> None:
        # a message was stored in a run's inbox (a signal, a cancel, a fired timer),
        # handed to its actor with the poke (None: a timer's schedule, not a message)
        try:
            self._wakes_in.send_nowait((partition, eid, msg))
        except anyio.WouldBlock:
            # a running actor may have missed this one, so every actor asks the server
            # at its next read; a parked one is looked at by the next reconcile
            self._missed = True
            for slot in self.actors.values():
                if slot.actor is not None:
                    slot.actor.push_lost()

    async def _wake_loop(self) -> None:
        async for p, eid, msg in self._wakes_out:
            # a hint: something was sent to the run (a start, a cancel); a run this
            # worker could not run gets another look, since the message may end it
            self.unrunnable.discard(eid)
            self.parked.pop(eid, None)
            self._ensure_actor(p, eid, poke=True, msg=msg)

    def _ensure_actor(
        self, p: int, eid: str, *, poke: bool = False, msg: Stored | None = None
    ) -> None:
        if self._stopping or p not in self.owned or eid in self.unrunnable or eid in self.parked:
            return
        running = self.actors.get(eid)
        if running is not None:
            if poke:
                running.poke(msg)
            return
        slot = _Slot(p)
        self.actors[eid] = slot
        assert self._actors_tg is not None
        self._actors_tg.start_soon(self._actor_task, slot, eid)

    async def _actor_task(self, slot: _Slot, eid: str) -> None:
        p = slot.partition
        again = False
        try:
            with slot.scope:
                run_id = unescape(eid)
                common: dict[str, Any] = {
                    "store": self.store,
                    "namespace": self.namespace,
                    "eid": eid,
                    "run_id": run_id,
                    "partition": p,
                    "registry": self.registry,
                    "clock": self.clock,
                    "always_replay": self.config.always_replay,
                    "evict_requested": lambda: slot.evict,
                    "partitions": self.config.partitions,
                }
                named = parse_object_id(run_id)
                if named is not None:
                    actor: RunActor = ObjectActor(object_type=named[0], key=named[1], **common)
                else:
                    actor = RunActor(**common)
                # from here on the inbox consumer hands the actor its inbox messages
                # (before its first read: what came earlier, that read finds)
                actor.pushes = True
                slot.actor = actor
                outcome = await actor.run()
                if outcome == "idle":
                    # An object with nothing queued: its marker becomes an idle one the
                    # server removes in IDLE_MARKER_TTL (if this worker dies before the
                    # re-read below, the next owner still sees it), then it parks.
                    await self.store.mark_idle(p, eid, IDLE_MARKER_TTL)
                if outcome in ("idle", "parked"):
                    # waits for its inbox (a parked run keeps its marker: a new owner
                    # activates it); this worker brings it back when a message arrives
                    again = await self._park(slot, eid, actor.left_at)
                    if again and outcome == "idle":
                        await self.store.mark_active(p, eid)
                elif outcome == "unrunnable":
                    self.unrunnable.add(eid)
                else:
                    await self.store.clear_active(p, eid)
        except Evicted:
            pass
        except CommitFailed as exc:
            # the store failed it: its marker stays, so a reconcile activates it again
            log.warning("actor.commit_failed", run_id=unescape(eid), error=str(exc))
        except Fenced:
            log.warning("actor.fenced", run_id=unescape(eid), partition=p)
            self._last_verify = 0.0  # re-read the owners now
            self._kick.set()
        except Exception:
            log.exception("actor.crashed", run_id=unescape(eid))
        finally:
            if self.actors.get(eid) is slot:  # (a parked actor's slot may be taken again)
                del self.actors[eid]
            slot.done.set()
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
        self.parked[eid] = (slot.partition, seen)
        if not await self.store.read_inbox(slot.partition, eid, seen, limit=1):
            return False
        # still parked as left here (a wake did not bring it back meanwhile)
        return self.parked.pop(eid, None) is not None
