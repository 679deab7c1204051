"""Notify when ready: a long task tells someone when it is done.

    fusee dev examples/patterns/notify_when_ready.py

The research runs as a child; then the step ``notify`` POSTs the report to a webhook
with the step's key as ``Idempotency-Key``. The key is the same on every attempt and
after a crash, so a receiver that dedupes on it is notified once even when the call is
made again (here the receiver answers 503 the first time, and the retry carries the
same key). A caller that would rather wait asks for the result instead:
``await engine.run(id).result()``, or ``GET /v1/runs/{id}/result``.

The model is scripted and the webhook receiver is a local HTTP server, so this runs
offline.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fusee
import fusee.dev
from fusee.ai import ModelRequest, generate
from fusee.testing import ScriptedModel


def write(request: ModelRequest, n: int) -> str:
    topic = getattr(request.messages[-1], "content", "").removeprefix("Write a report on ")
    return f"Report on {topic}: three suppliers, two of them late; order from the third."


model = ScriptedModel(write)


@fusee.workflow("write-report")
async def write_report(ctx: fusee.Context, topic: str) -> str:
    report = await generate(ctx, "write", model=model, prompt=f"Write a report on {topic}")
    return report.text


def post(url: str, body: dict[str, Any], key: str) -> int:
    """POST ``body`` as JSON with ``Idempotency-Key: key``; an error status raises."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


@fusee.workflow("notify-report")
async def report(ctx: fusee.Context, job: dict[str, str]) -> str:
    text: str = await ctx.child(write_report, f"{ctx.run_id}/research", job["topic"], type=str)
    await ctx.step(
        "notify",
        lambda s: post(job["webhook"], {"id": ctx.run_id, "report": text}, s.key),
        retry=fusee.Retry(attempts=5, initial="200ms"),
    )
    return text


class Receiver(ThreadingHTTPServer):
    """A webhook receiver on a free local port: it keeps each delivery and answers 503
    to the first one (busy), 200 to the others."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, dict[str, Any]]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks/report"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # the name http.server calls
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.deliveries.append((self.headers["Idempotency-Key"], body))
        self.send_response(503 if len(self.server.deliveries) == 1 else 200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


async def main(engine: fusee.Engine) -> None:
    receiver = Receiver()
    run_id = f"report-{time.strftime('%m%d-%H%M%S')}"
    job = {"topic": "our suppliers", "webhook": receiver.url}
    run = await engine.start(report, run_id, job)
    print(f"\n  {run_id} -> {await run.result(timeout='30s')}\n")
    for key, body in receiver.deliveries:
        print(f"  webhook got Idempotency-Key {key}: {body['id']}")
    keys = {key for key, _ in receiver.deliveries}
    print(f"  {len(receiver.deliveries)} deliveries, {len(keys)} key: notified once\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    print()
    receiver.close()
