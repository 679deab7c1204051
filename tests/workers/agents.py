"""Agent loops (``fusee.ai.loop``) for tests that run them in worker processes.

The model is a :class:`fusee.testing.ScriptedModel` whose record is a file
(``arg["model_log"]``), so the test reads every request any worker sent. Its reply is
picked by the turn the request is for (the assistant messages in it), not by the
count of requests, so a turn asked again after a crash gets the same reply.

``arg["script"]`` is one entry per turn: ``{"text": ...}`` or ``{"calls": [{"name",
"id", "args"} | {"name", "id", "arguments": <raw text>}]}``. The tools write what they
did to ``arg["effects"]`` (``tool key attempt``, one line an execution) and apply their
side effect once per key in ``arg["store"]`` (a file per key, created exclusively), as
a service that takes an idempotency key would. ``arg["kill_at"]`` names a hook point
(``charge:before``...) where the worker SIGKILLs itself, once (``arg["killed"]`` marks
it done). ``FUSEE_TEST_AGENT_DEPLOY=b`` makes ``lookup`` a workflow tool instead of a
function (a deploy that changed the tools).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import msgspec

import fusee
from fusee.ai import LoopState, ModelRequest, ToolCall, Turn, loop, tool, workflow_tool
from fusee.ai.types import AssistantMessage
from fusee.testing import ScriptedModel
from tests.workers.effects import record, record_line, wait_for_file

DEPLOY = os.environ.get("FUSEE_TEST_AGENT_DEPLOY", "a")


class OrderQuery(msgspec.Struct):
    """An order to look up."""

    order: str


def hook(arg: dict[str, Any], point: str) -> None:
    """SIGKILL this worker at ``point`` if the test chose it, once."""
    if arg.get("kill_at") != point:
        return
    try:
        fd = os.open(arg["killed"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, f"{point} {os.getpid()}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def apply_once(arg: dict[str, Any], key: str, what: str) -> None:
    """The side effect of a call with idempotency key ``key``: applied once, whatever
    the number of attempts (the file's exclusive create is the service's dedupe)."""
    store = Path(arg["store"])
    store.mkdir(exist_ok=True)
    try:
        fd = os.open(store / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, what.encode())
    os.close(fd)


@fusee.workflow("orders-lookup")
async def orders_lookup(ctx: fusee.Context, q: OrderQuery) -> dict[str, str]:
    """Look up an order's status."""
    arg = ctx_args(ctx)

    def look(s: fusee.StepInfo) -> dict[str, str]:
        record(arg["effects"], f"lookup:{q.order}", s.key, s.attempt)
        hook(arg, f"lookup:{q.order}:before")
        apply_once(arg, s.key, f"looked up {q.order}")
        hook(arg, f"lookup:{q.order}:after")
        return {"order": q.order, "status": "shipped"}

    result: dict[str, str] = await ctx.step("look", look)
    return result


def ctx_args(ctx: fusee.Context) -> dict[str, Any]:
    """The files of the test that started this child: its ID is ``<parent>/<call id>``,
    and the parent's test keeps them in one directory named by the environment."""
    base = Path(os.environ["FUSEE_TEST_AGENT_DIR"])
    arg: dict[str, Any] = msgspec.json.decode((base / "child-arg.json").read_bytes())
    return arg


def script_of(arg: dict[str, Any]) -> Any:
    turns = arg["script"]

    def reply(request: ModelRequest, n: int) -> Any:
        i = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        entry = turns[i]
        if "text" in entry:
            return entry["text"]
        return [
            ToolCall(
                id=c["id"],
                name=c["name"],
                arguments=c["arguments"]
                if "arguments" in c
                else msgspec.json.encode(c.get("args", {})).decode(),
            )
            for c in entry["calls"]
        ]

    return reply


def tools_of(arg: dict[str, Any]) -> dict[str, Any]:
    effects = arg["effects"]

    def search_kb(query: str, s: fusee.StepInfo) -> str:
        """Search the knowledge base.

        Args:
            query: the words to look for.
        """
        record(effects, "search_kb", s.key, s.attempt)
        return f"kb: {query} -> refunds take 3 days"

    async def charge(order: str, amount: int, s: fusee.StepInfo) -> dict[str, Any]:
        """Charge back an order.

        Args:
            order: the order's ID.
            amount: in EUR.
        """
        record(effects, "charge", s.key, s.attempt)
        hook(arg, "charge:before")
        apply_once(arg, s.key, f"charged {order} {amount}")
        hook(arg, "charge:after")
        return {"order": order, "charged": amount}

    def notify(who: str, s: fusee.StepInfo) -> str:
        """Tell someone."""
        record(effects, "notify", s.key, s.attempt)
        hook(arg, "notify:before")
        apply_once(arg, s.key, f"notified {who}")
        hook(arg, "notify:after")
        return f"notified {who}"

    async def meet(who: str, s: fusee.StepInfo) -> str:
        """Wait for the other caller of meet (the test's proof that calls overlap)."""
        record(effects, f"meet:{who}", s.key, s.attempt)
        here = Path(arg["meet"])
        (here / who).touch()
        other = "b" if who == "a" else "a"
        with anyio.move_on_after(arg.get("meet_timeout", 10)):
            await wait_for_file(str(here / other))
            return f"{who} met {other}"
        raise TimeoutError(f"{who} waited for {other}, who never came")

    def boom(order: str) -> str:
        """Fails."""
        raise ValueError(f"no such order {order}")

    def fatal() -> str:
        """Fails the run."""
        raise fusee.FatalError("the ledger is locked")

    async def hold(s: fusee.StepInfo) -> str:
        """Waits for the test."""
        record(effects, "hold", s.key, s.attempt)
        await wait_for_file(arg["release"])
        return "held"

    def refund(order: str, amount: int, s: fusee.StepInfo) -> str:
        """Refund an order (a person approves first)."""
        record(effects, "refund", s.key, s.attempt)
        return f"refunded {amount} EUR on {order}"

    def ask(cb: fusee.Completion, call: ToolCall) -> None:
        record_line(arg["asked"], f"{call.id} {call.name} {call.arguments} {cb.token}")

    def lookup(order: str) -> str:
        """Look an order up."""
        return f"{order}: shipped"

    tools: dict[str, Any] = {
        "search_kb": search_kb,
        "charge": charge,
        "notify": notify,
        "meet": meet,
        "boom": boom,
        "fatal": fatal,
        "hold": hold,
        "refund": tool(refund, approve=ask),
        "lookup_order": workflow_tool(orders_lookup),
        "lookup": lookup if DEPLOY == "a" else workflow_tool(orders_lookup),
    }
    return tools


@fusee.workflow("agent")
async def agent(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    model = ScriptedModel(script_of(arg), log=arg["model_log"])
    result = await loop(
        ctx,
        "agent",
        model=model,
        prompt=arg["prompt"],
        tools=tools_of(arg),
        max_iterations=arg.get("max_iterations", 6),
        parallel_tools=arg.get("parallel", True),
    )
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out


@fusee.workflow("evaluator")
async def evaluator(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    """Evaluator-optimizer with ``turn=`` (the user's own model call) and ``stop=``: each
    turn drafts and calls ``score``; ``stop`` judges the score in a step of its own."""
    effects = arg["effects"]
    scores = arg["scores"]

    def draft(state: LoopState, i: int) -> Turn:
        assert state.step is not None
        record(effects, f"turn:{len(state.history)}", state.step.key, state.step.attempt)
        args = msgspec.json.encode({"draft": f"draft {i}"}).decode()
        return Turn(
            text=f"draft {i}",
            tool_calls=[ToolCall(id=f"score-{i}", name="score", arguments=args)],
        )

    def score(draft: str) -> float:
        """Scores a draft."""
        return float(scores[draft])

    async def good_enough(state: LoopState, i: int) -> bool:
        mark = float(state.results[0].content)
        judged: bool = await ctx.step(f"judge-{i}", lambda: mark >= arg["bar"])
        return judged

    result = await loop(
        ctx,
        "refine",
        turn=draft,
        prompt=arg["prompt"],
        tools={"score": score},
        stop=good_enough,
        max_iterations=arg.get("max_iterations", 5),
    )
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out
