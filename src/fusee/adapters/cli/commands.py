"""What each ``fusee`` command does, as async functions returning an exit code."""

from __future__ import annotations

import contextlib
import inspect
import re
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

import fusee
from fusee.actors.registry import REGISTRY
from fusee.adapters.cli.loader import load_file
from fusee.adapters.cli.options import GlobalOptions, command_hint
from fusee.adapters.cli.render import (
    RunsTable,
    format_run,
    json_end,
    json_item,
    json_text,
)
from fusee.errors import NotPausedError, RunCancelled, RunFailed, Timeout
from fusee.logs import get_logger
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.ids import unescape, validate_id, validate_name

if TYPE_CHECKING:
    from fusee.actors.worker import Worker
    from fusee.adapters.http.server import Bound

__all__ = (
    "CliError",
    "open_engine",
    "dev",
    "worker",
    "api",
    "runs_list",
    "runs_show",
    "runs_result",
    "streams_follow",
)

log = get_logger()

# Every network wait has a deadline. A worker may be started while NATS is still
# coming up (compose, a restarting cluster), so it waits longer than a query does.
CONNECT_TIMEOUT_QUERY = 10.0
CONNECT_TIMEOUT_SERVE = 30.0
# `fusee dev` lets work that its file's main started, and did not wait for, finish this
# long before it stops
DEV_FINISH = 30.0


class CliError(Exception):
    """An error to print as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


@contextlib.asynccontextmanager
async def open_engine(
    opts: GlobalOptions, *, connect_timeout: float
) -> AsyncIterator[fusee.Engine]:
    """Connect as the options say; close (and stop an embedded server we started) on exit."""
    if opts.nats is not None:
        try:
            with anyio.fail_after(connect_timeout):
                engine = await fusee.connect(opts.nats, namespace=opts.namespace)
        except TimeoutError:
            raise CliError(
                f"cannot reach NATS at {_redact(opts.nats)} "
                f"(no connection within {format_duration(connect_timeout)})"
            ) from None
    else:
        # Shielded: a Ctrl-C here must not leave a started server without its owner.
        with anyio.CancelScope(shield=True):
            engine = await fusee.connect(namespace=opts.namespace, store_dir=opts.store)
    # its block: object keys made without engine= (in a worker's handlers too) use it;
    # it closes the engine on the way out, shielded from a Ctrl-C
    async with engine:
        yield engine


async def _until_signal(body: Callable[[], Awaitable[None]]) -> int | None:
    """Run ``body`` until it returns or SIGINT/SIGTERM arrives, which cancel it so its
    cleanup runs (a worker hands its partitions over); returns that signal's number,
    None when ``body`` returned by itself."""
    stopped: int | None = None
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def watch() -> None:
                nonlocal stopped
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if scope.cancel_called:
                        log.info("cli.still_stopping", signal=name)
                    else:
                        log.info("cli.stopping", signal=name)
                        stopped = signum
                        scope.cancel()

            tg.start_soon(watch)
            try:
                with scope:
                    await body()
            finally:
                tg.cancel_scope.cancel()
    return stopped


async def stoppable(command: Callable[[], Awaitable[int]]) -> int:
    """Run a one-shot command (``runs``, ``objects``, ``streams``) so that SIGINT or
    SIGTERM cancels it and its cleanup runs (an embedded server it started is stopped,
    not left running without its owner): exit 130 or 143, as a shell reports."""
    code = 0

    async def body() -> None:
        nonlocal code
        code = await command()

    stopped = await _until_signal(body)
    return 128 + stopped if stopped is not None else code


def _load(files: Sequence[str]) -> list[Any]:
    return [load_file(f) for f in files]


def _dev_main(module: Any, path: str) -> Callable[[fusee.Engine], Awaitable[Any]] | None:
    main = getattr(module, "main", None)
    if main is None:
        return None
    if not inspect.iscoroutinefunction(main):
        raise CliError(f"{path}: main must be defined as `async def main(engine)`")
    params = inspect.signature(main).parameters
    if len(params) != 1:
        raise CliError(f"{path}: main must take one argument, the engine: `async def main(engine)`")
    fn: Callable[[fusee.Engine], Awaitable[Any]] = main
    return fn


# -- fusee dev / fusee worker ---------------------------------------------------------


async def dev(opts: GlobalOptions, file: str, *, serve: bool, api_port: int | None = None) -> int:
    """Import ``file``, run a worker, await the file's ``main(engine)`` if it has one.

    With ``api_port``, the HTTP API serves on 127.0.0.1 at that port too, and the command
    keeps serving after ``main`` returns (as with ``serve``), so the API stays up.
    """
    if api_port is not None:
        _check_port(api_port, "--api-port")
        serve = True
    module = load_file(file)
    main = _dev_main(module, file)
    if not REGISTRY.names() and not REGISTRY.object_names():
        log.warning(
            "dev.nothing_to_serve", file=file, hint="define a fusee.workflow or fusee.object"
        )

    async def body() -> None:
        async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_SERVE) as engine:
            where = f"embedded, store {opts.store}" if opts.nats is None else "external"
            log.info("dev.connected", nats=_redact(engine.url), server=where)
            dev_token = await _print_dev_token(engine)
            try:
                async with engine.worker() as worker, anyio.create_task_group() as tg:
                    if api_port is not None:
                        await tg.start(_serve_api, engine, "127.0.0.1", api_port)
                    if main is not None:
                        await main(engine)
                    if serve or main is None:
                        log.info(
                            "dev.serving",
                            workflows=REGISTRY.names(),
                            objects=REGISTRY.object_names(),
                            stop="Ctrl-C",
                        )
                        await anyio.sleep_forever()
                    await _finish_work(worker)
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True), contextlib.suppress(fusee.FuseeError):
                    await engine.tokens.revoke(dev_token)

    await _until_signal(body)
    return 0


DEV_TOKEN_TTL = "1d"  # revoked when fusee dev stops; this bounds one left by a kill


async def _print_dev_token(engine: fusee.Engine) -> str:
    """Make an admin token for this ``fusee dev`` and print it on stdout (never in the
    log): the HTTP API asks for one. Revoked when ``fusee dev`` stops."""
    made = await engine.tokens.create("admin", name="fusee dev", ttl=DEV_TOKEN_TTL)
    sys.stdout.write(
        f"fusee dev: API token (admin, revoked when fusee dev stops): {made.token}\n"
        f"  curl -H 'Authorization: Bearer {made.token}' ...\n"
    )
    sys.stdout.flush()
    return made.id


async def _finish_work(worker: Worker, patience: float = DEV_FINISH) -> None:
    """Before ``fusee dev`` stops after ``main``: let what ``main`` started without
    waiting for it (a ``send``, a run it did not await) finish or park, for at most
    ``patience`` seconds; then say what is left (it goes on at the next start)."""
    left = await worker.unfinished()
    if not left:
        return
    log.info("dev.finishing", actors=len(left), patience=format_duration(patience), stop="Ctrl-C")
    with anyio.move_on_after(patience):
        while left:
            await anyio.sleep(0.1)
            left = await worker.unfinished()
    if left:
        log.warning(
            "dev.work_left",
            actors=sorted(unescape(e) for e in left)[:10],
            hint="it goes on when a worker of this namespace runs again (fusee dev --serve)",
        )


async def worker(opts: GlobalOptions, files: Sequence[str]) -> int:
    """Import ``files`` and execute runs until SIGINT or SIGTERM."""
    _load(files)
    if not REGISTRY.names():
        log.warning("worker.no_workflows", files=list(files))

    async def body() -> None:
        async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_SERVE) as engine:
            await engine.serve()

    await _until_signal(body)
    return 0


# -- fusee api ------------------------------------------------------------------------


def _check_port(port: int, flag: str) -> None:
    if not 0 <= port <= 65535:
        raise CliError(f"{flag} {port}: a port is a number from 0 to 65535 (0: any free port)")


async def _serve_api(
    engine: fusee.Engine,
    host: str,
    port: int,
    keepalive: float = 15.0,
    *,
    max_body: int = 1 << 20,
    auth: bool = True,
    task_status: anyio.abc.TaskStatus[Bound] = anyio.TASK_STATUS_IGNORED,
) -> None:
    # Imported here: the HTTP stack (starlette, uvicorn) loads only for commands that serve it.
    from fusee.adapters.http.server import serve_api

    try:
        await serve_api(
            engine,
            host=host,
            port=port,
            keepalive=keepalive,
            max_body=max_body,
            auth=auth,
            task_status=task_status,
        )
    except OSError as exc:
        raise CliError(
            f"cannot serve the HTTP API on {host}:{port}: {exc.strerror or exc}"
        ) from None


async def api(
    opts: GlobalOptions,
    *,
    host: str,
    port: int,
    keepalive: str = "15s",
    max_body: str = "1MiB",
    auth: bool = True,
) -> int:
    """Serve the HTTP API on ``host:port`` until SIGINT or SIGTERM."""
    from fusee.adapters.http.limits import parse_size

    _check_port(port, "--port")
    every = parse_duration(keepalive, "--keepalive")
    if every <= 0:
        raise CliError(f"--keepalive {keepalive}: must be more than 0")
    try:
        limit = parse_size(max_body, "--max-body")
    except ValueError as exc:
        raise CliError(str(exc)) from None

    async def body() -> None:
        async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_SERVE) as engine:
            await _serve_api(engine, host, port, every, max_body=limit, auth=auth)

    await _until_signal(body)
    return 0


# -- fusee runs ------------------------------------------------------------------------


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
        return 0
    if not count and not as_jsonl:
        filters = " and ".join(
            f for f in (status and f"status {status}", workflow and f"workflow {workflow}") if f
        )
        sys.stderr.write(
            f"No runs{' with ' + filters if filters else ''} in namespace {opts.namespace!r}.\n"
        )
    return 0


async def _one_page(infos: list[fusee.RunInfo]) -> AsyncGenerator[list[fusee.RunInfo], None]:
    yield infos


async def runs_show(opts: GlobalOptions, run_id: str, *, as_json: bool) -> int:
    run_id = validate_id(run_id, "run ID")
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        info = await run.describe()
        journal = await run.journal()
        stream = engine.store.layout.stream
    if as_json:
        entries = [{"seq": seq, "record": record} for seq, record in journal]
        _out(json_text({"run": info, "journal": entries}))
        return 0
    _out("\n".join(format_run(info, journal, now=time.time(), stream=stream)))
    return 0


async def runs_result(opts: GlobalOptions, run_id: str, *, timeout: str | None) -> int:
    run_id = validate_id(run_id, "run ID")
    limit = parse_duration(timeout, "--timeout") if timeout is not None else None
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        info = await run.describe()
        if info.status == "paused":
            raise CliError(
                f"run {run_id!r} is paused, so it has no result yet: {info.reason}", code=2
            )
        try:
            value = await run.result(timeout=limit)
        except RunCancelled as exc:
            raise CliError(f"run {run_id!r} was cancelled: {exc.reason}") from None
        except RunFailed as exc:
            raise CliError(f"run {run_id!r} failed: {exc.error_type}: {exc.message}") from None
        except Timeout:
            raise CliError(
                f"run {run_id!r} did not end within {timeout} (status: {info.status}); "
                f"wait longer with --timeout, or see `{command_hint('runs', 'show', run_id)}`",
                code=2,
            ) from None
    _out(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())
    return 0


async def runs_cancel(opts: GlobalOptions, run_id: str, *, reason: str) -> int:
    run_id = validate_id(run_id, "run ID")
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        if not await engine.run(run_id).cancel(reason):
            raise CliError(f"run {run_id!r} has already ended; nothing to cancel")
    _out(f"asked run {run_id!r} to stop: {reason}")
    return 0


async def runs_resume(opts: GlobalOptions, run_id: str, *, force: bool) -> int:
    run_id = validate_id(run_id, "run ID")
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            await engine.run(run_id).resume(force=force)
        except NotPausedError as exc:
            raise CliError(str(exc)) from None
    _out(f"asked run {run_id!r} to resume{' (forced)' if force else ''}")
    return 0


async def runs_signal(
    opts: GlobalOptions, run_id: str, name: str, payload: str, *, key: str | None
) -> int:
    run_id = validate_id(run_id, "run ID")
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError as exc:
        raise CliError(f"the payload is not JSON ({exc}): {payload!r}") from None
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        if not await engine.run(run_id).signal(name, value, key=key):
            raise CliError(f"run {run_id!r} has already ended; the signal was not stored")
    _out(f"signal {name!r} stored for run {run_id!r}")
    return 0


# -- fusee streams ---------------------------------------------------------------------


async def streams_follow(opts: GlobalOptions, run_id: str, name: str, *, offset: int) -> int:
    """Print the stream's token text as it comes, from token ``offset``, until its end.

    stdout gets the text only, flushed token by token. An attempt boundary (the model
    call started over) is a note on stderr, so piped text stays the text.
    """
    run_id = validate_id(run_id, "run ID")
    name = validate_name(name, "stream name")
    if offset < 0:
        raise CliError(f"--from {offset}: a token index must not be negative")
    out = sys.stdout
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        await run.describe()  # an unknown run fails at once, not after a wait
        last = ""
        async for ev in run.stream_events(name, offset=offset):
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
    return 0
