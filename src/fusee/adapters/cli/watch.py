"""``fusee runs show RUN_ID --watch``: the run as it runs, until it ends.

Three sources, each its own task: the run's end (``Run.result``: the engine's journal
watch, so the view stops the moment the run ends), the token streams named with
``--stream`` (``Run.stream_events``, text as each token is stored), and the journal's
new records (read again every ``REFRESH`` seconds from the last sequence seen: the
display's refresh, not the end's detection). Shown as:

- on a terminal, a rich ``Live`` view redrawn in place: status, the last records,
  each stream's latest text;
- elsewhere (a pipe, a file), lines appended as things happen: each new record as
  ``runs show`` prints it, a stream's text as it comes under a ``-- stream NAME``
  line, then the final status;
- with ``--json``, one compact JSON object a line: ``{"event": "record", "seq",
  "record"}``, ``{"event": "token", "stream", "index", "text", "attempt"}``,
  ``{"event": "status", "run"}`` when it changes, ``{"event": "stream_not_found",
  "stream", "message"}`` for a ``--stream`` the run has none of, and last
  ``{"event": "end", "run"}``.

Exit 0 when the run completed, 1 when it failed or was cancelled.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

import fusee
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import Exit
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.render import clip, format_journal, format_record
from fusee.errors import RunFailed, StreamNotFound

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ("runs_watch", "REFRESH")

REFRESH = 0.5  # how often the journal's tail is read again for the view
SHOWN = 12  # the live view's last records
TEXT_LINES = 12  # the live view's last lines of each stream
STREAM_GRACE = 5.0  # how long the streams may take to end after the run did


class _View:
    """What the watch has seen, and how it tells it (``live``, ``plain`` or ``json``)."""

    def __init__(self, info: fusee.RunInfo, mode: str, streams: Sequence[str]) -> None:
        self.info = info
        self.mode = mode
        self.records: list[tuple[int, Any]] = []
        self.text: dict[str, str] = dict.fromkeys(streams, "")
        self.open_stream: str | None = None  # plain: the stream whose text was last written
        self.live: Any = None

    # -- what happens ----------------------------------------------------------------

    def add_records(self, records: list[tuple[int, Any]]) -> None:
        self.records += records
        if self.mode == "json":
            for seq, record in records:
                self._line({"event": "record", "seq": seq, "record": record})
        elif self.mode == "plain" and records:
            self._close_text()
            sys.stdout.write("".join(line + "\n" for line in format_journal(records)))
            sys.stdout.flush()
        self._redraw()

    def token(self, stream: str, ev: Any) -> None:
        if ev.kind == "attempt" and ev.attempt > 1:
            self.text[stream] = ""  # the call started over: its earlier text is dropped
        if self.mode == "json":
            self._line(
                {
                    "event": "token",
                    "stream": stream,
                    "kind": ev.kind,
                    "index": ev.index,
                    "text": ev.text,
                    "attempt": ev.attempt,
                }
            )
            return
        if ev.kind != "token":
            return
        self.text[stream] += ev.text
        if self.mode == "plain":
            if self.open_stream != stream:
                self._close_text()
                sys.stdout.write(f"-- stream {stream}:\n")
                self.open_stream = stream
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        self._redraw()

    def missing(self, stream: str) -> None:
        """``--stream NAME`` names no stream of the run (mistyped, or never started):
        said in every mode, not only in the live view."""
        message = f"the run has no stream {stream!r}"
        self.text[stream] = f"({message})"
        if self.mode == "json":
            self._line({"event": "stream_not_found", "stream": stream, "message": message})
        elif self.mode == "plain":
            self._close_text()
            sys.stdout.write(f"-- stream {stream}: ({message})\n")
            sys.stdout.flush()
        self._redraw()

    def status(self, info: fusee.RunInfo) -> None:
        changed = (info.status, info.steps) != (self.info.status, self.info.steps)
        self.info = info
        if changed and self.mode == "json":
            self._line({"event": "status", "run": info})
        self._redraw()

    def end(self, info: fusee.RunInfo) -> None:
        self.info = info
        if self.mode == "json":
            self._line({"event": "end", "run": info})
        elif self.mode == "plain":
            self._close_text()
            sys.stdout.write(f"status    {self._status_line()}\n")
            sys.stdout.flush()
        self._redraw()

    # -- how it is shown ---------------------------------------------------------------

    def _line(self, value: Any) -> None:
        sys.stdout.write(msgspec.json.encode(value).decode() + "\n")
        sys.stdout.flush()

    def _close_text(self) -> None:
        if self.open_stream is not None:
            if not self.text[self.open_stream].endswith("\n"):
                sys.stdout.write("\n")
            self.open_stream = None

    def _status_line(self) -> str:
        i = self.info
        line = f"{i.status}, {i.steps} step{'s' if i.steps != 1 else ''}"
        if i.status == "failed":
            line += f": {i.error_type}: {clip(i.message or '', 120)}"
        elif i.reason:
            line += f": {clip(i.reason, 120)}"
        return line

    def renderable(self) -> RenderableType:
        from rich.console import Group
        from rich.panel import Panel
        from rich.text import Text

        head = Text(f"run       {self.info.run_id}\nworkflow  {self.info.workflow}\n")
        head.append(f"status    {self._status_line()}", style="bold")
        shown = self.records[-SHOWN:]
        width = max((len(str(s)) for s, _ in shown), default=1) + 1
        journal = Text(
            "\n".join(f"{f'#{s}':<{width}}  {format_record(r)}" for s, r in shown) or "(none yet)",
            no_wrap=True,
            overflow="ellipsis",
        )
        parts: list[RenderableType] = [head, Panel(journal, title="journal", title_align="left")]
        for name, text in self.text.items():
            lines = text.splitlines()[-TEXT_LINES:] if text else ["(waiting for tokens)"]
            parts.append(Panel(Text("\n".join(lines)), title=f"stream {name}", title_align="left"))
        return Group(*parts)

    def _redraw(self) -> None:
        if self.live is not None:
            self.live.update(self.renderable(), refresh=True)


async def runs_watch(opts: GlobalOptions, run_id: str, *, streams: Sequence[str]) -> int:
    streams = list(dict.fromkeys(streams))  # (a stream named twice is followed once)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        run = engine.run(run_id)
        info = await run.describe()  # an unknown run: not found, at once
        live = sys.stdout.isatty() and not opts.as_json
        view = _View(info, "json" if opts.as_json else "live" if live else "plain", streams)
        if view.mode == "plain":
            sys.stdout.write(f"run       {info.run_id}\nworkflow  {info.workflow}\n")
        last = 0

        async def tail() -> None:
            nonlocal last
            records = await run.journal(after=last)
            if records:
                last = records[-1][0]
                view.add_records(records)

        finished = {name: anyio.Event() for name in streams}

        async def follow(name: str) -> None:
            try:
                async for ev in run.stream_events(name):
                    view.token(name, ev)
            except StreamNotFound:
                view.missing(name)
            finally:
                finished[name].set()

        async def refresh() -> None:
            while True:
                await tail()
                view.status(await run.describe())
                await anyio.sleep(REFRESH)

        async def body() -> int:
            async with anyio.create_task_group() as tg:
                for name in streams:
                    tg.start_soon(follow, name)
                tg.start_soon(refresh)
                try:
                    await run.result()
                    code = Exit.OK
                except RunFailed:  # (RunCancelled too)
                    code = Exit.ERROR
                # a stream ends once its step's result is journaled: by the run's end, or
                # a moment after; a stream the run never started ends when it is told so
                with anyio.move_on_after(STREAM_GRACE):
                    for event in finished.values():
                        await event.wait()
                tg.cancel_scope.cancel()
            await tail()
            view.end(await run.describe())
            return code

        if not live:
            return await body()
        from rich.live import Live

        from fusee.adapters.cli.render import console

        with Live(view.renderable(), console=console(), auto_refresh=False) as shown:
            view.live = shown
            return await body()
