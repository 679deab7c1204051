"""A workflow whose step takes a permit of limit ``k``: it says it holds one (a file
naming its process), and, until ``release`` exists, keeps it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import fusee


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@fusee.workflow("limited")
async def limited(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    def call(s: fusee.StepInfo) -> str:
        d = Path(arg["dir"])
        mine = d / f"inflight-{os.getpid()}-{s.key}-{s.attempt}"
        mine.touch()
        live = [p for p in d.glob("inflight-*") if _alive(int(p.name.split("-")[1]))]
        with (d / "counts").open("a") as f:
            f.write(f"{len(live)}\n")
        (d / f"held-{ctx.run_id}").write_text(str(os.getpid()))
        while not (d / "release").exists():
            time.sleep(0.01)
        mine.unlink()
        return "ok"

    result: str = await ctx.step("call", call, limit="k", fairness_key=arg.get("tenant"))
    return result
