"""A support agent on ``fusee.ai.loop``: the model calls tools until it can answer.

    fusee dev examples/agent.py

Each model turn is a durable step (``agent/turn-<i>``) and so is each tool call: kill
the process in the middle and the run resumes at the call that was running; the model
is not asked again for a turn it answered, and no tool that finished runs twice. The
tools are the three kinds ``loop`` takes:

- ``search_kb``: a function, one step per call (``agent/tool-<i>-search_kb``);
- ``lookup_order``: a workflow, a child run per call (``<run id>/<tool call id>-<16 hex>``) with
  its own steps and retries;
- ``refund``: a function behind an approval, which waits for a person first.

Offline, the model is scripted (``fusee.testing.ScriptedModel``). With
``OPENAI_API_KEY`` set it is ``openai_model(OPENAI_MODEL or "gpt-4o-mini")``, and
``OPENAI_BASE_URL`` points it at any OpenAI-compatible server (vLLM, llama.cpp,
Ollama...). The workflow does not change. More shapes: ``examples/patterns/``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import anyio
import msgspec

import fusee
import fusee.dev
from fusee.ai import AssistantMessage, Model, ModelRequest, ToolCall, loop, tool, workflow_tool
from fusee.testing import Reply, ScriptedModel, tool_call

# -- the tools ------------------------------------------------------------------------

HELP_CENTER = {
    "damaged": "A parcel that arrived damaged is refunded in full; no need to send it back.",
    "late": "A parcel more than 5 days late can be refunded or sent again.",
}
ORDERS = {"1042": {"status": "delivered", "carrier": "DHL", "total_eur": 40}}
_lost_once: set[str] = set()
REFUNDS: dict[str, int] = {}  # the payment service, standing in: one refund per key


def search_kb(query: str) -> str:
    """Searches the help center's articles.

    Args:
        query: the words to look for.
    """
    found = [text for word, text in HELP_CENTER.items() if word in query.lower()]
    return " ".join(found) or "No article matches."


class OrderQuery(msgspec.Struct):
    """An order to look up."""

    order: str


def fetch_order(order: str, *, idempotency_key: str) -> dict[str, Any]:
    """The order service. Its first answer to a key is lost, as a flaky network would."""
    if idempotency_key not in _lost_once:
        _lost_once.add(idempotency_key)
        raise TimeoutError("the order service did not answer")
    return {"order": order, **ORDERS.get(order, {"status": "not found"})}


@fusee.workflow("orders-lookup")
async def lookup_order(ctx: fusee.Context, q: OrderQuery) -> dict[str, Any]:
    """Looks an order up: its status, carrier and total."""
    return await ctx.step(
        "fetch",
        # s.key is the same on every attempt and after a crash: an idempotency key.
        lambda s: fetch_order(q.order, idempotency_key=s.key),
        retry=fusee.Retry(attempts=3, initial="200ms"),
        timeout="10s",
    )


def refund(order: str, amount_eur: int, s: fusee.StepInfo) -> str:
    """Refunds an order. A person approves each refund first.

    Args:
        order: the order's number.
        amount_eur: how much to refund, in EUR.
    """
    REFUNDS.setdefault(s.key, amount_eur)  # s.key: <the step's key>-<the model's tool-call ID>
    return f"refunded {amount_eur} EUR on order {order}"


# approvals asked for, (what, completion token), as a chat channel would hold them
asking, asked = anyio.create_memory_object_stream[tuple[str, str]](math.inf)


async def ask_the_lead(cb: fusee.Completion, call: ToolCall) -> None:
    """Puts the refund in front of the support lead: prints ``cb.url`` (in real life a
    Slack post or a mail) and puts it on a channel ``main`` reads. Served by ``fusee
    worker``, nothing reads the channel: the printed URL is how the run gets its answer
    (``curl -X POST <url> -d true`` against ``fusee api``). Completing it with ``true``
    runs the tool; ``{"approved": false, "reason": ...}`` tells the model no."""
    print(f"  approval needed: {call.name} {call.arguments}: POST true to {cb.url}", flush=True)
    await asking.send((f"{call.name} {call.arguments}", cb.token))


# -- the model --------------------------------------------------------------------------


def scripted(request: ModelRequest, n: int) -> Reply:
    """The stand-in model, by turn: look things up (two calls at once), refund, answer."""
    turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
    if turn == 0:
        return [
            tool_call("search_kb", "call_kb", query="damaged parcel"),
            tool_call("lookup_order", "call_order", order="1042"),
        ]
    if turn == 1:
        return tool_call("refund", "call_refund", order="1042", amount_eur=40)
    return (
        "Sorry your parcel arrived damaged. Order 1042 is refunded in full (40 EUR), "
        "and there is no need to send it back."
    )


def choose_model() -> Model:
    if os.environ.get("OPENAI_API_KEY"):
        from fusee.ai import openai_model  # the SDK reads OPENAI_BASE_URL itself

        return openai_model(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedModel(scripted)


model = choose_model()

# -- the workflow -------------------------------------------------------------------------

INSTRUCTIONS = (
    "You are the support agent of an online shop. Use the tools to check the help center "
    "and the order before you answer; refund when the help center says so."
)


@fusee.workflow("support")
async def support(ctx: fusee.Context, question: str) -> str:
    result = await loop(
        ctx,
        "agent",
        model=model,
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": question},
        ],
        tools={
            "search_kb": search_kb,
            "lookup_order": workflow_tool(lookup_order),
            "refund": tool(refund, approve=ask_the_lead, approve_timeout="1d"),
        },
        max_iterations=6,
    )
    return result.text


# -- what `fusee dev` runs ----------------------------------------------------------------


async def play_the_lead(engine: fusee.Engine) -> None:
    """The support lead: approves each refund asked for (from a shell, `curl -X POST
    <cb.url> -d true` against `fusee api` does the same)."""
    async for what, token in asked:
        await engine.complete(token, True)
        print(f"  approval asked: {what} -> approved by the support lead")


async def main(engine: fusee.Engine) -> None:
    run_id = f"support-{time.strftime('%m%d-%H%M%S')}"
    question = "My parcel for order 1042 arrived damaged. Can I get my money back?"
    print(f"\n  model: {model.name}\n  Q: {question}")
    run = await engine.start(support, run_id, question, timeout="15m")
    async with anyio.create_task_group() as tg:
        tg.start_soon(play_the_lead, engine)
        reply = await run.result(timeout="60s")
        tg.cancel_scope.cancel()
    print(f"  A: {reply}\n")

    journal = await run.journal()
    print(f"Journal of run {run_id} (one durable record per line):")
    print("\n".join(fusee.dev.format_journal(journal)))
    children = dict.fromkeys(r.name for _, r in journal if getattr(r, "wait", None) == "child")
    for child in children:  # a workflow tool's runs
        print(f"\nJournal of the workflow tool's run {child}:")
        print("\n".join(fusee.dev.format_journal(await engine.run(child).journal())))
    if children:
        print("\nThe order service lost the first fetch; its retry took the same key.")
    print(
        "\nThe runs and their journals stay in NATS. Look at them again with:"
        f"\n  {fusee.dev.hint('runs', 'show', run_id)}"
        f"\n  {fusee.dev.hint('runs', 'list')}\n"
    )
