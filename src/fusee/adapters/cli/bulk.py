"""``fusee runs bulk resume|cancel``: the engine's bulk actions, with a progress bar and a
summary. The logic is the engine's (``Engine.bulk_resume``, ``Engine.bulk_cancel``),
shared with the HTTP API; this module parses, shows progress and prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import fusee
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.options import GlobalOptions
from fusee.runtime.bulk import make_filter

__all__ = ("bulk_parser", "runs_bulk")


def bulk_parser(
    runs_sub: Any,
    common: argparse.ArgumentParser,
    filters: Callable[[argparse.ArgumentParser], None],
) -> None:
    bulk = runs_sub.add_parser(
        "bulk",
        help="resume or cancel every run a filter matches",
        description=(
            "Resume or cancel every run the filters match, paging through the run index "
            "(never every run at once), 32 at a time, with a progress bar and a summary "
            "(done, skipped, failed). Safe to run again after an interruption: a run "
            "already resumed or cancelled is skipped. Exit 1 if any failed."
        ),
    )
    sub = bulk.add_subparsers(dest="bulk_action", metavar="ACTION", required=True)
    for action, help_ in (
        ("resume", "resume paused runs (--status paused is implied)"),
        ("cancel", "cancel runs that have not ended"),
    ):
        p = sub.add_parser(action, parents=[common], help=help_, description=help_)
        filters(p)
        if action == "cancel":
            p.add_argument("--reason", default="cancelled in bulk from the CLI", help="why")
        p.add_argument(
            "--dry-run", action="store_true", help="list what it would do, change nothing"
        )


async def _total(engine: fusee.Engine, action: str, filters: dict[str, Any]) -> int | None:
    """How many runs a bulk resume will meet at most, when the index can count them
    without reading them: the paused listing entries of the workflow (or of all), with
    no start time or ID prefix asked (those are checked on each entry read). None for a
    cancel: the runs not ended are active markers, named by partition and ID only; None
    too when NATS cannot count now (the bar then has no total)."""
    if action != "resume" or any(filters[k] for k in ("since", "until", "id_prefix")):
        return None
    return await engine.count_paused(workflow=filters["workflow"])


async def runs_bulk(opts: GlobalOptions, args: argparse.Namespace) -> int:
    # rich's progress bar is imported here, not with the CLI: it costs every command
    # about 7.5 ms to import, and only the bulk commands draw it
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    action = args.bulk_action
    err = Console(stderr=True)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        filters = {
            "status": args.status,
            "workflow": args.workflow,
            "since": args.since,
            "until": args.until,
            "id_prefix": args.id_prefix,
        }
        make_filter(**filters, now=time.time())  # bad input: refused before anything is read
        total = await _total(engine, action, filters)
        with Progress(
            TextColumn(f"{action} [progress.description]{{task.description}}"),
            BarColumn(bar_width=None),
            TextColumn(
                "{task.completed} runs" if total is None else "{task.completed} of {task.total:.0f}"
            ),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        ) as progress:
            task = progress.add_task("", total=total)
            counts = {"done": 0, "skipped": 0, "failed": 0}

            def on_run(info: fusee.RunInfo, what: str) -> None:
                if what == "would":  # (a dry run's done)
                    sys.stdout.write(f"would {action} {info.run_id} ({info.status})\n")
                    what = "done"
                counts[what] += 1
                desc = ", ".join(f"{k} {v}" for k, v in counts.items())
                progress.update(task, description=desc)
                progress.advance(task)

            kwargs: dict[str, Any] = {**filters, "dry_run": args.dry_run, "on_run": on_run}
            if action == "cancel":
                summary = await engine.bulk_cancel(reason=args.reason, **kwargs)
            else:
                summary = await engine.bulk_resume(**kwargs)
            done = progress.tasks[0].completed
            progress.update(task, total=done)  # (the count was at most this many)
    verb = "would " + action if summary.dry_run else action
    sent = f"{action}s {'to send' if summary.dry_run else 'sent'}"
    sys.stdout.write(
        f"{verb}: {summary.done} done, {summary.skipped} skipped, {len(summary.failed)} failed"
        f" (done: {sent}; each run acts on it when its worker reads it)\n"
    )
    for run_id, why in summary.failed.items():
        sys.stdout.write(f"  failed {run_id}: {why}\n")
    return 0 if summary.ok else 1
