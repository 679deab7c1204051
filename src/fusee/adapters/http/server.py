"""Serving the API with uvicorn inside fusee's own task group.

uvicorn normally owns the process: it installs signal handlers and re-raises the
signal when it stops. Here it is one service among others (``fusee dev`` runs a worker
next to it), so the caller owns the signals and stops the server by cancelling it.
The listening socket is bound before uvicorn starts, so ``port=0`` works and the
bound address is known when :func:`serve_api` reports it started.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import uvicorn
from anyio.abc import TaskStatus

from fusee import Engine
from fusee.adapters.http.app import api_state_of, create_app
from fusee.adapters.http.limits import DEFAULT_MAX_BODY
from fusee.logs import get_logger

__all__ = ("serve_api", "Bound")

log = get_logger()

# How long open requests get to finish once the server stops (event streams are ended
# at once; this bounds a long poll of /result).
GRACEFUL_STOP = 5.0


@dataclass(frozen=True)
class Bound:
    """Where the API listens."""

    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers, telling when it has started."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_api(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    keepalive: float = 15.0,
    max_body: int = DEFAULT_MAX_BODY,
    auth: bool = True,
    task_status: TaskStatus[Bound] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API on ``engine`` until cancelled; then stop gracefully.

    Reports the bound address through ``task_status`` (``await tg.start(serve_api, ...)``)
    and logs ``api.serving``. On cancellation, open event streams end at once (clients
    reconnect with ``Last-Event-ID``) and other requests get :data:`GRACEFUL_STOP` seconds.
    ``auth=False`` serves every route without a token (local development only; it
    logs ``api.no_auth`` as a warning).

    Raises:
        OSError: the address cannot be bound (in use, not local).

    Example:
        ``bound = await tg.start(functools.partial(serve_api, engine, port=0))``
    """
    app = create_app(engine, keepalive=keepalive, max_body=max_body, auth=auth)
    sock = _bind(host, port)
    bound = Bound(host, sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(GRACEFUL_STOP),
    )
    server = _Server(config)
    try:
        with sock:
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    # Shielded: uvicorn stops by its flag, not by cancellation, so it
                    # closes its connections itself; its graceful timeout bounds the wait.
                    with anyio.CancelScope(shield=True):
                        await server.serve(sockets=[sock])
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                try:
                    await server.ready.wait()
                    log.info(
                        "api.serving",
                        url=bound.url,
                        host=bound.host,
                        port=bound.port,
                        auth=auth,
                        ui=f"{bound.url}/ui",
                    )
                    if not auth:
                        log.warning(
                            "api.no_auth",
                            url=bound.url,
                            warning="NO AUTHENTICATION: anyone who reaches this port can "
                            "start, cancel and read every run; for local development only",
                        )
                    task_status.started(bound)
                    await anyio.sleep_forever()
                finally:
                    api_state_of(app).streams.close_all()
                    server.should_exit = True
    finally:
        if server.started:
            log.info("api.stopped", url=bound.url)
