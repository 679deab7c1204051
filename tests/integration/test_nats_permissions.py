"""NATS credentials and least-privilege roles (issue 15), against a real nats-server
started with ``nats/accounts.conf``.

A worker subprocess whose NATS user has only the worker role runs the whole
integration scenario; the client role reads, signals, cancels, follows token streams
and calls objects, and neither may purge or delete the stream, or (the client) write
into ``<ns>.run.>``: the server refuses it (a permission violation), nothing changes.
Then each way a connect can fail gives a fusee error that names what is wrong, TLS
with a client certificate (a CA made here), and nkey authentication.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

import fusee
from fusee.adapters.jetstream.permissions import accounts_config
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.errors import ConfigError, ConnectionLost
from fusee.runtime.ids import escape
from tests.workers.procs import HERE, Workers, wait_until

ROOT = Path(__file__).resolve().parents[2]
NS = "fusee"  # the namespace nats/accounts.conf is made for
PASSWORDS = {
    "FUSEE_ADMIN_PASS": "admin-pw",
    "FUSEE_WORKER_PASS": "worker-pw",
    "FUSEE_CLIENT_PASS": "client-pw",
    "FUSEE_SYS_PASS": "sys-pw",
}
ROLE = {
    role: {"user": f"fusee_{role}", "password": PASSWORDS[f"FUSEE_{role.upper()}_PASS"]}
    for role in ("admin", "worker", "client")
}


@pytest.fixture(scope="module")
def accounts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of this module's own with nats/accounts.conf included as it is."""
    store = tmp_path_factory.mktemp("nats-accounts")
    shutil.copy(ROOT / "nats" / "accounts.conf", store / "accounts.conf")
    server = EmbeddedServer.start(store, extra_config="include ./accounts.conf", env=PASSWORDS)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def admin(accounts_server: EmbeddedServer) -> AsyncIterator[fusee.Engine]:
    """The admin role's engine: it creates the namespace's layout (once)."""
    eng = await fusee.connect(accounts_server.url, namespace=NS, **ROLE["admin"])
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def client(accounts_server: EmbeddedServer, admin: fusee.Engine) -> AsyncIterator[Any]:
    eng = await fusee.connect(accounts_server.url, namespace=NS, **ROLE["client"])
    try:
        yield eng
    finally:
        await eng.close()


def test_the_accounts_config_is_the_one_made_from_the_layout() -> None:
    assert (ROOT / "nats" / "accounts.conf").read_text() == accounts_config(NS)


async def test_a_worker_with_the_worker_role_runs_the_whole_scenario(
    accounts_server: EmbeddedServer, admin: fusee.Engine, client: Any, tmp_path: Path
) -> None:
    workers = Workers(accounts_server.url, NS, tmp_path, module=HERE / "least_privilege.py")
    env = {"FUSEE_NATS_USER": "fusee_worker", "FUSEE_NATS_PASSWORD": PASSWORDS["FUSEE_WORKER_PASS"]}
    try:
        worker = await workers.start(extra_env=env)
        # starting a run writes its journal's first record: the worker role (the client
        # role may not write journals; see docs/reference/nats-permissions.md)
        starter = await fusee.connect(accounts_server.url, namespace=NS, **ROLE["worker"])
        async with starter:
            run_id = f"tour-{tmp_path.name}"
            await starter.start("tour", run_id, {"n": 1, "sleep": 0.2})
        run = client.run(run_id)
        await wait_until(
            lambda: worker.find("wait.started"), timeout=20, what="the run waiting for go"
        )
        assert await run.signal("go", {"ok": True})
        result = await run.result(timeout=30)
        assert result == {"first": 2, "signal": {"ok": True}, "text": "one two three", "child": 6}
        assert [t async for t in run.stream("model-0")] == ["one ", "two ", "three"]
        assert (await run.describe()).status == "completed"
        assert (await client.run(f"{run_id}/child").result(timeout=10)) == 6
        tally = client.object("tally", f"k-{tmp_path.name}")
        assert await tally.call("bump", 2) == 2
        assert await tally.call("bump", 3) == 5
        assert await tally.call("peek") == 5
        # the worker needed nothing its role lacks (a consumer's delete is asked for
        # and refused; the server removes the ephemeral consumer once inactive)
        denied = [e["subject"] for e in worker.find("nats.permission_denied")]
        assert all(s.startswith("$js.api.consumer.delete.") for s in denied), denied
        assert workers.procs[0].stop() == 0
    finally:
        workers.cleanup()


async def _refused(errors: list[str], subject: str, call: Any) -> None:
    """``call`` is refused: no answer (nats-py times out), and the server reports a
    permission violation for ``subject``."""
    with pytest.raises(nats.errors.TimeoutError):
        await call
    await wait_until(
        lambda: any(f'"{subject.lower()}"' in e for e in errors),
        timeout=5,
        what=f"a permission violation for {subject}",
    )


@pytest.mark.parametrize("role", ["worker", "client"])
async def test_a_worker_or_client_cannot_purge_or_delete_and_a_client_cannot_write_journals(
    accounts_server: EmbeddedServer, admin: fusee.Engine, role: str
) -> None:
    lay = admin.store.layout
    run_id = f"kept-{role}"
    run = await admin.start("noop", run_id, 1)  # its journal: the run.started record
    before = await admin.store.js.stream_info(lay.stream)
    journal = [seq for seq, _ in await run.journal()]

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(accounts_server.url, error_cb=on_error, **ROLE[role])
    try:
        js = nc.jetstream(timeout=0.5)
        await _refused(errors, f"$JS.API.STREAM.PURGE.{lay.stream}", js.purge_stream(lay.stream))
        await _refused(errors, f"$JS.API.STREAM.DELETE.{lay.stream}", js.delete_stream(lay.stream))
        delete_msg = f"$JS.API.STREAM.MSG.DELETE.{lay.stream}"  # (js.delete_msg waits 5 s)
        await _refused(errors, delete_msg, nc.request(delete_msg, b'{"seq":1}', timeout=0.5))
        if role == "client":  # a journal, and an index entry: the workers' to write
            for subject in (lay.journal(escape(run_id)), lay.index_entry(escape(run_id))):
                await _refused(errors, subject, js.publish(subject, b"{}"))
    finally:
        await nc.close()
    after = await admin.store.js.stream_info(lay.stream)
    # nothing written (markers' removals may expire meanwhile: counts move, not this)
    assert after.state.last_seq == before.state.last_seq
    assert [seq for seq, _ in await run.journal()] == journal
