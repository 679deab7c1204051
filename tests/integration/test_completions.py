"""Completions (part of issue 3): human approval by callback URL.

``ctx.await_completion`` parks the run on a wait of kind ``completion`` whose token is an
HMAC over the run, its start, the position and the name; ``ask(cb)`` runs once as a step;
``engine.complete(token, value)`` completes it. Forged, reused and expired tokens are
rejected with ``fusee.InvalidToken``; completing twice with the same value is a no-op.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.runtime.records import StepCompleted, WaitDone, WaitStarted
from tests.helpers import registry_of as _registry
from tests.workers.procs import assert_chained, executions, wait_until

COMPLETIONS = Path(__file__).resolve().parent.parent / "workers" / "completions.py"

pytestmark = pytest.mark.timeout(90)


def _token(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _refunder(posted: list[str], ran: list[str], *, timeout: Any = None) -> Any:
    """The seed "approval before a tool runs": ask posts the URL, the tool runs after."""

    async def refunder(ctx: fusee.Context, arg: Any) -> dict[str, Any]:
        async def post(cb: fusee.Completion) -> None:
            posted.append(f"Refund {arg}? {cb.url}")

        approval = await ctx.await_completion("refund-ok", ask=post, timeout=timeout)
        if not approval["approved"]:
            return {"refunded": False, "reason": approval.get("reason")}

        def refund() -> str:
            ran.append("refund")
            return f"refunded {arg}"

        return {"refunded": True, "did": await ctx.step("tool:refund", refund)}

    return refunder


async def test_approval_before_a_tool_runs(
    nats_server: Any, namespace: str, engine: fusee.Engine
) -> None:
    posted: list[str] = []
    ran: list[str] = []
    base = "https://approve.example.com/fusee/"
    serving = await fusee.connect(nats_server.url, namespace=namespace, callback_base_url=base)
    try:
        async with serving.worker(registry=_registry(_refunder(posted, ran), "refunder")):
            run = await engine.start("refunder", "refund-9", "42 EUR")
            await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
            assert posted[0].startswith(
                "Refund 42 EUR? https://approve.example.com/fusee/v1/completions/"
            )
            assert ran == []  # the tool waits for the human
            assert (await run.describe()).status in ("running", "waiting")
            assert await engine.complete(_token(posted[0]), {"approved": True, "by": "ana"})
            assert await run.result(timeout=20) == {"refunded": True, "did": "refunded 42 EUR"}
    finally:
        await serving.close()
    assert ran == ["refund"]
    assert len(posted) == 1  # ask ran once, also under FUSEE_ALWAYS_REPLAY
    journal = await run.journal()
    assert_chained(journal)
    records = [r for _, r in journal]
    started = [r for r in records if isinstance(r, WaitStarted)]
    done = [r for r in records if isinstance(r, WaitDone)]
    assert [(w.wait, w.name, w.until) for w in started] == [("completion", "refund-ok", None)]
    assert [(d.wait, bytes(d.value)) for d in done] == [
        ("completion", b'{"approved":true,"by":"ana"}')
    ]
    steps = [r.name for r in records if isinstance(r, StepCompleted)]
    assert steps == ["ask/refund-ok", "tool:refund"]
    # the tool ran after the completion was journaled
    kinds = [type(r).__name__ for r in records]
    assert kinds.index("WaitDone") < len(kinds) - 1 - kinds[::-1].index("StepCompleted")


async def test_completing_twice_is_idempotent_and_another_value_is_refused(
    engine: fusee.Engine,
) -> None:
    posted: list[str] = []
    ran: list[str] = []
    async with engine.worker(registry=_registry(_refunder(posted, ran), "refunder")):
        run = await engine.start("refunder", "refund-twice", "7 EUR")
        await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
        token = _token(posted[0])
        # keys in another order are the same value
        assert await engine.complete(token, {"approved": True, "n": 1}) is True
        assert await engine.complete(token, {"n": 1, "approved": True}) is False
        with pytest.raises(fusee.InvalidToken, match="already used"):
            await engine.complete(token, {"approved": False})
        assert (await run.result(timeout=20))["refunded"] is True
    # after the run took it: the same value is still a no-op, another still refused
    assert await engine.complete(token, {"approved": True, "n": 1}) is False
    with pytest.raises(fusee.InvalidToken, match="already used"):
        await engine.complete(token, {"approved": True, "n": 2})
    assert ran == ["refund"]
    done = [r for _, r in await run.journal() if isinstance(r, WaitDone)]
    assert len(done) == 1


async def test_forged_and_malformed_tokens_are_rejected(engine: fusee.Engine) -> None:
    posted: list[str] = []
    async with engine.worker(registry=_registry(_refunder(posted, []), "refunder")):
        run = await engine.start("refunder", "refund-forged", "1 EUR")
        await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
        token = _token(posted[0])
        run_part, pos, mac_part = token.split(".")
        mac = bytearray(base64.urlsafe_b64decode(mac_part + "=" * (-len(mac_part) % 4)))
        mac[5] ^= 0x01  # flip one bit
        forged = f"{run_part}.{pos}.{base64.urlsafe_b64encode(bytes(mac)).rstrip(b'=').decode()}"
        with pytest.raises(fusee.InvalidToken, match="forged"):
            await engine.complete(forged, {"approved": True})
        with pytest.raises(fusee.InvalidToken, match="no such completion wait"):
            await engine.complete(f"{run_part}.{int(pos) + 5}.{mac_part}", {"approved": True})
        for bad in ("", "abc", "a.b.c", f"{run_part}.x.{mac_part}", f"{run_part}.{pos}.AAAA", 42):
            with pytest.raises(fusee.InvalidToken, match="malformed"):
                await engine.complete(bad, {"approved": True})  # type: ignore[arg-type]
        assert len(token.split(".")[2]) >= 22  # at least 128 bits of MAC (here 256)
        # the run still waits, and the real token still works
        assert await engine.complete(token, {"approved": False, "reason": "no"})
        assert await run.result(timeout=20) == {"refunded": False, "reason": "no"}


async def test_a_token_for_another_run_is_rejected(engine: fusee.Engine) -> None:
    posted: list[str] = []
    async with engine.worker(registry=_registry(_refunder(posted, []), "refunder")):
        a = await engine.start("refunder", "refund-a", "a")
        await wait_until(lambda: len(posted) == 1, timeout=20, what="run a to ask")
        b = await engine.start("refunder", "refund-b", "b")
        await wait_until(lambda: len(posted) == 2, timeout=20, what="run b to ask")
        token_a, token_b = _token(posted[0]), _token(posted[1])
        assert token_a.split(".")[1] == token_b.split(".")[1]  # same position
        # a's MAC replayed for run b: swap the run part
        swapped = ".".join([token_b.split(".")[0], *token_a.split(".")[1:]])
        with pytest.raises(fusee.InvalidToken, match="forged"):
            await engine.complete(swapped, {"approved": True})
        # and for a run that does not exist
        ghost = base64.urlsafe_b64encode(b"no-such-run").rstrip(b"=").decode()
        with pytest.raises(fusee.InvalidToken, match="no such completion wait"):
            await engine.complete(".".join([ghost, *token_a.split(".")[1:]]), True)
        assert await engine.complete(token_a, {"approved": False, "reason": "a"})
        assert await engine.complete(token_b, {"approved": False, "reason": "b"})
        assert await a.result(timeout=20) == {"refunded": False, "reason": "a"}
        assert await b.result(timeout=20) == {"refunded": False, "reason": "b"}


async def test_another_namespace_rejects_the_token(nats_server: Any, engine: fusee.Engine) -> None:
    posted: list[str] = []
    async with engine.worker(registry=_registry(_refunder(posted, []), "refunder")):
        await engine.start("refunder", "refund-ns", "x")
        await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
    other = await fusee.connect(nats_server.url, namespace=engine.namespace + "x")
    try:
        with pytest.raises(fusee.InvalidToken):
            await other.complete(_token(posted[0]), {"approved": True})
    finally:
        await other.close()


async def test_an_expired_token_is_rejected_and_the_wait_raises_timeout(
    engine: fusee.Engine,
) -> None:
    posted: list[str] = []

    async def impatient(ctx: fusee.Context, _arg: Any) -> str:
        try:
            await ctx.await_completion("ok", ask=lambda cb: posted.append(cb.url), timeout="300ms")
        except fusee.Timeout as exc:
            return f"gave up: {exc}"
        return "approved"

    async with engine.worker(registry=_registry(impatient, "impatient")):
        run = await engine.start("impatient", "refund-expired", None)
        assert await run.result(timeout=20) == "gave up: no completion 'ok' within 300ms"
    with pytest.raises(fusee.InvalidToken, match="expired"):
        await engine.complete(_token(posted[0]), {"approved": True})
    assert len(posted) == 1


async def test_a_rejection_is_a_value_like_any_other(engine: fusee.Engine) -> None:
    posted: list[str] = []
    ran: list[str] = []
    async with engine.worker(registry=_registry(_refunder(posted, ran), "refunder")):
        run = await engine.start("refunder", "refund-no", "900 EUR")
        await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
        assert await engine.complete(
            _token(posted[0]), {"approved": False, "reason": "over the limit"}
        )
        assert await run.result(timeout=20) == {"refunded": False, "reason": "over the limit"}
    assert ran == []
    assert (await run.describe()).status == "completed"


@dataclass
class Approval:
    approved: bool
    reason: str = ""


async def test_the_value_is_decoded_into_type(engine: fusee.Engine) -> None:
    posted: list[fusee.Completion] = []

    async def typed(ctx: fusee.Context, _arg: Any) -> str:
        ok = await ctx.await_completion("ok", ask=posted.append, type=Approval)
        assert isinstance(ok, Approval)
        return f"{ok.approved} {ok.reason}"

    async with engine.worker(registry=_registry(typed, "typed")):
        run = await engine.start("typed", "refund-typed", None)
        await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
        cb = posted[0]
        assert isinstance(cb, fusee.Completion)
        assert cb.url.endswith(f"/v1/completions/{cb.token}")
        assert cb.name == "ok"
        assert await engine.complete(cb.token, {"approved": False, "reason": "late"})
        assert await run.result(timeout=20) == "False late"


async def test_a_failed_ask_fails_the_wait_and_expires_its_token(engine: fusee.Engine) -> None:
    tokens: list[str] = []

    def broken(cb: fusee.Completion) -> None:
        tokens.append(cb.token)
        raise fusee.FatalError("slack is down")

    async def asks(ctx: fusee.Context, _arg: Any) -> str:
        try:
            await ctx.await_completion("ok", ask=broken)
        except fusee.StepFailedError as exc:
            await ctx.wait_for("go")  # keep the run alive, waiting elsewhere
            return f"{exc.step}: {exc.message}"
        return "asked"

    async with engine.worker(registry=_registry(asks, "asks")):
        run = await engine.start("asks", "refund-ask-fails", None)
        await wait_until(lambda: tokens, timeout=20, what="the ask")

        async def ask_failed() -> bool:
            return any(type(r).__name__ == "StepFailed" for _, r in await run.journal())

        await wait_until(ask_failed, timeout=20, what="the ask step to fail")
        with pytest.raises(fusee.InvalidToken, match="ask step failed"):
            await engine.complete(tokens[0], {"approved": True})
        await run.signal("go")
        assert await run.result(timeout=20) == "ask/ok: slack is down"


async def test_a_replay_returns_the_same_value_and_asks_once(engine: fusee.Engine) -> None:
    posted: list[str] = []

    async def two_waits(ctx: fusee.Context, _arg: Any) -> list[Any]:
        first = await ctx.await_completion("first", ask=lambda cb: posted.append(cb.url))
        # parks the run (it leaves memory): the signal brings it back by replay
        second = await ctx.wait_for("go")
        return [first, second]

    async with engine.worker(registry=_registry(two_waits, "two-waits")) as worker:
        run = await engine.start("two-waits", "refund-replay", None)
        await wait_until(lambda: posted, timeout=20, what="the approval to be asked")
        token = _token(posted[0])
        assert await engine.complete(token, {"approved": True, "v": 1})

        async def parked() -> bool:
            return "refund-replay" in worker.parked and "refund-replay" not in worker.actors

        await wait_until(parked, timeout=20, what="the run to park on its second wait")
        with pytest.raises(fusee.InvalidToken, match="already used"):
            await engine.complete(token, {"approved": True, "v": 2})
        assert await run.signal("go", "now")
        assert await run.result(timeout=20) == [{"approved": True, "v": 1}, "now"]
    assert len(posted) == 1  # the ask step was replayed, not run again


async def test_killed_while_waiting_for_a_completion(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    workers.module = COMPLETIONS
    first = await workers.start()
    log, asked = tmp_path / "effects.log", tmp_path / "asked.txt"
    run = await engine.start("refunder", "refund-kill", {"log": str(log), "asked": str(asked)})
    await first.wait_for("wait.started", run_id="refund-kill", timeout=15)
    await wait_until(
        lambda: asked.exists() and asked.read_text().strip(), timeout=15, what="the ask"
    )
    first.kill()
    token = _token(asked.read_text().split()[-1])
    assert await engine.complete(token, {"approved": True})  # no worker alive
    assert await engine.complete(token, {"approved": True}) is False
    await workers.start()
    result = await run.result(timeout=30)
    assert result == {"approval": {"approved": True}, "did": "refunded"}
    counts = executions(log)
    assert sorted(counts.values()) == [1, 1], counts  # ask and refund once each
    assert asked.read_text().count("Refund?") == 1
    journal = await run.journal()
    assert_chained(journal)
    assert sum(isinstance(r, WaitDone) for _, r in journal) == 1
