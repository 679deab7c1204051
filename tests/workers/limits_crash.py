"""Worker module: the limits worker (tests/workers/limits.py), whose limit actor dies
(os._exit) right after it journaled a grant and before it sent it, when $CRASH_FLAG
exists (once). ``$CRASH_AT``: ``send`` (the default: the grant to a run's inbox; steps
here never ask on core NATS, so every grant is sent that way) or ``answer`` (the answer
to a permit asked on core NATS)."""

import os
from pathlib import Path

from fusee.actors import limit_actor
from fusee.actors.core import ActorCore
from tests.workers.limits import limited  # noqa: F401  (registers the workflow)

_send, _answer = limit_actor.LimitActor._send, limit_actor.LimitActor._answer
AT = os.environ.get("CRASH_AT", "send")


def _crash_now() -> bool:
    flag = Path(os.environ["CRASH_FLAG"])
    if flag.exists():
        flag.unlink()
        return True
    return False


async def send(self, waiter, error, **options):  # type: ignore[no-untyped-def]
    if AT == "send" and not error and _crash_now():
        os._exit(9)
    await _send(self, waiter, error, **options)


async def answer(self, grant, reply):  # type: ignore[no-untyped-def]
    if AT == "answer" and _crash_now():
        os._exit(9)
    await _answer(self, grant, reply)


async def no_ask(self, eid, fairness, key, *_, **__):  # type: ignore[no-untyped-def]
    return None


limit_actor.LimitActor._send = send  # type: ignore[method-assign]
limit_actor.LimitActor._answer = answer  # type: ignore[method-assign]
if AT == "send":
    ActorCore._ask = no_ask  # type: ignore[method-assign]
