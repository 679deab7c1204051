"""Worker processes for tests: spawn, kill, stop, freeze and thaw them; read their logs.

Each worker runs ``tests/workers/launch.py`` with its stderr (JSON log lines) in a file
under the test's ``tmp_path``. :func:`worker_procs` is a fixture (re-exported by the
integration and chaos conftests) that kills whatever a test left running.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from fusee.actors.worker import owner_for
from fusee.runtime.records import CallCancelled, StepCompleted, StepFailed, WaitStarted
from tests.helpers import cli_cmd, cli_env

HERE = Path(__file__).resolve().parent
LAUNCH = HERE / "launch.py"
CHAIN = HERE / "chain.py"
POLL = 0.05  # seconds between two looks at a file or a journal


@dataclass
class WorkerProc:
    """One worker process and the file its logs go to."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line the worker wrote so far (other lines are skipped)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a kill
        return out

    def find(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events()
            if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
        ]

    async def wait_for(self, event: str, *, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """The first log line with ``event`` (and ``fields``); fails the test after ``timeout``."""
        with anyio.move_on_after(timeout):
            while True:
                found = self.find(event, **fields)
                if found:
                    return found[0]
                if not self.alive:
                    pytest.fail(
                        f"worker {self.name} exited ({self.proc.returncode}):\n{self.tail()}"
                    )
                await anyio.sleep(POLL)
        pytest.fail(f"worker {self.name}: no {event} {fields} within {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive:
            self.proc.kill()
        self.proc.wait()

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"worker {self.name} ignored SIGTERM for {timeout}s:\n{self.tail()}")


@dataclass
class Workers:
    """Spawns worker processes for one test; all of them die with the test."""

    url: str
    namespace: str
    tmp_path: Path
    partitions: int | None = None
    module: Path = CHAIN
    procs: list[WorkerProc] = field(default_factory=list)
    prefix: tuple[str, ...] = ()  # what runs each worker (``ip netns exec <ns>``)

    def spawn(
        self, *, url: str | None = None, extra_env: dict[str, str] | None = None
    ) -> WorkerProc:
        name = f"w{len(self.procs) + 1}"
        log_path = self.tmp_path / f"worker-{name}.log"
        cmd = [
            *self.prefix,
            sys.executable,
            str(LAUNCH),
            "--nats",
            url or self.url,
            "--namespace",
            self.namespace,
            "--module",
            str(self.module),
        ]
        if self.partitions is not None:
            cmd += ["--partitions", str(self.partitions)]
        env = {**os.environ, **(extra_env or {})}
        with log_path.open("ab") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        worker = WorkerProc(name, proc, log_path)
        self.procs.append(worker)
        return worker

    async def start(self, **kwargs: Any) -> WorkerProc:
        """Spawn a worker and wait until it serves (its ``worker.started`` line)."""
        worker = self.spawn(**kwargs)
        await worker.wait_for("worker.started", timeout=60.0)
        return worker

    def cleanup(self) -> None:
        for w in self.procs:
            if w.alive:
                w.thaw()
                w.kill()


@contextlib.contextmanager
def api_server(
    url: str, namespace: str, tmp_path: Path, *, auth: bool = False, args: Sequence[str] = ()
) -> Iterator[WorkerProc]:
    """``fusee api`` on a free port, a process of its own (its log lines in
    ``tmp_path/api.log``); stopped with SIGTERM, killed if it does not go in 10 s.
    Without ``auth`` it serves with ``--no-auth`` (the tests of auth pass ``auth=True``);
    ``args``: more of ``fusee api``'s options."""
    log_path = tmp_path / "api.log"
    cmd = cli_cmd("api", "--port", "0", "--nats", url, "--namespace", namespace, *args)
    if not auth:
        cmd.append("--no-auth")
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=cli_env(), cwd=tmp_path
        )
    server = WorkerProc("api", proc, log_path)
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def api_and_worker(
    url: str, tmp_path: Path, module: Path, *, auth: bool = False
) -> Iterator[tuple[str, str]]:
    """``fusee api`` and a worker serving ``module``, in a fresh namespace:
    ``(the API's URL, the namespace)`` once both serve (for a module's fixture)."""
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(url, namespace, tmp_path, module=module)
    with api_server(url, namespace, tmp_path, auth=auth) as server:
        try:
            worker = workers.spawn()
            serving = started(server, "api.serving")
            started(worker, "worker.started")
            yield str(serving["url"]), namespace
        finally:
            workers.cleanup()


@dataclass
class ServedApi:
    """A module's ``fusee api`` and worker (:func:`served_api`): where they are."""

    base: str
    nats: str
    namespace: str


@contextlib.contextmanager
def served_api(url: str, tmp_path: Path, module: Path) -> Iterator[ServedApi]:
    """:func:`api_and_worker`, told as a :class:`ServedApi` (for a module's fixture)."""
    with api_and_worker(url, tmp_path, module) as (base, namespace):
        yield ServedApi(base, url, namespace)


def started(proc: WorkerProc, event: str) -> dict[str, Any]:
    """From a synchronous fixture: the first log line of ``event`` (60 s at most)."""
    return anyio.run(functools.partial(proc.wait_for, event, timeout=60.0))


@pytest.fixture
def worker_procs(
    nats_server: Any, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., Workers]]:
    """``worker_procs(url=None, partitions=None)`` -> :class:`Workers` for this test."""
    made: list[Workers] = []

    def make(*, url: str | None = None, partitions: int | None = None) -> Workers:
        w = Workers(url or nats_server.url, namespace, tmp_path, partitions)
        made.append(w)
        return w

    yield make
    for w in made:
        w.cleanup()


# -- side effects ---------------------------------------------------------------------


def executions(log: Path) -> collections.Counter[str]:
    """How many times each step key started, from the side-effect file."""
    if not log.exists():
        return collections.Counter()
    return collections.Counter(
        line.split()[1] for line in log.read_text().splitlines() if line.strip()
    )


def execution_lines(log: Path) -> list[tuple[str, str, int]]:
    """``(step name, key, attempt)`` per execution, in the order they started."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        name, key, attempt = line.split()
        out.append((name, key, int(attempt)))
    return out


def chain_input(log: Path, *, steps: int, delay: float, tag: str | None = None) -> dict[str, Any]:
    return {"log": str(log), "steps": steps, "delay": delay, "tag": tag}


def chain_result(arg: dict[str, Any]) -> dict[str, Any]:
    """What the ``chain`` workflow returns for ``arg``."""
    return {"tag": arg.get("tag"), "values": [i * i for i in range(1, arg["steps"] + 1)]}


async def wait_until(
    check: Callable[[], Any], *, timeout: float, what: str, interval: float = POLL
) -> Any:
    """Poll the async or sync ``check`` until it returns something truthy; fail after ``timeout``."""
    with anyio.move_on_after(timeout):
        while True:
            value = check()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await anyio.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


# -- journals -------------------------------------------------------------------------


def journal_calls(journal: list[tuple[int, Any]]) -> list[tuple[str, str]]:
    """Each position's call, in position order: ``("step", name)``, ``(wait kind,
    name)``, or ``("cancelled", name)`` for a call that lost a race. Positions count
    from 1 in each generation: give it one generation's records."""
    at: dict[int, tuple[str, str]] = {}
    for _, r in journal:
        if isinstance(r, StepCompleted | StepFailed):
            at.setdefault(r.pos, ("step", r.name))
        elif isinstance(r, WaitStarted):
            at.setdefault(r.pos, (r.wait, r.name))
        elif isinstance(r, CallCancelled):
            at.setdefault(r.pos, ("cancelled", r.name))
    return [at[p] for p in sorted(at)]


def assert_chained(journal: list[tuple[int, Any]]) -> None:
    """Every record names the record before it as ``prev`` (no gap, no interleaving).
    ``Run.journal()`` lists a wait's end that rode on a record at that record's
    sequence, with its link: one entry per sequence is checked."""
    assert journal, "empty journal"
    assert journal[0][1].prev == 0
    stored = list(dict(journal).items())
    for (before, _), (seq, record) in itertools.pairwise(stored):
        assert record.prev == before, f"record at {seq} names {record.prev}, not {before}"


async def owners(engine: Any) -> dict[int, str | None]:
    """Who owns each partition now, from the ``owner.<p>`` keys of the work bucket."""
    out: dict[int, str | None] = {}
    for p in range(engine.partitions):
        current = await engine.store.get_owner(p)
        out[p] = current[0] if current else None
    return out


def completed_keys(journal: list[tuple[int, Any]]) -> dict[int, str]:
    """``pos -> s.key`` of each StepCompleted of a ``chain`` run (its result holds the key)."""
    out: dict[int, str] = {}
    for _, record in journal:
        if isinstance(record, StepCompleted):
            assert record.pos not in out, f"step {record.pos} completed twice"
            out[record.pos] = msgspec.json.decode(bytes(record.result))["key"]
    return out


async def start_balanced(workers: Workers, engine: Any, count: int) -> dict[str, WorkerProc]:
    """Start ``count`` workers and wait until every partition has the owner the
    workers agree on (rendezvous hashing over the live ones); returns them by ID."""
    by_id: dict[str, WorkerProc] = {}
    for _ in range(count):
        proc = await workers.start()
        by_id[proc.find("worker.started")[0]["worker"]] = proc

    async def balanced() -> bool:
        now = await owners(engine)
        return all(now[p] == owner_for(p, set(by_id)) for p in now)

    await wait_until(balanced, timeout=15, what=f"{count} workers to share the partitions")
    return by_id
