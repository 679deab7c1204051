"""``fusee runs bulk resume|cancel``: the engine's bulk actions, with a progress bar and a
summary. The logic is the engine's (``Engine.bulk_resume``, ``Engine.bulk_cancel``),
shared with the HTTP API; this module parses, shows progress and prints.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import fusee
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.render import json_text
from fusee.errors import ConfigError
from fusee.runtime.bulk import make_filter

__all__ = ("runs_bulk", "show_progress")


async def _total(engine: fusee.Engine, action: str, filters: dict[str, Any]) -> int | None:
    """How many runs a bulk resume will meet at most, when the index can count them
    without reading them: the paused listing entries of the workflow (or of all), with
    no start time or ID prefix asked (those are checked on each entry read). None for a
    cancel: the runs not ended are active markers, named by partition and ID only; None
    too when NATS cannot count now (the bar then has no total)."""
    if action != "resume" or any(filters[k] for k in ("since", "until", "id_prefix")):
        return None
    return await engine.count_paused(workflow=filters["workflow"])


def show_progress(opts: GlobalOptions, progress: bool | None) -> bool:
    """Whether to draw the bar: ``--progress``/``--no-progress`` when given, else
    ``$FUSEE_PROGRESS`` (``1``/``0``), else on a terminal only; never with ``--json``."""
    if opts.as_json:
        return False
    if progress is not None:
        return progress
    env = os.environ.get("FUSEE_PROGRESS", "")
    if env in ("0", "1"):
        return env == "1"
    return sys.stderr.isatty()


async def runs_bulk(
    opts: GlobalOptions,
    action: str,
    *,
    filters: dict[str, Any],
    reason: str | None = None,
    dry_run: bool = False,
    progress: bool | None = None,
) -> int:
    """Resume or cancel every run ``filters`` match, with a progress bar on stderr
    (``show_progress``) and a summary on stdout (with ``--json``, the HTTP API's:
    ``{"action", "dry_run", "done", "skipped", "failed": {run ID: why}}``)."""
    try:
        make_filter(**filters, now=time.time())  # bad input: refused before anything is read
    except ConfigError as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        total = await _total(engine, action, filters)
        counts = {"done": 0, "skipped": 0, "failed": 0}
        with _Bar(action, total, shown=show_progress(opts, progress)) as bar:

            def on_run(info: fusee.RunInfo, what: str) -> None:
                if what == "would":  # (a dry run's done)
                    if not opts.as_json:
                        sys.stdout.write(f"would {action} {info.run_id} ({info.status})\n")
                    what = "done"
                counts[what] += 1
                bar.advance(", ".join(f"{k} {v}" for k, v in counts.items()))

            kwargs: dict[str, Any] = {**filters, "dry_run": dry_run, "on_run": on_run}
            if action == "cancel":
                summary = await engine.bulk_cancel(reason=reason or "cancelled", **kwargs)
            else:
                summary = await engine.bulk_resume(**kwargs)
    if opts.as_json:
        sys.stdout.write(json_text(summary) + "\n")
        return Exit.OK if summary.ok else Exit.ERROR
    verb = "would " + action if summary.dry_run else action
    sent = f"{action}s {'to send' if summary.dry_run else 'sent'}"
    sys.stdout.write(
        f"{verb}: {summary.done} done, {summary.skipped} skipped, {len(summary.failed)} failed"
        f" (done: {sent}; each run acts on it when its worker reads it)\n"
    )
    for run_id, why in summary.failed.items():
        sys.stdout.write(f"  failed {run_id}: {why}\n")
    return Exit.OK if summary.ok else Exit.ERROR


class _Bar:
    """rich's progress bar on stderr (``done 12, skipped 0, failed 0  ━━━━  12/40  0:00:01``),
    or nothing when not ``shown``. Without a total it counts (``12 runs``); at the end
    its total is what was met (the index's count is an upper bound)."""

    def __init__(self, action: str, total: int | None, *, shown: bool) -> None:
        self.action, self.total, self.shown = action, total, shown
        self.progress: Any = None
        self.task: Any = None

    def __enter__(self) -> _Bar:
        if not self.shown:
            return self
        # rich's progress bar is imported here, not with the CLI: it costs every command
        # about 7.5 ms to import, and only the bulk commands draw it
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        count = (
            MofNCompleteColumn() if self.total is not None else TextColumn("{task.completed} runs")
        )
        # forced on (--progress) without a terminal: drawn as on one, so it shows
        err = Console(stderr=True, force_terminal=True if not sys.stderr.isatty() else None)
        self.progress = Progress(
            TextColumn(f"{self.action} [progress.description]{{task.description}}"),
            BarColumn(bar_width=None),
            count,
            TimeElapsedColumn(),
            console=err,
            transient=False,
            # a dry run's lines print above the bar on a terminal, and stay on stdout
            # when it is a pipe or a file
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=False,
        )
        self.progress.__enter__()
        self.task = self.progress.add_task("", total=self.total)
        return self

    def advance(self, description: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=description, advance=1)

    def __exit__(self, *exc: object) -> None:
        if self.progress is None:
            return
        done = self.progress.tasks[0].completed
        self.progress.update(self.task, total=done)  # (the count was at most this many)
        self.progress.__exit__(*exc)
