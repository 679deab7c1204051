"""``fusee tokens create|ls|revoke``: the namespace's API tokens (``engine.tokens``).

``create`` prints the token once (stdout, nothing else there; ``--json``:
``{"token", "id", "scope", "expires_at"}``); it is stored nowhere, only its hash.
``create`` is also what makes the namespace's ``<ns>_auth`` bucket: it needs the NATS
rights of an admin (docs/security.md), the API only reads the bucket.
"""

from __future__ import annotations

import sys
from typing import Annotated, Literal

import typer

from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.params import fusee_command
from fusee.adapters.cli.render import console, json_text, table
from fusee.errors import InvalidArgument, InvalidId, UnknownToken

__all__ = ("tokens_app", "tokens_create", "tokens_ls", "tokens_revoke")

HEADER = ("ID", "SCOPE", "NAME", "CREATED", "EXPIRES")


tokens_app = typer.Typer(
    no_args_is_help=True,
    help="Make, list and revoke the bearer tokens `fusee api` asks for.",
)


@tokens_app.command("create")
@fusee_command()
async def _create(
    opts: GlobalOptions,
    scope: Annotated[
        Literal["read", "write", "admin"],
        typer.Option("--scope", help="read < write < admin (docs/security.md)", show_default=False),
    ],
    name: Annotated[
        str | None, typer.Option("--name", metavar="NAME", help="what it is for (shown by ls)")
    ] = None,
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl", metavar="DURATION", help="expire after this long (30d); default: never"
        ),
    ] = None,
) -> int:
    """Make a token and print it, once: only its hash is kept.

    stdout gets the token alone (--json: {"token", "id", "scope", "expires_at"}).
    Send it as `Authorization: Bearer <token>`.
    """
    return await tokens_create(opts, scope=scope, name=name, ttl=ttl)


@tokens_app.command("ls")
@fusee_command()
async def _ls(opts: GlobalOptions) -> int:
    """Each token: ID, scope, name, created, expiry (never the token)."""
    return await tokens_ls(opts)


@tokens_app.command("revoke")
@fusee_command()
async def _revoke(
    opts: GlobalOptions, token_id: Annotated[str, typer.Argument(metavar="ID")]
) -> int:
    """Revoke a token by its ID: the API refuses it at once, open streams included."""
    return await tokens_revoke(opts, token_id)


async def tokens_create(
    opts: GlobalOptions, *, scope: str, name: str | None, ttl: str | None
) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            made = await engine.tokens.create(scope, name=name, ttl=ttl)
        except (InvalidArgument, InvalidId) as exc:
            raise CliError(str(exc), Exit.USAGE) from None
    if opts.as_json:
        sys.stdout.write(json_text(made.to_json()) + "\n")
        return Exit.OK
    sys.stdout.write(made.token + "\n")
    until = made.expires_at.strftime("%Y-%m-%d %H:%M UTC") if made.expires_at else "never"
    sys.stderr.write(
        f"Token {made.id} ({made.scope}, expires: {until}). It is shown only this once: "
        "keep it somewhere safe. Send it as `Authorization: Bearer <token>`.\n"
    )
    return Exit.OK


async def tokens_ls(opts: GlobalOptions) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        infos = await engine.tokens.list()
    if opts.as_json:
        sys.stdout.write(json_text([i.to_json() for i in infos]) + "\n")
        return Exit.OK
    if not infos:
        sys.stderr.write(f"No API tokens in namespace {opts.namespace!r}.\n")
        return Exit.OK
    rows = []
    for i in infos:
        expires = i.expires_at.strftime("%Y-%m-%d %H:%M") if i.expires_at else "never"
        created = i.created_at.strftime("%Y-%m-%d %H:%M")
        shown = f"{expires} (expired)" if i.expired else expires
        rows.append((i.id, i.scope, i.name or "-", created, shown))
    console().print(table(HEADER, rows))
    return Exit.OK


async def tokens_revoke(opts: GlobalOptions, token_id: str) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            await engine.tokens.revoke(token_id)
        except UnknownToken as exc:
            raise CliError(str(exc), Exit.NOT_FOUND) from None
    if opts.as_json:
        sys.stdout.write(json_text({"id": token_id, "revoked": True}) + "\n")
    else:
        sys.stderr.write(f"Revoked {token_id}.\n")
    return Exit.OK
