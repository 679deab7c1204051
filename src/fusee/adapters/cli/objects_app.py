"""``fusee objects ...``: the commands, their arguments and help (typer); what each does
is in ``objects.py``."""

from __future__ import annotations

from typing import Annotated

import typer

from fusee.adapters.cli import objects
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.params import fusee_command

__all__ = ("objects_app",)

objects_app = typer.Typer(
    no_args_is_help=True,
    help="Look at keyed objects (fusee.object) and change their state. Bad input (an "
    "invalid type, key or JSON) exits 2 with nothing sent.",
)

Type = Annotated[
    str, typer.Argument(metavar="TYPE", help="the object type (its fusee.object name)")
]
Key = Annotated[str, typer.Argument(metavar="KEY", help="the object's key")]
Handler = Annotated[str, typer.Argument(metavar="HANDLER")]
Input = Annotated[str, typer.Argument(metavar="JSON", help="the input")]
IdemKey = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        metavar="K",
        help="a retry with the same key (within 2 minutes) does not run it again",
    ),
]
ApplyTimeout = Annotated[
    str,
    typer.Option(
        "--timeout",
        metavar="DURATION",
        help="how long to wait for it to apply (then exit 4; it stays queued)",
    ),
]


@objects_app.command("ls")
@fusee_command()
async def _ls(opts: GlobalOptions, object_type: Type) -> int:
    """The keys of a type that have state: one line per key, its state."""
    return await objects.objects_ls(opts, object_type)


@objects_app.command("get")
@fusee_command()
async def _get(opts: GlobalOptions, object_type: Type, key: Key) -> int:
    """Print a key's state as JSON (`{}` for a key never used)."""
    return await objects.objects_get(opts, object_type, key)


@objects_app.command("show")
@fusee_command()
async def _show(opts: GlobalOptions, object_type: Type, key: Key) -> int:
    """A key's state and queue: running, waiting (in order), the last that ended."""
    return await objects.objects_show(opts, object_type, key)


@objects_app.command("edit")
@fusee_command()
async def _edit(
    opts: GlobalOptions,
    object_type: Type,
    key: Key,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="KEY=JSON", help="set a state key to a JSON value (repeatable)"
        ),
    ] = None,
    deletes: Annotated[
        list[str] | None,
        typer.Option("--delete", metavar="KEY", help="remove a state key (repeatable)"),
    ] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file", metavar="PATH", help="a JSON object that replaces the whole state; - is stdin"
        ),
    ] = None,
    timeout: ApplyTimeout = "30s",
) -> int:
    """Change a key's state (in $EDITOR, or with --set/--delete/--file).

    Without flags, open the state as JSON in $VISUAL or $EDITOR (default: vi) and apply
    what you save. The change is an exclusive invocation: it waits for the invocations
    queued before it. Prints the new state.
    """
    return await objects.objects_edit(
        opts, object_type, key, sets=sets or [], deletes=deletes or [], file=file, timeout=timeout
    )


@objects_app.command("clear")
@fusee_command()
async def _clear(
    opts: GlobalOptions, object_type: Type, key: Key, timeout: ApplyTimeout = "30s"
) -> int:
    """Remove every key of a key's state, as an exclusive invocation (it waits its turn)."""
    return await objects.objects_clear(opts, object_type, key, timeout=timeout)


@objects_app.command("cancel")
@fusee_command()
async def _cancel(
    opts: GlobalOptions,
    object_type: Type,
    key: Key,
    seq: Annotated[
        int | None, typer.Argument(metavar="SEQ", help="the invocation's number")
    ] = None,
    reason: Annotated[
        str, typer.Option("--reason", help="why (its error)")
    ] = "cancelled from the CLI",
) -> int:
    """Cancel an invocation (by its number), or the running one.

    Cancel invocation SEQ (from `objects show` or `objects send`), or without SEQ the
    running one (else the next to run). It ends fusee.Cancelled and its state changes
    are dropped. Exit 1 when nothing is queued.
    """
    return await objects.objects_cancel(opts, object_type, key, seq, reason=reason)


@objects_app.command("call")
@fusee_command()
async def _call(
    opts: GlobalOptions,
    object_type: Type,
    key: Key,
    handler: Handler,
    arg: Input = "null",
    timeout: Annotated[
        str, typer.Option("--timeout", metavar="DURATION", help="how long to wait")
    ] = "30s",
    idempotency_key: IdemKey = None,
) -> int:
    """Invoke a handler and print its result as JSON.

    Every handler is queued as an exclusive invocation (this client does not know which
    are shared). Exit 1 if the handler failed or was cancelled, 4 if it did not end
    within --timeout (it stays queued).
    """
    return await objects.objects_call(
        opts, object_type, key, handler, arg, timeout=timeout, idempotency_key=idempotency_key
    )


@objects_app.command("send")
@fusee_command()
async def _send(
    opts: GlobalOptions,
    object_type: Type,
    key: Key,
    handler: Handler,
    arg: Input = "null",
    idempotency_key: IdemKey = None,
) -> int:
    """Queue an invocation and print its number (for `objects cancel`) once stored."""
    return await objects.objects_send(
        opts, object_type, key, handler, arg, idempotency_key=idempotency_key
    )
