"""``fusee limits ls`` and ``fusee limits set``: rate and concurrency limits."""

from __future__ import annotations

import dataclasses
import sys

from fusee import LimitInfo
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.render import console, json_text, table
from fusee.errors import InvalidArgument, InvalidId

__all__ = ("limits_ls", "limits_set")

HEADER = ("LIMIT", "PER SECOND", "BURST", "CONCURRENT", "HOLDERS", "WAITERS")


def _row(i: LimitInfo) -> tuple[str, ...]:
    waiters = ", ".join(f"{k or '-'}: {n}" for k, n in i.waiters.items()) or "0"
    return (
        i.name,
        "-" if i.per_second is None else f"{i.per_second:g}",
        "-" if i.burst is None else str(i.burst),
        "-" if i.concurrent is None else str(i.concurrent),
        str(i.holders),
        waiters,
    )


async def limits_ls(opts: GlobalOptions) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        infos = await engine.limits()
    if opts.as_json:
        sys.stdout.write(json_text([dataclasses.asdict(i) for i in infos]) + "\n")
        return Exit.OK
    if not infos:
        sys.stderr.write(f"No limits in namespace {opts.namespace!r}.\n")
        return Exit.OK
    console().print(table(HEADER, [_row(i) for i in infos], right={1, 2, 3, 4}))
    return Exit.OK


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
            info = await engine.update_limit(name, **changes)
        except (InvalidId, InvalidArgument) as exc:
            raise CliError(str(exc), Exit.USAGE) from None
    if opts.as_json:
        sys.stdout.write(json_text(dataclasses.asdict(info)) + "\n")
    else:
        console().print(table(HEADER, [_row(info)], right={1, 2, 3, 4}))
    return Exit.OK
