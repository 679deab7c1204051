"""Long conversations: summarize, then continue as a new run with the summary.

    fusee dev examples/patterns/long_conversations.py

A chat is one run that waits for the signal ``message``, answers each, and grows its
journal by a few records a turn. Once ``ctx.journal_size()`` passes a bound (a few
records here; a real chat would take ~1000), it asks the model for a summary and
returns ``ctx.continue_as_new({"summary": ..., "turn": ...})``: the same run ID goes on
as a new generation whose history is the summary, so replaying it stays cheap and the
model's context stays small. Messages sent meanwhile wait in the run's inbox, and
``engine.run(id).result()`` follows the run to its last generation.

The model is scripted, so this runs offline.
"""

from __future__ import annotations

import time
from typing import Any

import fusee
import fusee.dev
from fusee.ai import AssistantMessage, Message, ModelRequest, SystemMessage, UserMessage, generate
from fusee.testing import ScriptedModel

MAX_RECORDS = 8  # a real chat: ~1000


def reply(request: ModelRequest, n: int) -> str:
    last = request.messages[-1]
    assert isinstance(last, UserMessage)
    if last.content == "Summarize our conversation.":
        said = [m.content for m in request.messages[:-1] if isinstance(m, UserMessage)]
        earlier = [m.content for m in request.messages if isinstance(m, SystemMessage)]
        if earlier:  # fold the earlier summary in
            said.insert(0, earlier[0].split("asked about: ", 1)[1])
        return "The user asked about: " + "; ".join(said)
    return f"({len(request.messages)} messages in my context) Noted: {last.content}"


model = ScriptedModel(reply)


async def run_turns(ctx: fusee.Context, state: dict[str, Any]) -> tuple[list[Message], bool]:
    """Answer messages until "bye" (True) or until the journal is long (False)."""
    history: list[Message] = []
    if state.get("summary"):
        history.append(SystemMessage(f"Earlier in this conversation: {state['summary']}"))
    turn = state.get("turn", 0)
    while ctx.journal_size() <= MAX_RECORDS:
        text = await ctx.wait_for("message")
        if text == "bye":
            return history, True
        history.append(UserMessage(text))
        answer = await generate(ctx, f"turn-{turn}", model=model, messages=history)
        history.append(AssistantMessage(content=answer.text))
        turn += 1
    return history, False


@fusee.workflow("long-chat")
async def chat(ctx: fusee.Context, state: dict[str, Any]) -> dict[str, Any]:
    history, done = await run_turns(ctx, state)
    turns = state.get("turn", 0) + sum(isinstance(m, AssistantMessage) for m in history)
    if done:
        return {"turns": turns, "summary": state.get("summary", "")}
    ask = [*history, UserMessage("Summarize our conversation.")]
    summary = await generate(ctx, "summarize", model=model, messages=ask)
    return ctx.continue_as_new({"summary": summary.text, "turn": turns})


async def main(engine: fusee.Engine) -> None:
    run = await engine.start(chat, f"chat-{time.strftime('%m%d-%H%M%S')}", {})
    for i in range(1, 8):
        await run.signal("message", f"question {i}")
    await run.signal("message", "bye")
    print(f"\n  {await run.result(timeout='30s')}\n")
    info = await run.describe()
    print(f"  {info.generation} generations under the one run ID {run.run_id}")
    print(f"  the last generation holds {info.steps} steps\n")
    # each generation starts at a run.continued record, its input the summary so far
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    print()
