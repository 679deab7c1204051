"""The ``fusee`` CLI, SIGKILLed by itself once a bulk action has done N runs: an
interruption at a known point, for the tests that run an interrupted bulk operation again.

``python -m tests.workers.bulk_cli N runs bulk resume ...``: the engine's bulk methods
are wrapped so that the CLI's per-run callback (``on_run``) is followed by a count of the
runs done; the product code has no hook for it.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import fusee
from fusee.adapters.cli.main import main

Bulk = Callable[..., Awaitable[fusee.BulkSummary]]


def killing_after(after: int, method: Bulk) -> Bulk:
    """``method`` (``Engine.bulk_resume`` or ``bulk_cancel``) with its ``on_run``
    followed by a SIGKILL of this process once ``after`` runs are done."""

    @functools.wraps(method)
    async def bulk(self: fusee.Engine, *args: Any, on_run: Any = None, **kwargs: Any) -> Any:
        done = 0

        def tell(info: fusee.RunInfo, what: str) -> None:
            nonlocal done
            if on_run is not None:
                on_run(info, what)
            done += what == "done"
            if done >= after:
                os.kill(os.getpid(), signal.SIGKILL)

        return await method(self, *args, on_run=tell, **kwargs)

    return bulk


if __name__ == "__main__":
    count = int(sys.argv[1])
    fusee.Engine.bulk_resume = killing_after(count, fusee.Engine.bulk_resume)  # type: ignore[method-assign,assignment]
    fusee.Engine.bulk_cancel = killing_after(count, fusee.Engine.bulk_cancel)  # type: ignore[method-assign,assignment]
    sys.exit(main(sys.argv[2:]))
