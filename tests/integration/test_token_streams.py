"""Token streams: ``model_call`` writes, ``Run.stream``/``stream_events`` read, from any
offset, while the step runs and after the run ended (real nats-server, in-process worker).

A scripted token source stands in for the model: ``SCRIPTS[run_id]`` says what it yields,
where it stops to wait for the test (a gate), and on which attempt it fails.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

import fusee
from fusee.ai import model_call
from fusee.errors import StreamNotFound
from fusee.runtime.records import StepCompleted, StepRetrying
from fusee.runtime.tokens import TokenEvent
from tests.workers.procs import wait_until

FAST = fusee.Retry(attempts=4, initial=0.05, max=0.1)


@dataclass
class Script:
    tokens: int = 20
    gate_at: int | None = None  # wait for `gate` before yielding this token
    gate: anyio.Event = field(default_factory=anyio.Event)
    fail_at: dict[int, int] = field(default_factory=dict)  # attempt -> fail before token k
    delay: float = 0.0
    resumes: list[str] = field(default_factory=list)  # `resume` of every call
    calls: int = 0


SCRIPTS: dict[str, Script] = {}


def token(i: int) -> str:
    return f"t{i} "


def source(run_id: str, prefill: bool) -> Any:
    script = SCRIPTS[run_id]

    async def chunks(resume: str) -> Any:
        script.calls += 1
        attempt = script.calls
        script.resumes.append(resume)
        # continue after what is stored (prefill) or start over
        first = len(resume.split()) if prefill else 0
        for i in range(first, script.tokens):
            if script.gate_at == i:
                await script.gate.wait()
            if script.fail_at.get(attempt) == i:
                raise ConnectionError(f"stream cut at token {i}")
            if script.delay:
                await anyio.sleep(script.delay)
            yield token(i)

    return chunks


@fusee.workflow("tok_one")
async def one(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    text = await model_call(
        ctx, "model-0", source(ctx.run_id, arg.get("prefill", True)), retry=FAST,
        prefill=arg.get("prefill", True),
    )  # fmt: skip
    after = await ctx.step("after", lambda: len(text))
    return {"text": text, "after": after}


@fusee.workflow("tok_two_turns")
async def two_turns(ctx: fusee.Context) -> list[str]:
    out = []
    for turn in range(2):
        out.append(await model_call(ctx, f"model-{turn}", source(ctx.run_id, True)))
    return out


@fusee.workflow("tok_same_name")
async def same_name(ctx: fusee.Context) -> str:
    await model_call(ctx, "m", source(ctx.run_id, True))
    return await model_call(ctx, "m", source(ctx.run_id, True))


@fusee.workflow("tok_failing")
async def failing(ctx: fusee.Context) -> str:
    return await model_call(ctx, "model-0", source(ctx.run_id, True), retry=fusee.Retry(attempts=1))


def expected(n: int, start: int = 0) -> str:
    return "".join(token(i) for i in range(start, n))


async def collect(run: fusee.Run, name: str, offset: int = 0) -> list[TokenEvent]:
    with anyio.fail_after(20):
        return [e async for e in run.stream_events(name, offset)]


def check_order(events: list[TokenEvent], offset: int = 0) -> None:
    """Tokens in index order from ``offset``, no gap, no duplicate; cursors increase."""
    indexes = [e.index for e in events if e.kind == "token"]
    assert indexes == list(range(offset, offset + len(indexes))), indexes
    cursors = [e.cursor for e in events]
    assert cursors == sorted(set(cursors)), cursors


async def test_read_while_running_and_after(engine: fusee.Engine) -> None:
    SCRIPTS["live"] = script = Script(tokens=30, gate_at=12)
    async with engine.worker():
        run = await engine.start("tok_one", "live", {})
        seen: list[TokenEvent] = []
        got_twelve = anyio.Event()

        async def follow() -> None:
            async for e in run.stream_events("model-0"):
                seen.append(e)
                if len(seen) == 12:
                    got_twelve.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            with anyio.fail_after(10):
                await got_twelve.wait()  # 12 tokens stored, the step still running
            assert not (await run.describe()).ended
            # a reader joining in the middle, and one past what is stored (it waits)
            mid_task: list[TokenEvent] = []
            past_task: list[TokenEvent] = []

            async def join(offset: int, into: list[TokenEvent]) -> None:
                with anyio.fail_after(20):
                    async for e in run.stream_events("model-0", offset):
                        into.append(e)

            tg.start_soon(join, 5, mid_task)
            tg.start_soon(join, 20, past_task)
            # the one in the middle gets the 7 stored tokens 5..11 while the step waits
            await wait_until(lambda: len(mid_task) == 7, timeout=10, what="tokens 5..11")
            assert [e.index for e in mid_task] == list(range(5, 12))
            assert past_task == []  # nothing is stored from 20 on: it waits
            script.gate.set()
        result = await run.result(timeout=10)
    text = expected(30)
    assert result == {"text": text, "after": len(text)}
    for events, offset in ((seen, 0), (mid_task, 5), (past_task, 20)):
        check_order(events, offset)
        assert "".join(e.text for e in events) == expected(30, offset)
        assert events[-1].kind == "end"
        assert events[-1].index == 30
    # after the run ended: everything, then the end
    for offset in (0, 7, 29, 30, 31, 10_000):
        events = await collect(run, "model-0", offset)
        check_order(events, offset)
        assert "".join(e.text for e in events) == expected(30, offset)
        assert [e.kind for e in events if e.kind != "token"] == (["end"] if offset <= 30 else [])
    assert "".join([t async for t in run.stream("model-0")]) == text


async def test_reconnect_with_offset_continues_exactly(engine: fusee.Engine) -> None:
    SCRIPTS["recon"] = Script(tokens=200, delay=0.002)
    async with engine.worker():
        run = await engine.start("tok_one", "recon", {})
        got: list[TokenEvent] = []
        offset = 0
        while not got or got[-1].kind != "end":
            with anyio.fail_after(20):
                async for e in run.stream_events("model-0", offset):
                    got.append(e)
                    if e.kind == "token" and e.index % 37 == 36:
                        offset = e.index + 1
                        break  # disconnect, reconnect with the offset
        result = await run.result(timeout=10)
    check_order(got)
    assert "".join(e.text for e in got) == result["text"] == expected(200)


async def test_retry_with_prefill_resumes_stored_text(engine: fusee.Engine) -> None:
    SCRIPTS["prefill"] = script = Script(tokens=25, fail_at={1: 10, 2: 17})
    async with engine.worker():
        run = await engine.start("tok_one", "prefill", {})
        result = await run.result(timeout=10)
    assert result["text"] == expected(25)
    assert script.resumes == ["", expected(10), expected(17)]
    events = await collect(run, "model-0")
    check_order(events)
    assert [e.kind for e in events if e.kind != "token"] == ["end"]
    assert {e.attempt for e in events} == {1}  # a continued attempt is not a restart
    assert "".join(e.text for e in events) == result["text"]
    retrying = [r for _, r in await run.journal() if isinstance(r, StepRetrying)]
    assert [r.attempt for r in retrying] == [1, 2]


async def test_retry_without_prefill_records_a_boundary(engine: fusee.Engine) -> None:
    SCRIPTS["restart"] = script = Script(tokens=12, fail_at={1: 5, 2: 8})
    async with engine.worker():
        run = await engine.start("tok_one", "restart", {"prefill": False})
        result = await run.result(timeout=10)
    assert result["text"] == expected(12)
    assert script.resumes == ["", "", ""]
    events = await collect(run, "model-0")
    check_order(events)
    kinds = [(e.kind, e.index, e.attempt) for e in events if e.kind != "token"]
    # 5 tokens of attempt 1, 8 of attempt 2, then 12 of attempt 3
    assert kinds == [("attempt", 5, 2), ("attempt", 13, 3), ("end", 25, 3)]
    final = "".join(e.text for e in events if e.kind == "token" and e.attempt == 3)
    assert final == result["text"]
    # a reader that starts inside attempt 2 sees the boundary to attempt 3
    later = await collect(run, "model-0", 9)
    assert [e.kind for e in later if e.kind != "token"] == ["attempt", "end"]
    assert "".join(e.text for e in later if e.attempt == 3) == result["text"]


async def test_replay_does_not_stream_again(engine: fusee.Engine) -> None:
    SCRIPTS["replay"] = script = Script(tokens=15)
    async with engine.worker():
        run = await engine.start("tok_two_turns", "replay")
        result = await run.result(timeout=10)
    assert result == [expected(15), expected(15)]
    assert script.calls == 2  # once per turn, however often the run was replayed
    for name in ("model-0", "model-1"):
        events = await collect(run, name)
        assert len(events) == 16  # 15 tokens and the end, written once
    completed = [r for _, r in await run.journal() if isinstance(r, StepCompleted)]
    assert [r.name for r in completed] == ["model-0", "model-1"]


async def test_errors(engine: fusee.Engine) -> None:
    with pytest.raises(fusee.RunNotFound):
        await collect(engine.run("nope"), "model-0")
    SCRIPTS["errs"] = Script(tokens=3)
    async with engine.worker():
        run = await engine.start("tok_one", "errs", {})
        await run.result(timeout=10)
    with pytest.raises(fusee.InvalidArgument):
        await collect(run, "model-0", -1)
    with pytest.raises(fusee.InvalidArgument):
        await collect(run, "model-0", "3")  # type: ignore[arg-type]
    with pytest.raises(StreamNotFound):
        await collect(run, "model-9")
    with pytest.raises(StreamNotFound):
        await collect(run, "after")  # a step, but not a model call


async def test_unknown_stream_waits_while_running(engine: fusee.Engine) -> None:
    SCRIPTS["wait"] = script = Script(tokens=3, gate_at=1)
    async with engine.worker():
        run = await engine.start("tok_two_turns", "wait")
        with anyio.move_on_after(0.5) as scope:
            await collect(run, "model-1")  # comes with the second turn
        assert scope.cancelled_caught
        got: list[str] = []
        followed = anyio.Event()

        async def follow() -> None:
            got.extend([t async for t in run.stream("model-1")])
            followed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            # model-1 cannot exist before the gate opens: a reader that did not wait
            # for it would end (or fail) here
            with anyio.move_on_after(0.5) as waiting:
                await followed.wait()
            assert waiting.cancelled_caught
            assert got == []
            script.gate.set()
        assert "".join(got) == expected(3)
        await run.result(timeout=10)


async def test_failed_step_ends_readers_without_end(engine: fusee.Engine) -> None:
    SCRIPTS["fails"] = Script(tokens=10, fail_at={1: 4})
    async with engine.worker():
        run = await engine.start("tok_failing", "fails")
        with pytest.raises(fusee.RunFailed):
            await run.result(timeout=10)
    events = await collect(run, "model-0")
    assert [e.kind for e in events] == ["token"] * 4  # truncated: no end marker
    check_order(events)


async def test_a_stream_name_is_unique_in_a_run(engine: fusee.Engine) -> None:
    SCRIPTS["dup"] = Script(tokens=2)
    async with engine.worker():
        run = await engine.start("tok_same_name", "dup")
        with pytest.raises(fusee.RunFailed, match="unique in a run"):
            await run.result(timeout=10)


async def test_many_readers_in_parallel(engine: fusee.Engine) -> None:
    SCRIPTS["fan"] = Script(tokens=300, delay=0.001)
    results: dict[int, list[TokenEvent]] = collections.defaultdict(list)
    async with engine.worker():
        run = await engine.start("tok_one", "fan", {})

        async def reader(i: int) -> None:
            await anyio.sleep(i * 0.01)
            results[i] = await collect(run, "model-0", (i * 23) % 250)

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(reader, i)
        await wait_until(lambda: len(results) == 12, timeout=10, what="readers")
        result = await run.result(timeout=10)
    for i, events in results.items():
        offset = (i * 23) % 250
        check_order(events, offset)
        assert "".join(e.text for e in events) == result["text"][len(expected(offset)) :]


async def test_token_retention_is_configurable_and_updates_the_stream(
    nats_server: Any, namespace: str
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, token_retention="2h")
    try:
        info = await engine.store.js.stream_info(engine.store.tokens.stream)
        assert info.config.max_age == 7200
    finally:
        await engine.close()
    engine = await fusee.connect(nats_server.url, namespace=namespace)  # the default: 7 days
    try:
        info = await engine.store.js.stream_info(engine.store.tokens.stream)
        assert info.config.max_age == 7 * 24 * 3600
    finally:
        await engine.close()
    with pytest.raises(fusee.ConfigError):
        await fusee.connect(nats_server.url, namespace=namespace, token_retention="soon")


async def test_a_stale_token_writer_is_refused_after_a_newer_writer_claims_the_stream(
    nats_server: Any, namespace: str
) -> None:
    # A worker stopped mid-stream (SIGSTOP) while another took the run over: when it
    # wakes, its tokens must not land among the new writer's.
    engine = await fusee.connect(nats_server.url, namespace=namespace)
    tokens = engine.store.tokens
    try:
        old = await tokens.open("r-zombie", "model-0")
        for t in ["a", "b"]:
            await old.write(t)
        await old.flush()
        new = await tokens.open("r-zombie", "model-0")  # positioned after "a", "b"
        assert new.state.text == "ab"
        await new.write("c")
        await new.flush()
        await old.write("X")  # the zombie's next token
        with pytest.raises(fusee.FuseeError, match="publish failed"):
            await old.flush()
        await new.write("d")
        await new.end()
        stored = [e async for e in tokens._catch_up(tokens.subject("r-zombie", "model-0"), 1)]
        assert "".join(e.text for e in stored if e.kind == "token") == "abcd"
        assert [e.index for e in stored if e.kind == "token"] == [0, 1, 2, 3]
        await old.close()
        await new.close()
    finally:
        await engine.close()
