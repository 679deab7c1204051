"""``fusee tokens create|ls|revoke``: the namespace's API tokens (``engine.tokens``).

``create`` prints the token once (stdout, nothing else there; ``--json``:
``{"token", "id", "scope", "expires_at"}``); it is stored nowhere, only its hash.
"""

from __future__ import annotations

import sys

from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.render import json_text
from fusee.errors import InvalidArgument, InvalidId, UnknownToken

__all__ = ("tokens_create", "tokens_ls", "tokens_revoke", "SCOPES")

SCOPES = ("read", "write", "admin")


async def tokens_create(
    opts: GlobalOptions, *, scope: str, name: str | None, ttl: str | None, as_json: bool
) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            made = await engine.tokens.create(scope, name=name, ttl=ttl)
        except (InvalidArgument, InvalidId) as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    if as_json:
        sys.stdout.write(json_text(made.to_json()) + "\n")
        return 0
    sys.stdout.write(made.token + "\n")
    until = made.expires_at.strftime("%Y-%m-%d %H:%M UTC") if made.expires_at else "never"
    sys.stderr.write(
        f"Token {made.id} ({made.scope}, expires: {until}). It is shown only this once: "
        "keep it somewhere safe. Send it as `Authorization: Bearer <token>`.\n"
    )
    return 0


async def tokens_ls(opts: GlobalOptions, *, as_json: bool) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        infos = await engine.tokens.list()
    if as_json:
        sys.stdout.write(json_text([i.to_json() for i in infos]) + "\n")
        return 0
    if not infos:
        sys.stderr.write(f"No API tokens in namespace {opts.namespace!r}.\n")
        return 0
    rows = [("ID", "SCOPE", "NAME", "CREATED", "EXPIRES")]
    for i in infos:
        expires = i.expires_at.strftime("%Y-%m-%d %H:%M") if i.expires_at else "never"
        rows.append(
            (
                i.id,
                i.scope,
                i.name or "-",
                i.created_at.strftime("%Y-%m-%d %H:%M"),
                f"{expires} (expired)" if i.expired else expires,
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write(
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n"
        )
    return 0


async def tokens_revoke(opts: GlobalOptions, token_id: str) -> int:
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            await engine.tokens.revoke(token_id)
        except UnknownToken as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 1
    sys.stderr.write(f"Revoked {token_id}.\n")
    return 0
