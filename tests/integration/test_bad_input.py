"""Bad input gets a clear error that names the problem, and never touches stored data."""

from __future__ import annotations

from typing import Any

import pytest

import fusee
from fusee.errors import ConfigError, InvalidArgument
from fusee.runtime.records import RunStarted
from tests.workers.procs import wait_until


@fusee.workflow("bad_echo")
async def bad_echo(ctx: fusee.Context, arg: Any) -> Any:
    return await ctx.step("echo", lambda: arg)


@fusee.workflow("bad_typed")
async def bad_typed(ctx: fusee.Context, count: int) -> int:
    return count + 1


@fusee.workflow("bad_returns_object")
async def bad_returns_object(ctx: fusee.Context) -> Any:
    await ctx.step("fine", lambda: 1)
    return object()


@fusee.workflow("bad_step_returns_object")
async def bad_step_returns_object(ctx: fusee.Context) -> Any:
    return await ctx.step("open_file", lambda: open)  # a builtin function: not data


async def _stored_messages(engine: fusee.Engine) -> int:
    info = await engine.store.js.stream_info(engine.store.layout.stream)
    return int(info.state.messages)


async def _nothing_stored(engine: fusee.Engine) -> None:
    assert await _stored_messages(engine) == 0
    assert await engine.list_runs() == []


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("", r"run ID must not be empty"),
        ("r" * 300, r"at most 256 UTF-8 bytes, got 300"),
        ("é" * 129, r"at most 256 UTF-8 bytes, got 258"),
        (42, r"run ID must be a str, got int"),
        (None, r"run ID must be a str, got NoneType"),
        (b"bytes-id", r"run ID must be a str, got bytes"),
        ("line\nbreak", r"control characters, found '\\n' at index 4"),
        ("nul\x00", r"control characters"),
        ("\ud800", r"lone surrogate"),
    ],
    ids=[
        "empty",
        "300-bytes",
        "258-bytes-of-e-acute",
        "int",
        "none",
        "bytes",
        "newline",
        "nul",
        "surrogate",
    ],
)
async def test_invalid_run_id(engine: fusee.Engine, bad: Any, problem: str) -> None:
    with pytest.raises(fusee.InvalidId, match=problem):
        await engine.start(bad_echo, bad, 1)
    with pytest.raises(fusee.InvalidId, match=problem):
        engine.run(bad)
    await _nothing_stored(engine)


@pytest.mark.parametrize("bad", ["", "w" * 200, 7], ids=["empty", "200-bytes", "int"])
async def test_invalid_workflow_name(engine: fusee.Engine, bad: Any) -> None:
    with pytest.raises(fusee.InvalidId, match="workflow name"):
        await engine.start(bad, "r-badname", 1)
    await _nothing_stored(engine)


@pytest.mark.parametrize(
    "bad",
    [object(), {"callback": print}, {"nested": [1, {2, object()}]}, float("nan") * 1j],
    ids=["object", "function-in-dict", "object-in-set", "complex"],
)
async def test_unencodable_input_stores_nothing(engine: fusee.Engine, bad: Any) -> None:
    with pytest.raises(fusee.NotEncodable, match=r"the input of run 'r-unenc' cannot be stored"):
        await engine.start(bad_echo, "r-unenc", bad)
    await _nothing_stored(engine)
    with pytest.raises(fusee.RunNotFound, match="r-unenc"):
        await engine.run("r-unenc").result(timeout=0.2)
    with pytest.raises(fusee.RunNotFound, match="r-unenc"):
        await engine.run("r-unenc").describe()
    # the ID is still free: a good start with it works
    async with engine.worker():
        run = await engine.start(bad_echo, "r-unenc", {"ok": True})
        assert await run.result(timeout=10) == {"ok": True}


@pytest.mark.parametrize(
    ("timeout", "error", "problem"),
    [
        (-1, (InvalidArgument, ConfigError), "negative|positive"),
        (0, InvalidArgument, "must be positive"),
        ("banana", ConfigError, "banana"),
    ],
    ids=["negative", "zero", "nonsense"],
)
async def test_invalid_run_timeout(
    engine: fusee.Engine, timeout: Any, error: Any, problem: str
) -> None:
    with pytest.raises(error, match=problem) as caught:
        await engine.start(bad_echo, "r-timeout", 1, timeout=timeout)
    assert isinstance(caught.value, fusee.FuseeError)
    await _nothing_stored(engine)


async def test_unencodable_workflow_result_fails_the_run(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(bad_returns_object, "r-badresult")
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type == "fusee.NotEncodable"
    assert "the result of run 'r-badresult' cannot be stored" in caught.value.message
    info = await run.describe()
    assert (info.status, info.error_type) == ("failed", "fusee.NotEncodable")


async def test_unencodable_step_result_names_the_step(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(bad_step_returns_object, "r-badstep")
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type == "fusee.NotEncodable"
    assert "the result of step 'open_file' cannot be stored" in caught.value.message
    info = await run.describe()
    assert info.step == "open_file"


async def test_input_that_does_not_fit_the_workflow(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(bad_typed, "r-typed", "not a number")
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=10)
    assert caught.value.error_type == "fusee.InvalidInput"
    assert "r-typed" in caught.value.message
    assert "bad_typed" in caught.value.message


async def test_unknown_workflow_is_visible_and_does_not_block_others(engine: fusee.Engine) -> None:
    async with engine.worker():
        lost = await engine.start("bad_not_registered", "r-lost", {"x": 1})
        ok = await engine.start(bad_echo, "r-ok", 5)
        assert await ok.result(timeout=10) == 5

        async def reason() -> str | None:
            text = (await lost.describe()).reason or ""
            return text if "no live worker serves workflow 'bad_not_registered'" in text else None

        text = await wait_until(reason, timeout=10, what="the unrunnable run's reason")
        assert "bad_echo" in text  # it lists what the live workers have
        assert (await lost.describe()).status == "pending"
        # starting it again is still idempotent, and stores nothing new
        again = await engine.start("bad_not_registered", "r-lost", {"x": 1})
        assert again.run_id == "r-lost"
    assert [type(r) for _, r in await lost.journal()] == [RunStarted]


async def test_conflicting_starts_leave_the_stored_run_intact(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(bad_echo, "r-taken", {"who": "first"})
        assert await run.result(timeout=10) == {"who": "first"}
    journal_before = [(seq, type(r).__name__) for seq, r in await run.journal()]
    messages_before = await _stored_messages(engine)

    async def indexed() -> bool:  # the run index is written just after the end record
        return [(i.run_id, i.status) for i in await engine.list_runs()] == [
            ("r-taken", "completed")
        ]

    await wait_until(indexed, timeout=10, what="the run index to show the completed run")
    listed_before = await engine.list_runs()

    with pytest.raises(fusee.RunExists, match=r"run 'r-taken' exists with another input"):
        await engine.start(bad_echo, "r-taken", {"who": "second"})
    with pytest.raises(fusee.RunExists, match=r"run 'r-taken' exists with workflow 'bad_echo'"):
        await engine.start(bad_typed, "r-taken", 1)

    assert [(seq, type(r).__name__) for seq, r in await run.journal()] == journal_before
    assert await _stored_messages(engine) == messages_before
    listed = await engine.list_runs()
    assert [(i.run_id, i.workflow, i.status) for i in listed] == [
        (i.run_id, i.workflow, i.status) for i in listed_before
    ]
    assert await engine.run("r-taken").result(timeout=1) == {"who": "first"}


async def test_conflicting_start_before_the_run_moved(engine: fusee.Engine) -> None:
    """The conflict comes while run.started is still the journal's last record."""
    await engine.start(bad_echo, "r-fresh", {"who": "first"})
    with pytest.raises(fusee.RunExists, match=r"run 'r-fresh' exists with another input"):
        await engine.start(bad_echo, "r-fresh", {"who": "second"})
    with pytest.raises(fusee.RunExists, match=r"run 'r-fresh' exists with workflow 'bad_echo'"):
        await engine.start(bad_typed, "r-fresh", 1)
    journal = [r for _, r in await engine.run("r-fresh").journal()]
    assert len(journal) == 1
    assert isinstance(journal[0], RunStarted)
    assert journal[0].workflow == "bad_echo"
    [listed] = await engine.list_runs()
    assert (listed.run_id, listed.workflow) == ("r-fresh", "bad_echo")
    async with engine.worker():
        assert await engine.run("r-fresh").result(timeout=10) == {"who": "first"}
