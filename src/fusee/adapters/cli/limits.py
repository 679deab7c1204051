"""``fusee limits ls`` and ``fusee limits set``: rate and concurrency limits."""

from __future__ import annotations

import dataclasses
import sys

from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.render import json_text
from fusee.errors import InvalidArgument, InvalidId

__all__ = ("limits_ls", "limits_set")


async def limits_ls(opts: GlobalOptions, *, as_json: bool) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        infos = await engine.limits()
    if as_json:
        sys.stdout.write(json_text([dataclasses.asdict(i) for i in infos]) + "\n")
        return 0
    if not infos:
        sys.stderr.write(f"No limits in namespace {opts.namespace!r}.\n")
        return 0
    rows = [("LIMIT", "PER SECOND", "BURST", "CONCURRENT", "HOLDERS", "WAITERS")]
    for i in infos:
        waiters = ", ".join(f"{k or '-'}: {n}" for k, n in i.waiters.items()) or "0"
        rows.append(
            (
                i.name,
                "-" if i.per_second is None else f"{i.per_second:g}",
                "-" if i.burst is None else str(i.burst),
                "-" if i.concurrent is None else str(i.concurrent),
                str(i.holders),
                waiters,
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write(
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n"
        )
    return 0


async def limits_set(
    opts: GlobalOptions,
    name: str,
    *,
    per_second: float | None,
    burst: int | None,
    concurrent: int | None,
) -> int:
    # what is not given keeps its value (engine.limit() replaces the whole config)
    given = {"per_second": per_second, "burst": burst, "concurrent": concurrent}
    changes = {k: v for k, v in given.items() if v is not None}
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            await engine.update_limit(name, **changes)
        except (InvalidId, InvalidArgument) as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    return 0
