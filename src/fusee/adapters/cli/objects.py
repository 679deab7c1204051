"""``fusee objects ...``: look at and change keyed objects from a shell.

Every command checks its arguments (type, key, JSON) before it connects, so bad input
is one line on stderr and exit code 2 with nothing sent. The client here knows object
types by name only, so it cannot tell shared handlers from exclusive ones: ``call`` and
``send`` queue every invocation in the key's inbox, and the worker runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio

from fusee import Engine, ObjectInfo, ObjectKey
from fusee.adapters.cli.commands import CONNECT_TIMEOUT_QUERY, open_engine
from fusee.adapters.cli.errors import CliError, Exit
from fusee.adapters.cli.options import GlobalOptions, command_hint
from fusee.adapters.cli.render import clip, console, format_age, json_text, table
from fusee.errors import (
    ConfigError,
    HandlerFailed,
    InvalidArgument,
    InvalidId,
    NotEncodable,
    NothingToCancel,
    Timeout,
)
from fusee.runtime.durations import parse_duration
from fusee.runtime.ids import validate_id, validate_name
from fusee.runtime.objects import EDIT

__all__ = (
    "objects_ls",
    "objects_get",
    "objects_show",
    "objects_edit",
    "objects_clear",
    "objects_cancel",
    "head_of_queue",
    "objects_call",
    "objects_send",
    "parse_json",
    "format_object",
)

T = TypeVar("T")

USAGE = Exit.USAGE  # bad input: nothing was sent


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _bad(message: str) -> NoReturn:
    raise CliError(message, USAGE)


def parse_json(text: str, what: str) -> Any:
    """``text`` as strict JSON (no ``NaN``), or a usage error naming ``what``, the
    problem and where it is (line and column).

    Example:
        ``parse_json('{"a": 1}', "the state")`` -> ``{'a': 1}``
    """

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        _bad(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}")
    except ValueError as exc:
        _bad(f"{what} is not valid JSON: {exc}")


def _key(object_type: str, key: str) -> ObjectKey:
    """The object, checked (a bad type or key is a usage error), not yet connected."""
    try:
        return ObjectKey(object_type, key)
    except (InvalidId, InvalidArgument) as exc:
        _bad(str(exc))


def _type(object_type: str) -> str:
    _key(object_type, "k")
    return object_type


@contextlib.asynccontextmanager
async def _connected(opts: GlobalOptions, obj: ObjectKey) -> AsyncIterator[ObjectKey]:
    """``obj`` on an engine; input the engine refuses (a bad edit) is a usage error."""
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        try:
            yield engine.object(obj.object_type, obj.key)
        except (InvalidId, InvalidArgument, NotEncodable) as exc:
            _bad(str(exc))


def _where(obj: ObjectKey) -> str:
    return f"{obj.object_type}/{obj.key}"


# -- reading ---------------------------------------------------------------------------


async def objects_ls(opts: GlobalOptions, object_type: str) -> int:
    object_type = _type(object_type)
    async with open_engine(opts, connect_timeout=CONNECT_TIMEOUT_QUERY) as engine:
        keys = await engine.list_objects(object_type)
    if opts.as_json:
        _out(json_text([{"key": key, "state": state} for key, state in keys]))
        return 0
    if not keys:
        sys.stderr.write(
            f"No keys of object type {object_type!r} have state in namespace {opts.namespace!r}.\n"
        )
        return 0
    rows = [(key, clip(json.dumps(state, ensure_ascii=False), 100)) for key, state in keys]
    console().print(table(("KEY", "STATE"), rows))
    return 0


async def objects_get(opts: GlobalOptions, object_type: str, key: str) -> int:
    obj = _key(object_type, key)
    async with _connected(opts, obj) as live:
        state = await live.state()
    _out(json_text(state))
    return 0


def _stamp(ts: float | None, now: float) -> str:
    if ts is None:
        return "(time unknown)"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(ts))} UTC ({format_age(now - ts)} ago)"


def format_object(info: ObjectInfo, *, now: float) -> list[str]:
    """What ``fusee objects show`` prints: the state, then the queue, oldest first."""
    where = f"{info.object_type}/{info.key}"
    lines = [f"object    {where}"]
    if info.state:
        count = len(info.state)
        lines.append(f"state     {count} key{'s' if count != 1 else ''}:")
        width = max(len(k) for k in info.state)
        for k in sorted(info.state):
            value = json.dumps(info.state[k], ensure_ascii=False)
            lines.append(f"  {k.ljust(width)}  {clip(value, 80)}")
    else:
        lines.append("state     (empty)")
    if info.running is not None:
        inv = info.running
        off = "  (cancelling)" if inv.cancelling else ""
        lines.append(
            f"running   #{inv.seq}  {_handler(inv.handler)}  since {_stamp(inv.running_since, now)}{off}"
        )
    else:
        lines.append("running   (none)")
    if info.waiting:
        lines.append(f"waiting   {len(info.waiting)}, in the order they run:")
        width = max(len(str(inv.seq)) for inv in info.waiting) + 1
        for inv in info.waiting:
            off = "  (cancelled, will not run)" if inv.cancelling else ""
            lines.append(
                f"  {f'#{inv.seq}':<{width}}  {_handler(inv.handler)}  "
                f"queued {_stamp(inv.queued_at, now)}{off}"
            )
    else:
        lines.append("waiting   (none)")
    if info.last is not None:
        last = info.last
        outcome = "ok" if last.get("ok") else f"failed: {clip(str(last.get('error', '')), 120)}"
        lines.append(
            f"last      #{last.get('seq')}  {_handler(str(last.get('handler')))}  {outcome}"
        )
    if info.unserved is not None:
        lines.append(f"unserved  {clip(info.unserved, 200)}")
    if info.crashed is not None:
        crash = info.crashed
        lines.append(
            f"crashed   {crash.get('crashes')} time(s) in a row, last {_stamp(crash.get('at'), now)}: "
            f"{clip(str(crash.get('error', '')), 160)}; tried again {crash.get('retry_in')}s "
            f"later (worker {crash.get('worker')})"
        )
    queued = [
        inv.seq
        for inv in ([info.running] if info.running else []) + info.waiting
        if not inv.cancelling
    ]
    if queued:
        hint = command_hint("objects", "cancel", info.object_type, info.key, str(queued[0]))
        lines.append(f"cancel one with: {hint}")
    return lines


def _handler(name: str) -> str:
    return "(edit)" if name == EDIT else name


async def objects_show(opts: GlobalOptions, object_type: str, key: str) -> int:
    obj = _key(object_type, key)
    async with _connected(opts, obj) as live:
        info = await live.show()
    if opts.as_json:
        _out(json_text(info))
        return 0
    _out("\n".join(format_object(info, now=time.time())))
    return 0


# -- changing the state ----------------------------------------------------------------


def _parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    sets: dict[str, Any] = {}
    for pair in pairs:
        name, eq, text = pair.partition("=")
        if not eq or not name:
            _bad(f"--set {pair!r}: expected KEY=JSON, e.g. --set count=3")
        sets[name] = parse_json(text, f"--set {name}: the value")
    return sets


def _read_file(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        _bad(f"--file {path}: {exc.strerror or exc}")
    what = "the state on stdin" if path == "-" else f"the state in {path}"
    state = parse_json(text, what)
    if not isinstance(state, dict):
        _bad(f"{what} must be a JSON object, not {_json_kind(state)}")
    return state


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a number"


def _editor() -> list[str]:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    return shlex.split(editor)


def _run_editor(path: Path) -> None:
    command = [*_editor(), str(path)]
    try:
        done = subprocess.run(command, check=False)
    except OSError as exc:
        raise CliError(f"cannot start the editor {command[0]!r}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise CliError(f"the editor {command[0]!r} exited with {done.returncode}; nothing applied")


def _edit_text(text: str, prefix: str) -> tuple[Path, str]:
    """Write ``text`` to a temporary file, run the editor on it, and return the file
    and what it holds then (the caller removes the file)."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".json")
    path = Path(name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        _run_editor(path)
        return path, path.read_text()
    except BaseException:
        path.unlink(missing_ok=True)
        raise


async def _told_if_unserved(live: ObjectKey, apply: Callable[[], Awaitable[T]]) -> T:
    """``await apply()`` (an edit waiting to apply); meanwhile, if no live worker serves
    the key's type, say so at once (the edit stays queued) instead of waiting in silence."""

    async def check() -> None:
        engine = live.engine  # the CLI's keys are made on its Engine (``_connected``)
        if not isinstance(engine, Engine):
            return
        workers = await engine.live_workers()
        if not any(f"object:{live.object_type}" in serves for serves in workers.values()):
            _err(
                f"queued; it applies when a worker for {live.object_type!r} runs "
                f"({len(workers)} live worker{'s' if len(workers) != 1 else ''}, none serves it)"
            )

    outcome: list[T] = []
    failed: list[BaseException] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(check)
        try:
            outcome.append(await apply())
        except Exception as exc:  # noqa: BLE001 - raised below, outside the task group
            failed.append(exc)
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    return outcome[0]


def _not_applied(obj: ObjectKey, what: str, timeout: str) -> CliError:
    return CliError(
        f"{_where(obj)}: {what} did not apply within {timeout}; it stays queued and applies "
        f"when a worker serving {obj.object_type!r} reaches it "
        f"(see `{command_hint('objects', 'show', obj.object_type, obj.key)}`)",
        code=Exit.NOT_YET,
    )


async def _edit_in_editor(live: ObjectKey, limit: float, timeout: str) -> int:
    before = await live.state()
    prefix = f"fusee-{live.object_type}-"
    path, text = await anyio.to_thread.run_sync(_edit_text, json_text(before) + "\n", prefix)
    keep = False
    try:
        try:
            after = parse_json(text, "the edited state")
            if not isinstance(after, dict):
                _bad(f"the edited state must be a JSON object, not {_json_kind(after)}")
        except CliError as exc:
            keep = True
            raise CliError(f"{exc}; nothing applied (your edit is kept in {path})", USAGE) from None
        if after == before:
            _out(f"no change: the state of {_where(live)} is as it was; nothing applied")
            return 0
        if await live.state() != before:
            keep = True
            raise CliError(
                f"the state of {_where(live)} changed while you edited it; nothing applied "
                f"(your edit is kept in {path}; run the command again)"
            )
        try:
            state = await _told_if_unserved(live, lambda: live.edit(state=after, timeout=limit))
        except Timeout:
            keep = True
            raise _not_applied(live, "the edit", timeout) from None
    finally:
        if not keep:
            _discard(path)
    _out(json_text(state))
    return 0


def _discard(path: Path) -> None:
    path.unlink(missing_ok=True)


async def objects_edit(
    opts: GlobalOptions,
    object_type: str,
    key: str,
    *,
    sets: Sequence[str] = (),
    deletes: Sequence[str] = (),
    file: str | None = None,
    timeout: str = "30s",
) -> int:
    """Change the state: in ``$EDITOR`` without flags, else by ``--set`` / ``--delete``
    / ``--file``. Either way it is one exclusive invocation (it waits its turn, at most
    ``timeout``)."""
    obj = _key(object_type, key)
    limit = _timeout(timeout)
    if file is not None and (sets or deletes):
        _bad("--file replaces the whole state: use it without --set and --delete")
    new_state = _read_file(file) if file is not None else None
    changes = _parse_sets(sets)
    for name in deletes:
        if not name:
            _bad("--delete: a state key must not be empty")
    async with _connected(opts, obj) as live:
        if new_state is None and not changes and not deletes:
            return await _edit_in_editor(live, limit, timeout)
        try:
            state = await _told_if_unserved(
                live,
                lambda: live.edit(
                    set=changes or None,
                    delete=list(deletes) or None,
                    state=new_state,
                    timeout=limit,
                ),
            )
        except Timeout:
            raise _not_applied(obj, "the edit", timeout) from None
    _out(json_text(state))
    return 0


async def objects_clear(
    opts: GlobalOptions, object_type: str, key: str, *, timeout: str = "30s"
) -> int:
    obj = _key(object_type, key)
    limit = _timeout(timeout)
    async with _connected(opts, obj) as live:
        try:
            await _told_if_unserved(live, lambda: live.clear(timeout=limit))
        except Timeout:
            raise _not_applied(obj, "the clear", timeout) from None
    if opts.as_json:
        _out(json_text({"object_type": obj.object_type, "key": obj.key, "state": {}}))
    else:
        _out(f"cleared the state of {_where(obj)}")
    return 0


def _timeout(timeout: str) -> float:
    try:
        limit = parse_duration(timeout, "--timeout")
    except ConfigError as exc:
        _bad(str(exc))
    if limit <= 0:
        _bad(f"--timeout {timeout}: must be more than 0")
    return limit


async def head_of_queue(live: ObjectKey) -> int | None:
    """The invocation a cancel without a number means: the one running, else the next
    to run (one a cancel was sent for already is skipped). ``None``: nothing is queued.

    The CLI and the HTTP API send a numbered cancel rather than ``cancel(None)``: a
    cancel without a target stays in the inbox and would be applied again to a later
    invocation when the object is re-activated.
    """
    info = await live.show()
    for inv in ([info.running] if info.running else []) + info.waiting:
        if not inv.cancelling:
            return inv.seq
    return None


async def objects_cancel(
    opts: GlobalOptions, object_type: str, key: str, seq: int | None, *, reason: str
) -> int:
    obj = _key(object_type, key)
    if seq is not None and seq < 1:
        _bad(f"invocation {seq}: an invocation's number is >= 1 (see objects show)")
    async with _connected(opts, obj) as live:
        if seq is None:
            seq = await head_of_queue(live)
            if seq is None:
                raise CliError(
                    f"{_where(obj)} runs nothing and has nothing queued to cancel",
                    name="nothing_to_cancel",
                )
        try:
            await live.cancel(seq, reason)
        except NothingToCancel as exc:
            raise CliError(str(exc), name="nothing_to_cancel") from None
    if opts.as_json:
        _out(
            json_text(
                {"object_type": obj.object_type, "key": obj.key, "seq": seq, "reason": reason}
            )
        )
    else:
        _out(f"asked {_where(obj)} to cancel invocation #{seq}: {reason}")
    return 0


# -- invoking handlers -----------------------------------------------------------------


def _handler_name(handler: str, idempotency_key: str | None) -> str:
    try:
        if idempotency_key is not None:
            validate_id(idempotency_key, "idempotency key")
        return validate_name(handler, "handler name")
    except InvalidId as exc:
        _bad(str(exc))


async def objects_call(
    opts: GlobalOptions,
    object_type: str,
    key: str,
    handler: str,
    arg: str,
    *,
    timeout: str,
    idempotency_key: str | None,
) -> int:
    obj = _key(object_type, key)
    handler = _handler_name(handler, idempotency_key)
    value = parse_json(arg, "the input")
    try:
        limit = parse_duration(timeout, "--timeout")
    except ConfigError as exc:
        _bad(str(exc))
    async with _connected(opts, obj) as live:
        try:
            result = await live.call(handler, value, idempotency_key=idempotency_key, timeout=limit)
        except HandlerFailed as exc:
            raise CliError(str(exc)) from None
        except Timeout:
            raise CliError(
                f"{_where(obj)}: {handler!r} did not end within {timeout}; it stays queued "
                f"or running (see `{command_hint('objects', 'show', obj.object_type, obj.key)}`)",
                code=Exit.NOT_YET,
            ) from None
    _out(json_text(result))
    return 0


async def objects_send(
    opts: GlobalOptions,
    object_type: str,
    key: str,
    handler: str,
    arg: str,
    *,
    idempotency_key: str | None,
) -> int:
    obj = _key(object_type, key)
    handler = _handler_name(handler, idempotency_key)
    value = parse_json(arg, "the input")
    async with _connected(opts, obj) as live:
        seq = await live.send(handler, value, idempotency_key=idempotency_key)
    _out(
        json_text({"object_type": obj.object_type, "key": obj.key, "seq": seq})
        if opts.as_json
        else str(seq)
    )
    return 0
