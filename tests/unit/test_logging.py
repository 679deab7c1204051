"""The JSON lines of ``configure_logging`` (what ``fusee worker`` writes when stderr is not
a terminal): one object a line, with the bound context; in an event loop, an info line is
written two turns of the loop later (off the path of the step that logged it), a warning
at once with what waits before it, and nothing is lost on a clean exit."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Literal

import pytest
import structlog

from fusee.logs import configure_logging, get_logger


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    get_logger().use(None)


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.usefixtures("restore_structlog")
def test_a_json_line_has_time_level_event_and_the_bound_context() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()
    with structlog.contextvars.bound_contextvars(run_id="r1", step="s", pos=1):
        log.debug("step.started", attempt=1)  # below the level: nothing
        log.info("step.completed", attempt=1, duration_ms=0.5)
        log.info("child.started", run_id="r2")  # a call's own key wins over the bound one
    log.info("worker.stopped")  # outside the block: nothing of it is bound
    (line, child, after) = _lines(out)
    assert "run_id" not in after
    assert "step" not in after
    assert list(line)[:3] == ["timestamp", "level", "event"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", str(line["timestamp"]))
    assert line["level"] == "info"
    assert line["event"] == "step.completed"
    assert {"run_id": "r1", "step": "s", "pos": 1, "attempt": 1, "duration_ms": 0.5}.items() <= (
        line.items()
    )
    assert child["run_id"] == "r2"


@pytest.mark.usefixtures("restore_structlog")
def test_errors_carry_their_traceback_and_odd_values_their_repr() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        log.exception("actor.crashed", thing=object())
    (line,) = _lines(out)
    assert line["level"] == "error"
    assert "ZeroDivisionError: division by zero" in str(line["exception"])
    assert str(line["thing"]).startswith("<object object at ")


def _fails_holding(secret: str) -> None:
    token = f"fusee_0123456789ab_{secret}"  # a local, as in a request's check
    raise RuntimeError(f"failed with a token of {len(token)} characters")


@pytest.mark.parametrize("fmt", ["console", "json"])
@pytest.mark.usefixtures("restore_structlog")
def test_a_traceback_shows_no_local_variable(fmt: Literal["console", "json"]) -> None:
    """A secret held in a frame's local (a request's token) never reaches the log: the
    console format's rich traceback would show every frame's locals by default."""
    out = io.StringIO()
    configure_logging(fmt, "info", stream=out)
    secret = secrets.token_urlsafe(32)  # not in any source line the traceback shows
    try:
        _fails_holding(secret)
    except RuntimeError:
        get_logger().exception("http.internal_error", path="/v1/limits")
    text = out.getvalue()
    assert "RuntimeError" in text
    assert "_fails_holding" in text  # the frames are there
    assert secret not in text


@pytest.mark.usefixtures("restore_structlog")
def test_configuring_again_changes_fusee_s_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", "info", stream=first)
    get_logger().info("one")
    configure_logging("json", "warning", stream=second)
    get_logger().info("two")
    get_logger().warning("three")
    assert [e["event"] for e in _lines(first)] == ["one"]
    assert [e["event"] for e in _lines(second)] == ["three"]


@pytest.mark.usefixtures("restore_structlog")
def test_an_application_s_own_configuration_is_followed_when_it_changes() -> None:
    # fusee's logger is built once per configuration the application makes with
    # structlog.configure(), not on every line: configuring again must still take effect
    seen: dict[str, list[str]] = {"first": [], "second": []}

    def keep(into: str) -> structlog.typing.Processor:
        def processor(_: object, __: str, event: structlog.typing.EventDict) -> str:
            seen[into].append(str(event["event"]))
            return ""

        return processor

    def configure(into: str) -> None:
        structlog.configure(processors=[keep(into)], logger_factory=structlog.ReturnLoggerFactory())

    log = get_logger()
    configure("first")
    log.info("one")
    log.info("two")
    configure("second")
    log.info("three")
    structlog.reset_defaults()  # not configured: the standard library's logger, silent here
    log.debug("four")
    configure("first")
    log.info("five")
    assert seen == {"first": ["one", "two", "five"], "second": ["three"]}


@pytest.mark.usefixtures("restore_structlog")
async def test_in_an_event_loop_an_info_line_waits_two_turns_and_a_warning_none() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()
    with structlog.contextvars.bound_contextvars(run_id="r1", step="s"):
        log.info("step.completed", attempt=1)
    log.debug("below.level")  # (not taken at info)
    assert out.getvalue() == ""  # not rendered nor written on the logging task's path
    await asyncio.sleep(0)  # the turn that made its socket write ready, say
    assert out.getvalue() == ""
    await asyncio.sleep(0)
    (line,) = _lines(out)
    assert (line["event"], line["run_id"], line["step"]) == ("step.completed", "r1", "s")
    log.info("one")
    log.info("two")
    log.warning("three")  # written at once, after the lines that wait
    assert [e["event"] for e in _lines(out)] == ["step.completed", "one", "two", "three"]
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # (the write scheduled for "one" finds nothing left)
    assert len(_lines(out)) == 4


@pytest.mark.usefixtures("restore_structlog")
async def test_a_line_of_another_thread_is_written_at_once_after_those_waiting() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()
    log.info("in.the.loop")
    thread = threading.Thread(target=log.info, args=("in.a.thread",))
    thread.start()
    thread.join()
    assert [e["event"] for e in _lines(out)] == ["in.the.loop", "in.a.thread"]


@pytest.mark.usefixtures("restore_structlog")
def test_lines_a_stopped_loop_left_are_written_before_the_next() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()

    async def logs(event: str) -> None:
        log.info(event)

    for event in ("first", "second"):
        loop = asyncio.new_event_loop()
        loop.run_until_complete(logs(event))  # stops before the line's write runs
        loop.close()
        assert event not in out.getvalue()
    log.info("outside")
    assert [e["event"] for e in _lines(out)] == ["first", "second", "outside"]


def test_a_line_still_waiting_at_exit_is_written() -> None:
    program = """if True:
        import asyncio
        from fusee.logs import configure_logging, get_logger
        configure_logging("json", "info")

        async def main():
            get_logger().info("the.last.line")

        loop = asyncio.new_event_loop()
        loop.run_until_complete(main())  # stops before the line's write runs
        loop.close()
    """
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert line["event"] == "the.last.line"


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.usefixtures("restore_structlog")
async def test_a_line_that_cannot_be_rendered_says_so_and_the_others_are_written() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()
    circular: list[object] = []
    circular.append(circular)
    log.info("before")
    log.info("circular", value=circular)  # (msgspec raises RecursionError)
    with structlog.contextvars.bound_contextvars(thing=_BadRepr()):
        log.info("bound.bad.repr")  # (a bound value: rendered two turns later)
    log.info("after")
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the scheduled write: not one line lost
    log.warning("unrelated", value=_BadRepr())  # neither raises nor fails the others
    lines = _lines(out)
    assert [e["event"] for e in lines] == [
        "before",
        "circular",
        "bound.bad.repr",
        "after",
        "unrelated",
    ]
    assert [e.get("log_error") for e in lines] == [
        None,
        "RecursionError: maximum recursion depth exceeded while serializing an object",
        "RuntimeError: no repr",
        None,
        "RuntimeError: no repr",
    ]
    assert lines[1]["level"] == "info"
    assert lines[4]["level"] == "warning"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", str(lines[1]["timestamp"]))


@pytest.mark.usefixtures("restore_structlog")
async def test_a_line_shows_its_values_as_they_were_logged() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = get_logger()
    counts = {"n": 1}
    names = ["a"]
    log.info("counted", counts=counts, names=names, n=1)
    counts["n"] = 2
    names.append("b")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    (line,) = _lines(out)
    assert (line["counts"], line["names"], line["n"]) == ({"n": 1}, ["a"], 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_does_not_write_its_parent_s_waiting_lines() -> None:
    program = """if True:
        import asyncio, os
        from fusee.logs import configure_logging, get_logger
        configure_logging("json", "info")

        async def main():
            get_logger().info("the.parent.s.line")  # waits two turns
            pid = os.fork()
            if pid == 0:
                get_logger().warning("the.child.s.line")  # writes what waits in the child
                os._exit(0)
            os.waitpid(pid, 0)
            await asyncio.sleep(0)
            await asyncio.sleep(0)

        asyncio.run(main())
    """
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    events = [json.loads(text)["event"] for text in done.stderr.splitlines()]
    assert sorted(events) == ["the.child.s.line", "the.parent.s.line"]


def test_a_value_whose_repr_logs_is_written_before_the_line_its_repr_logs() -> None:
    # Before: the writer rendered under its lock, and the nested call waited for that
    # lock for ever (at log time for a call's value, at the write for a bound one). In
    # a process of its own, so a deadlock fails the test instead of hanging the suite.
    program = """if True:
        import asyncio, sys
        import structlog
        from fusee.logs import configure_logging, get_logger
        configure_logging("json", "info")
        log = get_logger()

        class Loud:
            def __init__(self, name, level="info"):
                self.name, self.level = name, level
            def __repr__(self):
                getattr(log, self.level)("repr." + self.name, plain=1)
                return "Loud(" + self.name + ")"

        class Itself:  # logs a line holding itself: its own repr, and so on
            def __repr__(self):
                log.info("repr.itself", me=self)
                return "Itself()"

        async def main():
            log.info("a.call.s.value", value=Loud("a"))  # rendered when logged
            with structlog.contextvars.bound_contextvars(bound=Loud("b")):
                log.info("a.bound.value")  # rendered two turns later
            log.info("a.warning.inside", value=Loud("c", "warning"))
            sys.stderr.write('{"event": "returned"}\\n')  # the warning is out by now
            log.warning("a.warning", value=Loud("d"))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            log.info("itself", value=Itself())
            await asyncio.sleep(0)
            await asyncio.sleep(0)

        asyncio.run(main())
        log.info("no.loop", value=Loud("e"))  # written at once
        print("done", flush=True)
    """
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=20, check=True
    )
    assert done.stdout == "done\n"
    lines = [json.loads(text) for text in done.stderr.splitlines()]
    events = [line["event"] for line in lines]
    nested = events.index("itself") + 1
    assert events[:nested] == [
        "a.call.s.value",
        "repr.a",
        "a.bound.value",
        "repr.b",
        "a.warning.inside",
        "repr.c",
        "returned",
        "a.warning",
        "repr.d",
        "itself",
    ]
    assert lines[0]["value"] == "Loud(a)"
    assert lines[2]["bound"] == "Loud(b)"
    assert lines[5]["level"] == "warning"
    # a line logged by a repr while rendering one so logged, and so on: a few deep, then
    # one line saying so, and it ends
    itself = events[nested:-2]
    assert 1 <= len(itself) <= 10
    assert set(itself) == {"repr.itself"}
    assert "log_error" in lines[nested + len(itself) - 1]
    assert events[-2:] == ["no.loop", "repr.e"]


def _stderr_lines(program: str) -> list[dict[str, object]]:
    """The JSON lines ``program`` writes, run in a process of its own (a loop that does
    not end fails the test instead of hanging the suite)."""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=20, check=True
    )
    assert done.stdout == "done\n"
    return [json.loads(text) for text in done.stderr.splitlines()]


def test_a_line_a_bound_value_s_repr_logs_has_its_outer_line_s_context_once() -> None:
    # Before: the nested line took the context its write ran in (that of the task that
    # scheduled this turn's write: run B's), and it had the outer line's bound value, so
    # rendering it logged another line, 4 deep.
    lines = _stderr_lines("""if True:
        import asyncio, structlog
        from fusee.logs import configure_logging, get_logger
        configure_logging("json", "info")
        log = get_logger()

        class Loud:
            def __repr__(self):
                log.info("repr.logged", plain=1)
                return "Loud()"

        async def other():
            with structlog.contextvars.bound_contextvars(run_id="B"):
                log.info("b.line")  # schedules this turn's write, in B's context

        async def main():
            task = asyncio.create_task(other())
            await asyncio.sleep(0)
            with structlog.contextvars.bound_contextvars(run_id="A", thing=Loud()):
                log.info("a.line")
            await task
            for _ in range(3):
                await asyncio.sleep(0)
            with structlog.contextvars.bound_contextvars(run_id="C", thing=Loud()):
                log.info("c.line")  # the first line of its turn: the write runs in C's
            for _ in range(3):
                await asyncio.sleep(0)

        asyncio.run(main())
        print("done", flush=True)
    """)
    assert [(line["event"], line.get("run_id")) for line in lines] == [
        ("b.line", "B"),
        ("a.line", "A"),
        ("repr.logged", "A"),
        ("c.line", "C"),
        ("repr.logged", "C"),
    ]
    assert [line.get("thing") for line in lines] == [None, "Loud()", None, "Loud()", None]
    assert not any("log_error" in line for line in lines)


def test_an_event_whose_repr_logs_itself_as_the_event_ends() -> None:
    # Before: the line written 4 deep describes its event with repr, which logged the
    # event again into the list the level above was going through: for ever.
    lines = _stderr_lines("""if True:
        from fusee.logs import configure_logging, get_logger
        configure_logging("json", "info")
        log = get_logger()

        class Event:
            def __repr__(self):
                log.info(self)
                return "Event"

        log.info(Event())
        print("done", flush=True)
    """)
    assert 1 <= len(lines) <= 10
    assert {line["event"] for line in lines} == {"Event"}
    assert "log_error" in lines[-1]
    assert not any("log_error" in line for line in lines[:-1])


class _LoudBadRepr:
    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __repr__(self) -> str:
        get_logger().info("repr.called")
        raise self.error("no repr")


@pytest.mark.parametrize("error", [ValueError, TypeError, RuntimeError])
@pytest.mark.usefixtures("restore_structlog")
def test_a_repr_that_raises_is_called_once(error: type[Exception]) -> None:
    # Before: msgspec's ValueError or TypeError sent the line to json.dumps, which called
    # the __repr__ again: its lines were written twice.
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    get_logger().info("outer", value=_LoudBadRepr(error))
    lines = _lines(out)
    assert [line["event"] for line in lines] == ["outer", "repr.called"]
    assert lines[0]["log_error"] == f"{error.__name__}: no repr"
