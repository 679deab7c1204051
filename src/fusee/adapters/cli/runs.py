"""``fusee runs ...`` and ``fusee streams follow``: what each does, as async functions
of the options returning an exit code. ``--json`` (``opts.as_json``) makes each print
JSON with stable keys instead of text; the keys are listed in docs/reference/cli.md."""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import msgspec

import fusee
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions, command_hint
from fusee.adapters.cli.render import (
    RunsTable,
    format_journal,
    format_run,
    json_end,
    json_item,
    json_text,
)
from fusee.errors import ConfigError, NotPausedError, RunCancelled, RunFailed, Timeout
from fusee.runtime.durations import parse_duration
from fusee.runtime.ids import validate_id, validate_name

__all__ = (
    "runs_start",
    "runs_list",
    "runs_show",
    "runs_journal",
    "runs_result",
    "runs_cancel",
    "runs_resume",
    "runs_signal",
    "streams_follow",
    "read_input",
    "check_run_id",
)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _json(value: Any) -> None:
    _out(json_text(value))


def check_run_id(run_id: str) -> str:
    """``run_id`` checked: an invalid one is a usage error (exit 2)."""
    try:
        return validate_id(run_id, "run ID")
    except fusee.InvalidId as exc:
        raise CliError(str(exc), Exit.USAGE) from None


def _duration(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = parse_duration(text, flag)
    except ConfigError as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    if value < 0:
        raise CliError(f"{flag} {text}: must not be negative", Exit.USAGE)
    return value


def read_input(text: str, what: str = "--input") -> Any:
    """``--input``'s value: JSON, ``@PATH`` (a file holding JSON) or ``@-`` (stdin)."""
    source = what
    if text.startswith("@"):
        path = text[1:]
        source = "stdin" if path == "-" else path
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text()
        except OSError as exc:
            raise CliError(f"{what} {text}: {exc.strerror or exc}", Exit.USAGE) from None
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise CliError(f"{what}: {source} is not JSON ({exc})", Exit.USAGE) from None


# -- starting and waiting ------------------------------------------------------------


def _ended(run_id: str, exc: RunFailed) -> CliError:
    if isinstance(exc, RunCancelled):
        return CliError(f"run {run_id!r} was cancelled: {exc.reason}", name="run_cancelled")
    return CliError(f"run {run_id!r} failed: {exc.error_type}: {exc.message}", name="run_failed")


async def runs_start(
    opts: GlobalOptions,
    workflow: str,
    *,
    run_id: str | None,
    arg: str,
    timeout: str | None,
    wait: bool,
) -> int:
    """Start ``workflow`` as ``run_id`` (idempotent by ID: the same start again is the
    same run); with ``wait``, wait for its end and print its result as ``runs result``."""
    try:
        workflow = validate_name(workflow, "workflow name")
    except fusee.InvalidId as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    run_id = check_run_id(run_id) if run_id is not None else f"{workflow}-{uuid.uuid4().hex[:12]}"
    value = read_input(arg)
    limit = _duration(timeout, "--timeout")
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            run = await engine.start(workflow, run_id, value, timeout=limit)
        except fusee.RunExists as exc:
            raise CliError(str(exc), name="run_exists") from None
        if not wait:
            if opts.as_json:
                _json({"run_id": run.run_id, "workflow": workflow})
            else:
                _out(f"started run {run.run_id!r} of {workflow}")
                sys.stderr.write(f"see it with: {command_hint('runs', 'show', run.run_id)}\n")
            return Exit.OK
        try:
            result = await run.result()
        except RunFailed as exc:
            raise _ended(run.run_id, exc) from None
    _json(
        {"run_id": run.run_id, "workflow": workflow, "result": result} if opts.as_json else result
    )
    return Exit.OK


async def runs_result(opts: GlobalOptions, run_id: str, *, timeout: str | None) -> int:
    run_id = check_run_id(run_id)
    limit = _duration(timeout, "--timeout")
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        info = await run.describe()
        if info.status == "paused":
            raise CliError(
                f"run {run_id!r} is paused, so it has no result yet: {info.reason}",
                Exit.NOT_YET,
                name="paused",
            )
        try:
            value = await run.result(timeout=limit)
        except RunFailed as exc:
            raise _ended(run_id, exc) from None
        except Timeout:
            raise CliError(
                f"run {run_id!r} did not end within {timeout} (status: {info.status}); "
                f"wait longer with --timeout, or see `{command_hint('runs', 'show', run_id)}`",
                Exit.NOT_YET,
            ) from None
    _json({"run_id": run_id, "result": value} if opts.as_json else value)
    return Exit.OK


# -- reading ---------------------------------------------------------------------------


async def runs_list(
    opts: GlobalOptions,
    *,
    status: str | None,
    workflow: str | None,
    as_json: bool,
    since: str | None = None,
    until: str | None = None,
    id_prefix: str | None = None,
    as_jsonl: bool = False,
) -> int:
    """Print the runs: with a filter, streamed from the index a page at a time (rows
    printed as each page comes, newest first within it; memory a page's, and the IDs
    of the runs not ended listed so far), read from the parts of the index the filter
    can match, one after the other (without a status: the runs not ended, then the
    paused, then the ended by status); without one, every run of the index, newest
    first (``Engine.list_runs``, which also reads the entries of earlier versions that
    filters do not). ``as_json``: one JSON array; ``as_jsonl``: one compact JSON object
    a line (a reader that stops early leaves no array unclosed)."""
    if as_json and as_jsonl:
        raise CliError("--json and --jsonl: give one of them", Exit.USAGE)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        if (status, workflow, since, until, id_prefix) == (None,) * 5:
            pages: AsyncGenerator[list[fusee.RunInfo], None] = _one_page(await engine.list_runs())
        else:
            pages = engine.runs(
                status=status,
                workflow=workflow,
                since=since,
                until=until,
                id_prefix=id_prefix,
            )
        table = RunsTable(now=time.time())
        count = 0
        async with contextlib.aclosing(pages):
            async for found in pages:
                if not found:
                    continue  # (no header before the first row)
                found.sort(key=lambda i: i.created_at, reverse=True)
                if as_jsonl:  # a line a run
                    text = "".join(msgspec.json.encode(i).decode() + "\n" for i in found)
                elif as_json:  # one JSON array, an item at a time
                    text = "".join(json_item(i, first=count + n == 0) for n, i in enumerate(found))
                else:
                    text = "".join(line + "\n" for line in table.page(found))
                sys.stdout.write(text)
                sys.stdout.flush()  # as they come, also into a pipe
                count += len(found)
    if as_json:
        _out(json_end(count > 0))
        return Exit.OK
    if not count and not as_jsonl:
        filters = " and ".join(
            f for f in (status and f"status {status}", workflow and f"workflow {workflow}") if f
        )
        sys.stderr.write(
            f"No runs{' with ' + filters if filters else ''} in namespace {opts.namespace!r}.\n"
        )
    return Exit.OK


async def _one_page(infos: list[fusee.RunInfo]) -> AsyncGenerator[list[fusee.RunInfo], None]:
    yield infos


async def runs_show(opts: GlobalOptions, run_id: str, *, as_json: bool) -> int:
    run_id = check_run_id(run_id)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        info = await run.describe()
        journal = await run.journal()
        stream = engine.store.layout.stream
    if as_json:
        entries = [{"seq": seq, "record": record} for seq, record in journal]
        _json({"run": info, "journal": entries})
        return Exit.OK
    _out("\n".join(format_run(info, journal, now=time.time(), stream=stream)))
    return Exit.OK


async def runs_journal(opts: GlobalOptions, run_id: str, *, after: int, limit: int | None) -> int:
    """The run's journal, oldest first, from the record after stream sequence ``after``,
    at most ``limit`` records: one line each, or with ``--json`` ``{"run_id", "records":
    [{"seq", "record"}], "next"}`` where ``next`` is the ``--after`` of the next page
    (``null`` at the end)."""
    run_id = check_run_id(run_id)
    if after < 0:
        raise CliError(f"--after {after}: a stream sequence is >= 0", Exit.USAGE)
    if limit is not None and limit < 1:
        raise CliError(f"--limit {limit}: at least 1", Exit.USAGE)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        await run.describe()  # an unknown run is not found, not an empty journal
        records = await run.journal(after=after)
    page = records[:limit] if limit is not None else records
    more = limit is not None and len(records) > limit
    if opts.as_json:
        entries = [{"seq": seq, "record": record} for seq, record in page]
        _json({"run_id": run_id, "records": entries, "next": page[-1][0] if more else None})
        return Exit.OK
    if page:
        _out("\n".join(format_journal(page, indent="")))
    if more:
        hint = command_hint("runs", "journal", run_id, "--after", str(page[-1][0]))
        sys.stderr.write(f"more: {hint}\n")
    return Exit.OK


# -- acting on a run -------------------------------------------------------------------


async def runs_cancel(opts: GlobalOptions, run_id: str, *, reason: str) -> int:
    run_id = check_run_id(run_id)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        if not await engine.run(run_id).cancel(reason):
            raise CliError(f"run {run_id!r} has already ended; nothing to cancel", name="ended")
    if opts.as_json:
        _json({"run_id": run_id, "action": "cancel", "reason": reason})
    else:
        _out(f"asked run {run_id!r} to stop: {reason}")
    return Exit.OK


async def runs_resume(opts: GlobalOptions, run_id: str, *, force: bool) -> int:
    run_id = check_run_id(run_id)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            await engine.run(run_id).resume(force=force)
        except NotPausedError as exc:
            raise CliError(str(exc), name="not_paused") from None
    if opts.as_json:
        _json({"run_id": run_id, "action": "resume", "force": force})
    else:
        _out(f"asked run {run_id!r} to resume{' (forced)' if force else ''}")
    return Exit.OK


async def runs_signal(
    opts: GlobalOptions, run_id: str, name: str, payload: str, *, key: str | None
) -> int:
    run_id = check_run_id(run_id)
    try:
        name = validate_name(name, "signal name")
        if key is not None:
            validate_id(key, "idempotency key")
    except fusee.InvalidId as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError as exc:
        raise CliError(f"the payload is not JSON ({exc}): {payload!r}", Exit.USAGE) from None
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        if not await engine.run(run_id).signal(name, value, key=key):
            raise CliError(
                f"run {run_id!r} has already ended; the signal was not stored", name="ended"
            )
    if opts.as_json:
        _json({"run_id": run_id, "action": "signal", "signal": name})
    else:
        _out(f"signal {name!r} stored for run {run_id!r}")
    return Exit.OK


# -- fusee streams ---------------------------------------------------------------------


async def streams_follow(opts: GlobalOptions, run_id: str, name: str, *, offset: int) -> int:
    """Print the stream's token text as it comes, from token ``offset``, until its end.

    stdout gets the text only, flushed token by token. An attempt boundary (the model
    call started over) is a note on stderr, so piped text stays the text. With
    ``--json``, one compact JSON object a line per event (``kind``, ``index``, ``text``,
    ``attempt``), the ``end`` included.
    """
    run_id = check_run_id(run_id)
    try:
        name = validate_name(name, "stream name")
    except fusee.InvalidId as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    if offset < 0:
        raise CliError(f"--from {offset}: a token index must not be negative", Exit.USAGE)
    out = sys.stdout
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        await run.describe()  # an unknown run fails at once, not after a wait
        last = ""
        async for ev in run.stream_events(name, offset=offset):
            if opts.as_json:
                event = {"kind": ev.kind, "index": ev.index, "text": ev.text, "attempt": ev.attempt}
                out.write(msgspec.json.encode(event).decode() + "\n")
                out.flush()
                if ev.kind == "end":
                    break
                continue
            if ev.kind == "token":
                out.write(ev.text)
                out.flush()
                last = ev.text or last
            elif ev.kind == "attempt" and ev.attempt > 1:
                if last and not last.endswith("\n"):
                    out.write("\n")
                    out.flush()
                sys.stderr.write(
                    f"-- attempt {ev.attempt}: the model call started over at token "
                    f"{ev.index}; the text above is from the attempt before\n"
                )
                sys.stderr.flush()
            elif ev.kind == "end":
                break
    if last and not last.endswith("\n") and out.isatty():
        out.write("\n")  # the shell prompt on a line of its own
    out.flush()
    return Exit.OK
