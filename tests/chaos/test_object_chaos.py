"""SIGKILL the worker mid-handler, 20 times at random points, while clients call a keyed
counter: the counter ends exactly at the number of calls, no handler's state change is
applied twice, every ``call`` returns, and a step that was journaled never runs again.

Two keys on the two partitions, three clients per key, each client's calls one after the
other; two workers alive at a time. A kill lands right after a step started (mid-step or
just after), inside the window between an invocation's ``obj.done`` commit and the KV
projection of its state (``tests/workers/objects_chaos.py`` stops a worker there when the
test asks, so the kill lands inside it by construction), or at a random time; a new
worker starts after each kill. Now and
then a key's clients pause together, so that its object goes idle and is activated again.
``FUSEE_CHAOS_SEED`` replays the same choices (the interleaving still varies).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.runtime.ids import partition_of
from fusee.runtime.objects import decode_state
from fusee.runtime.records import (
    Invocation,
    ObjectDone,
    ObjectStarted,
    StepCompleted,
    decode_record,
)
from tests.workers.procs import WorkerProc, assert_chained, owners, wait_until

pytestmark = pytest.mark.chaos

MODULE = Path(__file__).resolve().parent.parent / "workers" / "objects_chaos.py"
PARTITIONS = 2
CLIENTS_PER_KEY = 3
# each client calls until the kills are over: at least 7 calls (42 in all), and at most
# 3 more per kill begun so far (a kill aimed at a projection waits for one: a key of the
# chaos worker projects every 4 records, see objects_chaos.py); a client ahead of the
# kills waits for the next one to begin, so a machine slow to start workers (the kills)
# does not let the calls run out before the kills end (a fixed 60 did, at a load of 6),
# and a kill waiting for a step or a projection has calls coming
MIN_CALLS, CALLS_PER_KILL = 7, 3
KILLS = 20
CALL_TIMEOUT = 45.0  # a call that has not returned by then hangs: the test fails


class Tail:
    """The JSON log lines a worker wrote since the last look (read incrementally)."""

    def __init__(self, worker: WorkerProc) -> None:
        self.worker = worker
        self.offset = 0
        self.partial = b""

    def new(self) -> list[dict[str, Any]]:
        with self.worker.log_path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            if line.startswith(b"{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out


@dataclass
class Chaos:
    rng: random.Random
    workers: Any  # tests.workers.procs.Workers
    engine: Any
    stop_flag: Path  # a worker that renames it stops itself before a projection write
    by_id: dict[str, WorkerProc] = field(default_factory=dict)
    alive: list[WorkerProc] = field(default_factory=list)
    tails: dict[str, Tail] = field(default_factory=dict)
    killed: dict[int, float] = field(default_factory=dict)  # pid -> time it was dead by
    kills: list[str] = field(default_factory=list)  # how each kill was chosen
    begun: int = 0  # kills begun (the clients' budget grows with it)
    # set (and replaced) as each kill begins, and once they are over: clients ahead of
    # the kills wait on it
    next_kill: anyio.Event = field(default_factory=anyio.Event)

    def kill_begins(self) -> None:
        self.begun += 1
        began, self.next_kill = self.next_kill, anyio.Event()
        began.set()

    async def start(self) -> None:
        env = {"FUSEE_TEST_STOP_AT_PROJECTION": str(self.stop_flag)}
        proc = await self.workers.start(extra_env=env)
        self.by_id[proc.find("worker.started")[0]["worker"]] = proc
        self.alive.append(proc)
        self.tails[proc.name] = Tail(proc)
        self.tails[proc.name].new()  # from now on

    def kill(self, victim: WorkerProc, how: str) -> None:
        victim.kill()
        self.killed[victim.pid] = time.time()
        self.alive.remove(victim)
        self.kills.append(f"{how}:{victim.name}")

    async def next_event(self, event: str, timeout: float) -> WorkerProc | None:
        """The live worker that logs ``event`` for an object next (None: none in time)."""
        for w in self.alive:
            self.tails[w.name].new()
        with anyio.move_on_after(timeout):
            while True:
                for w in self.alive:
                    if any(
                        e.get("event") == event and e.get("object") == "counter"
                        for e in self.tails[w.name].new()
                    ):
                        return w
                await anyio.sleep(0.005)
        return None

    async def stopped_at_projection(self, timeout: float) -> WorkerProc | None:
        """Ask the workers to stop at their next projection write; the one that did,
        stopped between the obj.done commit and the write (None: none in time)."""
        flag = self.stop_flag
        flag.touch()
        with anyio.move_on_after(timeout):
            while flag.exists():
                await anyio.sleep(0.005)
        if flag.exists():
            try:
                flag.unlink()
                return None  # no projection in time: nobody stopped
            except FileNotFoundError:
                pass  # claimed just now
        [claim] = flag.parent.glob(f"{flag.name}.*")
        pid = int(claim.name.rsplit(".", 1)[1])
        claim.unlink()
        [victim] = [w for w in self.alive if w.pid == pid]
        return victim

    async def owner_of_some_key(self, partitions: list[int]) -> WorkerProc:
        now = await owners(self.engine)
        holders = [self.by_id.get(now[p] or "") for p in partitions]
        live = [w for w in holders if w is not None and w in self.alive]
        return self.rng.choice(live or self.alive)

    async def run(self, partitions: list[int]) -> None:
        for _ in range(KILLS):
            self.kill_begins()
            how = self.rng.choice(["step", "step", "projecting", "random"])
            victim: WorkerProc | None = None
            if how == "step":
                # right after a step started: mid-step, or just after it
                victim = await self.next_event("step.started", timeout=3)
                if victim is not None:
                    await anyio.sleep(self.rng.uniform(0.0, 0.3))
            elif how == "projecting":
                # obj.done is journaled, the KV projection not written yet: the victim
                # stopped itself there, so the kill lands in the window
                victim = await self.stopped_at_projection(timeout=3)
            else:
                await anyio.sleep(self.rng.uniform(0.05, 1.2))
            if victim is None or victim not in self.alive:
                how = "random" if how == "random" else f"{how} (none: random)"
                victim = await self.owner_of_some_key(partitions)
            self.kill(victim, how)
            await self.start()
            await anyio.sleep(self.rng.uniform(0.0, 0.4))


def _executions(log: Path) -> list[dict[str, Any]]:
    """Step executions from the side-effect log, in the order they started."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    order: list[tuple[str, int]] = []
    for line in log.read_text().splitlines():
        what, key, call_id, pid, at = line.split()
        k = (key, int(pid))
        if what == "start":
            assert k not in out, f"step {key} started twice in worker {pid}"
            out[k] = {"key": key, "id": call_id, "pid": int(pid), "start": float(at)}
            order.append(k)
        else:
            out[k]["end"] = float(at)
    return [out[k] for k in order]


def _invocations(
    records: list[Any], context: str
) -> list[tuple[Invocation, StepCompleted, ObjectDone]]:
    """Split an object's journal into its invocations: each is a first record that
    carries it (an ``obj.started`` or its step), its one ``step.completed`` and its
    ``obj.done``, and nothing else; one invocation ends before the next begins."""
    out: list[tuple[Invocation, StepCompleted, ObjectDone]] = []
    invoked: Invocation | None = None
    steps: list[StepCompleted] = []
    for i, record in enumerate(records):
        where = (context, i, record)
        if record.invoked is not msgspec.UNSET:
            assert invoked is None, ("an invocation began inside another", *where)
            invoked, steps = record.invoked, []
        assert invoked is not None, ("a record outside any invocation", *where)
        if isinstance(record, ObjectStarted):
            assert record.invoked is not msgspec.UNSET, where
        elif isinstance(record, StepCompleted):
            steps.append(record)
        elif isinstance(record, ObjectDone):
            assert record.inbox_seq == invoked.inbox_seq, where
            assert len(steps) == 1, ("the step is journaled once per invocation", *where)
            out.append((invoked, steps[0], record))
            invoked = None
        else:
            raise AssertionError(("a record this handler does not make", *where))
    assert invoked is None, (context, "the last invocation did not end", records[-1])
    return out


def _decode_state(data: bytes) -> dict[str, Any]:
    """The KV projection's JSON as plain values."""
    return {k: msgspec.json.decode(v) for k, v in decode_state(data).items()}


async def test_sigkill_mid_handler_20_times(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or random.randrange(1 << 30))
    print(f"FUSEE_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    # one key per partition
    keys: dict[int, str] = {}
    for i in range(100):
        keys.setdefault(partition_of(f"@counter/k{i}", PARTITIONS), f"k{i}")
        if len(keys) == PARTITIONS:
            break
    log = tmp_path / "effects.log"
    began = time.monotonic()
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=PARTITIONS)
    try:
        workers = worker_procs(partitions=PARTITIONS)
        workers.module = MODULE
        chaos = Chaos(random.Random(rng.random()), workers, engine, tmp_path / "stop-at-projection")
        await chaos.start()
        await chaos.start()

        plan = {key: [f"{key}.c{j}" for j in range(CLIENTS_PER_KEY)] for key in keys.values()}
        results: dict[str, Any] = {}
        errors: dict[str, BaseException] = {}
        calls: dict[str, int] = {}  # client -> how many calls it made
        kills_done = anyio.Event()
        quiet_until = dict.fromkeys(plan, 0.0)

        async def lulls(key: str, lrng: random.Random) -> None:
            # now and then a key's clients pause together, long enough for its object to
            # go idle (park_after: 1 s): the next call activates it again
            while not kills_done.is_set():
                await anyio.sleep(lrng.uniform(2.0, 5.0))
                quiet_until[key] = time.monotonic() + lrng.uniform(1.2, 1.8)

        async def client(key: str, name: str, crng: random.Random) -> None:
            obj = engine.object("counter", key)
            n = 0
            while n < MIN_CALLS or not kills_done.is_set():
                while n >= MIN_CALLS + CALLS_PER_KILL * chaos.begun:
                    if kills_done.is_set():
                        return
                    await chaos.next_kill.wait()  # ahead of the kills
                while time.monotonic() < quiet_until[key]:
                    await anyio.sleep(0.05)
                call_id = f"{name}.{n}"
                calls[name] = n = n + 1
                arg = {"id": call_id, "log": str(log), "delay": crng.uniform(0.05, 0.3)}
                try:
                    results[call_id] = await obj.call("add", arg, timeout=CALL_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - reported below, with the seed
                    errors[call_id] = exc
                    return
                await anyio.sleep(crng.uniform(0.0, 0.3))

        async def killer() -> None:
            await chaos.run(sorted(keys))
            kills_done.set()
            chaos.kill_begins()  # (clients waiting for a next kill: there is none)

        async with anyio.create_task_group() as tg:
            for key, names in plan.items():
                for name in names:
                    tg.start_soon(client, key, name, random.Random(rng.random()))
                tg.start_soon(lulls, key, random.Random(rng.random()))
            tg.start_soon(killer)
        context = f"seed {seed}, kills {chaos.kills}, calls {calls}"
        print(f"{len(chaos.kills)} kills in {time.monotonic() - began:.1f}s: {chaos.kills}")
        print(f"{sum(calls.values())} calls: {calls}")

        # every call returned, with the count it made: 1..N per key, each once
        assert not errors, (context, errors)
        # the kills aimed where they should (objects_chaos.py patches private methods of
        # ObjectActor: if they were renamed, no worker would ever stop at a projection)
        aimed = [k.split(":")[0] for k in chaos.kills]
        assert "step" in aimed or "projecting" in aimed, context
        if any(a.startswith("projecting") for a in aimed):
            assert "projecting" in aimed, f"no kill found a projection under way: {context}"
        for key, names in plan.items():
            ids = [f"{name}.{n}" for name in names for n in range(calls[name])]
            total = len(ids)
            assert sorted(results[i]["count"] for i in ids) == list(range(1, total + 1)), (
                context,
                key,
                {i: results[i] for i in ids},
            )
            assert all(results[i]["id"] == i for i in ids), context

            obj = engine.object("counter", key)

            # the state this engine reads reflects every call it was answered for
            state = await obj.state()
            assert state.get("count") == total, (context, key, state)

            # and the KV projection itself catches up with the journal (its writer may
            # have died between the two): it holds each call's change exactly once
            async def projected(
                obj: Any = obj, total: int = total, key: str = key
            ) -> dict[str, Any] | None:
                found = await engine.store.get_state(obj.object_type, obj.key)
                kv = {} if found is None else _decode_state(found[0])
                assert kv.get("count", 0) <= total, (context, key, kv)
                return kv if kv.get("count") == total else None

            kv = await wait_until(projected, timeout=20, what=f"the state of {key} in KV")
            assert kv == state, (context, key, kv, state)
            seen = state["seen"]
            assert len(seen) == total, (context, key, seen)
            assert set(seen) == set(ids), (context, key, seen)
            for name in names:
                mine = [s for s in seen if s.startswith(f"{name}.")]
                assert mine == [f"{name}.{n}" for n in range(calls[name])], (
                    context,
                    key,
                    seen,
                )
            # a call's result is the count its change made: its place in ``seen``
            for pos, call_id in enumerate(seen, 1):
                assert results[call_id]["count"] == pos, (context, key, call_id, seen)

            # the journal: the invocations one after the other, in arrival (inbox)
            # order, each once and all ok; each is its first record (which carries it),
            # its one step and its obj.done
            msgs = await engine.store.read_journal(obj.eid)
            journal = [(m.seq, decode_record(m.data)) for m in msgs]
            assert_chained(journal)
            invocations = _invocations([r for _, r in journal], context)
            assert len(invocations) == total, (context, key, len(invocations))
            inbox_seqs = [done.inbox_seq for _, _, done in invocations]
            assert inbox_seqs == sorted(set(inbox_seqs)), (context, key, inbox_seqs)
            for i, (invoked, step, done) in enumerate(invocations):
                assert done.ok, (context, done)
                result = msgspec.json.decode(bytes(done.result))  # type: ignore[arg-type]
                call_id = msgspec.json.decode(bytes(invoked.input))["id"]
                assert result["id"] == call_id == seen[i], (context, key, i, result, seen)
                assert result == results[call_id], (context, result, results[call_id])
                assert result["count"] == i + 1, (context, key, i, result)
                assert done.state_set is not msgspec.UNSET, (context, done)
                assert msgspec.json.decode(bytes(done.state_set["count"])) == i + 1, done
                stepped = msgspec.json.decode(bytes(step.result))
                assert stepped["key"] == result["step"], (context, stepped, result)

        # the steps: a step that was journaled never ran again; an execution whose result
        # was not kept was cut short by a kill; no two executions of a key overlapped
        committed: dict[str, int] = {}
        for key in plan:
            for m in await engine.store.read_journal(engine.object("counter", key).eid):
                record = decode_record(m.data)
                if isinstance(record, StepCompleted):
                    kept = msgspec.json.decode(bytes(record.result))
                    assert kept["key"] not in committed, (context, "step journaled twice", kept)
                    committed[kept["key"]] = kept["pid"]  # the execution whose result it kept
        fenced = {
            w.pid for w in workers.procs if w.find("actor.fenced") or w.find("partition.lost")
        }
        execs = _executions(log)
        by_step: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for e in execs:
            by_step[e["key"]].append(e)
        assert set(by_step) == set(committed), (context, set(by_step) ^ set(committed))
        again = 0
        for step_key, runs in by_step.items():
            kept_at = [i for i, e in enumerate(runs) if e["pid"] == committed[step_key]]
            assert len(kept_at) == 1, (context, step_key, runs, committed[step_key])
            for i, e in enumerate(runs):
                if i == kept_at[0]:
                    continue
                again += 1
                where = (context, step_key, runs, f"kept the run in {committed[step_key]}")
                if e["pid"] in fenced:
                    continue  # a worker taken for dead while alive: its write was refused
                # before the kept run, in a worker killed before it could journal it
                assert i < kept_at[0], ("a journaled step ran again", *where)
                assert e["pid"] in chaos.killed, ("a step ran twice without a kill", *where)
                assert e.get("end", 0.0) <= chaos.killed[e["pid"]], where
        assert again <= len(chaos.kills) * len(keys), (context, again)

        by_object: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for e in execs:
            e["until"] = e.get("end", chaos.killed.get(e["pid"], float("inf")))
            by_object[e["id"].split(".")[0]].append(e)
        for runs in by_object.values():
            runs.sort(key=lambda e: e["start"])
            for a, b in itertools.pairwise(runs):
                if a["pid"] in fenced or b["pid"] in fenced:
                    continue
                assert b["start"] >= a["until"], ("two handlers of a key overlapped", context, a, b)
        caught_up = sum(len(w.find("object.projection_caught_up")) for w in workers.procs)
        # each kill at a projection left one behind its journal: a later activation
        # wrote it (and said so) before running anything else
        assert caught_up >= aimed.count("projecting"), (context, caught_up)
        idle = sum(len(w.find("test.object_left", outcome="idle")) for w in workers.procs)
        print(
            f"{len(execs)} step executions for {len(committed)} steps ({again} again), "
            f"projections caught up: {caught_up}, went idle: {idle}, "
            f"fenced workers: {len(fenced)}, "
            f"{time.monotonic() - began:.1f}s"
        )
    finally:
        await engine.close()
