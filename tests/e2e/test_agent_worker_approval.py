"""``fusee worker examples/agent.py`` (what examples/README.md says serves the demo):
no ``main`` reads the approval channel there, so the worker prints each refund's
completion URL, and a person POSTing ``true`` to it (``fusee api``) lets the run end.
(From reviewer rex's repro: before, the URL went to an in-memory channel only, and the
run waited a day with no way to approve it.)"""

from __future__ import annotations

import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx

import fusee
from fusee.runtime.records import WaitStarted
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import WorkerProc, api_server, journal_calls, wait_until

DEMO = Path(__file__).resolve().parents[2] / "examples" / "agent.py"
ASKED = re.compile(r"approval needed: refund .*: POST true to \S*/v1/completions/(\S+)")


async def test_agent_served_by_fusee_worker_surfaces_its_approval(
    nats_server: Any, tmp_path: Path
) -> None:
    ns = f"t{secrets.token_hex(4)}"
    env = {k: v for k, v in cli_env().items() if not k.startswith("OPENAI_")}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cli_cmd("worker", str(DEMO), "--nats", nats_server.url, "--namespace", ns),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    worker = WorkerProc("agent", proc, log)
    try:
        with api_server(nats_server.url, ns, tmp_path) as api:
            await worker.wait_for("worker.started", timeout=20)
            base = (await api.wait_for("api.serving", timeout=20))["url"]
            async with await fusee.connect(nats_server.url, namespace=ns) as engine:
                run = await engine.start("support", "sup-1", "Order 1042 arrived damaged")

                async def parked() -> bool:
                    j = await run.journal()
                    return any(isinstance(r, WaitStarted) and r.wait == "completion" for _, r in j)

                await wait_until(parked, timeout=30, what="the approval wait")

                def asked() -> str | None:  # a person (or operator) finds what to complete
                    found = ASKED.search(log.read_text(errors="replace"))
                    return found.group(1) if found else None

                token = await wait_until(asked, timeout=10, what="the printed approval URL")
                async with httpx.AsyncClient(timeout=20) as client:
                    answered = await client.post(f"{base}/v1/completions/{token}", json=True)
                assert answered.status_code == 200, answered.text
                reply = await run.result(timeout=30)
                assert "refunded in full (40 EUR)" in reply
                steps = [n for k, n in journal_calls(await run.journal()) if k == "step"]
                assert "agent/tool-1-refund" in steps
    finally:
        worker.kill()
