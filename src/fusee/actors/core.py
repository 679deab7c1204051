"""The single-writer actor's core, the same for runs and objects: its fence and commits,
its values stored out of line, its inbox (read, handed over, decoded, watched), its
waits, and stopping or evicting the code it runs.

A *driver* runs code on it: :class:`~fusee.actors.run_actor.RunActor` (a workflow's
generations) or :class:`~fusee.actors.object_actor.ObjectActor` (one key's
invocations, in inbox order). The core is what ``ctx`` runs against (it is the
:class:`~fusee.actors.host.ActorHost`); what only one kind of actor knows (how the inbox
is sorted, what happens before a step, how an activation ends) is the driver's, given
to the core as callables. The decisions are pure code in ``fusee.runtime``: the waits
(``runtime/waits.py``), settling (``runtime/settle.py``), the retry (``Retry``).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import msgspec

from fusee.actors.combinators import in_branch, may_park
from fusee.actors.host import Stoppable
from fusee.actors.outcomes import Outcome
from fusee.actors.ports import NobodyListens, RunStore, Stored, TokenSink
from fusee.actors.stragglers import Stragglers
from fusee.errors import (
    CommitFailed,
    ConnectionLost,
    Evicted,
    JournalGap,
    NotEncodable,
    Parked,
    UnknownLimit,
    Unreplayable,
)
from fusee.logs import get_logger
from fusee.runtime.history import History
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import (
    KINDS,
    InboxMessage,
    PermitGrant,
    PermitRequest,
    TimerFired,
    Unknown,
    decode_message,
    encode_message,
)
from fusee.runtime.limits import (
    ASK_PATIENCE,
    LEASE,
    RENEW_EVERY,
    Answer,
    Ask,
    AskOp,
    Permit,
    ReleaseOp,
    core_subject,
    encode_core,
    limit_actor_id,
)
from fusee.runtime.records import AnyRecord, ValueRef, WaitDone, WaitStarted, encode_record, kind_of
from fusee.runtime.waits import Commit, InboxView, Park, SetTimer, Wait

__all__ = ("ActorCore", "Driver")

log = get_logger()

# The largest value (bytes of JSON) of a wait's end that may ride on the next record:
# that record is then at most this much larger than it would be alone, far below the
# headroom a record keeps for what surrounds its own value.
RIDE_MAX = 4096
# (ASK_PATIENCE, runtime/limits.py: how long a step waits for the live limit actor's
# answer to a permit asked on core NATS before it sends its durable request; a grant
# answered later is moved by it)
# How long a run parked waiting for a grant stays parked before it comes back to ask
# again, if no grant brought it back first (its timer: one durable write a park),
# doubled at each time it came back for nothing, up to REASK_MAX (so a run waiting
# its turn behind a long queue is not replayed every 31 s).
REASK_AFTER = 30.0
REASK_MAX = 240.0


# The lease bounds these: a fast grant answered after its step gave up (ASK_PATIENCE)
# is renewed by nobody until the step's durable request moves it, and a held permit is
# renewed every RENEW_EVERY; both inside one lease, or a live holder loses its permit.
assert ASK_PATIENCE + RENEW_EVERY < LEASE, "a fast grant's lease outlives the ask's patience"

_answer = msgspec.json.Decoder(Answer)


def _reask_after(view: InboxView, pos: int, start: int) -> float:
    """How long a run parking for a grant at wait ``pos`` stays parked: REASK_AFTER,
    doubled for each of its re-ask timers that fired already (in its inbox), at most
    REASK_MAX."""
    fired = sum(
        1
        for _, m in view.messages
        if isinstance(m, TimerFired) and m.pos == pos and m.start == start
    )
    return float(min(REASK_AFTER * 2.0 ** min(fired, 32), REASK_MAX))


class Driver(Protocol):
    """What a worker runs: a run's or an object's driver over its core."""

    core: ActorCore

    async def run(self) -> Outcome: ...


async def _nothing() -> None:
    return None


class ActorCore:
    def __init__(
        self,
        *,
        store: RunStore,
        namespace: str,
        eid: str,
        run_id: str,
        partition: int,
        clock: Callable[[], float],
        always_replay: bool = False,
        evict_requested: Callable[[], bool] = lambda: False,
        woken: anyio.Event | None = None,
        park_after: float = 1.0,
        partitions: int | None = None,
    ) -> None:
        self.store = store
        self.tokens: TokenSink | None = store.tokens
        self.namespace = namespace
        self.eid = eid
        self.run_id = run_id
        self.partition = partition
        self.clock = clock
        self.always_replay = always_replay
        self.evict_requested = evict_requested
        self.park_after = park_after
        self.partitions = partitions  # the namespace's, to route messages to other runs
        self.history = History(run_id)
        self.fence = 0
        self.writer = secrets.token_hex(6)
        self.commits = 0
        # ctx.all / ctx.race branches, and tasks the code starts itself, commit
        # concurrently: one append at a time, each under the fence and the link the
        # previous one left
        self._commit_lock = anyio.Lock()
        self.combinators = 0  # ctx.all / ctx.race running: always_replay waits for their end
        # steps running now (their attempt loops), of any task: the copy leaves memory
        # only when one alone runs (its end evicts), and a wait parks only with none
        self.steps_in_flight = 0
        # steps whose body returned, their result not journaled yet (a drain waits)
        self.results_in_flight = 0
        # the steps of tasks the code started itself (not ctx.all branches) running now
        self.stragglers = Stragglers()
        self.running_steps: set[Stoppable] = set()  # the running steps' StepInfo
        self.workflow_scope: anyio.CancelScope | None = None  # the code running now
        # the driver's: what happens before a step's function first runs
        self.on_step: Callable[[], Awaitable[None]] = _nothing
        # -- the inbox
        # set by the worker when the inbox may hold something new
        self.woken = woken  # made in start(): an Event needs the event loop
        # what was read of the inbox for the waits (pure: runtime/waits.py), and an
        # event set each time it grows
        self.view = InboxView()
        self.inbox_changed: anyio.Event | None = None
        # Inbox messages the worker's inbox consumer handed over (``pushes``: set by a
        # worker that hands over every message of this inbox from before the first
        # read on), so a read needs no round trip to the server.
        self.pushes = False
        self._pushed: list[Stored] = []
        self._push_ok = False  # a read covered what came before the pushes began
        # The last inbox sequence read when the actor decided to leave memory (park, or
        # go idle): what its watcher read after that, it no longer looks at, so whoever
        # parks it reads the inbox again from here.
        self.left_at = 0
        # a wait's end rides on the next record (False: each is journaled at once)
        self.ride_waits = True
        # -- limits: the worker running this actor (it renews the permits held), and
        # the permits held now (renewed by the worker, released as each attempt ends)
        self.worker_id = ""
        self.held: set[Permit] = set()
        self._requests = 0
        self._takes = 0  # acquire_permit calls: each a take (its ID: writer and count)

    def start(self) -> None:
        """Called as an activation begins (in the event loop)."""
        if self.woken is None:
            self.woken = anyio.Event()
        self.inbox_changed = anyio.Event()

    # -- the commit ---------------------------------------------------------------

    async def commit(self, record: AnyRecord, *, unlist: str | None = None) -> int:
        """Append ``record`` under this actor's fence, linked to its predecessor.
        ``unlist``: the run's workflow, whose paused listing entry goes in the same
        write (``run.resumed``).

        Raises:
            Fenced: another worker owns this run now; this copy must stop.
        """
        # Nothing more is journaled from code whose scope was cancelled (the run is
        # being cancelled, or replayed to find its compensations).
        await anyio.lowlevel.checkpoint_if_cancelled()
        lock = self._commit_lock
        try:
            lock.acquire_nowait()  # (free: no trip through the event loop)
        except anyio.WouldBlock:
            await lock.acquire()  # another task's commit is out: this one goes next
        try:
            if not self.combinators and not self.stragglers:
                # one task commits: no shield (a trip through the event loop each step)
                return await self._append(record, unlist)
            # shielded: a branch cancelled mid-append (a race's loser, a task stopped)
            # still records what landed, so the next commit links to it under the
            # right fence
            with anyio.CancelScope(shield=True):
                seq = await self._append(record, unlist)
        finally:
            lock.release()
        return seq

    async def _append(self, record: AnyRecord, unlist: str | None = None) -> int:
        prev, prev_hash = self.history.link()
        # what rides on whatever record comes next (ctx.now() values, an invocation)
        riders = self.history.take_riders()
        record = self.history.stamp(record)  # (a call of a concurrent task: its `after`)
        record = msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash, **riders)
        data = encode_record(record)
        # The ID names this writer too: when a reply is lost and the fence refuses the
        # retry, the last record's ID tells our landed write from another writer's.
        # A commit cut short (cancelled by the run's timeout) may still land: the next
        # commit must not reuse its ID, or the read-back would take that record for it.
        self.commits += 1
        msg_id = f"{self.eid}:{self.history.started_seq}:{self.commits}:{self.writer}"
        try:
            seq = await self.store.append(
                self.eid, kind_of(record), data, fence=self.fence, msg_id=msg_id, unlist=unlist
            )
        except NotEncodable:
            # too large to be stored (refused before it was sent): what rode on it
            # rides on the record the caller writes instead (a failed step's)
            self.history.give_back(riders)
            raise
        except Exception as exc:
            # the store's, not the code's: never an exception it could catch
            raise CommitFailed(
                f"{kind_of(record)} of {self.run_id!r} was not journaled: "
                f"{exc or type(exc).__name__}"
            ) from exc
        self.history.add(seq, record, data)
        self.fence = seq
        return seq

    async def flush(self) -> None:
        """Journal the waits resolved and not journaled yet (``wait.done`` on its own
        record), before something observable depends on them: a step's function, a
        child's start, leaving memory. Nothing to do when the last commit carried them."""
        if self.history.resolved:
            await self.commit(self.history.resolved.pop(0))  # the rest ride on it

    async def before_step(self) -> None:
        # the step's function acts on what the code decided: on durable waits only
        await self.flush()
        await self.on_step()

    async def store_value(self, data: bytes) -> ValueRef:
        """Store a value too large for a record out of line, before the record naming it.

        Raises:
            CommitFailed: the store refused it or did not answer (not the workflow's
                error: its code cannot catch it).
        """
        try:
            return await self.store.put_value(self.eid, data)
        except NotEncodable:
            raise  # over the largest value stored out of line: the step fails
        except Exception as exc:
            raise CommitFailed(
                f"a value of {len(data):,} bytes of {self.run_id!r} was not stored: "
                f"{exc or type(exc).__name__}"
            ) from exc

    async def read_value(self, ref: ValueRef) -> bytes:
        """A value the journal names, stored out of line.

        Raises:
            Unreplayable: it is missing or not the one named (the run pauses).
        """
        try:
            return await self.store.get_value(ref)
        except JournalGap as gap:
            raise Unreplayable(str(gap)) from None

    # -- waits ------------------------------------------------------------------------

    async def wait_out(self, started: WaitStarted) -> WaitDone:
        """Until the wait ends: a signal of its name in the inbox, or its time. Stays in
        memory for ``park_after`` seconds, then leaves (``Parked``): the next inbox
        message (a signal, the fired timer) brings the actor back by replay. What to do
        at each turn is decided by :class:`fusee.runtime.waits.Wait`; this performs it."""
        history = self.history
        wait = Wait(started, park_after=self.park_after, now=self.clock())
        while True:
            assert self.inbox_changed is not None
            changed = self.inbox_changed  # set by the next read that keeps a message
            cmd = wait.next(
                self.view,
                consumed=history.consumed,
                start=history.started_seq,
                now=self.clock(),
                may_park=self._may_park,
            )
            if isinstance(cmd, Commit):
                may_park(idle=False)  # busy again: a sibling branch must not park the run
                done = cmd.done
                rides = self._may_ride(done)
                if rides:
                    history.resolve(done)  # journaled by the next record, whatever it is
                else:
                    await self.commit(done)
                log.info(
                    "wait.done",
                    pos=started.pos,
                    wait=started.wait,
                    name=started.name,
                    timed_out=done.timed_out,
                )
                if not rides:
                    await self.maybe_evict()
                    return history.waited[started.pos]
                if self.evict_requested():
                    await self.maybe_evict()  # (always_replay evicts at the next commit)
                return done
            if isinstance(cmd, SetTimer):
                await self.store.schedule_timer(
                    self.eid, self.partition, cmd.pos, cmd.until, start=history.started_seq
                )
                wait.timer_scheduled()
            elif isinstance(cmd, Park):
                await self.flush()  # (the wait.started before it carried them)
                self.left_at = cmd.left_at
                raise Parked
            else:
                if cmd.kept:
                    log.debug("wait.kept", pos=started.pos, reason="another branch is busy")
                if self.view.version == cmd.version:  # (else: read meanwhile, look again)
                    with anyio.move_on_after(max(0.0, cmd.until - self.clock())):
                        await changed.wait()

    def _may_park(self, *, idle: bool = True) -> bool:
        # a step of another task runs: the run stays in memory (a ctx.all branch's wait
        # decides by the combinator's rule alone, as may_park keeps it: a sibling
        # waiting for a permit is idle); a wait outside a branch keeps it whatever
        # combinator is open beside it
        return may_park(idle=idle) and (in_branch() or not self.steps_in_flight)

    def _may_ride(self, done: WaitDone) -> bool:
        """Whether ``done`` may wait for the next record instead of its own: a wait that
        took an inbox message (a replay takes the same one again, see "Waits" in
        docs/design.md), small, outside ``ctx.all``/``ctx.race`` (they settle by the
        journal sequence ending each call: two on one record would tie)."""
        return (
            self.ride_waits
            and not done.timed_out
            and not self.combinators
            and len(done.value) <= RIDE_MAX
        )

    # -- limits -----------------------------------------------------------------------

    async def acquire_permit(self, name: str, fairness: str, key: str, *, pos: int = 0) -> Permit:
        """Ask limit ``name`` for a permit for attempt ``key`` and wait for it. First on
        core NATS, of the live limit actor (:meth:`_ask`: it journals the grant and
        answers); when it does not grant (nobody listens or answers in time, the limit
        is full or others wait), the request goes to the limit's inbox, the grant comes
        to this actor's. Stays in memory ``park_after`` seconds, then leaves
        (``Parked``): the grant brings the run back, whose replay asks again (the limit
        moves the permit it holds for ``key`` to the new request). Before it parks it
        sets a timer (wait position ``pos``, the step's) ``REASK_AFTER`` seconds on: a
        grant that never comes (journaled and never sent, its limit actor not back) does
        not leave the run parked for good; the timer brings it back, and it asks again.
        Returns the permit (what a release names): the limit's eid and the request's
        inbox sequence, or the fast grant's number (< 0).

        Raises:
            UnknownLimit: there is no such limit.
        """
        limit_id = limit_actor_id(name)
        eid = escape(limit_id)
        assert self.partitions is not None, "a worker's actor knows the partitions"
        # this acquire's take: asked again (an answer lost) it gets the permit it took
        # back, no second token; a replay of the step is a new take (a new start)
        self._takes += 1
        take_id = f"{self.writer}:{self._takes}"
        taking = False
        while True:
            # a permit granted on core NATS, or the one the attempt holds, taken (the
            # limit spends the token as the attempt starts)
            fast = await self._ask(eid, fairness, key, take=take_id, taking=taking)
            if fast is not None:
                permit = Permit(eid, fast)
                self.held.add(permit)
                return permit
            # (no answer in time: the durable request names the take, so a permit it
            # took, a fast grant answered late or a take's, comes as a grant to start
            # on, no token again)
            seq, take = await self._request_permit(name, limit_id, fairness, key, pos, take_id)
            taking = take
            if not take:
                permit = Permit(eid, seq)
                self.held.add(permit)
                return permit
            # granted: taken by the ask above, as the attempt starts

    async def _request_permit(
        self, name: str, limit_id: str, fairness: str, key: str, pos: int, take: str = ""
    ) -> tuple[int, bool]:
        """The durable request of a permit (see :meth:`acquire_permit`), in memory
        until ``park_after``, then parked. Its inbox sequence and whether the grant
        must be taken (``take``)."""
        eid = escape(limit_id)
        assert self.partitions is not None
        body = encode_message(
            PermitRequest(
                key=key,
                run=self.eid,
                partition=self.partition,
                worker=self.worker_id,
                fairness=fairness,
                take=take,
            )
        )
        self._requests += 1
        seq = await self.store.send_inbox(
            partition_of(limit_id, self.partitions),
            eid,
            "permit",
            body,
            msg_id=f"{key}:{self.writer}:{self._requests}",
        )
        idle_since = self.clock()
        version = -1
        while True:
            assert self.inbox_changed is not None
            changed = self.inbox_changed
            view = self.view
            for i, (_, msg) in enumerate(view.messages):
                if isinstance(msg, PermitGrant) and msg.request == seq and msg.limit == name:
                    del view.messages[i]
                    if msg.error:
                        raise UnknownLimit(msg.error)
                    return seq, msg.take
            if view.version != version:
                version, idle_since = view.version, self.clock()
            left = idle_since + self.park_after - self.clock()
            if left <= 0:
                if may_park() and (self.combinators > 0 or self.steps_in_flight <= 1):
                    # what came after this was read is looked at again by whoever parks
                    # it (read here, not after the awaits below: a grant pushed while
                    # they ran was neither taken nor read again, and the run waited for
                    # its re-ask timer)
                    left_at = view.seen
                    await self.flush()
                    # the bound on a grant that never comes: back to ask again (the
                    # limit keeps its place, or moves the permit the attempt holds)
                    start = self.history.started_seq
                    await self.store.schedule_timer(
                        self.eid,
                        self.partition,
                        pos,
                        self.clock() + _reask_after(view, pos, start),
                        start=start,
                    )
                    self.left_at = left_at
                    raise Parked
                idle_since = self.clock()
                continue
            may_park(idle=False)
            with anyio.move_on_after(left):
                await changed.wait()

    async def _ask(
        self, eid: str, fairness: str, key: str, *, take: str = "", taking: bool = False
    ) -> int | None:
        """The fast path: ask the live limit actor on core NATS (no durable write here;
        it journals a grant before it answers). The grant's number, or None: not granted
        (no answer within ``ASK_PATIENCE``, nobody listening, or "no"). ``taking``: the
        attempt holds a grant it takes now (as take ``take``): with no answer in time,
        or told to wait, it asks again (a loaded limit actor answers late; asked again,
        the same take spends no second token), for ``park_after`` at most; then None
        (the durable request, naming the take; the run parks if it waits longer)."""
        ask = Ask(
            key=key,
            run=self.eid,
            partition=self.partition,
            worker=self.worker_id,
            fairness=fairness,
            take=take,
        )
        body = encode_core(AskOp(ask))
        until = self.clock() + self.park_after
        while True:
            if taking and self.clock() >= until:
                return None
            try:
                answer = await self.store.request_core(
                    core_subject(self.namespace, eid), body, ASK_PATIENCE
                )
            except NobodyListens:
                return None  # parked (or no worker yet): the durable request activates it
            except ConnectionLost:
                return None  # the durable request is as patient as any write
            if answer is None:
                if taking:
                    continue
                return None  # a grant answered late is moved by the durable request
            try:
                decoded = _answer.decode(answer)
            except msgspec.DecodeError:
                return None
            if not decoded.wait:
                # a fast grant's number (< 0), or the permit the attempt held, taken
                return decoded.grant
            # the take waits for a token, its place kept: asked again (a long poll)

    async def release_permit(self, permit: Permit) -> None:
        """The attempt holding ``permit`` ended: its limit hears it on core NATS (a
        lost release: its lease runs out)."""
        if permit in self.held:
            self.held.discard(permit)
            with anyio.CancelScope(shield=True):
                await self.store.publish_core(
                    core_subject(self.namespace, permit.limit), encode_core(ReleaseOp(permit.seq))
                )

    # -- the code running -------------------------------------------------------------

    async def stop_workflow(self) -> None:
        """Cancel the code where it is (it reached where it was stopped before)."""
        if self.workflow_scope is not None:
            self.workflow_scope.cancel()
        await anyio.lowlevel.checkpoint()

    async def maybe_evict(self, *, in_step: bool = False) -> None:
        """Drop the in-memory copy at this step boundary when asked to (or always).
        ``in_step``: called by a step's own attempt loop. While another task's step
        runs, the copy stays: the last of them to end evicts it."""
        if (self.always_replay and not self.combinators) or self.evict_requested():
            if self.steps_in_flight > in_step:
                return
            await self.flush()
            raise Evicted

    def cancel_running(self) -> None:
        """Stop the code where it is: each running step's ``s.signal`` is set first (so
        its cleanup knows why it stops), then the code's scope is cancelled."""
        for step in list(self.running_steps):
            step.stop()
        if self.workflow_scope is not None:
            self.workflow_scope.cancel()

    # -- the inbox ----------------------------------------------------------------------

    async def watch_inbox(self, read: Callable[[], Awaitable[bool]], *, once: bool) -> None:
        """Read the inbox (the driver's ``read``: it sorts what came) each time the
        worker says it has news (its inbox consumer saw a message, or a wake hint came);
        a cancel (``read`` answered True) stops the running code, and ends the watch
        ``once`` it did (a run ends; an object watches on for its next ones)."""
        while True:
            assert self.woken is not None
            await self.woken.wait()
            self.woken = anyio.Event()
            if await read():
                self.cancel_running()
                if once:
                    return

    def push(self, msg: Stored) -> None:
        """A message stored in this actor's inbox, handed over by the worker."""
        if self.pushes:
            self._pushed.append(msg)

    def push_lost(self) -> None:
        """The worker missed a message of some inbox: the next read asks the server."""
        self._push_ok = False

    def read_again(self, seen: int) -> None:
        """Start reading the inbox afresh above ``seen``, from the server (an object
        activated again reads from its cursor)."""
        self.view = InboxView(seen=seen)
        self._push_ok = False

    async def _fetch_inbox(self) -> list[Stored]:
        """The inbox messages above what the view saw: those handed over, once a read
        from the server covered everything before them; else read from the server."""
        seen = self.view.seen
        if self._push_ok:
            taken = [m for m in self._pushed if m.seq > seen]
            self._pushed = []
            return taken
        read = list(await self.store.read_inbox(self.partition, self.eid, seen))
        last = read[-1].seq if read else seen
        # handed over meanwhile, and not in the read: kept for the next one
        self._pushed = [m for m in self._pushed if m.seq > last]
        self._push_ok = self.pushes
        return read

    async def inbox_messages(self) -> list[tuple[int, InboxMessage | Unknown]]:
        """What arrived in the inbox since the view's ``seen``, decoded: ``(seq,
        message)`` (bytes that are not a JSON object are skipped, and logged)."""
        out: list[tuple[int, InboxMessage | Unknown]] = []
        for msg in await self._fetch_inbox():
            self.view.read(msg.seq)
            decoded = decode_message(msg.data)
            if decoded is None:
                log.warning("inbox.unreadable", seq=msg.seq)
                continue
            if isinstance(decoded, Unknown) and decoded.kind in KINDS:
                log.error("inbox.malformed", seq=msg.seq, kind=decoded.kind, why=decoded.why)
            elif isinstance(decoded, Unknown):
                log.warning("inbox.unknown", seq=msg.seq, kind=decoded.kind, why=decoded.why)
            out.append((msg.seq, decoded))
        return out

    def keep(self, seq: int, msg: InboxMessage) -> None:
        """A message for the waits: kept in the view, and a waiting wait looks again."""
        self.view.add(seq, msg)
        if self.inbox_changed is not None:
            self.inbox_changed.set()
            self.inbox_changed = anyio.Event()
