"""Runs and journals as text: what ``fusee runs list`` and ``fusee runs show`` print.

A record's line is a pure function of the record, with ``now`` passed in, so tests and
examples can use them on any journal; tables are rich's (laid out to the terminal's
width), imported when one is drawn.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

from fusee.runtime.durations import format_duration
from fusee.runtime.index import RunInfo
from fusee.runtime.records import (
    CallCancelled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepRetrying,
    WaitDone,
    WaitStarted,
    kind_of,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = (
    "clip",
    "format_age",
    "format_ms",
    "format_record",
    "format_journal",
    "format_run",
    "format_runs_table",
    "RunsTable",
    "console",
    "table",
    "render_lines",
    "json_text",
    "json_item",
    "json_end",
)

CLIP = 64


def clip(text: str, n: int = CLIP) -> str:
    """``text`` on one line, cut to ``n`` characters with an ellipsis."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= n else one_line[: n - 1] + "…"


def _value(raw: msgspec.Raw | bytes, n: int = CLIP) -> str:
    return clip(bytes(raw).decode(errors="replace"), n)


def _child_end(raw: msgspec.Raw | bytes) -> str:
    """A child's end as its parent journaled it: ``-> result``, ``failed: T: m``..."""
    try:
        end = msgspec.json.decode(bytes(raw))
    except msgspec.DecodeError:
        return f"-> {_value(raw)}"
    if not isinstance(end, dict):
        return f"-> {_value(raw)}"
    if end.get("status") == "failed":
        return clip(f"failed: {end.get('error_type')}: {end.get('message')}")
    if end.get("status") == "cancelled":
        return clip(f"cancelled: {end.get('reason')}")
    return f"-> {_value(msgspec.json.encode(end.get('result')))}"


def format_ms(ms: float) -> str:
    """``0.2 ms``, ``212 ms``, ``1.3 s``: a step's duration, short."""
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    return f"{ms / 1000:.1f} s"


def format_age(seconds: float) -> str:
    """``12s``, ``5m``, ``3h``, ``2d``: how long ago, to one unit."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def format_record(record: Any, name_width: int = 0) -> str:
    """One journal record as one line, without its sequence number."""
    kind = kind_of(record)
    if isinstance(record, RunStarted):
        timeout = f"  (timeout {format_duration(record.timeout)})" if record.timeout else ""
        body = f"{record.workflow}  <- {_value(record.input)}{timeout}"
    elif isinstance(record, StepCompleted):
        result = (
            _value(record.result)
            if isinstance(record.result_ref, msgspec.UnsetType)
            else f"<{record.result_ref.size:,} bytes, stored out of line>"
        )
        body = (
            f"{record.name.ljust(name_width)}  (attempt {record.attempt}, "
            f"{format_ms(record.duration_ms)})  -> {result}"
        )
    elif isinstance(record, StepRetrying):
        body = (
            f"{record.name.ljust(name_width)}  (attempt {record.attempt})  "
            f"{clip(f'{record.error_type}: {record.message}')}; "
            f"retry in {format_ms(record.retry_in * 1000)}"
        )
    elif isinstance(record, StepFailed):
        body = (
            f"{record.name.ljust(name_width)}  (attempt {record.attempt})  "
            f"{clip(f'{record.error_type}: {record.message}')}"
        )
    elif isinstance(record, WaitStarted):
        what = "sleep" if record.wait == "sleep" else f"{record.wait} {record.name!r}"
        until = ""
        if record.until is not None:
            stamp = datetime.datetime.fromtimestamp(record.until, tz=datetime.UTC)
            until = f"  (until {stamp:%Y-%m-%d %H:%M:%S} UTC)"
        body = f"{what}{until}"
    elif isinstance(record, WaitDone):
        what = "sleep" if record.wait == "sleep" else f"{record.wait} {record.name!r}"
        if record.timed_out:
            body = f"{what}  {'woke' if record.wait == 'sleep' else 'timed out'}"
        elif record.wait == "child":
            body = f"{what}  {_child_end(record.value)}"
        else:
            body = f"{what}  -> {_value(record.value)}"
    elif isinstance(record, CallCancelled):
        what = record.name.ljust(name_width) if record.call == "step" else record.name
        what = what if record.call == "step" else f"{record.call} {what!r}"
        body = f"{what}  cancelled: {clip(record.reason)}".rstrip()
    elif isinstance(record, RunCompleted):
        body = f"-> {_value(record.result)}"
    elif isinstance(record, RunFailed):
        where = f"  (in step {record.step})" if record.step else ""
        body = clip(f"{record.error_type}: {record.message}") + where
    elif isinstance(record, RunPaused) and isinstance(record.step, str):
        body = (
            f"{record.step.ljust(name_width)}  ({record.attempts} attempt(s))  "
            f"{clip(f'{record.error_type}: {record.message}')}; attempts ran out: paused"
        )
    elif isinstance(record, RunCancelled | RunPaused):
        body = clip(record.reason, 200)
    elif isinstance(record, RunResumed):
        body = f"the pause at #{record.paused}" if record.paused else "a broken chain"
        if record.force:
            body += f", forced past the break(s) up to #{record.gap}"
        body += f"  (inbox #{record.inbox_seq})" if record.inbox_seq else ""
    else:  # pragma: no cover - a record kind newer than this CLI
        body = clip(msgspec.json.encode(record).decode())
    values = getattr(record, "values", None)
    if isinstance(values, list) and values:  # ctx.now()... taken before this record
        body += "  [took " + ", ".join(_format_taken(v.kind, v.value) for v in values) + "]"
    return f"{kind:<15} {body}".rstrip()


def _format_taken(kind: str, value: float | str) -> str:
    if kind == "now" and isinstance(value, float):
        stamp = datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
        return f"now {stamp:%Y-%m-%d %H:%M:%S.%f} UTC"
    return f"{kind} {value}"


def format_journal(journal: Sequence[tuple[int, Any]], indent: str = "  ") -> list[str]:
    """The journal, one line per record: ``#seq  kind  name  (attempt, time)  -> value``.

    ``seq`` is the record's sequence in the namespace's stream, as ``nats stream view``
    and ``nats stream get`` show it.
    """
    names = [
        len(r.name) for _, r in journal if isinstance(r, StepCompleted | StepRetrying | StepFailed)
    ] + [len(r.step) for _, r in journal if isinstance(r, RunPaused) and isinstance(r.step, str)]
    width = max(names, default=0)
    seq_width = max((len(str(seq)) for seq, _ in journal), default=1) + 1
    return [f"{indent}{f'#{seq}':<{seq_width}}  {format_record(r, width)}" for seq, r in journal]


def _when(ts: float, now: float) -> str:
    stamp = datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
    return f"{stamp:%Y-%m-%d %H:%M:%S} UTC ({format_age(now - ts)} ago)"


def format_run(
    info: RunInfo, journal: Sequence[tuple[int, Any]], *, now: float, stream: str = ""
) -> list[str]:
    """What ``fusee runs show`` prints: the run's status, then its journal."""
    steps = f"{info.steps} step{'s' if info.steps != 1 else ''}"
    lines = [f"run       {info.run_id}", f"workflow  {info.workflow}"]
    if info.status == "paused":
        lines.append("status    PAUSED: it waits for an operator, nothing runs until then")
        lines.append(f"reason    {info.reason or '(none recorded)'}")
        if info.step is not None:
            lines.append(
                f"step      {info.step}, after {info.attempts} attempt(s): "
                f"{info.error_type}: {clip(info.message or '', 200)}"
            )
        lines.append(f"resume    fusee runs resume {info.run_id}")
    elif info.ended:
        took = format_ms(max(0.0, info.updated_at - info.created_at) * 1000)
        lines.append(f"status    {info.status} after {steps}, in {took}")
    else:
        lines.append(f"status    {info.status}, {steps} done so far")
    if info.status == "failed":
        where = f"  (in step {info.step})" if info.step else ""
        lines.append(f"error     {info.error_type}: {clip(info.message or '', 200)}{where}")
    elif info.reason and info.status != "paused":
        lines.append(f"reason    {clip(info.reason, 200)}")
    lines.append(f"started   {_when(info.created_at, now)}")
    where = f" (stream {stream})" if stream else ""
    lines.append(f"journal{where}:")
    lines.extend(format_journal(journal))
    return lines


def _detail(info: RunInfo) -> str:
    if info.status == "failed":
        step = f" (step {info.step})" if info.step else ""
        return clip(f"{info.error_type}: {info.message}", 60) + step
    if info.status == "paused" and info.step is not None:
        return f"step {info.step} ran out of attempts ({info.attempts}): " + clip(
            f"{info.error_type}: {info.message}", 60
        )
    return clip(info.reason or "", 60)


def format_runs_table(infos: Iterable[RunInfo], *, now: float) -> list[str]:
    """What ``fusee runs list`` prints: one row per run, newest first as given."""
    return RunsTable(now=now).page(infos)


def console(*, stderr: bool = False, file: TextIO | None = None) -> Console:
    """A rich console for ``fusee``'s tables: the terminal's width on a terminal (a
    table that does not fit folds its widest column), else no width limit, so a pipe
    gets whole lines to ``grep`` and ``cut``; no colour guessed from the text."""
    from rich.console import Console

    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    isatty = getattr(target, "isatty", None)
    terminal = bool(isatty and isatty())
    return Console(
        file=target,
        stderr=stderr,
        width=None if terminal else 100_000,
        highlight=False,
        soft_wrap=False,
        emoji=False,
        markup=False,
    )


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    right: Collection[int] = (),
    min_widths: Sequence[int] = (),
    show_header: bool = True,
) -> Table:
    """A borderless rich table of plain text (``--json`` is for machines; this is for
    eyes): two spaces between columns, the columns ``right`` right-aligned (numbers),
    column ``c`` at least ``min_widths[c]`` wide."""
    from rich.table import Table

    widths = min_widths
    out = Table(
        box=None,
        pad_edge=False,
        show_edge=False,
        show_header=show_header,
        header_style="bold",
        padding=(0, 2, 0, 0),
    )
    for c, name in enumerate(headers):
        out.add_column(
            name,
            justify="right" if c in right else "left",
            min_width=widths[c] if c < len(widths) else None,
            overflow="fold",
        )
    for row in rows:
        out.add_row(*row)
    return out


def render_lines(renderable: Any, out: Console) -> list[str]:
    """``renderable`` as ``out`` would print it, as lines without trailing spaces."""
    with out.capture() as captured:
        out.print(renderable)
    return [line.rstrip() for line in captured.get().splitlines()]


class RunsTable:
    """``fusee runs list``'s table, a page at a time (a filtered listing streams: its
    rows are printed as the index yields them). The header comes with the first page,
    whose rows size the columns; a later row wider than a column widens it from there
    on (the rows above are not printed again)."""

    HEADER = ("RUN ID", "WORKFLOW", "STATUS", "STEPS", "AGE", "DETAIL")
    RIGHT = frozenset({3})  # numbers align right

    def __init__(self, *, now: float, out: Console | None = None) -> None:
        self.now = now
        self.out = out
        self.widths: list[int] | None = None

    def page(self, infos: Iterable[RunInfo]) -> list[str]:
        """The lines of ``infos``' rows (with the header, the first time)."""
        from rich.cells import cell_len

        rows = [
            (
                i.run_id,
                i.workflow,
                i.status,
                str(i.steps),
                format_age(self.now - i.created_at),
                _detail(i),
            )
            for i in infos
        ]
        first = self.widths is None
        shown = [self.HEADER, *rows] if first else rows
        widths = self.widths or [0] * len(self.HEADER)
        self.widths = [max([w, *(cell_len(r[c]) for r in shown)]) for c, w in enumerate(widths)]
        # the last column's width is its own: padding it would pad every line
        grid = table(
            self.HEADER,
            rows,
            right=self.RIGHT,
            min_widths=self.widths[:-1],
            show_header=first,
        )
        return render_lines(grid, self.out or console())


def json_text(value: Any) -> str:
    """``value`` as indented JSON (msgspec Structs and ``Raw`` values included)."""
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def json_item(value: Any, *, first: bool) -> str:
    """``value`` as an item of an indented JSON array written an item at a time (what
    :func:`json_text` of the whole list would print, the ``[`` before the first item
    and ``,`` between them; ``json_end`` closes it)."""
    text = "  " + json_text(value).replace("\n", "\n  ")
    return ("[\n" if first else ",\n") + text


def json_end(any_item: bool) -> str:
    """What closes an array written by :func:`json_item` (``[]`` when empty)."""
    return "\n]" if any_item else "[]"
