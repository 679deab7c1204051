"""The options every ``fusee`` command takes, as typer parameters, and the decorator
that gives them to a command.

They go before the command (``fusee --nats URL runs list``, the root callback keeps
them) or after it (``fusee runs list --nats URL``): the command's own copy wins, then
the root's, then the environment (``$FUSEE_NATS_URL``...), then the default. One list
of parameters added to each command's signature, not repeated by hand on 30 commands:
a command declares only its own, and gets a ``GlobalOptions`` first.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import typing
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
import typer

from fusee.adapters.cli.commands import single, stoppable
from fusee.adapters.cli.errors import CliError, tell
from fusee.adapters.cli.loader import LoadError
from fusee.adapters.cli.options import (
    CREDENTIALS,
    CURRENT,
    DEFAULT_NAMESPACE,
    DEFAULT_STORE,
    GlobalOptions,
)
from fusee.errors import FuseeError
from fusee.logs import LEVELS, LogFormat, configure_logging

__all__ = ("fusee_command", "ROOT_PARAMS", "root_options")

Command = Callable[..., Awaitable[int]]

CONNECTION = "Connection"
OUTPUT = "Output and logging"
_KW = inspect.Parameter.KEYWORD_ONLY
_CTX = "fusee_ctx"


def _param(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(f"fusee_{name}", _KW, default=default, annotation=annotation)


def _str_option(flag: str, help_: str, panel: str = CONNECTION, metavar: str = "TEXT") -> Any:
    return Annotated[
        str | None,
        typer.Option(flag, help=help_, rich_help_panel=panel, metavar=metavar, show_default=False),
    ]


def _options() -> list[inspect.Parameter]:
    """The shared parameters (named ``fusee_<field>``, so no command's own clashes)."""
    params = [
        _param(
            "nats",
            _str_option(
                "--nats",
                "NATS server URL, or a cluster's as URL,URL,... "
                "(env FUSEE_NATS_URL; default: the embedded server of --store)",
                metavar="URL",
            ),
        ),
        _param(
            "namespace",
            _str_option(
                "--namespace",
                f"fusee namespace: its stream and buckets (env FUSEE_NAMESPACE; default: "
                f"{DEFAULT_NAMESPACE})",
                metavar="NS",
            ),
        ),
        _param(
            "store",
            _str_option(
                "--store",
                f"the embedded server's directory, used without a URL (default: {DEFAULT_STORE})",
                metavar="DIR",
            ),
        ),
    ]
    for field, flag, env, help_ in CREDENTIALS:
        metavar = "PATH" if field.startswith("tls") or field == "creds" else "TEXT"
        params.append(_param(field, _str_option(flag, f"{help_} (env {env})", metavar=metavar)))
    params += [
        _param(
            "json",
            Annotated[
                bool,
                typer.Option(
                    "--json",
                    help="machine-readable output: JSON with stable keys (errors too, on stderr)",
                    rich_help_panel=OUTPUT,
                ),
            ],
            default=False,
        ),
        _param(
            "log_format",
            Annotated[
                Literal["console", "json"] | None,
                typer.Option(
                    "--log-format",
                    help="log lines on stderr (default: console on a terminal, else json)",
                    rich_help_panel=OUTPUT,
                    show_default=False,
                ),
            ],
        ),
        _param(
            "log_level",
            Annotated[
                Literal[LEVELS] | None,
                typer.Option(
                    "--log-level",
                    help="the lowest level logged (default: info for dev, worker and api, "
                    "else warning)",
                    rich_help_panel=OUTPUT,
                    show_default=False,
                ),
            ],
        ),
    ]
    return params


ROOT_PARAMS = _options()
_NAMES = [p.name for p in ROOT_PARAMS]
_ROOT_KEY = "fusee_root_options"


def root_options(ctx: typer.Context, values: dict[str, Any]) -> None:
    """Keep the options given before the command (the root callback's) for it."""
    ctx.meta[_ROOT_KEY] = values


def _resolve(ctx: typer.Context, given: dict[str, Any], *, serving: bool) -> GlobalOptions:
    root: dict[str, Any] = ctx.meta.get(_ROOT_KEY, {})

    def pick(field: str, env: str | None = None) -> Any:
        name = f"fusee_{field}"
        for value in (given.get(name), root.get(name)):
            if value is not None:
                return value
        return os.environ.get(env) or None if env is not None else None

    flag = pick("nats")
    nats = flag or os.environ.get("FUSEE_NATS_URL") or None
    as_json = bool(given.get("fusee_json") or root.get("fusee_json"))
    # --json: the logs on stderr are JSON lines too, unless --log-format says otherwise
    terminal = sys.stderr.isatty() and not as_json
    log_format: LogFormat = pick("log_format") or ("console" if terminal else "json")
    creds = {field: pick(field, env) for field, _, env, _ in CREDENTIALS}
    return GlobalOptions(
        nats=nats,
        nats_flag=flag is not None,
        namespace=pick("namespace", "FUSEE_NAMESPACE") or DEFAULT_NAMESPACE,
        store=pick("store") or DEFAULT_STORE,
        log_format=log_format,
        log_level=pick("log_level") or ("info" if serving else "warning"),
        as_json=as_json,
        **creds,
    )


def _run(body: Callable[[], Awaitable[int]], opts: GlobalOptions) -> int:
    try:
        try:
            return anyio.run(body)
        except BaseExceptionGroup as group:
            raise single(group) from None
    except (CliError, LoadError, FuseeError, OSError) as exc:
        return tell(exc, as_json=opts.as_json)
    except KeyboardInterrupt:
        return 130
    # Anything else is an error of the user's own code (a dev file's main): Python
    # prints its traceback, which is what helps there.


def fusee_command(*, serving: bool = False) -> Callable[[Command], Callable[..., None]]:
    """Make ``async def fn(opts, **own) -> int`` a typer command that takes the shared
    options too: it gets them as ``opts``, logging set up, and its exit code is the
    process's. A one-shot command (not ``serving``) stops cleanly on SIGINT/SIGTERM
    (exit 130/143, its embedded server stopped); a serving one stops its own way."""

    def decorate(fn: Command) -> Callable[..., None]:
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in list(inspect.signature(fn).parameters.values())[1:]
        ]
        ctx_param = inspect.Parameter(_CTX, _KW, annotation=typer.Context)
        params = [*own, *ROOT_PARAMS, ctx_param]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            ctx: typer.Context = kwargs.pop(_CTX)
            given = {name: kwargs.pop(name) for name in _NAMES}
            opts = _resolve(ctx, given, serving=serving)
            configure_logging(opts.log_format, opts.log_level)
            CURRENT.set(opts)

            async def body() -> int:
                return await fn(opts, **kwargs)

            code = _run(body if serving else lambda: stoppable(body), opts)
            raise typer.Exit(code)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
