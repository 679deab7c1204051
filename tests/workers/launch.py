"""Run one fusee worker in its own process, for tests that kill, stop and restart workers.

    python tests/workers/launch.py --nats URL --namespace NS --module tests/workers/chain.py

The module file is imported first (its ``@fusee.workflow`` decorators register the
workflows), then the worker serves until SIGTERM/SIGINT. Logs are JSON lines on stderr,
so a test can wait for an event (``worker.started``, ``actor.fenced``...).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
from pathlib import Path

import anyio
import structlog

import fusee

# Worker modules import shared helpers as ``tests.workers.effects``: run as a script,
# this file only has its own folder on sys.path, so put the repository root there too.
ROOT = Path(__file__).resolve().parents[2]
# Worker modules are imported by path (below), not by name; this directory on sys.path
# (the script's own, put there by Python) would make tests/workers/agents.py shadow the
# OpenAI Agents SDK's ``agents`` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _import_file(path: str) -> None:
    file = Path(path).resolve()
    name = f"fusee_test_workers_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


async def _main(args: argparse.Namespace) -> None:
    engine = await fusee.connect(args.nats, namespace=args.namespace, partitions=args.partitions)
    try:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(on_signal)
            await engine.serve()
    finally:
        with anyio.CancelScope(shield=True):
            await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nats", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--partitions", type=int, default=None)
    args = parser.parse_args()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    _import_file(args.module)
    anyio.run(_main, args)


if __name__ == "__main__":
    main()
