"""A worker process for the benchmarks: ``python -m bench.worker URL NAMESPACE``."""

from __future__ import annotations

import sys

import anyio

import bench.workflows  # noqa: F401 - registers the workflows
import fusee


async def main(url: str, namespace: str) -> None:
    engine = await fusee.connect(url, namespace=namespace)
    print("ready", flush=True)
    await engine.serve()


if __name__ == "__main__":
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, sys.argv[1], sys.argv[2])
