"""Keyed objects (issue 4): one actor per key, exclusive handlers one at a time in
arrival order, shared handlers at once, state in KV as a projection of the journal.

The object types are in ``tests/workers/objects.py``; a worker process loads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.registry import Registry
from fusee.actors.worker import owner_for
from fusee.runtime.objects import object_id
from fusee.runtime.records import ObjectDone
from tests.workers.objects import chats, counters
from tests.workers.procs import WorkerProc, Workers, owners, start_balanced, wait_until

OBJECTS = Path(__file__).resolve().parent.parent / "workers" / "objects.py"

pytestmark = pytest.mark.timeout(120)


async def _workers(worker_procs: Any) -> Workers:
    workers: Workers = worker_procs(partitions=4)
    workers.module = OBJECTS
    await workers.start()
    return workers


async def _projected(engine: fusee.Engine, name: str) -> Any:
    """The state in the KV projection under ``name`` (None: none written yet)."""
    try:
        entry = await engine.store.objects.get(name)
    except Exception:  # noqa: BLE001 - KeyNotFoundError: not projected yet
        return None
    return msgspec.json.decode(entry.value or b"null")


async def _marker(engine: fusee.Engine, key: fusee.ObjectKey) -> bytes | None:
    """The key's marker in the work bucket (``{}`` active, ``{"idle":true}`` idle)."""
    try:
        return (await engine.store.work.get(f"active.{key._partition}.{key.eid}")).value
    except Exception:  # noqa: BLE001 - KeyNotFoundError: no marker
        return None


async def _gone_idle(engine: fusee.Engine, key: fusee.ObjectKey) -> None:
    """Until the key's actor left memory idle (its worker wrote the idle marker)."""

    async def idle() -> bool:
        return await _marker(engine, key) == b'{"idle":true}'

    await wait_until(idle, what=f"{key!r} to go idle", timeout=15)


async def _dones(engine: fusee.Engine, type_name: str, key: str) -> list[ObjectDone]:
    """The object's ``obj.done`` records, in journal order."""
    run = fusee.Run(engine, object_id(type_name, key))
    return [r for _, r in await run.journal() if isinstance(r, ObjectDone)]


async def test_the_issue_example_chat(engine: fusee.Engine, worker_procs: Any) -> None:
    await _workers(worker_procs)
    chat = chats.key("user-7", engine=engine)
    assert await chat.call("say", "Where is my order?") == "echo: Where is my order?"
    seq = await chat.send("say", "And the refund?")
    assert await chat.result(seq, timeout=20) == "echo: And the refund?"
    history = await chat.call("history")
    assert [m["content"] for m in history] == [
        "Where is my order?",
        "echo: Where is my order?",
        "And the refund?",
        "echo: And the refund?",
    ]
    assert await chat.state() == {"history": history}

    # the KV projection, as `nats kv get <ns>_objects chat.user-7` shows it: written just
    # after the reply, so it may lag the call by a moment
    async def projected() -> bool:
        return bool(await _projected(engine, "chat.user-7") == {"history": history})

    await wait_until(projected, what="the projection to catch up", timeout=5)
    assert await engine.list_objects("chat") == [("user-7", {"history": history})]


async def test_200_calls_from_10_clients_never_overlap_and_keep_arrival_order(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _workers(worker_procs)
    counter = counters.key("shared-counter", engine=engine)
    marker = str(tmp_path / "running")  # O_EXCL file: a second handler inside fails
    results: dict[int, list[int]] = {c: [] for c in range(10)}

    async def client(c: int) -> None:
        for n in range(20):
            got = await counter.call("add", {"client": c, "n": n, "marker": marker}, timeout=60)
            results[c].append(got)

    async with anyio.create_task_group() as tg:
        for c in range(10):
            tg.start_soon(client, c)

    returned = sorted(v for vs in results.values() for v in vs)
    assert returned == list(range(1, 201))  # each call saw the one before it: no overlap
    for c, values in results.items():
        assert values == sorted(values), f"client {c} saw its calls run out of order"
    state = await counter.state()
    assert state["count"] == 200
    for c in range(10):
        mine = [s for s in state["seen"] if s.startswith(f"{c}:")]
        assert mine == [f"{c}:{n}" for n in range(20)]
    dones = await _dones(engine, "counter", "shared-counter")
    assert len(dones) == 200
    assert all(d.ok for d in dones)
    seqs = [d.inbox_seq for d in dones]
    assert seqs == sorted(set(seqs)), "invocations ran out of arrival order"
    assert not os.path.exists(marker)


async def test_a_failed_handler_leaves_the_state_and_the_next_one_runs(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("fails", engine=engine)
    assert await counter.call("add", {}) == 1
    with pytest.raises(fusee.HandlerFailed) as failed:
        await counter.call("fail", {"message": "boom"}, timeout=20)
    assert failed.value.error_type == "ValueError"
    assert failed.value.message == "boom"
    assert await counter.state() == {"count": 1, "seen": ["None:None"]}
    assert await counter.call("add", {}, timeout=20) == 2


async def test_a_stuck_handler_times_out_and_frees_the_key(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("stuck", engine=engine)
    behind = await counter.send("add", {})
    first = anyio.current_time()
    with pytest.raises(fusee.HandlerFailed) as failed:
        await counter.call("stall", {"seconds": 30}, timeout=25)  # its timeout is 2s
    assert failed.value.error_type == "fusee.Timeout"
    assert "2s" in failed.value.message
    assert anyio.current_time() - first < 15
    assert await counter.result(behind, timeout=20) == 1
    assert "stalled" not in await counter.state()


async def test_show_lists_the_queue_and_cancel_takes_an_invocation_out(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _workers(worker_procs)
    counter = counters.key("queue", engine=engine)
    release = tmp_path / "release"  # the hold keeps the key until this file exists
    holding = await counter.send("hold", {"until": str(release)})
    a = await counter.send("add", {"client": "a"})
    b = await counter.send("add", {"client": "b"})

    async def running() -> fusee.ObjectInfo | None:
        info = await counter.show()
        return info if info.running is not None else None

    info = await wait_until(running, what="the hold to show as running", timeout=20)
    assert info.running is not None
    assert info.running.seq == holding
    assert info.running.handler == "hold"
    assert info.running.running_since
    assert [(w.seq, w.handler) for w in info.waiting] == [(a, "add"), (b, "add")]

    await counter.cancel(a, reason="not wanted")  # durable now; `a` has not run: it waits
    assert [(w.seq, w.cancelling) for w in (await counter.show()).waiting] == [
        (a, True),
        (b, False),
    ]
    release.touch()
    with pytest.raises(fusee.HandlerCancelled, match="not wanted"):
        await counter.result(a, timeout=20)
    assert await counter.result(holding, timeout=20) == "held"
    assert await counter.result(b, timeout=20) == 1
    state = await counter.state()
    assert state["seen"] == ["b:None"]
    assert state["held"] is True
    after = await counter.show()
    assert after.running is None
    assert after.waiting == []


async def test_cancel_stops_the_running_handler_and_drops_its_changes(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _workers(worker_procs)
    counter = counters.key("cancel-running", engine=engine)
    log = tmp_path / "effects.log"
    # never released: only the cancel can end the step
    holding = await counter.send("hold", {"until": str(tmp_path / "never"), "log": str(log)})
    await wait_until(lambda: log.exists(), what="the hold step to start", timeout=20)
    await counter.cancel(reason="operator")
    with pytest.raises(fusee.HandlerCancelled, match="operator"):
        await counter.result(holding, timeout=20)
    assert "held" not in await counter.state()
    assert await counter.call("add", {}, timeout=20) == 1


async def test_an_edit_waits_its_turn_and_no_earlier_handler_overwrites_it(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _workers(worker_procs)
    counter = counters.key("edited", engine=engine)
    release = tmp_path / "release"
    await counter.send("hold", {"until": str(release)})  # holds the key while the rest queue
    before = [await counter.send("add", {"client": "before", "n": n}) for n in range(3)]

    async def edit() -> dict[str, Any]:
        return await counter.edit(set={"count": 100, "note": "fixed by hand"}, timeout=30)

    async def queue() -> list[str]:
        info = await counter.show()
        return [q.handler for q in [*([info.running] if info.running else []), *info.waiting]]

    async def edit_queued() -> bool:
        return "fusee.edit" in await queue()

    async with anyio.create_task_group() as tg:
        tg.start_soon(edit)
        await wait_until(edit_queued, what="the edit to be queued", timeout=20)
        after = [await counter.send("add", {"client": "after", "n": n}) for n in range(2)]
        # nothing ran yet (the hold holds the key): the queue is in arrival order
        assert await queue() == ["hold", "add", "add", "add", "fusee.edit", "add", "add"]
        release.touch()
    assert [await counter.result(s, timeout=20) for s in before] == [1, 2, 3]
    assert [await counter.result(s, timeout=20) for s in after] == [101, 102]
    state = await counter.state()
    assert state["count"] == 102
    assert state["note"] == "fixed by hand"
    handlers = [d.handler for d in await _dones(engine, "counter", "edited")]
    assert handlers == ["hold", "add", "add", "add", "fusee.edit", "add", "add"]


async def test_shared_handlers_run_at_once_and_read_the_last_finished_state(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _workers(worker_procs)
    counter = counters.key("reader", engine=engine)
    assert await counter.call("add", {}) == 1
    log, release = tmp_path / "effects.log", tmp_path / "release"
    holding = await counter.send("hold", {"until": str(release), "log": str(log)})
    await wait_until(log.exists, what="the hold step to start", timeout=20)
    # the hold cannot end before `release` exists (nor time out within 60s): a peek
    # queued behind it would not answer within this limit
    with anyio.fail_after(20):
        assert await counter.call("peek", timeout=20) == {"count": 1, "keys": ["count", "seen"]}
    info = await counter.show()
    assert info.running is not None
    assert info.running.seq == holding
    release.touch()
    assert await counter.result(holding, timeout=20) == "held"
    assert (await counter.call("peek"))["keys"] == ["count", "held", "seen"]
    with pytest.raises(fusee.InvalidArgument, match="shared handler"):
        await counter.send("peek")


async def test_an_idempotency_key_makes_a_retry_return_the_first_result(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("idem", engine=engine)
    first = await counter.call("add", {}, idempotency_key="order-1")
    again = await counter.call("add", {}, idempotency_key="order-1")
    assert first == again == 1
    assert await counter.call("add", {}) == 2
    assert len(await _dones(engine, "counter", "idem")) == 2


async def test_send_is_durable_before_any_worker_runs(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    counter = counters.key("offline", engine=engine)
    seqs = [await counter.send("add", {"client": "x", "n": n}) for n in range(3)]
    await _workers(worker_procs)
    assert [await counter.result(s, timeout=30) for s in seqs] == [1, 2, 3]


async def test_a_handler_sleeps_durably_holding_its_key(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("napper", engine=engine)
    napping = await counter.send("nap", {"seconds": 1.5})
    behind = await counter.send("add", {})
    assert await counter.result(napping, timeout=30) == 1
    assert await counter.result(behind, timeout=30) == 2


async def test_a_handler_waits_for_a_signal_to_its_key(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    worker = (await _workers(worker_procs)).procs[0]
    counter = counters.key("approval", engine=engine)
    waiting = await counter.send("approve", {"timeout": "20s"})
    # the signal comes while the handler waits for it
    await worker.wait_for("wait.started", object="counter", key="approval", timeout=20)
    await counter.signal("approval", {"ok": True})
    assert await counter.result(waiting, timeout=30) == {"ok": True}
    assert (await counter.state())["approved"] == {"ok": True}


async def test_a_handler_streams_a_model_call_and_starts_a_child(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("streamer", engine=engine)
    first = await counter.send("stream_say", "one two three")
    second = await counter.send("stream_say", "four five")
    tokens = [t async for t in counter.stream(second, "reply")]
    assert "".join(tokens) == "four five "
    assert "".join([t async for t in counter.stream(first, "reply")]) == "one two three "
    assert "".join([t async for t in counter.stream(first, "reply", offset=1)]) == "two three "
    assert await counter.result(second, timeout=20) == "four five "
    assert await counter.call("spawn", 21, timeout=30) == 42
    assert await engine.run("double-streamer-21").result(timeout=10) == 42
    assert (await counter.state())["doubled"] == 42


async def test_an_idle_object_keeps_an_expiring_marker_and_comes_back_on_the_next_call(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("idle", engine=engine)
    assert await counter.call("add", {}) == 1
    # idle for a second: its marker becomes one the server removes in 10 minutes
    await _gone_idle(engine, counter)
    assert await counter.call("add", {}, timeout=20) == 2
    assert await counter.send("add", {}) > 0  # the idle marker is made active again
    assert await _marker(engine, counter) == b"{}"


async def test_bad_input_gets_clear_errors_and_changes_nothing(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("bad", engine=engine)
    assert await counter.call("add", {}) == 1
    with pytest.raises(fusee.InvalidId, match="object type"):
        fusee.object("a/b", {"x": lambda ctx: None})
    with pytest.raises(fusee.InvalidId, match="must not be empty"):
        counters.key("", engine=engine)
    with pytest.raises(fusee.InvalidId, match="control characters"):
        counters.key("a\x00b", engine=engine)
    with pytest.raises(fusee.InvalidId, match="at most 256"):
        counters.key("k" * 300, engine=engine)
    with pytest.raises(fusee.InvalidId, match="reserved for objects"):
        await engine.start("chain", "@counter/bad", None)
    with pytest.raises(fusee.InvalidArgument, match=r"no handler .nope.*add"):
        await counter.call("nope")
    with pytest.raises(fusee.NotEncodable, match="input"):
        await counter.call("add", {"x": object()})
    with pytest.raises(fusee.NotEncodable):
        await counter.edit(set={"count": object()})
    with pytest.raises(fusee.InvalidArgument, match="'state' must be a JSON object"):
        await counter.edit(state="x")  # type: ignore[arg-type]
    with pytest.raises(fusee.InvalidArgument, match="needs"):
        await counter.edit()
    by_name = engine.object("counter", "bad")
    with pytest.raises(fusee.HandlerFailed, match="no handler 'nope'"):
        await by_name.call("nope", timeout=20)
    assert await counter.state() == {"count": 1, "seen": ["None:None"]}
    assert await counter.call("add", {}) == 2


async def test_state_that_is_not_json_fails_the_handler_and_keeps_the_state(
    engine: fusee.Engine,
) -> None:
    async def bad(ctx: Any) -> None:
        ctx.state.set("fine", 1)
        ctx.state.set("broken", object())

    async def ok(ctx: Any) -> int:
        ctx.state.set("fine", 2)
        return 2

    registry = Registry()
    weird = fusee.object("weird", {"bad": bad, "ok": ok})
    registry.add_object(weird)
    async with engine.worker(registry=registry):
        key = weird.key("k", engine=engine)
        with pytest.raises(fusee.HandlerFailed, match="not JSON-encodable") as failed:
            await key.call("bad", timeout=20)
        assert failed.value.error_type == "fusee.NotEncodable"
        assert await key.state() == {}
        assert await key.call("ok", timeout=20) == 2
        assert await key.state() == {"fine": 2}


async def test_a_failed_invocation_runs_its_compensations_and_cancels_its_children(
    engine: fusee.Engine,
) -> None:
    undone: list[str] = []

    async def slow(ctx: fusee.Context, _arg: Any) -> str:
        await ctx.sleep("30s")
        return "late"

    async def book(ctx: Any, arg: dict[str, Any]) -> str:
        booking = await ctx.step("book", lambda: "B-1")
        ctx.compensate("unbook", lambda: undone.append(booking))
        ctx.state.set("booking", booking)
        if arg.get("child"):
            return str(await ctx.child("slow", f"slow-{ctx.key}", None))
        raise ValueError("payment declined")

    registry = Registry()
    registry.add(fusee.Workflow("slow", slow, Any, True))
    trips = fusee.object("trip", {"book": fusee.exclusive(book, timeout="1s")})
    registry.add_object(trips)
    async with engine.worker(registry=registry):
        key = trips.key("t-1", engine=engine)
        with pytest.raises(fusee.HandlerFailed, match="payment declined"):
            await key.call("book", {}, timeout=20)
        assert undone == ["B-1"]
        with pytest.raises(fusee.HandlerFailed) as timed_out:
            await key.call("book", {"child": True}, timeout=20)
        assert timed_out.value.error_type == "fusee.Timeout"
        assert undone == ["B-1", "B-1"]
        with pytest.raises(fusee.RunCancelled):
            await engine.run("slow-t-1").result(timeout=20)
        assert await key.state() == {}


async def test_a_cancel_of_the_running_one_never_hits_a_later_invocation(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    worker = (await _workers(worker_procs)).procs[0]
    counter = counters.key("cancel-once", engine=engine)
    first = await counter.send("approve", {"timeout": "20s"})

    async def running(seq: int) -> bool:
        info = await counter.show()
        return info.running is not None and info.running.seq == seq

    await wait_until(lambda: running(first), what="the first approval to run", timeout=20)
    assert await counter.cancel(reason="meant for the first") == first
    with pytest.raises(fusee.HandlerCancelled, match="meant for the first"):
        await counter.result(first, timeout=20)
    second = await counter.send("approve", {"timeout": "20s"})
    await wait_until(lambda: running(second), what="the second approval to run", timeout=20)
    info = await counter.show()
    assert info.running is not None
    assert not info.running.cancelling
    # parked meanwhile: its next activation reads the inbox again
    await worker.wait_for(
        "object.parked", object="counter", key="cancel-once", inbox_seq=second, timeout=20
    )
    await counter.signal("approval", "yes")
    assert await counter.result(second, timeout=20) == "yes"
    assert await counter.cancel() is None  # nothing left to cancel


async def test_a_frozen_owner_is_fenced_out_and_the_change_applies_once(
    nats_server: Any, namespace: str, worker_procs: Any, tmp_path: Path
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        workers: Workers = worker_procs(partitions=4)
        workers.module = OBJECTS
        by_id = await start_balanced(workers, engine, 2)
        counter = counters.key("zombie", engine=engine)
        owner_id = (await owners(engine))[counter._partition]
        assert owner_id is not None
        zombie = by_id[owner_id]
        release = tmp_path / "release"  # the step waits for it: frozen, it cannot finish
        seq = await counter.send("add", {"client": "z", "n": 0, "until": str(release)})
        await zombie.wait_for("step.started", object="counter", key="zombie", timeout=15)
        zombie.freeze()
        release.touch()  # for the run of the invocation on the other worker
        try:
            # the other worker takes the partition over and runs the invocation again
            assert await counter.result(seq, timeout=30) == 1
        finally:
            zombie.thaw()

        def shut_out() -> list[dict[str, Any]]:
            return zombie.find("actor.fenced") + zombie.find("partition.lost")

        await wait_until(shut_out, timeout=15, what="the zombie to be shut out")
        assert not zombie.find("invocation.completed", object="counter", key="zombie")
        assert await counter.call("add", {"client": "z", "n": 1}, timeout=30) == 2
        assert (await counter.state())["seen"] == ["z:0", "z:1"]
        dones = await _dones(engine, "counter", "zombie")
        assert len(dones) == 2
        assert dones[0].inbox_seq == seq
    finally:
        await engine.close()


async def test_state_written_by_hand_in_kv_is_rebuilt_from_the_journal(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    await _workers(worker_procs)
    counter = counters.key("by-hand", engine=engine)
    assert await counter.call("add", {}) == 1

    async def projected() -> bool:  # written after the reply: else it may overwrite ours
        return bool(
            await _projected(engine, "counter.by-hand") == {"count": 1, "seen": ["None:None"]}
        )

    await wait_until(projected, what="the projection of the first call", timeout=10)
    # what `nats kv put <ns>_objects counter.by-hand '{"count": 99}'` would do
    await engine.store.objects.put("counter.by-hand", b'{"count": 99, "extra": true}')
    await _gone_idle(engine, counter)  # its next activation reads KV again
    assert await engine.object("counter", "by-hand").call("add", {}, timeout=20) == 2
    state = await counter.state()
    assert state["count"] == 2
    assert "extra" not in state  # the journal is the truth; edit state with objects edit


async def test_keys_move_between_workers_without_overlap_or_reordering(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """Workers join and leave (gracefully) while 4 clients call 4 keys: each key's
    handlers never overlap, run in each client's order, and apply once each."""
    workers: Workers = worker_procs(partitions=4)
    workers.module = OBJECTS
    first = await workers.start()
    ids = {first.name: first.find("worker.started")[0]["worker"]}
    keys = [counters.key(f"moving-{k}", engine=engine) for k in range(4)]
    markers = [str(tmp_path / f"running-{k}") for k in range(4)]
    got: dict[int, list[int]] = {k: [] for k in range(4)}
    moving = True

    async def client(k: int) -> None:
        n = 0
        while moving or n < 10:  # calling all along, while the keys move
            arg = {"client": k, "n": n, "marker": markers[k], "step_delay": 0.01}
            got[k].append(await keys[k].call("add", arg, timeout=60))
            n += 1

    async def progress(what: str) -> None:
        """Until each client made two more calls (in the phase ``what``)."""
        target = {k: len(got[k]) + 2 for k in range(4)}
        await wait_until(
            lambda: all(len(got[k]) >= target[k] for k in range(4)),
            what=f"calls to go on {what}",
            timeout=30,
        )

    async def owned_by(*live: WorkerProc) -> None:
        """Until the partitions are shared as the ``live`` workers agree (rendezvous)."""
        live_ids = {ids[w.name] for w in live}

        async def settled() -> bool:
            now = await owners(engine)
            return all(now[p] == owner_for(p, live_ids) for p in now)

        await wait_until(settled, what=f"{sorted(live_ids)} to own the partitions", timeout=30)

    async def start() -> WorkerProc:
        proc = await workers.start()
        ids[proc.name] = proc.find("worker.started")[0]["worker"]
        return proc

    async with anyio.create_task_group() as tg:
        for k in range(4):
            tg.start_soon(client, k)
        await progress("with one worker")
        second = await start()  # takes its share of the partitions
        await owned_by(first, second)
        await progress("with two workers")
        assert await anyio.to_thread.run_sync(first.stop) == 0  # hands its share over
        await owned_by(second)
        await progress("after the first left")
        third = await start()
        await owned_by(second, third)
        await progress("with the second and the third")
        assert await anyio.to_thread.run_sync(second.stop) == 0
        await owned_by(third)
        await progress("after the second left")
        moving = False

    for k in range(4):
        calls = len(got[k])
        assert calls > 10
        assert got[k] == list(range(1, calls + 1))  # in order, none lost, none twice
        state = await keys[k].state()
        assert state["count"] == calls
        assert state["seen"] == [f"{k}:{n}" for n in range(calls)]
        assert not os.path.exists(markers[k])


async def test_a_shared_handlers_own_timeout_error_is_its_error_not_the_deadline(
    engine: fusee.Engine,
) -> None:
    """Only the shared handler's deadline is a ``fusee.Timeout``; a ``TimeoutError`` the
    handler raises itself (a slow upstream) comes back as the handler's own error."""

    async def upstream(ctx: Any) -> None:
        raise TimeoutError("the upstream API did not answer")

    async def stalls(ctx: Any) -> None:
        await anyio.sleep(30)

    registry = Registry()
    reader = fusee.object(
        "timeouts",
        {"upstream": fusee.shared(upstream), "stalls": fusee.shared(stalls)},
        timeout=0.5,
    )
    registry.add_object(reader)
    async with engine.worker(registry=registry):
        key = reader.key("k", engine=engine)
        with pytest.raises(fusee.HandlerFailed) as own:
            await key.call("upstream", timeout=20)
        assert own.value.error_type == "TimeoutError"
        assert own.value.message == "the upstream API did not answer"
        with pytest.raises(fusee.HandlerFailed) as deadline:
            await key.call("stalls", timeout=20)
        assert deadline.value.error_type == "fusee.Timeout"
        assert "500ms" in deadline.value.message or "0.5s" in deadline.value.message
