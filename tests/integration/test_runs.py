"""Runs as a user sees them: start, result, describe, retries, timeouts, errors.

Workflows run in an in-process worker (``async with engine.worker()``), for speed.
"""

from __future__ import annotations

import collections
import gc
import warnings
from typing import Any

import anyio
import pytest

import fusee
from fusee.runtime.records import (
    RunStarted,
    StepCompleted,
    StepFailed,
    StepRetrying,
)
from tests.workers.procs import wait_until

FAST = fusee.Retry(attempts=3, initial=0.05, max=0.1)

# Per run ID: attempts seen by steps, and gates that hold a step until the test opens them.
attempts: dict[str, list[int]] = collections.defaultdict(list)
gates: dict[str, anyio.Event] = {}


@fusee.workflow("runs_echo")
async def echo(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    doubled = await ctx.step("double", lambda: arg["n"] * 2)
    greeting = await ctx.step("greet", lambda: f"hello {arg['who']}")
    return {"doubled": doubled, "greeting": greeting}


@fusee.workflow("runs_other")
async def other(ctx: fusee.Context, arg: Any) -> str:
    return "other"


@fusee.workflow("runs_gated")
async def gated(ctx: fusee.Context, arg: str) -> str:
    first = await ctx.step("first", lambda: "one")

    async def wait_gate() -> str:
        await gates[ctx.run_id].wait()
        return "two"

    second = await ctx.step("second", wait_gate)
    return f"{first}-{second}-{arg}"


@fusee.workflow("runs_flaky")
async def flaky(ctx: fusee.Context, fail_times: int) -> list[int]:
    async def call(s: fusee.StepInfo) -> int:
        attempts[ctx.run_id].append(s.attempt)
        if s.attempt <= fail_times:
            raise RuntimeError(f"boom {s.attempt}")
        return s.attempt

    got = await ctx.step("call", call, retry=FAST)
    return [got]


class Unlucky(Exception):
    pass


@fusee.workflow("runs_non_retryable")
async def non_retryable(ctx: fusee.Context) -> None:
    async def call(s: fusee.StepInfo) -> None:
        attempts[ctx.run_id].append(s.attempt)
        raise Unlucky("not worth retrying")

    await ctx.step(
        "call", call, retry=fusee.Retry(attempts=5, initial=0.05, non_retryable=(Unlucky,))
    )


@fusee.workflow("runs_fatal")
async def fatal(ctx: fusee.Context) -> None:
    async def call(s: fusee.StepInfo) -> None:
        attempts[ctx.run_id].append(s.attempt)
        raise fusee.FatalError("the card was declined")

    await ctx.step("charge", call, retry=fusee.Retry(attempts=5, initial=0.05))


@fusee.workflow("runs_step_timeout")
async def step_timeout(ctx: fusee.Context) -> int:
    async def call(s: fusee.StepInfo) -> int:
        attempts[ctx.run_id].append(s.attempt)
        if s.attempt == 1:
            await anyio.sleep(30)
        return s.attempt

    return await ctx.step("slow", call, retry=FAST, timeout=0.3, type=int)


@fusee.workflow("runs_sleepy")
async def sleepy(ctx: fusee.Context) -> str:
    await ctx.step("nap", lambda: anyio.sleep(30))
    return "woke up"


@fusee.workflow("runs_unencodable")
async def unencodable(ctx: fusee.Context) -> Any:
    return await ctx.step("make_socket", lambda: object())


async def test_start_and_result(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(echo, "r-basic", {"n": 21, "who": "ada"})
        assert run.run_id == "r-basic"
        assert await run.result(timeout=10) == {"doubled": 42, "greeting": "hello ada"}
        # a second handle, by ID, sees the same end
        assert await engine.run("r-basic").result(timeout=1) == {
            "doubled": 42,
            "greeting": "hello ada",
        }
    info = await run.describe()
    assert info.status == "completed"
    assert info.workflow == "runs_echo"
    assert info.steps == 2


async def test_start_by_name(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start("runs_echo", "r-name", {"n": 1, "who": "bob"})
        assert await run.result(timeout=10) == {"doubled": 2, "greeting": "hello bob"}


async def test_start_is_idempotent(engine: fusee.Engine) -> None:
    first = await engine.start(echo, "r-idem", {"n": 1, "who": "x"})
    # the same input in another key order is the same input
    again = await engine.start(echo, "r-idem", {"who": "x", "n": 1})
    assert again.run_id == first.run_id
    async with engine.worker():
        assert await again.result(timeout=10) == {"doubled": 2, "greeting": "hello x"}
    # starting a finished run again returns it, and does not run it again
    third = await engine.start(echo, "r-idem", {"n": 1, "who": "x"})
    assert await third.result(timeout=1) == {"doubled": 2, "greeting": "hello x"}
    journal = await first.journal()
    assert sum(isinstance(r, RunStarted) for _, r in journal) == 1
    assert sum(isinstance(r, StepCompleted) for _, r in journal) == 2


async def test_start_conflicts_raise_and_keep_the_first_run(engine: fusee.Engine) -> None:
    await engine.start(echo, "r-conflict", {"n": 5, "who": "first"})
    with pytest.raises(
        fusee.RunExists, match=r"r-conflict.*workflow 'runs_echo', not 'runs_other'"
    ):
        await engine.start(other, "r-conflict", {"n": 5, "who": "first"})
    with pytest.raises(fusee.RunExists, match=r"r-conflict.*another input"):
        await engine.start(echo, "r-conflict", {"n": 6, "who": "second"})
    async with engine.worker():
        result = await engine.run("r-conflict").result(timeout=10)
    assert result == {"doubled": 10, "greeting": "hello first"}
    journal = await engine.run("r-conflict").journal()
    starts = [r for _, r in journal if isinstance(r, RunStarted)]
    assert len(starts) == 1
    assert starts[0].workflow == "runs_echo"
    # the run index (what listings show) still names the first run's workflow
    listed = {i.run_id: i for i in await engine.list_runs()}
    assert listed["r-conflict"].workflow == "runs_echo"
    assert listed["r-conflict"].status == "completed"


async def test_describe_while_running_and_after(engine: fusee.Engine) -> None:
    gates["r-desc"] = anyio.Event()
    async with engine.worker():
        run = await engine.start(gated, "r-desc", "x")

        async def running_at_second_step() -> bool:
            info = await run.describe()
            return info.status == "running" and info.steps == 1

        await wait_until(running_at_second_step, timeout=10, what="the run to wait in step 2")
        info = await run.describe()
        assert info.run_id == "r-desc"
        assert info.workflow == "runs_gated"
        assert not info.ended
        gates["r-desc"].set()
        assert await run.result(timeout=10) == "one-two-x"
    info = await run.describe()
    assert info.status == "completed"
    assert info.steps == 2
    assert info.ended


async def test_step_fails_twice_then_succeeds(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(flaky, "r-flaky", 2)
        assert await run.result(timeout=10) == [3]
    assert attempts["r-flaky"] == [1, 2, 3]
    journal = [r for _, r in await run.journal()]
    retrying = [r for r in journal if isinstance(r, StepRetrying)]
    assert [(r.name, r.attempt, r.error_type, r.message) for r in retrying] == [
        ("call", 1, "RuntimeError", "boom 1"),
        ("call", 2, "RuntimeError", "boom 2"),
    ]
    assert all(r.retry_in > 0 for r in retrying)
    completed = [r for r in journal if isinstance(r, StepCompleted)]
    assert [(r.name, r.attempt) for r in completed] == [("call", 3)]


async def test_non_retryable_error_fails_the_run_at_once(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(non_retryable, "r-nonretry")
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type.endswith("Unlucky")
    assert caught.value.message == "not worth retrying"
    assert attempts["r-nonretry"] == [1]
    journal = [r for _, r in await run.journal()]
    assert not any(isinstance(r, StepRetrying) for r in journal)
    failed = [r for r in journal if isinstance(r, StepFailed)]
    assert [(r.name, r.attempt) for r in failed] == [("call", 1)]
    info = await run.describe()
    assert info.status == "failed"
    assert info.error_type == caught.value.error_type


async def test_fatal_error_fails_the_run_at_once(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(fatal, "r-fatal")
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type == "fusee.FatalError"
    assert caught.value.message == "the card was declined"
    assert attempts["r-fatal"] == [1]
    journal = [r for _, r in await run.journal()]
    assert not any(isinstance(r, StepRetrying) for r in journal)
    assert [r.attempt for r in journal if isinstance(r, StepFailed)] == [1]


async def test_exhausted_retries_fail_the_run_with_the_last_error(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(flaky, "r-exhaust", 99)
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type == "RuntimeError"
    assert caught.value.message == "boom 3"
    assert attempts["r-exhaust"] == [1, 2, 3]
    journal = [r for _, r in await run.journal()]
    assert [r.attempt for r in journal if isinstance(r, StepRetrying)] == [1, 2]
    failed = [r for r in journal if isinstance(r, StepFailed)]
    assert [(r.attempt, r.error_type, r.message) for r in failed] == [(3, "RuntimeError", "boom 3")]
    info = await run.describe()
    assert (info.status, info.error_type, info.step) == ("failed", "RuntimeError", "call")


async def test_step_timeout_fails_the_attempt_and_retries(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(step_timeout, "r-steptimeout")
        with anyio.fail_after(10):
            assert await run.result(timeout=10) == 2
    assert attempts["r-steptimeout"] == [1, 2]
    journal = [r for _, r in await run.journal()]
    retrying = [r for r in journal if isinstance(r, StepRetrying)]
    assert [(r.attempt, r.error_type) for r in retrying] == [(1, "fusee.StepTimeout")]
    assert "timeout" in retrying[0].message


async def test_workflow_timeout_cancels_the_run(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(sleepy, "r-wftimeout", timeout=0.5)
        with pytest.raises(fusee.RunCancelled) as caught:
            await run.result(timeout=10)
    assert "timeout" in caught.value.reason
    info = await run.describe()
    assert info.status == "cancelled"
    assert info.reason is not None
    assert "timeout" in info.reason


async def test_unencodable_step_result_fails_the_run(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(unencodable, "r-unenc")
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type == "fusee.NotEncodable"
    assert "make_socket" in caught.value.message
    assert "object" in caught.value.message


async def test_unknown_workflow_stays_pending_with_a_reason(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start("runs_no_such_workflow", "r-unknown", 1)

        async def has_reason() -> bool:
            return "no live worker serves workflow" in ((await run.describe()).reason or "")

        await wait_until(has_reason, timeout=10, what="a reason on the unrunnable run")
        info = await run.describe()
        assert info.status == "pending"
        assert "no live worker serves workflow 'runs_no_such_workflow'" in (info.reason or "")
        with pytest.raises(fusee.Timeout):
            await run.result(timeout=0.2)
    kinds = [type(r) for _, r in await run.journal()]
    assert kinds == [RunStarted]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [("", "must not be empty"), ("x" * 300, "at most 256"), (42, "must be a str")],
    ids=["empty", "300-bytes", "int"],
)
async def test_invalid_run_ids_are_refused(engine: fusee.Engine, bad: Any, problem: str) -> None:
    with pytest.raises(fusee.InvalidId, match=problem):
        await engine.start(echo, bad, {"n": 1, "who": "x"})
    with pytest.raises(fusee.InvalidId, match=problem):
        engine.run(bad)
    assert await engine.list_runs() == []


async def test_result_of_unknown_run(engine: fusee.Engine) -> None:
    with pytest.raises(fusee.RunNotFound, match="no run 'never-started'"):
        await engine.run("never-started").result(timeout=1)
    with pytest.raises(fusee.RunNotFound):
        await engine.run("never-started").describe()


async def test_result_times_out_while_the_run_waits(engine: fusee.Engine) -> None:
    gates["r-wait"] = anyio.Event()
    async with engine.worker():
        run = await engine.start(gated, "r-wait", "y")
        with anyio.fail_after(5), pytest.raises(fusee.Timeout, match="r-wait"):
            await run.result(timeout=0.2)
        gates["r-wait"].set()
        assert await run.result(timeout=10) == "one-two-y"


async def test_a_stopped_worker_leaves_no_unclosed_streams(engine: fusee.Engine) -> None:
    """A worker that served and stopped must not leak resources (pytest makes the
    ResourceWarning of an unclosed anyio stream an error at the end of the session)."""
    async with engine.worker() as w:
        run = await engine.start(echo, "r-leak", {"n": 1, "who": "z"})
        assert await run.result(timeout=10) == {"doubled": 2, "greeting": "hello z"}
    del w
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaks = [str(c.message) for c in caught if issubclass(c.category, ResourceWarning)]
    assert leaks == []
