"""The NATS rights docs/security.md gives the API's user on the ``<ns>_auth`` bucket
(read and watch) are enough to check tokens and follow revokes, and do not let it
write: a nats-server of its own whose API user has only those subjects."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import nats
import pytest

from fusee._tokens import Tokens
from fusee.adapters.jetstream.auth import AuthBucket
from fusee.adapters.jetstream.layout import Layout
from fusee.adapters.jetstream.server import find_nats_server_binary
from tests.cluster import free_ports, get_json
from tests.workers.procs import wait_until

NAMESPACE = "perm"
BUCKET = f"KV_{NAMESPACE}_auth"
# the API's rows of docs/security.md's table, for namespace "perm"
API_PUBLISH = [
    f"$JS.API.STREAM.INFO.{BUCKET}",
    f"$JS.API.DIRECT.GET.{BUCKET}.>",
    f"$JS.API.CONSUMER.CREATE.{BUCKET}",
    f"$JS.FC.{BUCKET}.>",
]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port, monitor = free_ports(2)
    allow = ", ".join(f'"{s}"' for s in API_PUBLISH)
    (tmp_path / "nats.conf").write_text(
        f"""
listen: 127.0.0.1:{port}
http: 127.0.0.1:{monitor}
jetstream {{ store_dir: "{tmp_path / "js"}" }}
accounts {{
  APP {{
    jetstream: enabled
    users = [
      {{ user: admin, password: admin }}
      {{ user: api, password: api,
         permissions: {{ publish: {{ allow: [{allow}] }}, subscribe: {{ allow: ["_INBOX.>"] }} }} }}
    ]
  }}
}}
"""
    )
    with (tmp_path / "nats.log").open("wb") as log:
        proc = subprocess.Popen(
            [find_nats_server_binary(), "-c", str(tmp_path / "nats.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def ready() -> bool:
        try:
            return bool(get_json(f"http://127.0.0.1:{monitor}/healthz").get("status") == "ok")
        except OSError:
            return False

    try:
        anyio.run(lambda: wait_until(ready, timeout=10, what="nats-server ready"))
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_api_s_rights_check_tokens_and_follow_revokes_but_write_nothing(
    server: str,
) -> None:
    secret = secrets.token_bytes(32)
    admin = await nats.connect(f"nats://admin:admin@{server}")
    api = await nats.connect(f"nats://api:api@{server}")
    try:
        layout = Layout(NAMESPACE)
        made = await Tokens(AuthBucket(admin, admin.jetstream(), layout), secret, NAMESPACE).create(
            "read"
        )
        tokens = Tokens(AuthBucket(api, api.jetstream(), layout), secret, NAMESPACE)
        assert (await tokens.verify(made.token)).id == made.id
        ended = anyio.Event()
        tokens.on_revoke(made.id, ended.set)
        await Tokens(AuthBucket(admin, admin.jetstream(), layout), secret, NAMESPACE).revoke(
            made.id
        )
        with anyio.fail_after(5):
            await ended.wait()  # the watch, under the API's rights, saw the delete
        # and it may not write: NATS refuses the publish, so no ack comes
        kv = await api.jetstream(timeout=1.0).key_value(f"{NAMESPACE}_auth")
        with pytest.raises(nats.errors.TimeoutError):
            await kv.create("000000000000", b"{}")
    finally:
        await api.close()
        await admin.close()
