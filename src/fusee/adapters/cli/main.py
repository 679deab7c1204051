"""``fusee``: run a dev environment, a worker or the HTTP API, and look at and act on
runs, streams, objects and limits. Built with typer (parsing, help, shell completion)
and rich (tables, progress, the live view). docs/reference/cli.md is the reference;
exit codes are in ``fusee.adapters.cli.errors``.

The commands: ``dev``, ``worker``, ``api``; ``runs start|list|show|journal|result|
signal|cancel|resume|bulk resume|bulk cancel``; ``streams follow``; ``objects ls|get|
show|edit|clear|cancel|call|send``; ``limits ls|set``; ``tokens create|ls|revoke``.
Another module's commands join as a sub-app with ``register(name, sub_app, help)``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from fusee.adapters.cli import commands, limits
from fusee.adapters.cli.errors import CliError, Exit, tell
from fusee.adapters.cli.objects_app import objects_app
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.params import ROOT_PARAMS, fusee_command, root_options
from fusee.adapters.cli.regions import region_app
from fusee.adapters.cli.runs import streams_follow
from fusee.adapters.cli.runs_app import runs_app
from fusee.adapters.cli.tokens import tokens_app

__all__ = ("main", "app", "register")

app = typer.Typer(
    name="fusee",
    help="Durable execution for AI agents, on NATS JetStream.",
    epilog="Run `fusee COMMAND --help` for a command's options. Exit codes: "
    "0 done, 1 an error (a run failed...), 2 bad input, 3 not found, 4 not yet (a wait "
    "ran out), 130/143 stopped by a signal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # a dev file's own error: Python's plain traceback
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _root(**kwargs: Any) -> None:
    """Durable execution for AI agents, on NATS JetStream."""
    ctx: typer.Context = kwargs.pop("fusee_ctx")
    root_options(ctx, kwargs)


_root.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *ROOT_PARAMS,
        inspect.Parameter("fusee_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
    ]
)
_root.__annotations__ = {p.name: p.annotation for p in ROOT_PARAMS} | {"fusee_ctx": typer.Context}
app.callback()(_root)


def register(name: str, sub: typer.Typer, help_: str) -> None:
    """Add ``sub``'s commands as ``fusee NAME ...`` (its commands made with
    ``params.fusee_command`` take the shared options)."""
    app.add_typer(sub, name=name, help=help_)


# -- serving -----------------------------------------------------------------------------


@app.command("dev")
@fusee_command(serving=True)
async def _dev(
    opts: GlobalOptions,
    file: Annotated[str, typer.Argument(metavar="FILE", help="a Python file defining workflows")],
    serve: Annotated[
        bool, typer.Option("--serve", help="keep serving after main(engine) returns")
    ] = False,
    api_port: Annotated[
        int | None,
        typer.Option(
            "--api-port",
            metavar="PORT",
            help="also serve the HTTP API on 127.0.0.1:PORT (0: any free port); implies --serve",
        ),
    ] = None,
) -> int:
    """Run FILE with an embedded NATS server and a worker.

    Start (or reuse) the embedded NATS server of --store, import FILE, run a worker, and
    await FILE's `async def main(engine)` if it has one. Without main, or with --serve,
    keep serving until Ctrl-C.
    """
    return await commands.dev(opts, file, serve=serve, api_port=api_port)


@app.command("worker")
@fusee_command(serving=True)
async def _worker(
    opts: GlobalOptions,
    files: Annotated[
        list[str], typer.Argument(metavar="FILE...", help="Python files defining workflows")
    ],
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            metavar="REGION",
            envvar="FUSEE_REGION",
            help="the region (NATS cluster) this worker is in: a new namespace's home; "
            "a worker serves a namespace only in its home",
        ),
    ] = None,
    partner: Annotated[
        str | None,
        typer.Option(
            "--partner",
            metavar="REGION",
            envvar="FUSEE_PARTNER_REGION",
            help="the region that keeps a mirror of the namespace's journal (made if missing)",
        ),
    ] = None,
) -> int:
    """Serve the workflows in FILEs until SIGTERM or Ctrl-C.

    Import FILEs (registering their workflows) and execute runs until SIGTERM or SIGINT;
    on either, hand the partitions over to the other workers and exit 0.
    """
    opts = dataclasses.replace(opts, region=region, partner=partner)
    return await commands.worker(opts, files)


@app.command("api")
@fusee_command(serving=True)
async def _api(
    opts: GlobalOptions,
    host: Annotated[str, typer.Option("--host", help="the address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="the port (0: any free port)")] = 8000,
    keepalive: Annotated[
        str,
        typer.Option(
            "--keepalive",
            metavar="DURATION",
            help="keep-alive comments on an idle event stream this often",
        ),
    ] = "15s",
    max_body: Annotated[
        str,
        typer.Option(
            "--max-body",
            metavar="SIZE",
            help="refuse request bodies larger than this with 413, unread",
        ),
    ] = "1MiB",
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="serve every route without a token: local development only (default: "
            "require `fusee tokens create` tokens)",
        ),
    ] = False,
) -> int:
    """Serve the HTTP API until SIGTERM or Ctrl-C.

    Serve the HTTP API (docs/reference/http-api.md; GET /openapi.json) on the namespace,
    until SIGTERM or SIGINT. It executes no runs: run workers for that. Every route but
    /healthz, /openapi.json and the completion URLs asks for a bearer token (docs/security.md).
    """
    return await commands.api(
        opts, host=host, port=port, keepalive=keepalive, max_body=max_body, auth=not no_auth
    )


# -- streams, limits ----------------------------------------------------------------------

streams_app = typer.Typer(no_args_is_help=True, help="Read a run's token streams.")


@streams_app.command("follow")
@fusee_command()
async def _follow(
    opts: GlobalOptions,
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="the stream: the name given to model_call")
    ],
    offset: Annotated[
        int, typer.Option("--from", metavar="N", help="the index of the first token to print")
    ] = 0,
) -> int:
    """Print a token stream's text as it comes, until its end.

    Print the text of the run's token stream NAME (a model_call's name) as it comes,
    from token --from, and exit at the end of the stream. stdout gets the text only; a
    note on stderr marks where the model call started over. --json: one JSON object a
    line per event.
    """
    return await streams_follow(opts, run_id, name, offset=offset)


limits_app = typer.Typer(
    no_args_is_help=True,
    help="Rate and concurrency limits (engine.limit): list them, or set one at run time.",
)


@limits_app.command("ls")
@fusee_command()
async def _limits_ls(opts: GlobalOptions) -> int:
    """Each limit: rate, burst, concurrency, holders, waiters."""
    return await limits.limits_ls(opts)


@limits_app.command("set")
@fusee_command()
async def _limits_set(
    opts: GlobalOptions,
    name: Annotated[str, typer.Argument(metavar="NAME")],
    per_second: Annotated[
        float | None, typer.Option("--per-second", help="permits a second")
    ] = None,
    burst: Annotated[
        int | None, typer.Option("--burst", help="permits at once beyond the rate")
    ] = None,
    concurrent: Annotated[
        int | None, typer.Option("--concurrent", help="permits held at once")
    ] = None,
) -> int:
    """Set or change a limit: what is not given keeps its value; every worker sees it."""
    return await limits.limits_set(
        opts, name, per_second=per_second, burst=burst, concurrent=concurrent
    )


app.add_typer(runs_app, name="runs", help="Start, list, inspect and act on runs.")
app.add_typer(streams_app, name="streams")
app.add_typer(objects_app, name="objects")
app.add_typer(limits_app, name="limits")
register("tokens", tokens_app, "API tokens of the HTTP API: make, list, revoke.")
register("region", region_app, "Regions: a namespace's home and mirror, and failing it over.")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fusee`` command line and return its exit code.

    Example:
        ``main(["runs", "list", "--status", "failed"])``
    """
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        if _wants_json(args):
            return _main_json(args)
        app(args=args, prog_name="fusee")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _wants_json(args: list[str]) -> bool:
    """Whether ``--json`` is among the options (before a ``--``)."""
    options = args[: args.index("--")] if "--" in args else args
    return "--json" in options


def _main_json(args: list[str]) -> int:
    """Run with ``--json``: a usage error (an unknown option, a missing argument) is
    the one JSON error object on stderr that docs/reference/cli.md promises, exit 2,
    not click's panel."""
    try:
        result = typer.main.get_command(app).main(
            args=args, prog_name="fusee", standalone_mode=False
        )
    except typer.TyperException as exc:  # (click's errors: a usage error exits 2)
        name = "bad_input" if exc.exit_code == Exit.USAGE else "error"
        return tell(CliError(exc.format_message(), exc.exit_code, name=name), as_json=True)
    except typer.Abort:
        return tell(CliError("aborted"), as_json=True)
    return result if isinstance(result, int) else 0
