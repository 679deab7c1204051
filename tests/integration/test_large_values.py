"""Values over the NATS message limit, and values nested too deeply, are clear errors:
checked before anything is written, they fail the step or the invocation alone (the
key moves on), or the caller's call, and never a whole run, a worker or a key. A step's
result too large for a record is stored out of line (up to ``MAX_LARGE_VALUE``)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import fusee
from fusee.adapters.cli.render import format_journal
from fusee.runtime.codec import MAX_DEPTH, MAX_LARGE_VALUE
from fusee.runtime.objects import object_id
from fusee.runtime.records import ObjectDone, StepCompleted, StepFailed, ValueRef, WaitStarted
from tests.workers.procs import wait_until

MB2 = 2_000_000


def _deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@fusee.workflow("lv_big_step")
async def lv_big_step(ctx: fusee.Context, size: int) -> dict[str, Any]:
    try:
        await ctx.step("fetch_page", lambda: "x" * size)
    except fusee.StepFailedError as exc:
        after = await ctx.step("after", lambda: "went on")
        return {"error_type": exc.error_type, "message": exc.message, "after": after}
    return {"error_type": None}


def _raises_long() -> None:
    raise ValueError("y" * MB2)  # an error quoting a whole response


@fusee.workflow("lv_long_error")
async def lv_long_error(ctx: fusee.Context) -> str:
    try:
        await ctx.step("call_api", _raises_long, retry=fusee.Retry(attempts=2, initial="10ms"))
    except fusee.StepFailedError as exc:
        return exc.message
    return "not raised"


@fusee.workflow("lv_fits")
async def lv_fits(ctx: fusee.Context, size: int) -> int:
    text = await ctx.step("fetch_page", lambda: "x" * size)
    return len(text)


@fusee.workflow("lv_large")
async def lv_large(ctx: fusee.Context, size: int) -> dict[str, int]:
    out = await ctx.step("tool_output", lambda: {"text": "x" * size, "size": size})
    await ctx.wait_for("go")  # the run leaves memory here: the rest is a replay
    after = await ctx.step("after", lambda: len(out["text"]))
    return {"len": len(out["text"]), "size": out["size"], "after": after}


@fusee.workflow("lv_echo")
async def lv_echo(ctx: fusee.Context, arg: Any) -> Any:
    return await ctx.wait_for("go")


async def _grow(ctx: Any, size: int) -> int:
    ctx.state.set("blob", "x" * size)
    return size


async def _add(ctx: Any, arg: dict[str, Any]) -> None:
    ctx.state.set(arg["name"], "x" * arg["size"])


async def _big_result(ctx: Any, size: int) -> str:
    return "x" * size


async def _both(ctx: Any, size: int) -> str:
    ctx.state.set("blob", "x" * size)
    return "y" * size


async def _ok(ctx: Any) -> str:
    ctx.state.set("fine", 1)
    return "ok"


blobs = fusee.object(
    "lv_blobs",
    {
        "grow": _grow,
        "add": _add,
        "big_result": _big_result,
        "both": _both,
        "ok": _ok,
        "peek": fusee.shared(lambda ctx, size: "z" * size),
    },
)


async def _stored_messages(engine: fusee.Engine) -> int:
    info = await engine.store.js.stream_info(engine.store.layout.stream)
    return int(info.state.messages)


def test_the_limit_is_the_servers_max_payload_less_the_headroom(engine: fusee.Engine) -> None:
    assert engine.store.max_payload == 1024 * 1024  # the embedded server's max_payload: 1MB
    assert engine.store.max_value == 1024 * 1024 - 16 * 1024


async def test_a_step_result_over_the_limit_fails_the_step_and_the_workflow_catches_it(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        run = await engine.start(lv_big_step, "r-lv-step", MAX_LARGE_VALUE)
        out = await run.result(timeout=60)
    assert out["error_type"] == "fusee.NotEncodable"
    message = out["message"]
    assert "the result of step 'fetch_page' is 67,108,866 bytes as JSON" in message
    assert "over the limit of 67,108,864 bytes for a step's result" in message
    assert out["after"] == "went on"  # the run went on past the failed step
    journal = [r for _, r in await run.journal()]
    failed = [r for r in journal if isinstance(r, StepFailed)]
    assert [(f.pos, f.name, f.error_type) for f in failed] == [
        (1, "fetch_page", "fusee.NotEncodable")
    ]
    assert (await run.describe()).status == "completed"


async def test_a_step_result_at_the_limit_is_stored_and_replayed(engine: fusee.Engine) -> None:
    size = engine.store.max_value - 2  # the JSON string's quotes: exactly the limit
    async with engine.worker():
        run = await engine.start(lv_fits, "r-lv-fits", size)
        assert await run.result(timeout=20) == size
    [done] = [r for _, r in await run.journal() if isinstance(r, StepCompleted)]
    assert len(bytes(done.result)) == engine.store.max_value
    assert done.result_ref is msgspec.UNSET  # in the record itself
    async with engine.worker():
        over = await engine.start(lv_fits, "r-lv-over", size + 1)
        assert await over.result(timeout=20) == size + 1
    [done] = [r for _, r in await over.journal() if isinstance(r, StepCompleted)]
    assert isinstance(done.result_ref, ValueRef)  # one byte more: out of line
    assert done.result_ref.chunks == 2


async def test_a_step_result_too_large_for_a_record_is_stored_out_of_line_and_replayed(
    engine: fusee.Engine,
) -> None:
    run = await engine.start(lv_large, "r-lv-large", 5_000_000)
    async with engine.worker():

        async def waiting() -> bool:
            return any(isinstance(r, WaitStarted) for _, r in await run.journal())

        await wait_until(waiting, timeout=30, what="the run to wait for its signal")
    [done] = [r for _, r in await run.journal() if isinstance(r, StepCompleted)]
    assert isinstance(done.result_ref, ValueRef)
    assert bytes(done.result) == b"null"
    assert done.result_ref.size == len(b'{"text":"","size":5000000}') + 5_000_000
    assert done.result_ref.chunks == 5  # of max_value bytes each
    shown = "\n".join(format_journal(await run.journal()))
    assert "-> <5,000,026 bytes, stored out of line>" in shown
    async with engine.worker():  # a fresh worker replays the step from its stored value
        await run.signal("go")
        out = await run.result(timeout=30)
    assert out == {"len": 5_000_000, "size": 5_000_000, "after": 5_000_000}


async def test_an_object_state_over_the_limit_fails_that_call_and_the_key_moves_on(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        key = blobs.key("k1", engine=engine)
        with pytest.raises(fusee.HandlerFailed) as failed:
            await key.call("grow", 1_500_000, timeout=20)
        assert failed.value.error_type == "fusee.NotEncodable"
        message = failed.value.message
        assert "the state of object" in message
        assert "after handler 'grow' is 1,500,0" in message  # its size, named
        assert "over the limit of 1,032,192 bytes" in message
        assert await key.call("ok", timeout=20) == "ok"  # the next call runs
        assert await key.state() == {"fine": 1}

        # a state that grows past the limit one call at a time: the call that would
        # cross it fails, and the state keeps what it had
        await key.call("add", {"name": "a", "size": 600_000}, timeout=20)
        with pytest.raises(fusee.HandlerFailed, match="after handler 'add' is 1,200,0"):
            await key.call("add", {"name": "b", "size": 600_000}, timeout=20)
        assert sorted(await key.state()) == ["a", "fine"]
        assert await key.call("ok", timeout=20) == "ok"


async def test_an_object_result_over_the_limit_fails_that_call_alone(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        key = blobs.key("k2", engine=engine)
        with pytest.raises(fusee.HandlerFailed) as failed:
            await key.call("big_result", MB2, timeout=20)
        assert failed.value.error_type == "fusee.NotEncodable"
        assert "the result of handler 'big_result'" in failed.value.message
        assert "2,000,002 bytes" in failed.value.message
        # a result and state changes that fit alone, but not in one record together
        with pytest.raises(fusee.HandlerFailed) as together:
            await key.call("both", 700_000, timeout=20)
        assert together.value.error_type == "fusee.NotEncodable"
        assert "cannot be stored together" in together.value.message
        assert await key.state() == {}
        assert await key.call("ok", timeout=20) == "ok"
        with pytest.raises(fusee.HandlerFailed) as shared:
            await key.call("peek", MB2, timeout=20)
        assert shared.value.error_type == "fusee.NotEncodable"
        assert "2,000,002 bytes" in shared.value.message
    dones = [
        r
        for _, r in await fusee.Run(engine, object_id("lv_blobs", "k2")).journal()
        if isinstance(r, ObjectDone)
    ]
    assert [d.ok for d in dones] == [False, False, True]


async def test_a_start_signal_or_call_with_a_value_over_the_limit_stores_nothing(
    engine: fusee.Engine,
) -> None:
    with pytest.raises(fusee.NotEncodable, match=r"the input of run 'r-lv-in' is 2,000,0"):
        await engine.start(lv_echo, "r-lv-in", "x" * MB2)
    assert await _stored_messages(engine) == 0
    assert await engine.list_runs() == []

    run = await engine.start(lv_echo, "r-lv-sig", 1)
    before = await _stored_messages(engine)
    with pytest.raises(fusee.NotEncodable, match=r"the payload of signal 'go' is 2,000,0"):
        await run.signal("go", "x" * MB2)
    key = blobs.key("k3", engine=engine)
    with pytest.raises(fusee.NotEncodable, match=r"the input of .*grow is 2,000,0"):
        await key.call("grow", "x" * MB2, timeout=5)
    with pytest.raises(fusee.NotEncodable, match=r"2,000,0"):
        await key.send("grow", "x" * MB2)
    with pytest.raises(fusee.NotEncodable, match=r"2,000,0"):
        await key.call("peek", "x" * MB2, timeout=5)
    with pytest.raises(fusee.NotEncodable, match=r"2,000,0"):
        await key.signal("go", "x" * MB2)
    assert await _stored_messages(engine) == before


async def test_a_value_nested_too_deeply_is_a_clear_error_and_stores_nothing(
    engine: fusee.Engine,
) -> None:
    deep = _deep(10_000)
    problem = rf"nests deeper than {MAX_DEPTH} levels"
    with pytest.raises(fusee.NotEncodable, match=problem):
        await engine.start(lv_echo, "r-lv-deep", deep)
    assert await _stored_messages(engine) == 0
    with pytest.raises(fusee.NotEncodable, match=problem):
        await engine.start(lv_echo, "r-lv-deep", _deep(MAX_DEPTH + 1))
    run = await engine.start(lv_echo, "r-lv-deep", _deep(MAX_DEPTH))  # the deepest allowed
    before = await _stored_messages(engine)
    with pytest.raises(fusee.NotEncodable, match=problem):
        await run.signal("go", deep)
    with pytest.raises(fusee.NotEncodable, match=problem):
        await blobs.key("k4", engine=engine).call("grow", deep, timeout=5)
    assert await _stored_messages(engine) == before
    async with engine.worker():
        await run.signal("go", _deep(MAX_DEPTH))
        assert await run.result(timeout=20) == _deep(MAX_DEPTH)


async def test_an_error_message_over_the_limit_is_cut_and_the_step_fails_as_usual(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        run = await engine.start(lv_long_error, "r-lv-err")
        message = await run.result(timeout=20)
    assert message.startswith("y" * 8192)
    assert message.endswith("... (cut: 2,000,000 bytes in all)")
    kinds = [type(r).__name__ for _, r in await run.journal()]
    assert kinds.count("StepRetrying") == 1
    assert kinds.count("StepFailed") == 1
