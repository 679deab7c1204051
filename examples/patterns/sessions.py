"""Sessions: one conversation per key, one turn at a time.

    fusee dev examples/patterns/sessions.py

The object ``chat`` keeps a conversation's history in its state, under its key
(``user-7-<stamp>``). Its exclusive handler ``say`` runs one turn at a time per key, in the
order the messages came; the reply is a ``model_call``, so its tokens are a stream
readers follow while it runs (``engine.run(...).stream("reply")``), and a retried or
resumed call continues from the tokens already stored. A support engineer can fix a
history from outside with ``fusee objects edit chat user-7-<stamp>``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

import fusee
import fusee.dev
from fusee.ai import Message, ModelRequest, model_call
from fusee.testing import ScriptedModel


def scripted(request: ModelRequest, n: int) -> str:
    """The stand-in model: it answers the last message, and knows how long the talk is."""
    said = [m.content for m in request.messages if m.role == "user"]
    return f"You said {said[-1]!r} (message {len(said)} of this conversation)."


model = ScriptedModel(scripted)


async def say(ctx: Any, text: str) -> str:
    history = ctx.state.get("history") or []
    history.append({"role": "user", "content": text})
    request = ModelRequest(messages=msgspec.convert(history, list[Message]))
    reply = await model_call(ctx, "reply", lambda resume: model.stream(request, prefill=resume))
    history.append({"role": "assistant", "content": reply})
    ctx.state.set("history", history)
    return reply


chats = fusee.object(
    "chat", {"say": say, "history": fusee.shared(lambda ctx: ctx.state.get("history") or [])}
)


async def main(engine: fusee.Engine) -> None:
    # keys with a stamp: run again on the same store, the chats start over (a fixed key
    # would go on with the conversations of the run before)
    stamp = f"{time.strftime('%m%d-%H%M%S')}{time.time_ns() // 1_000_000 % 1000:03d}"
    seven, eight = f"user-7-{stamp}", f"user-8-{stamp}"
    chat = chats.key(seven, engine=engine)
    for text in ("Where is my order?", "It is order 1042."):
        print(f"\n  user-7: {text}\n  chat:   {await chat.call('say', text)}")
    other = chats.key(eight, engine=engine)
    print(f"\n  user-8: Hello\n  chat:   {await other.call('say', 'Hello')}")
    history = await chat.call("history")
    print(f"\n  user-7's history holds {len(history)} messages (user-8's is its own):")
    print(f"  {fusee.dev.hint('objects', 'show', 'chat', seven)}\n")
