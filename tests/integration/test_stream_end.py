"""A token stream's reader ends at the stream's own ``end`` marker, also when no step
of the stream's name completes: Pydantic AI's streamed requests write to
``<step name>/<n>``, and a reader of one used to follow it until the run ended."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

import fusee
from fusee.ai.pydantic import FuseeDurability, run
from tests.helpers import registry_of

pytestmark = pytest.mark.timeout(60)


async def _words(messages: list[ModelMessage], info: AgentInfo) -> Any:
    for word in ["hello ", "streamed ", "world"]:
        yield word


async def test_a_reader_stops_at_the_end_marker_while_the_run_goes_on(
    engine: fusee.Engine,
) -> None:
    agent = Agent(
        FunctionModel(stream_function=_words), name="talker", capabilities=[FuseeDurability()]
    )

    async def talk(ctx: fusee.Context, _arg: Any) -> str:
        async def go() -> str:
            async with agent.run_stream("hi") as result:
                return "".join([c async for c in result.stream_text(delta=True)])

        text = await run(ctx, go)
        await ctx.wait_for("done")  # the run goes on after the stream ended
        return text

    async with engine.worker(registry=registry_of(talk, "talk")):
        r = await engine.start("talk", "t-end", None)
        seen: list[str] = []
        kinds: list[str] = []
        with anyio.fail_after(15):  # (before: followed until the run ended)
            async for event in r.stream_events("talker__model.request_stream/0"):
                kinds.append(event.kind)
                seen.append(event.text)
        assert not (await r.describe()).ended
        assert "".join(seen) == "hello streamed world"
        assert kinds[-1] == "end"
        # read again from an offset past the text: only the end, then it stops
        with anyio.fail_after(15):
            tail = [
                e.kind async for e in r.stream_events("talker__model.request_stream/0", offset=3)
            ]
        assert tail == ["end"]
        assert await r.signal("done", None)
        assert await r.result(timeout=20) == "hello streamed world"
