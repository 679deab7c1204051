"""``fusee runs ...``: the commands, their arguments and help (typer); what each does is
in ``runs.py``, ``bulk.py`` and ``watch.py``."""

from __future__ import annotations

from typing import Annotated, get_args

import typer

from fusee.adapters.cli import runs
from fusee.adapters.cli.bulk import runs_bulk
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.params import fusee_command
from fusee.adapters.cli.watch import runs_watch
from fusee.runtime.index import Status

__all__ = ("runs_app",)

STATUSES: tuple[str, ...] = get_args(Status)
FILTERS = "Filters"

runs_app = typer.Typer(no_args_is_help=True)
bulk_app = typer.Typer(
    no_args_is_help=True,
    help="Resume or cancel every run a filter matches, with a progress bar and a summary.",
)
runs_app.add_typer(bulk_app, name="bulk")

RunId = Annotated[str, typer.Argument(metavar="RUN_ID", help="the run's ID")]
StatusOpt = Annotated[
    str | None,
    typer.Option(
        "--status",
        metavar="S",
        help=f"only runs with this status: {', '.join(STATUSES)}",
        rich_help_panel=FILTERS,
    ),
]
WorkflowOpt = Annotated[
    str | None,
    typer.Option(
        "--workflow",
        "--type",
        metavar="NAME",
        help="only runs of this workflow",
        rich_help_panel=FILTERS,
    ),
]
SinceOpt = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="WHEN",
        help="only runs started at or after WHEN: a duration back from now (1h) or an ISO time",
        rich_help_panel=FILTERS,
    ),
]
UntilOpt = Annotated[
    str | None,
    typer.Option(
        "--until", metavar="WHEN", help="only runs started before WHEN", rich_help_panel=FILTERS
    ),
]
PrefixOpt = Annotated[
    str | None,
    typer.Option(
        "--id-prefix",
        metavar="PREFIX",
        help="only runs whose ID starts with PREFIX",
        rich_help_panel=FILTERS,
    ),
]


@runs_app.command("start")
@fusee_command()
async def _start(
    opts: GlobalOptions,
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="the workflow's name")],
    run_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            metavar="ID",
            help="the run's ID (default: WORKFLOW-<random>); starting the same ID again is the same run",
        ),
    ] = None,
    arg: Annotated[
        str,
        typer.Option(
            "--input",
            metavar="JSON|@FILE",
            help="the input: JSON, @FILE (a JSON file) or @- (stdin)",
        ),
    ] = "null",
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            help="the run's own timeout (15m): it is cancelled past it",
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for the run to end and print its result")
    ] = False,
) -> int:
    """Start a run of WORKFLOW (idempotent by --id).

    Store the start and print the run's ID; a worker serving WORKFLOW runs it. The same
    start again (same ID, workflow and input) is the same run; the same ID with another
    workflow or input is an error. --wait: wait for the end and print the result as
    `runs result` does (exit 1 if it failed or was cancelled).
    """
    return await runs.runs_start(opts, workflow, run_id=run_id, arg=arg, timeout=timeout, wait=wait)


@runs_app.command("list")
@fusee_command()
async def _list(
    opts: GlobalOptions,
    status: StatusOpt = None,
    workflow: WorkflowOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    id_prefix: PrefixOpt = None,
    jsonl: Annotated[
        bool, typer.Option("--jsonl", help="JSON lines: one object a run, a line each")
    ] = False,
) -> int:
    """List runs, newest first (with a filter: page by page, newest first in each)."""
    return await runs.runs_list(
        opts,
        status=status,
        workflow=workflow,
        since=since,
        until=until,
        id_prefix=id_prefix,
        as_json=opts.as_json,
        as_jsonl=jsonl,
    )


@runs_app.command("show")
@fusee_command()
async def _show(
    opts: GlobalOptions,
    run_id: RunId,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", "-w", help="a live view until the run ends: status, journal, token streams"
        ),
    ] = False,
    streams: Annotated[
        list[str] | None,
        typer.Option(
            "--stream",
            metavar="NAME",
            help="with --watch: also show token stream NAME as it comes (repeatable)",
        ),
    ] = None,
) -> int:
    """A run's status and journal (--watch: as it runs, until it ends).

    Print a run's status and its journal, one line per record. --watch follows the run
    until it ends (exit 0 completed, 1 failed or cancelled): a live view on a terminal,
    lines as things happen elsewhere, JSON lines with --json.
    """
    if watch:
        return await runs_watch(opts, runs.check_run_id(run_id), streams=streams or [])
    if streams:
        raise CliError("--stream shows a stream with --watch only", Exit.USAGE)
    return await runs.runs_show(opts, run_id, as_json=opts.as_json)


@runs_app.command("journal")
@fusee_command()
async def _journal(
    opts: GlobalOptions,
    run_id: RunId,
    after: Annotated[
        int,
        typer.Option(
            "--after", metavar="SEQ", help="records after this stream sequence (a page's `next`)"
        ),
    ] = 0,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="N", help="at most N records")
    ] = None,
) -> int:
    """A run's journal records, a page at a time (--after, --limit)."""
    return await runs.runs_journal(opts, run_id, after=after, limit=limit)


@runs_app.command("result")
@fusee_command()
async def _result(
    opts: GlobalOptions,
    run_id: RunId,
    timeout: Annotated[
        str, typer.Option("--timeout", metavar="DURATION", help="how long to wait")
    ] = "30s",
) -> int:
    """Wait for a run's result and print it as JSON.

    Exit 1 if it failed or was cancelled (the error on stderr), 4 if it has no result
    yet: it did not end in time, or it is paused; 3 if there is no such run.
    """
    return await runs.runs_result(opts, run_id, timeout=timeout)


@runs_app.command("signal")
@fusee_command()
async def _signal(
    opts: GlobalOptions,
    run_id: RunId,
    name: Annotated[str, typer.Argument(metavar="NAME", help="the signal (ctx.wait_for(NAME))")],
    payload: Annotated[str, typer.Argument(metavar="JSON", help="the payload")] = "null",
    key: Annotated[
        str | None,
        typer.Option("--key", help="an idempotency key: a retried send stores nothing new"),
    ] = None,
) -> int:
    """Send a run a signal (exit 1 when the run had already ended)."""
    return await runs.runs_signal(opts, run_id, name, payload, key=key)


@runs_app.command("cancel")
@fusee_command()
async def _cancel(
    opts: GlobalOptions,
    run_id: RunId,
    reason: Annotated[
        str, typer.Option("--reason", help="why (shown on the run)")
    ] = "cancelled from the CLI",
) -> int:
    """Cancel a run (exit 1 when it had already ended).

    Ask a run to stop: its running step is told and cancelled, and the run ends
    cancelled with the reason.
    """
    return await runs.runs_cancel(opts, run_id, reason=reason)


@runs_app.command("resume")
@fusee_command()
async def _resume(
    opts: GlobalOptions,
    run_id: RunId,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="resume a run paused on a broken journal chain, taking the chain as it is",
        ),
    ] = False,
) -> int:
    """Resume a paused run (exit 1 when it is not paused).

    A step whose attempts ran out under Retry(on_exhausted='pause') runs again with a
    fresh retry budget; a run paused because its code no longer matched its journal is
    replayed by the code deployed now. Twice is fine: it resumes once.
    """
    return await runs.runs_resume(opts, run_id, force=force)


ProgressOpt = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="draw the progress bar on stderr (default: on a terminal; $FUSEE_PROGRESS=1/0)",
        show_default=False,
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="list what it would do, change nothing")]


@bulk_app.command("resume")
@fusee_command()
async def _bulk_resume(
    opts: GlobalOptions,
    status: StatusOpt = None,
    workflow: WorkflowOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    id_prefix: PrefixOpt = None,
    dry_run: DryRunOpt = False,
    progress: ProgressOpt = None,
) -> int:
    """Resume the paused runs the filters match (--status paused is implied).

    Pages through the run index (never every run at once), 32 at a time. Safe to run
    again after an interruption: a run already resumed is skipped. Exit 1 if any failed.
    """
    filters = {
        "status": status,
        "workflow": workflow,
        "since": since,
        "until": until,
        "id_prefix": id_prefix,
    }
    return await runs_bulk(opts, "resume", filters=filters, dry_run=dry_run, progress=progress)


@bulk_app.command("cancel")
@fusee_command()
async def _bulk_cancel(
    opts: GlobalOptions,
    status: StatusOpt = None,
    workflow: WorkflowOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    id_prefix: PrefixOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="why")] = "cancelled in bulk from the CLI",
    dry_run: DryRunOpt = False,
    progress: ProgressOpt = None,
) -> int:
    """Cancel the runs not ended that the filters match.

    Pages through the run index (never every run at once), 32 at a time. Safe to run
    again after an interruption: a run already cancelled is skipped. Exit 1 if any failed.
    """
    filters = {
        "status": status,
        "workflow": workflow,
        "since": since,
        "until": until,
        "id_prefix": id_prefix,
    }
    return await runs_bulk(
        opts, "cancel", filters=filters, reason=reason, dry_run=dry_run, progress=progress
    )
