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
from tests.helpers import cli_env, registry_of, run_cli
from tests.workers.procs import HERE, Workers, wait_until

ROOT = Path(__file__).resolve().parents[2]
NS = "fusee"  # the namespace nats/accounts.conf is made for
PASSWORDS = {
    "FUSEE_ADMIN_PASS": "admin-pw",
    "FUSEE_WORKER_PASS": "worker-pw",
    "FUSEE_CLIENT_PASS": "client-pw",
    "FUSEE_SYS_PASS": "sys-pw",
}
ROLE: dict[str, dict[str, Any]] = {
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


@pytest.mark.slow  # a refused purge costs its timeout (5 s)
async def test_a_limit_served_by_the_worker_role_skips_its_inbox_trim(
    accounts_server: EmbeddedServer, admin: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit actor trims its inbox with a purge, which the worker role may not do:
    the refusal (one request's timeout) ends the trims of that connection, and the
    limit goes on granting."""
    from fusee.actors import limit_actor as limit_actor_module

    monkeypatch.setattr(limit_actor_module, "TRIM_AFTER", 1)
    eng = await fusee.connect(accounts_server.url, namespace=NS, **ROLE["worker"])
    async with eng:
        await eng.limit("one-at-a-time", concurrent=1)

        async def limited(ctx: fusee.Context, n: int) -> int:
            return int(await ctx.step("call", lambda: n, limit="one-at-a-time"))

        async with eng.worker(registry=registry_of(limited, "limited")):
            runs = [await eng.start("limited", f"limited-{i}", i) for i in range(3)]
            assert [await r.result(timeout=30) for r in runs] == [0, 1, 2]
        assert eng.store.is_denied(f"$JS.API.STREAM.PURGE.{eng.store.layout.stream}")


# -- each way a connect fails ---------------------------------------------------------


async def test_each_connect_failure_is_a_fusee_error_naming_what_is_wrong(
    accounts_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = accounts_server.url
    with pytest.raises(ConfigError) as refused:
        await fusee.connect(url, namespace=NS, user="fusee_worker", password="not-it")
    text = str(refused.value)
    assert f"NATS at {url} refused the credentials (user/password (user 'fusee_worker'))" in text
    assert "not-it" not in text
    # a password in the URL is not repeated in the message
    in_url = url.replace("nats://", "nats://fusee_worker:not-it@")
    with pytest.raises(ConfigError, match=r"nats://fusee_worker:\*\*\*@127\.0\.0\.1") as masked:
        await fusee.connect(in_url, namespace=NS)
    assert "not-it" not in str(masked.value)
    with pytest.raises(ConfigError, match="refused the credentials"):
        await fusee.connect(url, namespace=NS)  # no credentials at all

    missing = tmp_path / "nope.creds"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"creds": missing}, f"creds='{missing}': no such file"),
        ({"nkey_seed": tmp_path / "nope.nk"}, "nkey_seed=.*: no such file"),
        ({"tls_ca": tmp_path / "ca.pem"}, "tls_ca=.*: no such file"),
        ({"user": "fusee_worker"}, "user was given without password"),
        ({"user": "u", "password": "p", "token": "t"}, "user/password and token were both given"),
        ({"tls_cert": tmp_path / "c.pem"}, "tls_cert and tls_key go together"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            await fusee.connect(url, namespace=NS, **kwargs)
    monkeypatch.delenv("FUSEE_NATS_URL", raising=False)
    with pytest.raises(ConfigError, match="without a url: the embedded server"):
        await fusee.connect(namespace=NS, token="t", store_dir=tmp_path / "store")
    # nothing listens there
    with pytest.raises(ConnectionLost, match=r"cannot connect to NATS at nats://127\.0\.0\.1:1 "):
        await fusee.connect("nats://127.0.0.1:1", namespace=NS, **ROLE["worker"])


async def test_a_role_that_may_not_create_the_layout_is_told_to_use_the_admin_one(
    accounts_server: EmbeddedServer,
) -> None:
    # the roles name the streams of namespace "fusee"; another one they may not even see
    with pytest.raises(ConfigError, match="connect once with the admin credentials") as err:
        await fusee.connect(accounts_server.url, namespace="other", **ROLE["worker"])
    assert "$js.api.stream.info.other" in str(err.value)


async def test_the_cli_takes_the_credential_flags(
    accounts_server: EmbeddedServer, admin: fusee.Engine
) -> None:
    url = accounts_server.url
    creds = ["--nats-user", "fusee_client", "--nats-password", PASSWORDS["FUSEE_CLIENT_PASS"]]
    listed = await run_cli("runs", "list", "--json", "--nats", url, *creds)
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)
    wrong = await run_cli(
        "runs", "list", "--nats", url, "--nats-user", "fusee_client", "--nats-password", "no"
    )
    assert wrong.returncode != 0
    assert "refused the credentials (user/password (user 'fusee_client'))" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    # the variables, read by fusee.connect itself
    env = {**cli_env(), "FUSEE_NATS_USER": "fusee_client", "FUSEE_NATS_PASSWORD": "no"}
    by_env = await run_cli("runs", "list", "--nats", url, env=env)
    assert "refused the credentials (user/password (user 'fusee_client'))" in by_env.stderr


# -- TLS with a client certificate, nkeys ----------------------------------------------


def _certificates(where: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    files: dict[str, Path] = {}

    def write(name: str, key: Any, cert: Any) -> None:
        files[f"{name}_key"] = where / f"{name}.key"
        files[f"{name}_key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        files[name] = where / f"{name}.pem"
        files[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def make(
        name: str, issuer: Any, issuer_key: Any, *, ca: bool = False, server: bool = False
    ) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fusee test {name}")])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if server:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        elif not ca:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False
            )
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        write(name, key, cert)
        return subject, key

    ca_name, ca_key = make("ca", None, None, ca=True)
    make("server", ca_name, ca_key, server=True)
    make("client", ca_name, ca_key)
    return files


async def test_tls_with_a_ca_and_a_client_certificate(tmp_path: Path) -> None:
    certs = _certificates(tmp_path)
    q = json.dumps
    tls = (
        f"tls {{ cert_file: {q(str(certs['server']))}, key_file: {q(str(certs['server_key']))}, "
        f"ca_file: {q(str(certs['ca']))}, verify: true }}"
    )
    server = EmbeddedServer.start(tmp_path / "nats", extra_config=tls)
    try:
        url = server.url.replace("tls://", "nats://")
        client: dict[str, Any] = {"tls_cert": certs["client"], "tls_key": certs["client_key"]}
        eng = await fusee.connect(url, namespace="tlsns", tls_ca=certs["ca"], **client)
        async with eng:
            run = await eng.start("any", "r1", 1)
            assert [seq for seq, _ in await run.journal()]
        # the server asks for a client certificate: without one, the handshake fails
        # the server's TLS alert, or (when it closes first) the socket it closed: seen in
        # a CI run as "[Errno 32] Broken pipe"
        with pytest.raises(
            ConnectionLost, match=r"certificate required|Broken pipe|Connection reset"
        ):
            await fusee.connect(url, namespace="tlsns", tls_ca=certs["ca"])
        # a CA that did not sign the server's certificate
        (tmp_path / "other").mkdir()
        other = _certificates(tmp_path / "other")
        with pytest.raises(ConnectionLost, match="certificate verify failed"):
            await fusee.connect(url, namespace="tlsns", tls_ca=other["ca"], **client)
        with pytest.raises(ConfigError, match="not a certificate and its private key"):
            await fusee.connect(
                url,
                namespace="tlsns",
                tls_ca=certs["ca"],
                tls_cert=certs["ca"],
                tls_key=certs["client_key"],
            )
    finally:
        server.stop()


async def test_an_nkey_seed_as_a_string_or_a_file(tmp_path: Path) -> None:
    import secrets as random

    import nkeys

    seed = nkeys.encode_seed(random.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    server = EmbeddedServer.start(
        tmp_path / "nats", extra_config=f"authorization {{ users: [ {{ nkey: {public} }} ] }}"
    )
    try:
        seed_file = tmp_path / "user.nk"
        seed_file.write_bytes(seed)
        for given in (seed.decode(), seed_file, str(seed_file)):
            eng = await fusee.connect(server.url, namespace="nk", nkey_seed=given)
            async with eng:
                await eng.start("any", "r1", 1)
        other = nkeys.encode_seed(random.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode()
        with pytest.raises(ConfigError, match=r"refused the credentials \(nkey seed\)"):
            await fusee.connect(server.url, namespace="nk", nkey_seed=other)
    finally:
        server.stop()
