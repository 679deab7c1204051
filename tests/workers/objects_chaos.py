"""A keyed counter for the object chaos test (``tests/chaos/test_object_chaos.py``).

``add`` reads ``count``, runs one step (where a kill lands mid-handler), then writes
``count + 1`` and appends the call's ID to ``seen``. The step logs each execution, with
its ``s.key`` and the worker's PID, at its start and at its end, one O_APPEND line each,
so the test can tell which executions a kill cut short and whether a step that was
journaled ran again. The step returns its key and PID: the journal then says which
execution's result it kept.

The window between an invocation's ``obj.done`` commit and the KV projection of the
state is opened here on the test's demand, so that the test can SIGKILL a worker inside
it on purpose, not by luck: before each write of the projection the worker logs
``test.projecting``; if the file named by ``FUSEE_TEST_STOP_AT_PROJECTION`` exists, the
first worker to rename it to ``<file>.<pid>`` stops itself (SIGSTOP) right there, and
the test kills it. How each activation of an object ends is logged too
(``test.object_left``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio
import structlog

import fusee
from fusee.actors.object_actor import ObjectActor
from fusee.runtime.object_life import ObjectLife
from tests.workers.effects import record_line

log = structlog.get_logger("fusee")

STOP_AT_PROJECTION = os.environ.get("FUSEE_TEST_STOP_AT_PROJECTION", "")


async def add(ctx: Any, arg: dict[str, Any]) -> dict[str, Any]:
    count = ctx.state.get("count", 0)

    async def work(s: fusee.StepInfo) -> dict[str, Any]:
        pid = os.getpid()
        record_line(arg["log"], f"start {s.key} {arg['id']} {pid} {time.time():.6f}")
        await anyio.sleep(arg["delay"])
        record_line(arg["log"], f"end {s.key} {arg['id']} {pid} {time.time():.6f}")
        return {"key": s.key, "pid": pid}

    step = await ctx.step("work", work)
    ctx.state.set("count", count + 1)
    seen = ctx.state.get("seen") or []
    seen.append(arg["id"])
    ctx.state.set("seen", seen)
    return {"count": count + 1, "id": arg["id"], "step": step["key"]}


counters = fusee.object("counter", {"add": add}, timeout="60s")


_put = ObjectActor._put


def _claim_stop() -> bool:
    """Whether this worker is the one to stop at this projection (the test asked)."""
    if not STOP_AT_PROJECTION:
        return False
    try:
        os.rename(STOP_AT_PROJECTION, f"{STOP_AT_PROJECTION}.{os.getpid()}")
    except FileNotFoundError:
        return False
    return True


async def _stopping_put(self: ObjectActor, data: bytes, seq: int, cursor: int) -> None:
    stop = _claim_stop()
    log.info("test.projecting", cursor=cursor, journal_seq=seq, stopping=stop)
    if stop:
        os.kill(os.getpid(), signal.SIGSTOP)  # obj.done is journaled, KV not written yet
    await _put(self, data, seq, cursor)


ObjectActor._put = _stopping_put  # type: ignore[method-assign]


# A key writes its projection every REPROJECT_AFTER (64) records, about every 20 calls
# here: a kill that asks for the next projection could wait seconds for one, and the
# test's 3 s found none in some runs. Every 4 records (about every other call) the
# window opens often; the kill still lands between an obj.done and its projection.
_life_init = ObjectLife.__init__


def _projecting_often(
    self: ObjectLife, object_id: str, *, park_after: float, reproject_after: int = 4
) -> None:
    _life_init(self, object_id, park_after=park_after, reproject_after=reproject_after)


ObjectLife.__init__ = _projecting_often  # type: ignore[method-assign]


_run = ObjectActor.run


async def _run_logged(self: ObjectActor) -> Any:
    outcome = await _run(self)
    # how the object's activation ended (``idle``: nothing queued for park_after)
    log.info("test.object_left", object=self.object_type, key=self.key, outcome=outcome)
    return outcome


ObjectActor.run = _run_logged  # type: ignore[method-assign]
