"""Group commit: the real ``GroupCommitter`` driven with every order of appends, answers,
appenders leaving and a closing connection.

The adapter (``adapters/jetstream/commit.py``) runs on an asyncio loop of its own per
example, against fakes of what it touches: ``direct`` (an append alone) and the batch's
publishes (``nc.publish`` for messages 1..n-1, ``js.publish`` for the commit message).
Each send waits on a future of its own, which the machine answers (a sequence, an error),
or leaves unanswered; between rules the loop runs until no task can move. No real time.
Appenders are cancelled at any point: in their lone send, or while they wait for the
committer. Invariants:

- a record is sent at most once per route: alone, or in one batch; when a batch is
  refused (a stale fence, an API error, a timeout) each of its records is sent alone;
- a batch is well formed: messages 1..n-1 then the commit, numbered, each with its own
  headers (its fence);
- a send is cut short only by its own appender leaving (its lone send) or by the
  connection closing; the committer's sends never run in an appender's context;
- nothing stays queued while no committer task runs;
- at the end, every send answered: every appender that did not leave a lone send gets
  its own outcome (its sequence, the error its send got, or ``CommitterClosed`` when the
  connection closed while the committer held its record), whoever else left; so does the
  record of an appender that left while it waited; the queue is empty, nothing is in
  flight alone, no committer runs.

The mutants are the real module with one change (its source, edited and compiled), patched
into ``GroupCommitter``: issue 9's defect (the first appender to queue runs the committer
in its own task; or awaits the committer's task: either way its cancel takes the lot and
the queue with it), a committer that does not fail what it held when stopped, a refused
batch that fails all its records, a cancelled lone send that stays counted in flight.
The machine finds each.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import nats.errors
import nats.js.errors
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from nats.aio.client import Client
from nats.js.api import PubAck

from fusee.adapters.jetstream import commit
from fusee.adapters.jetstream.commit import (
    BATCH_COMMIT,
    BATCH_ID,
    BATCH_SEQ,
    CommitterClosed,
    GroupCommitter,
    Pending,
)
from fusee.errors import ConnectionLost, Fenced, StorageFull
from fusee.runtime.commits import CommitQueue, Route
from tests.machines import machine_settings

T = TypeVar("T")
WHO: contextvars.ContextVar[int] = contextvars.ContextVar("who")  # set by each appender
CLOSED = "closed"  # the outcome CommitterClosed
Outcome = int | BaseException | str  # a sequence, the very error a send got, or CLOSED


@dataclass
class Lone:
    who: int
    answer: asyncio.Future[int]
    own: bool  # in its appender's task (not the committer's)


@dataclass
class Batch:
    records: list[int]
    ack: asyncio.Future[PubAck]


@dataclass
class Wire:
    """The fakes' side: the sends waiting for an answer, what each record went through,
    and what each record's outcome must be."""

    tasks: dict[int, asyncio.Task[int]] = field(default_factory=dict)  # the appenders
    lone: list[Lone] = field(default_factory=list)  # lone sends waiting for an answer
    batches: list[Batch] = field(default_factory=list)  # commit messages waiting for an ack
    building: dict[str, list[int]] = field(default_factory=dict)  # batch id: messages 1..n-1
    routes: dict[int, list[str]] = field(default_factory=dict)  # alone | batch | refused
    fate: dict[int, Outcome] = field(default_factory=dict)
    left_alone: set[int] = field(default_factory=set)  # left during their own lone send
    wrong: list[str] = field(default_factory=list)  # seen in a fake (raising there would
    # reach the adapter, which hands errors to appenders)
    closing: bool = False
    seq: int = 0  # the stream's last sequence

    def _route(self, who: int, route: str) -> None:
        before = self.routes.setdefault(who, [])
        allowed = [[]] if route == "batch" else [[], ["refused"]]
        if before not in allowed:
            self.wrong.append(f"record {who} sent {route} after {before}")
        before.append(route)

    def _cut(self, what: str, who: int | None) -> None:
        """A send was cancelled: by the connection closing, or (a lone send, ``who``'s)
        by its appender leaving, in its own task; anything else lost it."""
        task = asyncio.current_task()
        if self.closing:
            return
        if who is not None and task is self.tasks.get(who) and task and task.cancelling():
            self.left_alone.add(who)
            return
        self.wrong.append(f"{what} was cut short, not by a close nor by its appender")

    async def direct(self, item: Pending) -> int:
        who = int(item.eid)
        self._route(who, "alone")
        in_own_task = asyncio.current_task() is self.tasks.get(who)
        if not in_own_task and WHO.get(None) is not None:
            self.wrong.append(f"record {who} re-sent in appender {WHO.get()}'s context")
        send = Lone(who, asyncio.get_running_loop().create_future(), in_own_task)
        return await self._answered(send.answer, self.lone, send, f"record {who}'s lone send", who)

    async def _answered(
        self,
        answer: asyncio.Future[T],
        waiting: list[Any],
        send: object,
        what: str,
        who: int | None,
    ) -> T:
        """``send`` waits in ``waiting`` until the machine answers it, or it is cut short."""
        waiting.append(send)
        try:
            return await answer
        except asyncio.CancelledError:
            if send in waiting:  # not answered yet
                waiting.remove(send)
                self._cut(what, who)
            raise

    def _batch_message(self, subject: str, headers: dict[str, str] | None, last: bool) -> int:
        who = int(subject.split(".")[1])
        self._route(who, "batch")
        if WHO.get(None) is not None:
            self.wrong.append(f"record {who} batched in appender {WHO.get()}'s context")
        h = headers or {}
        if h.get("own") != str(who):
            self.wrong.append(f"record {who} lost its own headers: {h}")
        if (BATCH_COMMIT in h) != last:
            self.wrong.append(f"record {who}: commit header {h}, last message: {last}")
        msgs = self.building.setdefault(h.get(BATCH_ID, "?"), [])
        if h.get(BATCH_SEQ) != str(len(msgs) + 1):
            self.wrong.append(f"record {who}: batch sequence {h.get(BATCH_SEQ)} after {msgs}")
        msgs.append(who)
        return who

    async def nc_publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: Any = None
    ) -> None:
        self._batch_message(subject, headers, last=False)

    async def js_publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: Any = None,
        stream: Any = None,
        headers: Any = None,
    ) -> PubAck:
        self._batch_message(subject, headers, last=True)
        records = self.building.pop((headers or {}).get(BATCH_ID, "?"))
        batch = Batch(records, asyncio.get_running_loop().create_future())
        return await self._answered(batch.ack, self.batches, batch, f"the batch {records}", None)

    def answer_lone(self, send: Lone, answer: str) -> None:
        self.lone.remove(send)
        if answer == "ok":
            self.seq += 1
            self.fate[send.who] = self.seq
            send.answer.set_result(self.seq)
            return
        err = {"fenced": Fenced, "full": StorageFull, "lost": ConnectionLost}[answer]()
        self.fate[send.who] = err
        send.answer.set_exception(err)

    def answer_batch(self, batch: Batch, answer: str) -> None:
        self.batches.remove(batch)
        if answer == "ok":
            for who in batch.records:
                self.seq += 1
                self.fate[who] = self.seq
            batch.ack.set_result(PubAck(stream="S", seq=self.seq))
            return
        for who in batch.records:
            self.routes[who][-1] = "refused"
        batch.ack.set_exception(
            {
                "stale": nats.js.errors.BadRequestError(code=400, err_code=10071),
                "api": nats.js.errors.APIError(code=503),
                "timeout": nats.errors.TimeoutError(),
                "no stream": nats.js.errors.NoStreamResponseError(),  # a 503: a leader election
            }[answer]
        )


class FakeNc:
    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.publish = wire.nc_publish


async def _publish_acked(
    nc: Any, subject: str, data: bytes, headers: dict[str, str], timeout: float
) -> int:
    """The batch's commit message (``direct.publish_acked`` in the adapter): its ack,
    as the machine answers it."""
    ack = await nc.wire.js_publish(subject, data, timeout=timeout, headers=headers)
    return int(ack.seq)


@pytest.fixture(autouse=True)
def _acks_from_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    # the commit message goes out through the connection's reply subscription in the
    # adapter; here the machine answers it (the mutants share the module's globals)
    monkeypatch.setattr(commit, "publish_acked", _publish_acked)


def outcome(f: asyncio.Future[int]) -> Outcome:
    if f.cancelled():
        return "cancelled"
    exc = f.exception()
    if isinstance(exc, CommitterClosed):
        return CLOSED
    return exc if exc is not None else f.result()


class CommitMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.wire = Wire()
        self.gc = GroupCommitter(cast(Client, FakeNc(self.wire)), self.wire.direct)
        self.items: dict[int, Pending] = {}
        self.closes = 0

    def _settle(self) -> None:
        """Run the loop until no task can move (every one waits on an unanswered send,
        on its record's outcome, or is done): the longest chain of wake-ups here is a
        few loop turns, and more turns change nothing (checked with 40)."""

        async def idle() -> None:
            for _ in range(10):
                await asyncio.sleep(0)

        self.loop.run_until_complete(idle())

    async def _appender(self, who: int) -> int:
        WHO.set(who)  # its own context (log fields): the committer's sends must not see it
        item = Pending(
            f"j.{who}", b"x", {"own": str(who)}, str(who), 0, f"{who}:1", "test", float("inf")
        )
        self.items[who] = item
        return await self.gc.append(item)

    @initialize(direct_limit=st.integers(0, 2), max_batch=st.integers(1, 3))
    def limits(self, direct_limit: int, max_batch: int) -> None:
        self.gc.direct_limit = direct_limit
        self.gc.plan.max_batch = max_batch

    @rule()
    def append(self) -> None:
        who = len(self.wire.tasks)
        self.wire.tasks[who] = self.loop.create_task(self._appender(who))
        self._settle()

    @precondition(lambda self: bool(self.wire.lone))
    @rule(data=st.data(), answer=st.sampled_from(["ok", "fenced", "full", "lost"]))
    def a_lone_send_ends(self, data: st.DataObject, answer: str) -> None:
        self.wire.answer_lone(data.draw(st.sampled_from(self.wire.lone)), answer)
        self._settle()

    @precondition(lambda self: bool(self.wire.batches))
    @rule(data=st.data(), answer=st.sampled_from(["ok", "stale", "api", "timeout", "no stream"]))
    def a_batch_is_acked(self, data: st.DataObject, answer: str) -> None:
        self.wire.answer_batch(data.draw(st.sampled_from(self.wire.batches)), answer)
        self._settle()

    @precondition(lambda self: any(not t.done() for t in self.wire.tasks.values()))
    @rule(data=st.data())
    def an_appender_leaves(self, data: st.DataObject) -> None:
        """Cancelled (its run's cancel, its timeout): in its lone send, or waiting."""
        waiting = [who for who, t in self.wire.tasks.items() if not t.done()]
        self.wire.tasks[data.draw(st.sampled_from(waiting))].cancel()
        self._settle()

    @precondition(lambda self: self.closes < 2)  # appends go on after a close
    @rule()
    def the_connection_closes(self) -> None:
        self.closes += 1
        w = self.wire
        in_own_send = {s.who for s in w.lone if s.own}
        for who in w.tasks:  # what the committer holds fails with CommitterClosed
            if who not in w.fate and who not in w.left_alone and who not in in_own_send:
                w.fate[who] = CLOSED
        w.closing = True
        self.loop.run_until_complete(self.gc.close())
        self._settle()
        w.closing = False

    @invariant()
    def the_fakes_saw_nothing_wrong(self) -> None:
        assert not self.wire.wrong, self.wire.wrong

    @invariant()
    def nothing_is_queued_without_a_committer(self) -> None:
        if self.gc.plan.queue:
            task = self.gc._committer
            assert task is not None, f"{len(self.gc.plan.queue)} queued, no committer"
            assert not task.done(), f"{len(self.gc.plan.queue)} queued, the committer ended"

    def teardown(self) -> None:
        try:
            self._every_send_answered()
            self._every_outcome_its_own()
        finally:
            self._stop()

    def _every_send_answered(self) -> None:
        for _ in range(len(self.wire.tasks) + 1):  # each answer can lead to one more send
            if not self.wire.lone and not self.wire.batches:
                break
            for send in list(self.wire.lone):
                self.wire.answer_lone(send, "ok")
            for batch in list(self.wire.batches):
                self.wire.answer_batch(batch, "ok")
            self._settle()
        self.the_fakes_saw_nothing_wrong()

    def _every_outcome_its_own(self) -> None:
        w = self.wire
        for who, task in w.tasks.items():
            if who in w.left_alone:  # it took its own record away, nobody else's
                continue
            fate = w.fate.get(who, "undecided")  # no answer nor close decided it
            if task.cancelled():  # it left while it waited: its record still gets its own
                got = outcome(self.items[who].done) if self.items[who].done.done() else "none"
                assert got == fate, f"record {who} (appender left): {got!r}, not {fate!r}"
            else:
                assert task.done(), f"appender {who} still waits ({w.routes.get(who)})"
                got = outcome(task)
                assert got == fate, f"appender {who} got {got!r}, not {fate!r}"
        plan = self.gc.plan
        assert (plan.in_flight, plan.queue, plan.committing) == (0, [], False), plan
        assert self.gc._committer is None

    def _stop(self) -> None:
        async def stop() -> None:
            await self.gc.close()
            for task in self.wire.tasks.values():
                task.cancel()
            await asyncio.gather(*self.wire.tasks.values(), return_exceptions=True)

        try:
            self.loop.run_until_complete(stop())
        finally:
            self.loop.close()


SETTINGS = machine_settings(300, 25)


def test_every_order_keeps_the_invariants() -> None:
    run_state_machine_as_test(CommitMachine, settings=SETTINGS)


# -- mutants: the real module with one change ------------------------------------------

LEADER = (
    """\
            self._committer = asyncio.get_running_loop().create_task(
                self._commit_queued(), context=contextvars.Context()
            )
""",
    # issue 9's defect: the first appender to queue sends the lot in its own task
    """\
            self._committer = asyncio.current_task()
            await self._commit_queued()
""",
)
MUTANTS: dict[str, tuple[str, tuple[str, str]]] = {
    "the first appender to queue runs the committer": ("append", LEADER),
    "the first appender to queue awaits the committer's task": (
        "append",
        (LEADER[0], LEADER[0] + "            await self._committer\n"),
    ),
    "the committer does not fail what it still held": (
        "_commit_queued",
        (
            'item.done.set_exception(CommitterClosed("the connection to NATS closed"))',
            "pass",
        ),
    ),
    "a refused batch fails all its records": (
        "_send",
        ("await asyncio.gather(*(self._alone(item) for item in lot))\n", "raise\n"),
    ),
    "a cancelled lone send stays in flight": (
        "append",
        (
            """\
            try:
                return await self.direct(item)
            finally:
                self.plan.sent_alone()
""",
            """\
            seq = await self.direct(item)
            self.plan.sent_alone()
            return seq
""",
        ),
    ),
}


def mutant(method: str, old: str, new: str) -> Callable[..., Any]:
    """``GroupCommitter.<method>`` compiled from the real module's source with ``old``
    made ``new``, running in the real module's globals (its ``CommitterClosed``)."""
    source = inspect.getsource(commit)
    assert source.count(old) == 1, f"the mutated text is no longer in commit.py: {old!r}"
    namespace: dict[str, Any] = {"__name__": commit.__name__}
    exec(compile(source.replace(old, new), commit.__file__, "exec"), namespace)
    fn = getattr(namespace["GroupCommitter"], method)
    return types.FunctionType(fn.__code__, vars(commit), fn.__name__, fn.__defaults__)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_a_mutant_is_found(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    method, (old, new) = MUTANTS[name]
    monkeypatch.setattr(GroupCommitter, method, mutant(method, old, new))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            CommitMachine,
            settings=settings(SETTINGS, phases=[Phase.generate], report_multiple_bugs=False),
        )


# -- the pure queue on its own ---------------------------------------------------------


def test_the_queue_routes_alone_then_queues_and_starts_one_committer() -> None:
    q: CommitQueue[int] = CommitQueue(direct_limit=1, max_batch=2)
    assert [q.offer(i) for i in range(4)] == [Route.ALONE, Route.START, Route.QUEUED, Route.QUEUED]
    q.sent_alone()
    assert q.offer(4) is Route.QUEUED  # a committer runs: nothing overtakes the queue
    assert (q.next_lot(), q.next_lot(), q.next_lot()) == ([1, 2], [3, 4], [])
    assert not q.committing
    assert q.offer(5) is Route.ALONE


def test_closing_the_queue_hands_back_what_was_never_sent() -> None:
    q: CommitQueue[int] = CommitQueue(direct_limit=0)
    assert [q.offer(i) for i in range(3)] == [Route.START, Route.QUEUED, Route.QUEUED]
    assert q.next_lot() == [0, 1, 2]
    q.offer(3)
    assert q.close() == [3]
    assert (q.queue, q.committing) == ([], False)
    assert q.offer(4) is Route.START
