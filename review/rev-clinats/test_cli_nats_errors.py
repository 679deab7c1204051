# ruff: noqa: F811, PT018
"""Repros (review rev-clinats) of the CLI's and connect()'s error paths. Run:

    cd /work/wt-rev-clinats && PYTHONPATH=/work/wt-rev-clinats/src:/work/wt-rev-clinats \
      /work/main/.venv/bin/python -m pytest -q -p no:xdist review/rev-clinats/test_cli_nats_errors.py

Each test fails today.
"""

from __future__ import annotations

import json

import anyio
import pytest
from tests.helpers import run_cli
from tests.integration.test_nats_permissions import (  # noqa: F401 (fixtures)
    NS,
    ROLE,
    accounts_server,
    admin,
)

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer


async def test_a_refused_publish_is_told_at_once_as_a_permission_error(
    accounts_server: EmbeddedServer, admin: fusee.Engine
) -> None:
    """The client role may not start runs (documented). The server answers the publish
    with a permission violation at once, and fusee logs it as nats.permission_denied,
    but start() waits 30 s and raises ConnectionLost "NATS did not answer ... may or may
    not have happened": wrong (NATS did answer; nothing happened) and slow. Same for
    resume / cancel of a paused run, and `runs bulk resume` (each run "failed" so)."""
    eng = await fusee.connect(accounts_server.url, namespace=NS, **ROLE["client"])
    async with eng:
        with anyio.fail_after(10):
            with pytest.raises(fusee.FuseeError) as err:
                await eng.start("noop", "by-client", 1)
    text = str(err.value)
    assert "permission" in text.lower() and "fusee.run.by-client.j" in text, text
    assert "may or may not have happened" not in text


async def test_json_usage_errors_are_json(accounts_server: EmbeddedServer) -> None:
    """docs/reference/cli.md '--json': "an error is one JSON object on stderr". A click
    usage error (unknown option, missing argument) is a rich panel instead."""
    done = await run_cli("runs", "result", "--json", "--nats", accounts_server.url)
    assert done.returncode == 2
    body = json.loads(done.stderr)
    assert body["error"]["code"] == "bad_input"


async def test_credentials_in_the_url_are_not_called_no_credentials(
    accounts_server: EmbeddedServer,
) -> None:
    """A wrong password given in the URL is reported as '(no credentials)'."""
    url = accounts_server.url.replace("nats://", "nats://fusee_client:wrong@")
    done = await run_cli("runs", "list", "--json", "--nats", url)
    message = json.loads(done.stderr.splitlines()[-1])["error"]["message"]
    assert "no credentials" not in message, message
    assert "wrong" not in message


async def test_a_bad_nkey_seed_is_a_config_error_not_a_traceback(
    accounts_server: EmbeddedServer,
) -> None:
    """An nkey seed that does not decode: today nkeys.ErrInvalidSeed's traceback, exit 1,
    from deep in nats-py's connect."""
    done = await run_cli(
        "runs", "list", "--json", "--nats", accounts_server.url, "--nats-nkey", "SUNOTASEED"
    )
    assert "Traceback" not in done.stderr, done.stderr[-300:]
    assert done.returncode == 2
    assert "nkey" in json.loads(done.stderr.splitlines()[-1])["error"]["message"]


async def test_hints_do_not_repeat_a_password_given_in_the_url(
    accounts_server: EmbeddedServer, admin: fusee.Engine
) -> None:
    """`runs start` prints `see it with: fusee runs show ID --nats <the URL as given>`
    (options.command_hint), password included; `runs journal` its `more:` hint too."""
    pw = ROLE["worker"]["password"]
    url = accounts_server.url.replace("nats://", f"nats://fusee_worker:{pw}@")
    done = await run_cli("runs", "start", "noop", "--id", "hinted", "--nats", url)
    assert done.returncode == 0, done.stderr
    assert pw not in done.stderr, done.stderr
