"""``fusee``: run a dev environment or a worker, and inspect runs.

    fusee dev FILE [--serve] [--api-port N]   embedded NATS + a worker + FILE's main(engine)
    fusee worker FILE [FILE...]         serve the workflows in FILEs until SIGTERM
    fusee api [--host H] [--port N]     serve the HTTP API until SIGTERM
    fusee runs list [--status S] [--workflow W] [--since T] [--until T] [--id-prefix P]
                    [--json | --jsonl]
    fusee runs bulk resume|cancel [FILTERS] [--reason TEXT] [--dry-run]
    fusee runs show RUN_ID [--json]
    fusee runs result RUN_ID [--timeout 30s]
    fusee runs signal RUN_ID NAME [JSON] [--key K]
    fusee runs cancel RUN_ID [--reason TEXT]
    fusee runs resume RUN_ID [--force]  resume a paused run (a step whose retries ran
                                        out gets a fresh budget; --force: past a
                                        broken journal chain)
    fusee streams follow RUN_ID NAME [--from N]
    fusee objects ls TYPE [--json]
    fusee objects get TYPE KEY
    fusee objects show TYPE KEY [--json]
    fusee objects edit TYPE KEY [--set K=JSON]... [--delete K]... [--file PATH|-]
    fusee objects clear TYPE KEY
    fusee objects cancel TYPE KEY [SEQ] [--reason TEXT]
    fusee objects call TYPE KEY HANDLER [JSON] [--timeout 30s] [--idempotency-key K]
    fusee objects send TYPE KEY HANDLER [JSON] [--idempotency-key K]

Exit codes: 0 done; 1 an error (bad input, unknown run, a failed or cancelled run);
2 a usage error, or a run with no result yet (``runs result`` timed out, or it is paused).
``objects`` commands exit 2 on bad input (type, key, JSON) without sending anything.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, cast, get_args

import anyio

from fusee.adapters.cli import commands, limits, objects, tokens
from fusee.adapters.cli.bulk import bulk_parser, runs_bulk
from fusee.adapters.cli.commands import CliError
from fusee.adapters.cli.loader import LoadError
from fusee.adapters.cli.options import CURRENT, DEFAULT_NAMESPACE, DEFAULT_STORE, GlobalOptions
from fusee.errors import FuseeError
from fusee.logs import LEVELS, LogFormat, configure_logging
from fusee.runtime.index import Status

__all__ = ("main", "build_parser")

STATUSES: tuple[str, ...] = get_args(Status)


def _global_options() -> argparse.ArgumentParser:
    # SUPPRESS: options may come before or after the command without one copy's default
    # overwriting what the other copy parsed; defaults are filled in by _options().
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and logging")
    group.add_argument(
        "--nats",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="NATS server URL (default: $FUSEE_NATS_URL, else the embedded server of --store)",
    )
    group.add_argument(
        "--namespace",
        metavar="NS",
        default=argparse.SUPPRESS,
        help=f"fusee namespace: its stream and buckets (default: {DEFAULT_NAMESPACE})",
    )
    group.add_argument(
        "--store",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help=f"the embedded server's directory, used without a URL (default: {DEFAULT_STORE})",
    )
    group.add_argument(
        "--log-format",
        choices=("console", "json"),
        default=argparse.SUPPRESS,
        help="log lines on stderr (default: console on a terminal, else json)",
    )
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default=argparse.SUPPRESS,
        help="the lowest level logged (default: info for dev and worker, warning for runs)",
    )
    return common


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--status", metavar="S", help=f"only runs with this status: {', '.join(STATUSES)}"
    )
    p.add_argument(
        "--workflow", "--type", dest="workflow", metavar="NAME", help="only runs of this workflow"
    )
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="only runs started at or after WHEN: a duration back from now (1h) or an ISO time",
    )
    p.add_argument("--until", metavar="WHEN", help="only runs started before WHEN (as --since)")
    p.add_argument("--id-prefix", metavar="PREFIX", help="only runs whose ID starts with PREFIX")


def build_parser() -> argparse.ArgumentParser:
    """The ``fusee`` argument parser (commands, their options, the global options)."""
    common = _global_options()
    parser = argparse.ArgumentParser(
        prog="fusee",
        description="Durable execution for AI agents, on NATS JetStream.",
        parents=[common],
        epilog="Run `fusee COMMAND --help` for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    dev = sub.add_parser(
        "dev",
        parents=[common],
        help="run FILE with an embedded NATS server and a worker",
        description=(
            "Start (or reuse) the embedded NATS server of --store, import FILE, run a worker, "
            "and await FILE's `async def main(engine)` if it has one. Without main, or with "
            "--serve, keep serving until Ctrl-C."
        ),
    )
    dev.add_argument("file", metavar="FILE", help="a Python file defining workflows")
    dev.add_argument("--serve", action="store_true", help="keep serving after main(engine) returns")
    dev.add_argument(
        "--api-port",
        type=int,
        metavar="PORT",
        help="also serve the HTTP API on 127.0.0.1:PORT (0: any free port); implies --serve",
    )

    worker = sub.add_parser(
        "worker",
        parents=[common],
        help="serve the workflows in FILEs until SIGTERM or Ctrl-C",
        description=(
            "Import FILEs (registering their workflows) and execute runs until SIGTERM or "
            "SIGINT; on either, hand the partitions over to the other workers and exit 0."
        ),
    )
    worker.add_argument("files", metavar="FILE", nargs="+", help="Python files defining workflows")

    api = sub.add_parser(
        "api",
        parents=[common],
        help="serve the HTTP API until SIGTERM or Ctrl-C",
        description=(
            "Serve the HTTP API (docs/reference/http-api.md; GET /openapi.json) on the "
            "namespace, until SIGTERM or SIGINT. It executes no runs: run workers for that."
        ),
    )
    api.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    api.add_argument(
        "--port", type=int, default=8000, help="the port (default: 8000; 0: any free port)"
    )
    api.add_argument(
        "--keepalive",
        default="15s",
        metavar="DURATION",
        help="keep-alive comments on an idle event stream this often (default: 15s)",
    )
    api.add_argument(
        "--no-auth",
        action="store_true",
        help="serve every route without a token: local development only (default: "
        "require `fusee tokens create` tokens)",
    )
    api.add_argument(
        "--max-body",
        default="1MiB",
        metavar="SIZE",
        help="refuse request bodies larger than this with 413, unread (default: 1MiB)",
    )

    runs = sub.add_parser(
        "runs", help="list and inspect runs", description="List and inspect runs."
    )
    runs_sub = runs.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)

    ls = runs_sub.add_parser(
        "list", parents=[common], help="list runs, newest first", description="List runs."
    )
    _filters(ls)
    as_json = ls.add_mutually_exclusive_group()
    as_json.add_argument("--json", action="store_true", help="print a JSON array")
    as_json.add_argument(
        "--jsonl", action="store_true", help="print JSON lines: one object a run, a line each"
    )
    bulk_parser(runs_sub, common, _filters)

    show = runs_sub.add_parser(
        "show",
        parents=[common],
        help="a run's status and journal",
        description="Print a run's status and its journal, one line per record.",
    )
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")

    result = runs_sub.add_parser(
        "result",
        parents=[common],
        help="wait for a run's result and print it as JSON",
        description=(
            "Wait for the run to end and print its result as JSON. Exit 1 if it failed or "
            "was cancelled (the error goes to stderr), 2 if it has no result yet: it did "
            "not end in time, or it is paused."
        ),
    )
    result.add_argument("run_id", metavar="RUN_ID")
    result.add_argument(
        "--timeout", default="30s", metavar="DURATION", help="how long to wait (default: 30s)"
    )

    cancel = runs_sub.add_parser(
        "cancel",
        parents=[common],
        help="cancel a run",
        description=(
            "Ask a run to stop: its running step is told and cancelled, and the run ends "
            "cancelled with the reason. Exit 0 when asked, 1 when the run had already ended."
        ),
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.add_argument("--reason", default="cancelled from the CLI", help="why (shown on the run)")

    resume = runs_sub.add_parser(
        "resume",
        parents=[common],
        help="resume a paused run",
        description=(
            "Resume a paused run: a step whose attempts ran out under "
            "Retry(on_exhausted='pause') runs again with a fresh retry budget; a run "
            "paused because its code no longer matched its journal is replayed by the "
            "code deployed now. Exit 0 when asked (twice is fine: it resumes once), 1 "
            "when the run is not paused (nothing is stored)."
        ),
    )
    resume.add_argument("run_id", metavar="RUN_ID")
    resume.add_argument(
        "--force",
        action="store_true",
        help="resume a run paused on a broken journal chain, taking the chain as it is",
    )

    signal = runs_sub.add_parser(
        "signal",
        parents=[common],
        help="send a run a signal",
        description=(
            "Send the signal NAME with a JSON payload to a run (its ctx.wait_for(NAME) returns "
            "it). Exit 0 when stored, 1 when the run had already ended."
        ),
    )
    signal.add_argument("run_id", metavar="RUN_ID")
    signal.add_argument("name", metavar="NAME")
    signal.add_argument("payload", metavar="JSON", nargs="?", default="null", help="default: null")
    signal.add_argument("--key", help="an idempotency key: a retried send stores nothing new")

    streams = sub.add_parser(
        "streams", help="read a run's token streams", description="Read a run's token streams."
    )
    streams_sub = streams.add_subparsers(dest="streams_command", metavar="COMMAND", required=True)
    follow = streams_sub.add_parser(
        "follow",
        parents=[common],
        help="print a token stream's text as it comes, until its end",
        description=(
            "Print the text of the run's token stream NAME (a model_call's name) as it "
            "comes, from token --from, and exit at the end of the stream. stdout gets the "
            "text only; a note on stderr marks where the model call started over."
        ),
    )
    follow.add_argument("run_id", metavar="RUN_ID")
    follow.add_argument("name", metavar="NAME", help="the stream: the name given to model_call")
    follow.add_argument(
        "--from",
        dest="offset",
        type=int,
        default=0,
        metavar="N",
        help="the index of the first token to print (default: 0)",
    )
    _objects_parser(sub, common)
    _limits_parser(sub, common)
    _tokens_parser(sub, common)
    return parser


def _objects_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    objs = sub.add_parser(
        "objects",
        help="look at and change keyed objects",
        description=(
            "Look at keyed objects (fusee.object) and change their state. Exit 2 on bad "
            "input (an invalid type, key or JSON), with nothing sent."
        ),
    )
    objs_sub = objs.add_subparsers(dest="objects_command", metavar="COMMAND", required=True)

    def command(name: str, help_: str, description: str, *, key: bool = True) -> Any:
        p = objs_sub.add_parser(name, parents=[common], help=help_, description=description)
        p.add_argument("type", metavar="TYPE", help="the object type (its fusee.object name)")
        if key:
            p.add_argument("key", metavar="KEY", help="the object's key")
        return p

    ls = command(
        "ls",
        "the keys of a type that have state",
        "One line per key: the key and its state.",
        key=False,
    )
    ls.add_argument("--json", action="store_true", help="print JSON instead of text")
    command("get", "print a key's state as JSON", "Print the state (`{}` for a key never used).")
    show = command(
        "show",
        "a key's state and queue",
        "Print the state, the invocation running, those waiting (in order) and the last one "
        "that ended.",
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    edit = command(
        "edit",
        "change a key's state (in $EDITOR, or with --set/--delete/--file)",
        "Without flags, open the state as JSON in $VISUAL or $EDITOR (default: vi) and apply "
        "what you save. The change is an exclusive invocation: it waits for the invocations "
        "queued before it. Prints the new state.",
    )
    edit.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="set a state key to a JSON value (repeatable)",
    )
    edit.add_argument(
        "--delete",
        dest="deletes",
        action="append",
        default=[],
        metavar="KEY",
        help="remove a state key (repeatable)",
    )
    edit.add_argument(
        "--file", metavar="PATH", help="a JSON object that replaces the whole state; - is stdin"
    )
    clear = command(
        "clear",
        "remove every key of a key's state",
        "Remove every key of the state, as an exclusive invocation (it waits its turn).",
    )
    for p in (edit, clear):
        p.add_argument(
            "--timeout",
            default="30s",
            metavar="DURATION",
            help="how long to wait for it to apply (default: 30s; then exit 2, it stays queued)",
        )
    cancel = command(
        "cancel",
        "cancel an invocation (by its number), or the running one",
        "Cancel invocation SEQ (from `objects show` or `objects send`), or without SEQ the "
        "running one (else the next to run). It ends fusee.Cancelled and its state changes "
        "are dropped. Exit 1 when nothing is queued.",
    )
    cancel.add_argument("seq", metavar="SEQ", type=int, nargs="?", help="the invocation's number")
    cancel.add_argument("--reason", default="cancelled from the CLI", help="why (its error)")
    for name, help_, description in (
        (
            "call",
            "invoke a handler and print its result as JSON",
            "Invoke HANDLER with the JSON input and print its result. Every handler is "
            "queued as an exclusive invocation (this client does not know which are "
            "shared). Exit 1 if the handler failed or was cancelled, 2 if it did not end "
            "within --timeout (it stays queued).",
        ),
        (
            "send",
            "queue an invocation and print its number",
            "Queue an invocation of HANDLER with the JSON input and print its number (for "
            "`objects cancel`) once it is stored.",
        ),
    ):
        p = command(name, help_, description)
        p.add_argument("handler", metavar="HANDLER")
        p.add_argument("input", metavar="JSON", nargs="?", default="null", help="default: null")
        p.add_argument(
            "--idempotency-key",
            metavar="K",
            help="a retry with the same key (within 2 minutes) does not run it again",
        )
        if name == "call":
            p.add_argument(
                "--timeout",
                default="30s",
                metavar="DURATION",
                help="how long to wait (default: 30s)",
            )


def _limits_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    lim = sub.add_parser(
        "limits",
        help="rate and concurrency limits (engine.limit)",
        description="List limits, or set one (at run time: every worker sees it).",
    )
    lim_sub = lim.add_subparsers(dest="limits_command", metavar="COMMAND", required=True)
    ls = lim_sub.add_parser(
        "ls", parents=[common], help="each limit: rate, burst, concurrency, holders, waiters"
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    st = lim_sub.add_parser("set", parents=[common], help="set or change a limit")
    st.add_argument("name", metavar="NAME")
    st.add_argument("--per-second", type=float, default=None)
    st.add_argument("--burst", type=int, default=None)
    st.add_argument("--concurrent", type=int, default=None)


def _tokens_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    tok = sub.add_parser(
        "tokens",
        help="API tokens of the HTTP API (engine.tokens)",
        description="Make, list and revoke the bearer tokens `fusee api` asks for.",
    )
    tok_sub = tok.add_subparsers(dest="tokens_command", metavar="COMMAND", required=True)
    cr = tok_sub.add_parser("create", parents=[common], help="make a token (printed once)")
    cr.add_argument("--scope", required=True, choices=tokens.SCOPES)
    cr.add_argument("--name", default=None, help="what it is for (shown by ls)")
    cr.add_argument(
        "--ttl", default=None, metavar="DURATION", help="expire after (30d); default: never"
    )
    cr.add_argument(
        "--json", action="store_true", help='print {"token", "id", "scope", "expires_at"}'
    )
    ls = tok_sub.add_parser("ls", parents=[common], help="each token: ID, scope, name, expiry")
    ls.add_argument("--json", action="store_true", help="print JSON")
    rv = tok_sub.add_parser("revoke", parents=[common], help="revoke a token by its ID")
    rv.add_argument("id", metavar="ID")


def _objects_command(args: argparse.Namespace, opts: GlobalOptions) -> Callable[[], Awaitable[int]]:
    name = args.objects_command
    if name == "ls":
        return lambda: objects.objects_ls(opts, args.type, as_json=args.json)
    if name == "get":
        return lambda: objects.objects_get(opts, args.type, args.key)
    if name == "show":
        return lambda: objects.objects_show(opts, args.type, args.key, as_json=args.json)
    if name == "edit":
        return lambda: objects.objects_edit(
            opts,
            args.type,
            args.key,
            sets=args.sets,
            deletes=args.deletes,
            file=args.file,
            timeout=args.timeout,
        )
    if name == "clear":
        return lambda: objects.objects_clear(opts, args.type, args.key, timeout=args.timeout)
    if name == "cancel":
        return lambda: objects.objects_cancel(
            opts, args.type, args.key, args.seq, reason=args.reason
        )
    if name == "call":
        return lambda: objects.objects_call(
            opts,
            args.type,
            args.key,
            args.handler,
            args.input,
            timeout=args.timeout,
            idempotency_key=args.idempotency_key,
        )
    return lambda: objects.objects_send(
        opts, args.type, args.key, args.handler, args.input, idempotency_key=args.idempotency_key
    )


def _options(args: argparse.Namespace) -> GlobalOptions:
    nats_flag = getattr(args, "nats", None)
    log_format = getattr(args, "log_format", None) or ("console" if sys.stderr.isatty() else "json")
    default_level = (
        "warning" if args.command in ("runs", "streams", "objects", "limits", "tokens") else "info"
    )
    return GlobalOptions(
        nats=nats_flag or os.environ.get("FUSEE_NATS_URL") or None,
        nats_flag=bool(nats_flag),
        namespace=getattr(args, "namespace", DEFAULT_NAMESPACE),
        store=getattr(args, "store", DEFAULT_STORE),
        log_format=cast(LogFormat, log_format),
        log_level=getattr(args, "log_level", default_level),
    )


def _command(args: argparse.Namespace, opts: GlobalOptions) -> Callable[[], Awaitable[int]]:
    if args.command in ("dev", "worker", "api"):
        return _serving_command(args, opts)  # they stop on a signal their own way
    one_shot = _one_shot_command(args, opts)
    return lambda: commands.stoppable(one_shot)


def _serving_command(args: argparse.Namespace, opts: GlobalOptions) -> Callable[[], Awaitable[int]]:
    if args.command == "dev":
        return lambda: commands.dev(opts, args.file, serve=args.serve, api_port=args.api_port)
    if args.command == "worker":
        return lambda: commands.worker(opts, args.files)
    if args.command == "api":
        return lambda: commands.api(
            opts,
            host=args.host,
            port=args.port,
            keepalive=args.keepalive,
            max_body=args.max_body,
            auth=not args.no_auth,
        )
    raise AssertionError(f"not a serving command: {args.command}")


def _one_shot_command(
    args: argparse.Namespace, opts: GlobalOptions
) -> Callable[[], Awaitable[int]]:
    if args.command == "objects":
        return _objects_command(args, opts)
    if args.command == "tokens":
        if args.tokens_command == "create":
            return lambda: tokens.tokens_create(
                opts, scope=args.scope, name=args.name, ttl=args.ttl, as_json=args.json
            )
        if args.tokens_command == "ls":
            return lambda: tokens.tokens_ls(opts, as_json=args.json)
        return lambda: tokens.tokens_revoke(opts, args.id)
    if args.command == "limits":
        if args.limits_command == "ls":
            return lambda: limits.limits_ls(opts, as_json=args.json)
        return lambda: limits.limits_set(
            opts,
            args.name,
            per_second=args.per_second,
            burst=args.burst,
            concurrent=args.concurrent,
        )
    if args.command == "streams":
        return lambda: commands.streams_follow(opts, args.run_id, args.name, offset=args.offset)
    if args.runs_command == "list":
        return lambda: commands.runs_list(
            opts,
            status=args.status,
            workflow=args.workflow,
            as_json=args.json,
            since=args.since,
            until=args.until,
            id_prefix=args.id_prefix,
            as_jsonl=args.jsonl,
        )
    if args.runs_command == "bulk":
        return lambda: runs_bulk(opts, args)
    if args.runs_command == "show":
        return lambda: commands.runs_show(opts, args.run_id, as_json=args.json)
    if args.runs_command == "cancel":
        return lambda: commands.runs_cancel(opts, args.run_id, reason=args.reason)
    if args.runs_command == "resume":
        return lambda: commands.runs_resume(opts, args.run_id, force=args.force)
    if args.runs_command == "signal":
        return lambda: commands.runs_signal(
            opts, args.run_id, args.name, args.payload, key=args.key
        )
    return lambda: commands.runs_result(opts, args.run_id, timeout=args.timeout)


def _single(exc: BaseException) -> BaseException:
    # Task groups wrap errors in groups; one error in a group of one is that error.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _fail(message: str, code: int = 1) -> Literal[1, 2]:
    sys.stderr.write(f"error: {message}\n")
    return cast(Literal[1, 2], code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fusee`` command line and return its exit code.

    Example:
        ``main(["runs", "list", "--status", "failed"])``
    """
    args = build_parser().parse_args(argv)
    opts = _options(args)
    configure_logging(opts.log_format, opts.log_level)
    CURRENT.set(opts)
    run = _command(args, opts)
    try:
        try:
            return anyio.run(run)
        except BaseExceptionGroup as group:
            raise _single(group) from None
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except (LoadError, FuseeError, OSError) as exc:
        return _fail(str(exc) or repr(exc))
    except KeyboardInterrupt:
        return 130
    # Anything else is an error of the user's own code (a dev file's main): Python
    # prints its traceback, which is what helps there.
