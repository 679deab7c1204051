"""How ``fusee`` commands connect and stop, and what the serving commands (``dev``,
``worker``, ``api``) do, as async functions returning an exit code."""

from __future__ import annotations

import contextlib
import inspect
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

import fusee
from fusee.actors.registry import REGISTRY
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.loader import load_file
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.jetstream.credentials import redact
from fusee.logs import get_logger
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.ids import unescape

if TYPE_CHECKING:
    from fusee.actors.worker import Worker
    from fusee.adapters.http.server import Bound

__all__ = (
    "CliError",
    "CONNECT_TIMEOUT_QUERY",
    "open_engine",
    "stoppable",
    "single",
    "dev",
    "worker",
    "api",
)

log = get_logger()

# Every network wait has a deadline. A worker may be started while NATS is still
# coming up (compose, a restarting cluster), so it waits longer than a query does.
CONNECT_TIMEOUT_QUERY = 10.0
CONNECT_TIMEOUT_SERVE = 30.0
# `fusee dev` lets work that its file's main started, and did not wait for, finish this
# long before it stops
DEV_FINISH = 30.0


@contextlib.asynccontextmanager
async def open_engine(
    opts: GlobalOptions, *, connect_timeout: float
) -> AsyncIterator[fusee.Engine]:
    """Connect as the options say; close (and stop an embedded server we started) on exit."""
    if opts.nats is not None:
        try:
            with anyio.fail_after(connect_timeout):
                engine = await fusee.connect(
                    opts.nats,
                    namespace=opts.namespace,
                    region=opts.region,
                    partner=opts.partner,
                    **opts.credentials(),
                )
        except TimeoutError:
            raise CliError(
                f"cannot reach NATS at {redact(opts.nats)} "
                f"(no connection within {format_duration(connect_timeout)})"
            ) from None
    else:
        # Shielded: a Ctrl-C here must not leave a started server without its owner.
        # No credentials: the embedded server has no auth, and fusee.connect refuses
        # them without a URL (they may come from $FUSEE_NATS_USER and the like, set for
        # another server).
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
            log.info("dev.connected", nats=engine.url, server=where)
            async with (
                _dev_token(engine, api_port is not None),
                engine.worker() as worker,
                anyio.create_task_group() as tg,
            ):
                if api_port is not None:
                    bound = await tg.start(_serve_api, engine, "127.0.0.1", api_port)
                    # the web UI, served by the same app (log in with the token above)
                    sys.stdout.write(f"fusee dev: web UI at {bound.url}/ui\n")
                    sys.stdout.flush()
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

    await _until_signal(body)
    return 0


DEV_TOKEN_TTL = "1d"  # revoked when fusee dev stops; this bounds one left by a kill


@contextlib.asynccontextmanager
async def _dev_token(engine: fusee.Engine, serves_api: bool) -> AsyncIterator[None]:
    """While ``fusee dev`` serves the HTTP API, an admin token for it, printed on stdout
    (never in the log) and revoked when it stops. Without the API, no token: nothing
    would ask for one, and a token made for nothing is one more to leak."""
    if not serves_api:
        yield
        return
    made = await engine.tokens.create("admin", name="fusee dev", ttl=DEV_TOKEN_TTL)
    sys.stdout.write(
        f"fusee dev: API token (admin, revoked when fusee dev stops): {made.token}\n"
        f"  curl -H 'Authorization: Bearer {made.token}' ...\n"
    )
    sys.stdout.flush()
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(fusee.FuseeError):
            await engine.tokens.revoke(made.id)


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
        raise CliError(
            f"{flag} {port}: a port is a number from 0 to 65535 (0: any free port)", Exit.USAGE
        )


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
    # Imported here: the HTTP stack (litestar, uvicorn) loads only for commands that serve it.
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
        raise CliError(f"--keepalive {keepalive}: must be more than 0", Exit.USAGE)
    try:
        limit = parse_size(max_body, "--max-body")
    except ValueError as exc:
        raise CliError(str(exc), Exit.USAGE) from None

    async def body() -> None:
        async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_SERVE) as engine:
            await _serve_api(engine, host, port, every, max_body=limit, auth=auth)

    await _until_signal(body)
    return 0


def single(exc: BaseException) -> BaseException:
    """Task groups wrap errors in groups; one error in a group of one is that error."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
