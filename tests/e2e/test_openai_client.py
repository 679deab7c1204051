"""The real-client check of issue 5: ``model_call`` over the real ``openai`` client,
pointed at a small OpenAI-compatible server (``tests/fakes/openai_server.py``, a real
HTTP server on 127.0.0.1), in a worker process that is SIGKILLed mid-stream.

A reader in this process follows the run's token stream from the start (another joins
at an offset right after the kill). After the kill a new worker takes the run over and
the call goes on:

- with a prefill, the new attempt sends the stored text as an assistant message, the
  server continues after it, and the reader sees one continuous text (no boundary);
- without one, the reader sees the cut attempt, an attempt boundary, then the whole
  text again; the result is the final attempt's text.

Either way the reader gets exactly the stored events: in order, no gap, no duplicate.
A stream the server closes cleanly without a ``finish_reason`` (which the raw client
takes quietly) is a truncated attempt, retried from the stored text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import msgspec
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

import fusee
from fusee.runtime.records import StepCompleted
from fusee.runtime.tokens import TokenEvent
from tests.fakes.openai_server import FakeOpenAI, tokenize
from tests.helpers import split_attempts
from tests.workers import procs as worker_lib
from tests.workers.procs import wait_until

worker_procs = worker_lib.worker_procs  # the fixture: worker subprocesses, killed after the test

AGENT = Path(worker_lib.__file__).resolve().parent / "openai_agent.py"
TEXT = (
    "Durable execution means a crash is an interruption, not a loss. The worker that "
    "ran this reply was killed while the model was still talking, and another one "
    "picked the call up where the stored tokens ended. A reader attached to the stream "
    "should never notice: every token arrives once, in order, with nothing missing and "
    "nothing repeated, and the final answer is exactly this paragraph."
)
TOKENS = tokenize(TEXT)
DELAY = 0.02  # seconds per token: the whole text takes ~1.4 s
KILL_AFTER = 20  # tokens the reader has seen when the worker is killed
LATE_OFFSET = 7  # a second reader joins at this token index right after the kill
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What does durable execution mean for a chat reply?"},
]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(TEXT, delay=DELAY) as server:
        yield server


def agent_input(fake: FakeOpenAI, *, prefill: bool) -> dict[str, Any]:
    return {
        "base_url": fake.base_url,
        "messages": MESSAGES,
        "model": "fake-gpt",
        "prefill": prefill,
    }


def texts(events: list[TokenEvent]) -> list[str]:
    return [e.text for e in events if e.kind == "token"]


def assert_well_formed(truth: list[TokenEvent]) -> None:
    """The stored stream: token indexes 0..n-1 in order, one end marker, last."""
    indexes = [e.index for e in truth if e.kind == "token"]
    assert indexes == list(range(len(indexes))), indexes
    assert [e.kind for e in truth].count("end") == 1, truth[-3:]
    assert truth[-1].kind == "end"
    assert truth[-1].index == len(indexes)
    cursors = [e.cursor for e in truth]
    assert cursors == sorted(set(cursors)), "cursors must increase"


async def run_and_read(
    engine: fusee.Engine,
    workers: worker_lib.Workers,
    fake: FakeOpenAI,
    run_id: str,
    arg: dict[str, Any],
    *,
    kill_after: int | None,
) -> tuple[Any, list[TokenEvent], list[TokenEvent], str]:
    """Start the run with a worker, follow its stream from 0, kill the worker once the
    reader has ``kill_after`` tokens (then start another; a second reader joins at
    ``LATE_OFFSET`` in between); returns the result, what the first reader saw, the
    stored stream read afterwards, and the text the reader had at the kill."""
    worker = await workers.start()
    seen: list[TokenEvent] = []
    late: list[TokenEvent] = []
    at_kill = ""
    if kill_after is not None:
        # the first response waits a few tokens past kill_after until the kill is done:
        # the kill lands mid-stream by construction
        fake.hold(1, kill_after + 5)

    async def read(into: list[TokenEvent], offset: int) -> None:
        async for e in engine.run(run_id).stream_events("model-0", offset):
            into.append(e)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await engine.start("openai_agent", run_id, arg)
            tg.start_soon(
                read, seen, 0
            )  # after the start: a reader of an unknown run gets RunNotFound
            if kill_after is not None:
                await wait_until(
                    lambda: len(texts(seen)) >= kill_after,
                    timeout=10,
                    what=f"{kill_after} tokens to reach the reader",
                    interval=0.005,
                )
                worker.kill()
                fake.release()
                at_kill = "".join(texts(seen))
                assert len(texts(seen)) < len(TOKENS), "the kill came after the stream ended"
                tg.start_soon(read, late, LATE_OFFSET)  # joins between the two workers
                await workers.start()
            result = await engine.run(run_id).result(timeout=15)
        # the reader's iterator ended by itself: the stream is over
        truth = [e async for e in engine.run(run_id).stream_events("model-0")]
    journaled = [
        msgspec.json.decode(bytes(r.result))
        for _, r in await engine.run(run_id).journal()
        if isinstance(r, StepCompleted)
    ]
    assert journaled == [result], "the text is journaled once, as the step's result"
    if kill_after is not None:
        assert late == [e for e in truth if e.index >= LATE_OFFSET], "the late reader"
    return result, seen, truth, at_kill


# -- the raw client -------------------------------------------------------------------


async def test_raw_client_ends_quietly_on_a_cut_stream() -> None:
    """Why the adapter checks ``finish_reason``: a stream closed cleanly before its final
    chunk ends the raw client's iteration with no error, and ``stream_openai`` raises."""
    from tests.workers.openai_agent import TruncatedStream, stream_openai

    with FakeOpenAI(TEXT, delay=0.001, cut_after=lambda n: 7) as fake:
        async with AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="fake-gpt",
                messages=cast("list[ChatCompletionMessageParam]", MESSAGES),
                stream=True,
            )
            chunks = [c async for c in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(TOKENS[:7])
            assert all(c.choices[0].finish_reason is None for c in chunks)

            got: list[str] = []

            async def consume() -> None:
                async for text in stream_openai(client, MESSAGES, "", model="fake-gpt"):
                    got.append(text)

            with pytest.raises(TruncatedStream):
                await consume()
            assert got == TOKENS[:7]

            # a prefill continues after it, to the finish
            fake.cut_after = lambda n: None
            prefix = "".join(TOKENS[:7])
            rest = [t async for t in stream_openai(client, MESSAGES, prefix, model="fake-gpt")]
            assert prefix + "".join(rest) == TEXT
        reqs = await fake.settled(3)
        assert [r.ending for r in reqs] == ["cut", "cut", "done"]
        assert reqs[2].messages == [*MESSAGES, {"role": "assistant", "content": prefix}]


# -- killed mid-stream ----------------------------------------------------------------


async def test_killed_mid_stream_continues_with_prefill(
    nats_server: Any, namespace: str, worker_procs: Any, fake: FakeOpenAI
) -> None:
    workers = worker_procs(partitions=2)
    workers.module = AGENT
    async with await fusee.connect(nats_server.url, namespace=namespace, partitions=2) as engine:
        result, seen, truth, at_kill = await run_and_read(
            engine,
            workers,
            fake,
            "chat-prefill",
            agent_input(fake, prefill=True),
            kill_after=KILL_AFTER,
        )
    assert result == TEXT
    assert seen == truth, "the reader saw exactly the stored events"
    assert_well_formed(truth)
    # one continuous text: no boundary, one attempt number, nothing lost or repeated
    assert [e.kind for e in truth].count("attempt") == 0
    assert {e.attempt for e in truth} == {1}
    assert "".join(texts(truth)) == TEXT

    first, second = await fake.settled(2)
    assert len(fake.snapshot()) == 2, [r.prefill for r in fake.snapshot()]
    assert first.prefill is None
    assert first.messages == MESSAGES
    assert first.ending == "disconnected"  # the worker died mid-response
    # the second request carried the stored text as the assistant's prefill...
    stored = texts(truth)[: len(texts(truth)) - len(second.sent)]
    assert second.prefill == "".join(stored)
    assert second.messages == [*MESSAGES, {"role": "assistant", "content": "".join(stored)}]
    assert second.prefill.startswith(at_kill), "at least what the reader had was stored"
    assert first.sent[: len(stored)] == stored
    # ...and its tokens follow the stored ones exactly
    assert second.ending == "done"
    assert texts(truth)[len(stored) :] == second.sent
    print(f"killed after {len(at_kill)} chars read; resumed from {len(second.prefill)} stored")


async def test_killed_mid_stream_restarts_without_prefill(
    nats_server: Any, namespace: str, worker_procs: Any, fake: FakeOpenAI
) -> None:
    workers = worker_procs(partitions=2)
    workers.module = AGENT
    async with await fusee.connect(nats_server.url, namespace=namespace, partitions=2) as engine:
        result, seen, truth, at_kill = await run_and_read(
            engine,
            workers,
            fake,
            "chat-restart",
            agent_input(fake, prefill=False),
            kill_after=KILL_AFTER,
        )
    assert result == TEXT
    assert seen == truth, "the reader saw exactly the stored events"
    assert_well_formed(truth)
    cut, final = split_attempts(truth)  # one boundary: the crash
    assert final[0].kind == "attempt"
    assert final[0].attempt == 2
    assert {e.attempt for e in cut} == {1}
    assert {e.attempt for e in final} == {2}
    assert "".join(texts(final)) == result, "the result is the final attempt's text"
    cut_text = "".join(texts(cut))
    assert cut_text.startswith(at_kill)
    assert cut_text != TEXT
    assert TEXT.startswith(cut_text)

    first, second = await fake.settled(2)
    assert len(fake.snapshot()) == 2
    assert first.prefill is None, "no prefill: start over"
    assert second.prefill is None, "no prefill: start over"
    assert first.messages == second.messages == MESSAGES
    assert first.ending == "disconnected"
    assert second.ending == "done"
    assert first.sent[: len(texts(cut))] == texts(cut)
    assert texts(final) == second.sent == TOKENS


# -- cut by the server ----------------------------------------------------------------


async def test_cut_stream_is_retried_from_the_stored_text(
    nats_server: Any, namespace: str, worker_procs: Any
) -> None:
    """The server closes the first response cleanly after 12 tokens, without a
    ``finish_reason``: a truncated attempt, retried with the 12 tokens as a prefill."""
    workers = worker_procs(partitions=2)
    workers.module = AGENT
    with FakeOpenAI(TEXT, delay=0.005, cut_after=lambda n: 12 if n == 1 else None) as fake:
        async with await fusee.connect(
            nats_server.url, namespace=namespace, partitions=2
        ) as engine:
            result, seen, truth, _ = await run_and_read(
                engine,
                workers,
                fake,
                "chat-cut",
                agent_input(fake, prefill=True),
                kill_after=None,
            )
        first, second = await fake.settled(2)
        assert len(fake.snapshot()) == 2
    assert result == TEXT
    assert seen == truth
    assert_well_formed(truth)
    assert [e.kind for e in truth].count("attempt") == 0
    assert texts(truth) == TOKENS
    assert first.ending == "cut"
    assert first.sent == TOKENS[:12]
    assert second.prefill == "".join(TOKENS[:12])
    assert second.sent == TOKENS[12:]
    assert second.ending == "done"
