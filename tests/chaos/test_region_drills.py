"""Drills on two regions of three nodes and a JetStream witness (research/reliability.md
§1.4, §3.3): a namespace's home region and its partner's mirror; the loss of the whole
home region, failed over by the documented procedure (``fusee.fail_over``), with the
RPO and RTO measured; the old home's writers refused by the epoch once it comes back.

The topology is the repository's ``nats/region-*.conf`` on free loopback ports
(``tests.cluster.LoopbackRegions``): seven nats-servers, the workers in their own
processes (``tests/workers/chain.py``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import nats
import nats.js.errors
import pytest

import fusee
from fusee.adapters.jetstream.layout import EPOCH, MSG_ID, Layout
from fusee.adapters.jetstream.regions import current_stream, pending_promotion
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import Fenced
from fusee.runtime.ids import partition_of
from tests.chaos.regions_kit import (
    LEASE,
    PARTITIONS,
    caught_up,
    connect_home,
    env_for,
    epoch_one_after,
    step_runs,
)
from tests.cluster import LoopbackRegions
from tests.helpers import cli_cmd, cli_env, run_cli
from tests.workers.procs import CHAIN, Workers, chain_result, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(240)]


async def _has_kinds(store: NatsStore, eid: str, kinds: set[str]) -> bool:
    """Whether the inbox of ``eid`` (partition 0) holds messages of each of ``kinds``."""
    return kinds <= {m.headers.get("Fusee-Kind", "") for m in await store.read_inbox(0, eid)}


async def test_a_regional_namespace_lives_in_its_home_with_a_mirror_in_its_partner(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """Streams and buckets in the home's cluster, R3; the journal's and values' mirrors
    in the partner's, named as the next epoch's streams; the lag readable; appends
    carry the epoch; a worker outside the home is refused."""
    engine = await fusee.connect(
        regions.url("east"), namespace=namespace, region="east", partner="west", replicas=3
    )
    try:
        ns = namespace.upper()
        js = engine.store.js
        for name in (ns, f"{ns}_VALUES", f"{ns}_TOKENS", f"KV_{namespace}_work"):
            info = await js.stream_info(name)
            assert info.cluster is not None
            assert info.cluster.name == "east", (name, info.cluster)
            assert info.config.num_replicas == 3, name
        for name in (f"{ns}_E2", f"{ns}_E2_VALUES"):
            info = await js.stream_info(name)
            assert info.cluster is not None
            assert info.cluster.name == "west", (name, info.cluster)
            assert info.mirror is not None
            assert info.config.metadata is not None
            assert info.config.metadata["fusee.home"] == "west"
            assert info.config.metadata["fusee.partitions"] == "16"
        meta = (await js.stream_info(ns)).config.metadata or {}
        assert meta["fusee.home"] == "east"
        assert meta["fusee.epoch"] == "1"

        @fusee.workflow("regional-hello")
        async def hello(ctx: fusee.Context, name: str) -> str:
            greeting: str = await ctx.step("greet", lambda: f"hello {name}")
            return greeting

        west = await fusee.connect(regions.url("west"), namespace=namespace, region="west")
        try:
            async with engine.worker():
                assert await (await engine.start(hello, "r1", "ana")).result(timeout=30) == (
                    "hello ana"
                )
                # a client in the partner region starts and reads runs through the gateways
                run = await west.start(hello, "r2", "bo")
                assert await run.result(timeout=30) == "hello bo"
        finally:
            await west.close()
        journal = await engine.store.read_journal("r1")
        assert journal
        assert all(m.headers.get(EPOCH) == "1" for m in journal)
        assert all(m.headers.get(EPOCH) == "1" for m in await engine.store.read_journal("r2"))
        await wait_until(lambda: caught_up(engine), timeout=30, what="the mirror caught up")
        lag = await engine.mirror_lag()
        assert lag is not None
        assert lag.mirror == f"{ns}_E2"
        assert lag.region == "west"
        assert lag.origin_last_seq == lag.mirror_last_seq

        status = await run_cli(
            "region", "status", "--region", "west", "--nats", regions.url("west"),
            "--namespace", namespace, "--json",
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert (shown["home"], shown["epoch"], shown["stream"]) == ("east", 1, ns)
        assert shown["mirror"]["mirror"] == f"{ns}_E2"
        # a worker outside the home exits at once, naming the home and the way out
        refused = await run_cli(
            "worker", str(CHAIN), "--region", "west", "--nats", regions.url("west"),
            "--namespace", namespace, timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "home in region 'east'" in refused.stderr, refused.stderr
        assert "fusee region failover --to west" in refused.stderr, refused.stderr
        # a process without a region would append without the epoch: refused
        with pytest.raises(fusee.ConfigError, match="has regions"):
            await fusee.connect(regions.url("east"), namespace=namespace)
        west = await fusee.connect(regions.url("west"), namespace=namespace, region="west")
        try:
            assert west.store.layout == Layout(namespace, 1, "east")  # the home, read back
            with pytest.raises(fusee.ConfigError, match="home in region 'east'"):
                await west.serve()
        finally:
            await west.close()
    finally:
        await engine.close()


async def test_region_loss_fails_over_to_the_partner_and_the_old_home_is_fenced(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """Every east server SIGKILLed while runs hold a step and a probe appends back to
    back; ``fusee region failover --to west``; a west worker finishes every run, no step
    that was replicated runs again; the RPO (acknowledged appends missing from the
    promoted journal) and the RTO are printed. East comes back: its worker, still
    holding the old epoch, is refused (fenced), and so is an old-epoch append."""
    east_url, west_url = regions.url("east"), regions.url("west")
    east = await connect_home(east_url, namespace)
    gate = tmp_path / "gate"
    runs: dict[str, dict[str, Any]] = {
        f"run-{i}": {
            "log": str(tmp_path / f"effects-{i}.log"),
            "steps": 4,
            "delay": 0.0,
            "tag": str(i),
            "hold": {"step": "s3", "until": str(gate)},
        }
        for i in range(8)
    }
    workers = Workers(east_url, namespace, tmp_path, partitions=PARTITIONS)
    (tmp_path / "west").mkdir()
    west_workers = Workers(west_url, namespace, tmp_path / "west", partitions=PARTITIONS)
    try:
        old_worker = await workers.start(extra_env=env_for("east", "west"))
        for rid, arg in runs.items():
            await east.start("chain", rid, arg)
        # every run is inside s3 (s1 and s2 committed), held there by the gate
        await wait_until(
            lambda: all(step_runs(Path(a["log"]))["s3"] == 1 for a in runs.values()),
            timeout=60, what="every run in s3",
        )  # fmt: skip
        await wait_until(lambda: caught_up(east), timeout=30, what="the mirror caught up")

        # a probe appending back to back up to the loss: what was acknowledged in east
        acked: list[str] = []
        kill_at = anyio.Event()

        async def probe() -> None:
            store, fence, n = east.store, 0, 0
            with store.retrying_for(2.0):
                while True:
                    n += 1
                    try:
                        fence = await store.append(
                            "probe", "run.started" if n == 1 else "step.completed", b"{}",
                            fence=fence, msg_id=f"probe:{n}",
                        )  # fmt: skip
                    except fusee.FuseeError:
                        return  # the region is gone
                    acked.append(f"probe:{n}")
                    if n == 200:
                        kill_at.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            await kill_at.wait()
            t_lost = time.monotonic()
            regions.kill_region("east")
        await east.close()

        # the documented procedure, as an operator runs it
        done = await run_cli(
            "region", "failover", "--to", "west", "--nats", west_url,
            "--namespace", namespace, "--json", timeout=120,
            env={**cli_env(), "FUSEE_REGION_LEASE": LEASE},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        t_promoted = time.monotonic()
        report = json.loads(done.stdout)
        assert report["epoch"] == 2
        assert report["stream"] == f"{namespace.upper()}_E2"
        assert report["from_region"] == "east"
        assert not report["planned"]

        west = await fusee.connect(west_url, namespace=namespace, region="west")
        assert west.store.layout == Layout(namespace, 2, "west")
        assert west.partitions == PARTITIONS  # carried by the mirror's metadata
        promoted = [m.headers.get(MSG_ID) for m in await west.store.read_journal("probe")]
        assert promoted == acked[: len(promoted)], "the promoted journal is not a prefix"
        rpo = len(acked) - len(promoted)

        await west_workers.start(extra_env=env_for("west"))
        t_served = time.monotonic()
        gate.touch()  # the held steps may finish now (in the west worker, and the zombie's)
        got: dict[str, Any] = {}
        first_done: list[float] = []

        async def one(rid: str) -> None:
            got[rid] = await west.run(rid).result(timeout=90)
            first_done.append(time.monotonic())

        with anyio.fail_after(100):
            async with anyio.create_task_group() as tg:
                for rid in runs:
                    tg.start_soon(one, rid)
        assert got == {rid: chain_result(arg) for rid, arg in runs.items()}
        for rid, arg in runs.items():
            ran = step_runs(Path(arg["log"]))
            # s1, s2 were committed and replicated: never again; s3 was running in east
            # when it went (uncommitted): it runs again in west, as a failover says
            assert (ran["s1"], ran["s2"]) == (1, 1), (rid, ran)
            assert ran["s3"] >= 2, (rid, ran)
            assert ran["s4"] >= 1, (rid, ran)
            journal = await west.store.read_journal(rid)
            assert [m.headers.get(EPOCH) for m in journal][-1] == "2"
        rto = min(first_done) - t_lost
        print(
            f"\nregion loss: RPO {rpo} of {len(acked)} acknowledged probe appends "
            f"(the failover reported the mirror {report['last_lag']} behind at its last "
            f"fetch); failover procedure {report['seconds']:.1f}s; west worker serving "
            f"{t_served - t_lost:.1f}s after the loss; RTO (loss to the first run "
            f"finished in west) {rto:.1f}s; promotion at +{t_promoted - t_lost:.1f}s"
        )

        # east comes back: its servers drop their copies (the meta group deleted them),
        # its worker's actors still hold epoch 1 and the gate is open: refused
        regions.restart_region("east")

        def stopped() -> bool:
            # each actor stops without writing: fenced by the epoch at its next append,
            # or dropped with its partition (the owner records name west's worker)
            fenced = {e["run_id"] for e in old_worker.find("actor.fenced")}
            lost = {e["partition"] for e in old_worker.find("partition.lost")}
            return all(r in fenced or partition_of(r, PARTITIONS) in lost for r in runs)

        await wait_until(stopped, timeout=60, what="every old-epoch actor stopped")
        # it heard west's worker across the regions: it claims nothing any more
        await old_worker.wait_for("region.superseded", timeout=30)
        west_id = west_workers.procs[0].find("worker.started")[0]["worker"]

        async def west_owns_all() -> bool:
            owners = [await west.store.get_owner(p) for p in range(PARTITIONS)]
            return all(o is not None and o[0] == west_id for o in owners)

        await wait_until(west_owns_all, timeout=30, what="west's worker owning every partition")
        old = await NatsStore.connect(regions.urls("east"), namespace)
        try:
            old.layout = Layout(namespace, 1, "east")  # a writer of the old epoch
            last = (await west.store.read_journal("run-0"))[-1]
            with pytest.raises(Fenced, match=r"epoch 1 .* is over"):
                await old.append("run-0", "step.completed", b"{}", fence=last.seq, msg_id="z")
        finally:
            await old.close()
        stray = await epoch_one_after(west, report["stream"], report["last_seq"])
        assert not stray, f"old-epoch records in the promoted journal: {stray}"
        await west.close()
    finally:
        workers.cleanup()
        west_workers.cleanup()


async def test_a_planned_handover_and_the_fail_back_lose_nothing(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """East's worker stopped (SIGTERM) with runs held in a step, ``fusee region failover
    --to west`` while east is up: it waits for the mirror, reports 0 lost, and a west
    worker finishes the runs with no committed step run again. Then back: a west
    process names east its partner (the epoch-3 mirror), the west worker is stopped,
    ``failover --to east``, and an east worker serves the namespace again."""
    east_url, west_url = regions.url("east"), regions.url("west")
    east = await connect_home(east_url, namespace)
    gate = tmp_path / "gate"
    runs: dict[str, dict[str, Any]] = {
        f"run-{i}": {
            "log": str(tmp_path / f"effects-{i}.log"),
            "steps": 3,
            "delay": 0.0,
            "tag": str(i),
            "hold": {"step": "s2", "until": str(gate)},
        }
        for i in range(4)
    }
    for sub in ("east", "west", "back"):
        (tmp_path / sub).mkdir()
    east_workers = Workers(east_url, namespace, tmp_path / "east", partitions=PARTITIONS)
    west_workers = Workers(west_url, namespace, tmp_path / "west", partitions=PARTITIONS)
    back_workers = Workers(east_url, namespace, tmp_path / "back", partitions=PARTITIONS)
    try:
        worker = await east_workers.start(extra_env=env_for("east", "west"))
        for rid, arg in runs.items():
            await east.start("chain", rid, arg)
        await wait_until(
            lambda: all(step_runs(Path(a["log"]))["s2"] == 1 for a in runs.values()),
            timeout=60, what="every run in s2",
        )  # fmt: skip
        assert worker.stop() == 0
        await east.close()
        # a handover interrupted after its first step: the old home's streams closed to
        # writes (as the procedure closes them) and nothing deleted; a write there is
        # refused, not stored, and the failover run again finds the closed stream
        nc = await nats.connect(east_url.split(","))
        try:
            js, old = nc.jetstream(timeout=5.0), Layout(namespace, 1, "east")
            for name, part in ((old.stream, "run"), (old.values_stream, "val")):
                config = (await js.stream_info(name)).config
                config.subjects = [f"{namespace}.closed.e1.{part}"]
                await js.update_stream(config)
            with pytest.raises(nats.js.errors.NoStreamResponseError):
                await js.publish(f"{namespace}.in.0.late", b"a write after the close")
        finally:
            await nc.close()

        async def failover(to: str, url: str) -> dict[str, Any]:
            done = await run_cli(
                "region", "failover", "--to", to, "--nats", url, "--namespace", namespace,
                "--json", timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            report: dict[str, Any] = json.loads(done.stdout)
            return report

        report = await failover("west", west_url)
        assert (report["epoch"], report["planned"], report["lost"]) == (2, True, 0)
        west = await fusee.connect(
            west_url, namespace=namespace, region="west", partner="east", replicas=3
        )
        try:
            await west_workers.start(extra_env=env_for("west", "east"))
            gate.touch()
            for rid, arg in runs.items():
                assert await west.run(rid).result(timeout=60) == chain_result(arg)
                ran = step_runs(Path(arg["log"]))
                assert ran["s1"] == 1, (rid, ran)  # committed: never again
            await wait_until(lambda: caught_up(west), timeout=30, what="the epoch-3 mirror")
            lag = await west.mirror_lag()
            assert lag is not None
            assert (lag.mirror, lag.region) == (f"{namespace.upper()}_E3", "east")
        finally:
            await west.close()
        for w in west_workers.procs:
            assert w.stop() == 0

        report = await failover("east", east_url)
        assert (report["epoch"], report["planned"], report["lost"]) == (3, True, 0)
        back = await fusee.connect(east_url, namespace=namespace, region="east")
        try:
            assert back.store.layout == Layout(namespace, 3, "east")
            await back_workers.start(extra_env=env_for("east"))
            arg = {**runs["run-0"], "hold": None, "tag": "back"}
            run = await back.start("chain", "after-fail-back", arg)
            assert await run.result(timeout=60) == chain_result(arg)
            for rid, arg in runs.items():  # the journals came back whole
                assert await back.run(rid).result(timeout=10) == chain_result(arg)
        finally:
            await back.close()
    finally:
        for group in (east_workers, west_workers, back_workers):
            group.cleanup()


async def test_a_failover_carries_objects_their_queues_tokens_limits_and_the_secret(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """What lives in the buckets and the token streams survives a planned handover: an
    object's state (and its revision: the next call's write is accepted), a call
    queued while no worker ran (found by its active marker, with nothing new sent), a
    completion URL made in east (the namespace's secret), an API token, a limit, and a
    finished invocation's token stream. Each bucket is the promoted mirror, on the new
    epoch's stream, under the same name."""
    from tests.workers.handover import ledger

    east_url, west_url = regions.url("east"), regions.url("west")
    posted = tmp_path / "posted"
    for sub in ("east", "west"):
        (tmp_path / sub).mkdir()
    module = Path(__file__).resolve().parent.parent / "workers" / "handover.py"
    east_workers = Workers(east_url, namespace, tmp_path / "east", partitions=PARTITIONS)
    west_workers = Workers(west_url, namespace, tmp_path / "west", partitions=PARTITIONS)
    east_workers.module = west_workers.module = module
    east = await connect_home(east_url, namespace)
    try:
        worker = await east_workers.start(extra_env=env_for("east", "west"))
        assert await ledger.key("a", engine=east).call("add", 2, timeout=30) == 2
        assert await ledger.key("a", engine=east).call("add", 3, timeout=30) == 5
        spoken = await ledger.key("s", engine=east).send("speak", "one two three")
        assert await ledger.key("s", engine=east).result(spoken, timeout=30) == "one two three "
        asked = await ledger.key("q", engine=east).send("ask", {"posted": str(posted)})
        await wait_until(posted.exists, timeout=30, what="the completion URL")
        url = posted.read_text().split()[0]
        token = (await east.tokens.create("read", name="ops")).token
        await east.limit("provider", per_second=5, concurrent=2)
        secret = await east.store.load_secret()
        assert worker.stop() == 0
        queued = await ledger.key("w", engine=east).send("add", 7)  # no worker runs it
    finally:
        await east.close()

    done = await run_cli(
        "region", "failover", "--to", "west", "--nats", west_url, "--namespace", namespace,
        "--json", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["epoch"], report["planned"], report["lost"]) == (2, True, 0)

    west = await fusee.connect(west_url, namespace=namespace, region="west")
    try:
        layout = west.store.layout
        assert layout == Layout(namespace, 2, "west")
        js = west.store.js
        for bucket in (layout.runs_bucket, layout.work_bucket, layout.objects_bucket):
            info = await js.stream_info(layout.kv_stream(bucket))
            assert info.config.name == f"KV_{bucket}_E2"
            assert info.config.mirror is None
            assert info.config.subjects == [f"$KV.{bucket}.>"]
            assert info.cluster is not None
            assert info.cluster.name == "west"
        assert await west.store.load_secret() == secret
        assert (await west.tokens.verify(token)).name == "ops"
        limit = await west.get_limit("provider")
        assert (limit.per_second, limit.concurrent) == (5, 2)
        assert await ledger.key("a", engine=west).state() == {"count": 5}
        assert [t async for t in ledger.key("s", engine=west).stream(spoken, "reply")] == [
            "one ",
            "two ",
            "three ",
        ]

        await west_workers.start(extra_env=env_for("west"))
        # the queued call: its active marker came with the work bucket
        assert await ledger.key("w", engine=west).result(queued, timeout=30) == 7
        # the projection's revision carried over: the next write is accepted
        assert await ledger.key("a", engine=west).call("add", 1, timeout=30) == 6
        assert await west.complete(url.rsplit("/", 1)[1], {"ok": True}) is True
        assert await ledger.key("q", engine=west).result(asked, timeout=30) == {"ok": True}
        assert (await ledger.key("q", engine=west).state())["answer"] == {"ok": True}
    finally:
        await west.close()
        east_workers.cleanup()
        west_workers.cleanup()


async def test_a_worker_frozen_across_a_failover_is_fenced_when_it_wakes(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """East's worker SIGSTOPped while its runs hold a step (a zombie), the namespace
    failed over to west; SIGCONT before any west worker runs: the zombie's held steps
    finish and their commits, whose fences match the promoted journal, are refused by
    the epoch (``actor.fenced``); it starts no further step; a west worker then
    finishes every run, and no epoch-1 record is in the promoted journal."""
    east_url, west_url = regions.url("east"), regions.url("west")
    east = await connect_home(east_url, namespace)
    gate = tmp_path / "gate"
    runs: dict[str, dict[str, Any]] = {
        f"run-{i}": {
            "log": str(tmp_path / f"effects-{i}.log"),
            "steps": 3,
            "delay": 0.0,
            "tag": str(i),
            "hold": {"step": "s2", "until": str(gate)},
        }
        for i in range(4)
    }
    (tmp_path / "west").mkdir()
    east_workers = Workers(east_url, namespace, tmp_path, partitions=PARTITIONS)
    west_workers = Workers(west_url, namespace, tmp_path / "west", partitions=PARTITIONS)
    try:
        zombie = await east_workers.start(extra_env=env_for("east", "west"))
        for rid, arg in runs.items():
            await east.start("chain", rid, arg)
        await wait_until(
            lambda: all(step_runs(Path(a["log"]))["s2"] == 1 for a in runs.values()),
            timeout=60, what="every run in s2",
        )  # fmt: skip
        await wait_until(lambda: caught_up(east), timeout=30, what="the mirror caught up")
        zombie.freeze()
        await east.close()
        report = await fusee.fail_over(west_url, namespace=namespace, to="west")
        assert report.epoch == 2
        # the zombie wakes first, before the new home wrote anything: its fences
        # match the promoted journal's tails, only the epoch can refuse it
        gate.touch()
        zombie.thaw()
        await wait_until(
            lambda: {e["run_id"] for e in zombie.find("actor.fenced")} >= set(runs),
            timeout=60, what="every zombie actor fenced",
        )  # fmt: skip
        west = await fusee.connect(west_url, namespace=namespace, region="west")
        try:
            new_home = await west_workers.start(extra_env=env_for("west"))
            for rid, arg in runs.items():
                assert await west.run(rid).result(timeout=60) == chain_result(arg)
            for rid, arg in runs.items():
                ran = step_runs(Path(arg["log"]))
                # s2: the zombie's (frozen in it) and west's; s3: west's alone
                assert (ran["s1"], ran["s2"], ran["s3"]) == (1, 2, 1), (rid, ran)
                journal = await west.store.read_journal(rid)
                names = [m.headers.get("Fusee-Kind") for m in journal]
                assert names.count("step.completed") == 3, (rid, names)
            stray = await epoch_one_after(west, report.stream, report.last_seq)
            assert not stray, f"old-epoch records in the promoted journal: {stray}"
            # the zombie heard west's heartbeats across the regions: not a peer of its
            await zombie.wait_for("region.superseded", timeout=30)
            assert zombie.alive  # (heartbeating, unheard by the new home:)
            assert west.store.layout.epoch == 2
            live = set(await west.live_workers())
            assert live == {new_home.find("worker.started")[0]["worker"]}, live
        finally:
            await west.close()
    finally:
        east_workers.cleanup()
        west_workers.cleanup()


async def test_a_home_cut_off_from_the_meta_quorum_stops_appending_within_its_lease(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """West and the witness frozen (SIGSTOP: to east, a partition), east alone: its
    servers still take appends (the stream's own quorum is in east), but its worker's
    region lease, renewed by a write only the meta quorum accepts, runs out within the
    lease; a step that finishes then is not committed (the commit waits, logged
    ``region.lease_wait``, and no step is logged completed, which is logged once its
    commit landed, until the lease is back); on heal the lease is held again, the
    commit lands and the run finishes, each step committed once."""
    east_url = regions.url("east")
    east = await connect_home(east_url, namespace)
    gate = tmp_path / "gate"
    arg: dict[str, Any] = {
        "log": str(tmp_path / "effects.log"), "steps": 4, "delay": 0.0, "tag": "cut",
        "hold": {"step": "s3", "until": str(gate)},
    }  # fmt: skip
    workers = Workers(east_url, namespace, tmp_path, partitions=PARTITIONS)
    try:
        worker = await workers.start(extra_env=env_for("east", "west"))
        run = await east.start("chain", "cut-off", arg)
        await wait_until(lambda: step_runs(Path(arg["log"]))["s3"] == 1, timeout=60, what="s3")
        before = [m.headers.get("Fusee-Kind") for m in await east.store.read_journal("cut-off")]
        assert before.count("step.completed") == 2, before  # s1, s2; s3 held
        # the lease held all along so far (a slow renewal under load would make the
        # waits below find an earlier lapse's lines)
        lapses = ("region.lease_lost", "region.lease_wait", "region.lease_regained")
        assert not [e for e in lapses if worker.find(e)], worker.tail()
        cut = time.monotonic()
        regions.freeze_region("west")
        regions.freeze_region("witness")
        try:
            lost = await worker.wait_for("region.lease_lost", timeout=60)
            took = time.monotonic() - cut
            gate.touch()  # s3's body returns now: its commit must wait for the lease
            waited = await worker.wait_for("region.lease_wait", timeout=30)
            assert waited["run_id"] == "cut-off"  # s3's commit waits for the lease
            # (no read of east's journal here: with the meta group gone its API may
            # answer 503 for as long as the cut lasts, as one CI run's did; the commit's
            # step.completed line, written once it landed, is the check below)
        finally:
            regions.thaw_region("witness")
            regions.thaw_region("west")
        regained = await worker.wait_for("region.lease_regained", timeout=90)
        assert await run.result(timeout=90) == chain_result(arg)
        ran = step_runs(Path(arg["log"]))
        assert (ran["s1"], ran["s2"], ran["s3"], ran["s4"]) == (1, 1, 1, 1), ran
        kinds = [m.headers.get("Fusee-Kind") for m in await east.store.read_journal("cut-off")]
        assert kinds.count("step.completed") == 4, kinds
        # no step was committed while the lease was out
        between = [
            e for e in worker.find("step.completed")
            if lost["timestamp"] < e["timestamp"] < regained["timestamp"]
        ]  # fmt: skip
        assert not between, between
        # the gate closed by cut + lease; its log line comes at the next failed renewal
        assert took < 3 * float(LEASE), took
        print(
            f"\nregion cut off: lease {LEASE}s; the worker logged its lease lost "
            f"{took:.1f}s after the cut (its appends were refused from the lease's end, "
            f"at most {LEASE}s after it)"
        )
    finally:
        await east.close()
        workers.cleanup()


async def test_an_old_epochs_writes_outside_the_fence_are_refused_by_the_new_home(
    regions: LoopbackRegions, namespace: str
) -> None:
    """A worker's writes outside a run's fence (inbox messages, timers, a run's active
    marker and its removal, index and listing entries, values, and every write into a
    bucket: an object's marker, an owner claim, a state projection) name its epoch's stream
    as its appends do: after a failover, an epoch-1 store (as a worker's, which does not
    follow) whose publishes reach the new home through the gateways is refused
    (``FailedOver``, or ``Fenced`` through the committer, naming the failover) and
    stores nothing there. Before, they landed: a
    zombie's marker removal took a live run's marker away in the new home."""
    east_url, west_url = regions.url("east"), regions.url("west")
    east = await connect_home(east_url, namespace)
    east.store.follows_failover = False  # as a worker's store: it keeps epoch 1
    west: fusee.Engine | None = None
    try:
        lay = east.store.layout
        await east.store.mark_run_active(0, "zombie-run", b"{}")
        await wait_until(lambda: caught_up(east), timeout=30, what="the mirror caught up")
        report = await fusee.fail_over(west_url, namespace=namespace, to="west", lease=1)
        west = await fusee.connect(west_url, namespace=namespace, region="west")
        new = west.store.layout
        assert (new.epoch, lay.epoch) == (2, 1)
        js = west.store.js
        streams = [new.stream, new.values_stream]
        streams += [
            new.kv_stream(b) for b in (new.work_bucket, new.objects_bucket, new.runs_bucket)
        ]
        before = {s: (await js.stream_info(s)).state for s in streams}
        value = {"status": "completed", "workflow": "chain"}
        index = json.dumps(value).encode()
        writes: dict[str, Callable[[], Awaitable[object]]] = {
            "an inbox message": lambda: east.store.send_inbox(0, "zombie-run", "signal", b"{}"),
            "a timer": lambda: east.store.schedule_timer("zombie-run", 0, 1, time.time() + 3600),
            "an active marker": lambda: east.store.mark_run_active(0, "zombie-run", b"{}"),
            "a marker's removal": lambda: east.store.clear_run_active(0, "zombie-run"),
            "an index entry": lambda: east.store.end_run(0, "zombie-run", index, journal_seq=1),
            "a listing's removal": lambda: east.store.unlist("paused", "chain", "zombie-run", 1),
            "a value": lambda: east.store.put_value("zombie-run", b"v" * 64),
            # the buckets keep their subjects: a zombie's write reaches the new home's
            "an object's marker": lambda: east.store.mark_active(0, "zombie-key"),
            "an idle marker": lambda: east.store.mark_idle(0, "zombie-key", 600.0),
            "an owner claim": lambda: east.store.claim_owner(0, "zombie-worker", None),
            "a state projection": lambda: east.store.put_state(
                "T", "zombie-key", b"{}", journal_seq=1, cursor=0, last=0
            ),
            "an index entry in the bucket": lambda: east.store.put_index(
                "zombie-run", index, journal_seq=1, last=0
            ),
        }
        for what, write in writes.items():
            # (FailedOver; Fenced for the two that go through the committer)
            with pytest.raises((fusee.FailedOver, Fenced), match="failed over") as refused:
                with anyio.fail_after(30):
                    await write()
            assert "epoch 1" in str(refused.value), (what, refused.value)
        after = {s: (await js.stream_info(s)).state for s in streams}
        for s in before:
            assert after[s].last_seq == before[s].last_seq, (s, before[s], after[s])
        # the run's marker in the new home is the one epoch 1 wrote before the failover
        marker = await west.store.has_run_marker(0, "zombie-run", leader=True)
        assert marker, "the zombie removed the run's marker in the new home"
        assert report.epoch == 2
        # the new home's own writes, naming its stream, are stored (a timer fires)
        home = west.store
        home.follows_failover = False
        await home.schedule_timer("home-run", 0, 1, time.time() + 0.5)
        await home.mark_run_active(0, "home-run", b"{}")
        assert await home.send_inbox(0, "home-run", "signal", b"{}") > 0
        await home.end_run(0, "home-run", index, journal_seq=1)
        assert not await home.has_run_marker(0, "home-run", leader=True)
        assert await home.get_final_entry("home-run", leader=True) is not None
        await wait_until(
            lambda: _has_kinds(home, "home-run", {"signal", "timer"}), timeout=30,
            what="the signal and the fired timer in the new home's inbox",
        )  # fmt: skip
    finally:
        await east.close()
        if west is not None:
            await west.close()


async def test_a_failover_interrupted_in_its_lease_wait_is_resumed_and_nothing_is_made_meanwhile(
    regions: LoopbackRegions, namespace: str, tmp_path: Path
) -> None:
    """East lost; ``fusee region failover`` deletes its streams, waits the lease, and
    its process is SIGKILLed there: no stream binds the journal's subjects. A process
    connecting then takes the mirror's epoch (before, it made a fresh epoch-1 stream,
    whose subjects would have refused the promotion); the failover run again resumes:
    it promotes the mirror, whose marker written in east is there, and that process's
    writes land in it."""
    east_url, west_url = regions.url("east"), regions.url("west")
    east = await connect_home(east_url, namespace)
    await east.store.mark_run_active(0, "kept", b"{}")
    await wait_until(lambda: caught_up(east), timeout=30, what="the mirror caught up")
    await east.close()
    regions.kill_region("east")
    observer = await nats.connect(servers=regions.urls("west"))
    window: fusee.Engine | None = None
    out = (tmp_path / "failover.out").open("w")
    failover = subprocess.Popen(
        cli_cmd("region", "failover", "--to", "west", "--nats", west_url,
                "--namespace", namespace),
        env={**cli_env(), "FUSEE_REGION_LEASE": "600"}, stdout=out, stderr=out,
    )  # fmt: skip
    try:

        async def in_lease_wait() -> bool:
            bound = await current_stream(observer, namespace)
            return bound is None and await pending_promotion(observer, namespace) is not None

        await wait_until(in_lease_wait, timeout=120, what="the old home's streams deleted")
        assert failover.poll() is None, (tmp_path / "failover.out").read_text()
        window = await fusee.connect(west_url, namespace=namespace, region="west")
        assert window.store.layout.epoch == 2
        assert window.store.layout.home == "west"
        failover.kill()  # the failover's process dies in its lease wait
        failover.wait()
        js = observer.jetstream(timeout=5)
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.stream_info(Layout(namespace).stream)  # no epoch-1 stream was made
        report = await fusee.fail_over(west_url, namespace=namespace, to="west", lease=1)
        assert (report.epoch, report.to_region, report.planned) == (2, "west", False)
        assert await window.store.has_run_marker(0, "kept", leader=True)
        before = (await js.stream_info(report.stream)).state.last_seq
        await window.store.send_inbox(0, "kept", "signal", b"{}")
        assert (await js.stream_info(report.stream)).state.last_seq == before + 1
        # asked once more, it is over: the namespace's home is west
        with pytest.raises(fusee.InvalidArgument, match="already the namespace's home"):
            await fusee.fail_over(west_url, namespace=namespace, to="west", lease=1)
    finally:
        if failover.poll() is None:
            failover.kill()
            failover.wait()
        out.close()
        if window is not None:
            await window.close()
        await observer.close()
