"""Workflows whose step takes a permit of a limit, for worker processes.

- ``limited`` (limit ``k``): each attempt holds one of ``arg["slots"]`` slot files,
  taken with ``O_EXCL`` (an O_EXCL detector: an attempt that finds every slot held by
  a live process writes ``overflow``), says which run holds one (``held-<run>``, naming
  its process), and keeps its permit until ``release`` exists.
- ``rated`` (limit ``r``): each attempt appends the time it began to ``starts``.
  With ``$LIMITS_GATE`` set (a directory the test controls): once ``armed`` exists
  there, a run whose ID ends in an even number waits before it asks for its permit
  (its replay, woken by its grant) until ``go`` exists, having written
  ``gated-<run>``: the test lets them come back together, as replays bunch on a
  loaded machine.
- ``fair`` (limit ``f``, fairness key ``arg["tenant"]``): each attempt waits for
  ``go``, then appends its tenant to ``done``: the order attempts ended in.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import anyio

import fusee
from fusee.actors.core import ActorCore


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _append(path: Path, line: str) -> None:
    # one write of a short line with O_APPEND: lines of several processes do not mix
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def take_slot(d: Path, slots: int) -> Path | None:
    """One of ``slots`` slot files (``slot-<i>``, holding this pid), created with
    ``O_EXCL``; a slot whose process is dead (SIGKILLed with its permit) is taken back
    (renamed away: one taker wins). ``None``: every slot is held by a live process."""
    while True:
        for i in range(slots):
            slot = d / f"slot-{i}"
            try:
                fd = os.open(slot, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return slot
        freed = False
        for i in range(slots):
            slot = d / f"slot-{i}"
            try:
                text = slot.read_text()
            except FileNotFoundError:
                freed = True  # released meanwhile
                continue
            if text and not _alive(int(text)):
                try:
                    slot.rename(d / f"stale-{i}-{secrets.token_hex(4)}")
                except FileNotFoundError:
                    pass  # another taker renamed it first
                freed = True
        if not freed:
            return None


def live_slots(d: Path) -> list[int]:
    """The pids of the live processes holding a slot."""
    pids = []
    for slot in d.glob("slot-*"):
        try:
            text = slot.read_text()
        except FileNotFoundError:
            continue
        if text and _alive(int(text)):
            pids.append(int(text))
    return pids


@fusee.workflow("limited")
async def limited(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    def call(s: fusee.StepInfo) -> str:
        d = Path(arg["dir"])
        slot = take_slot(d, arg.get("slots", 1))
        if slot is None:
            _append(d / "overflow", f"{ctx.run_id} attempt {s.attempt} in pid {os.getpid()}")
        (d / f"held-{ctx.run_id}").write_text(str(os.getpid()))
        while not (d / "release").exists():
            time.sleep(0.01)
        if slot is not None:
            slot.unlink()
        return "ok"

    result: str = await ctx.step("call", call, limit="k", fairness_key=arg.get("tenant"))
    return result


@fusee.workflow("rated")
async def rated(ctx: fusee.Context, arg: dict[str, Any]) -> None:
    def call() -> None:
        _append(Path(arg["dir"]) / "starts", repr(time.time()))

    await ctx.step("call", call, limit="r")


@fusee.workflow("fair")
async def fair(ctx: fusee.Context, arg: dict[str, Any]) -> None:
    def call() -> None:
        d = Path(arg["dir"])
        while not (d / "go").exists():
            time.sleep(0.01)
        _append(d / "done", arg["tenant"])

    await ctx.step("call", call, limit="f", fairness_key=arg["tenant"])


_GATE = os.environ.get("LIMITS_GATE")
if _GATE:
    _acquire = ActorCore.acquire_permit

    async def _gated(self, name, fairness, key, *, pos=0):  # type: ignore[no-untyped-def]
        d = Path(str(_GATE))
        if (d / "armed").exists() and int(self.run_id.rsplit("-", 1)[1]) % 2 == 0:
            if not (d / "go").exists():
                _append(d / f"gated-{self.run_id}", "")
            while not (d / "go").exists():  # (a file the test writes)
                await anyio.sleep(0.01)
        return await _acquire(self, name, fairness, key, pos=pos)

    ActorCore.acquire_permit = _gated  # type: ignore[method-assign]
