# ruff: noqa: F811 (the fixtures imported from test_nats_permissions)
"""The CLI's and connect()'s error paths with NATS credentials (issue 15, review
rev-clinats), through ``fusee`` subprocesses against a real nats-server with
``nats/accounts.conf``: usage errors as JSON with ``--json``, a refused login naming
the credentials of the URL (exit 2), a bad nkey seed told without a traceback or the
seed, no password repeated in a hint or ``Engine.url``, a mistyped ``--stream``."""

from __future__ import annotations

import json

import anyio
import pytest

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from tests.helpers import registry_of, run_cli
from tests.integration.test_nats_permissions import (
    NS,
    ROLE,
    accounts_server,  # noqa: F401 (a fixture)
    admin,  # noqa: F401 (a fixture)
)

SECRET = "n0t-the-client-pw"  # a wrong password no message may repeat


def _error(stderr: str) -> dict[str, str]:
    return dict(json.loads(stderr.splitlines()[-1])["error"])


async def test_json_usage_errors_are_json(accounts_server: EmbeddedServer) -> None:
    """docs/reference/cli.md '--json': "an error is one JSON object on stderr"; a click
    usage error (a missing argument, an unknown option) was a rich panel."""
    for args in (("runs", "result"), ("runs", "list", "--bogus")):
        done = await run_cli(*args, "--json", "--nats", accounts_server.url)
        assert done.returncode == 2, done.stderr
        body = json.loads(done.stderr)
        assert body["error"]["code"] == "bad_input"
        assert body["error"]["message"]


async def test_a_refused_login_names_the_credentials_of_the_url(
    accounts_server: EmbeddedServer,
) -> None:
    """A wrong password given in the URL was reported as '(no credentials)'. A refused
    login is bad input: exit 2 (docs/reference/cli.md)."""
    url = accounts_server.url.replace("nats://", f"nats://fusee_client:{SECRET}@")
    done = await run_cli("runs", "list", "--json", "--nats", url)
    assert done.returncode == 2, done.stderr
    error = _error(done.stderr)
    assert error["code"] == "bad_input"
    assert "user/password in the URL (user 'fusee_client')" in error["message"], error
    assert "no credentials" not in error["message"]
    assert SECRET not in done.stderr


async def test_a_bad_nkey_seed_is_a_config_error_not_a_traceback(
    accounts_server: EmbeddedServer,
) -> None:
    """An nkey seed that does not decode was nkeys.ErrInvalidSeed's traceback, exit 1."""
    seed = "SUNOTASEEDATALL"
    done = await run_cli(
        "runs", "list", "--json", "--nats", accounts_server.url, "--nats-nkey", seed
    )
    assert "Traceback" not in done.stderr, done.stderr[-300:]
    assert done.returncode == 2
    message = _error(done.stderr)["message"]
    assert "nkey" in message
    assert seed not in done.stderr


async def test_hints_and_the_engine_url_do_not_repeat_a_password(
    accounts_server: EmbeddedServer,
    admin: fusee.Engine,
) -> None:
    """`runs start` printed `see it with: fusee runs show ID --nats <the URL as given>`,
    password included; ``Engine.url`` kept it too."""
    pw = ROLE["worker"]["password"]
    url = accounts_server.url.replace("nats://", f"nats://fusee_worker:{pw}@")
    done = await run_cli("runs", "start", "noop", "--id", "hinted", "--nats", url)
    assert done.returncode == 0, done.stderr
    assert "see it with:" in done.stderr
    assert pw not in done.stderr, done.stderr
    assert "fusee_worker:***@" in done.stderr
    eng = await fusee.connect(url, namespace=NS)
    async with eng:
        assert pw not in eng.url
        assert "fusee_worker:***@" in eng.url


async def echo(ctx: fusee.Context, n: int) -> int:
    return int(await ctx.step("s", lambda: n))


@pytest.mark.parametrize("as_json", [False, True])
async def test_a_mistyped_stream_of_runs_show_watch_is_told(
    accounts_server: EmbeddedServer, admin: fusee.Engine, as_json: bool
) -> None:
    """`runs show ID --watch --stream NAME` with a NAME the run has no stream of said so
    in the live view only; a pipe or --json showed nothing."""
    run_id = f"watched-{as_json}"
    eng = await fusee.connect(accounts_server.url, namespace=NS, **ROLE["worker"])
    async with eng, eng.worker(registry=registry_of(echo, "echo")):
        with anyio.fail_after(20):
            assert await (await eng.start("echo", run_id, 3)).result() == 3
    flags = ["--json"] if as_json else []
    done = await run_cli(
        "runs", "show", run_id, "--watch", "--stream", "modle", *flags,
        "--nats", accounts_server.url, "--nats-user", "fusee_client",
        "--nats-password", ROLE["client"]["password"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if as_json:
        events = [json.loads(line) for line in done.stdout.splitlines()]
        missing = [e for e in events if e["event"] == "stream_not_found"]
        assert missing == [
            {
                "event": "stream_not_found",
                "stream": "modle",
                "message": "the run has no stream 'modle'",
            }
        ]
    else:
        assert "-- stream modle: (the run has no stream 'modle')" in done.stdout, done.stdout
