"""Worker module: the limits worker (tests/workers/limits.py), whose limit actor dies (os._exit) right after it
journaled a grant and before it sent it, when $CRASH_FLAG exists (once)."""

import os
from pathlib import Path

from fusee.actors import limit_actor
from tests.workers.limits import limited  # noqa: F401  (registers the workflow)

_orig = limit_actor.LimitActor._send


async def _send(self, waiter, error):  # type: ignore[no-untyped-def]
    flag = Path(os.environ["CRASH_FLAG"])
    if flag.exists() and not error:
        flag.unlink()
        os._exit(9)
    await _orig(self, waiter, error)


limit_actor.LimitActor._send = _send  # type: ignore[method-assign]
