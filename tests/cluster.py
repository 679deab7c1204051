"""A 3-node JetStream cluster on loopback, from the repository's ``nats/cluster-n*.conf``.

Each node runs its shipped config with only its addresses and store moved: the client,
route and monitor ports become free ones, ``./data/nX`` a directory of the test's, so
the tests exercise the configs an operator starts (``sync_interval: always``, the route
mesh, the cluster name). Readiness is read from each node's ``/healthz``, never from log
lines. A node can be SIGKILLed, stopped, restarted on its ports, and wiped (its store
removed, so it must catch up from its peers).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import nats

from fusee.adapters.jetstream.server import find_nats_server_binary

__all__ = (
    "ClusterNode",
    "LoopbackRegions",
    "LoopbackStretch",
    "LoopbackCluster",
    "Netns",
    "free_ports",
    "get_json",
    "move_leader",
    "stream_leader",
)

CONFIGS = Path(__file__).resolve().parents[1] / "nats"
NODES = ("n1", "n2", "n3")
# the shipped configs' loopback ports, per node index 1..3
_CLIENT, _ROUTE, _HTTP = 24220, 24320, 28220


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now (bound, then let go together)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def get_json(url: str, timeout: float = 1.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # a loopback URL we built
        return json.loads(response.read())


@dataclass
class ClusterNode:
    """One nats-server of the cluster: its ports, its store, its process."""

    name: str
    port: int
    route_port: int
    http_port: int
    dir: Path
    config: str
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # where the test reaches it (its region's address in a netns)
    prefix: tuple[str, ...] = ()  # what runs the server (``ip netns exec <ns>``)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def store(self) -> Path:
        return self.dir / "data" / self.name

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / f"{self.name}.conf"
        conf.write_text(self.config)
        with (self.dir / "nats-server.log").open("ab") as log:
            # the config's relative store_dir lands under the node's dir
            self.proc = subprocess.Popen(
                [*self.prefix, find_nats_server_binary(), "-c", str(conf)],
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy(self, *, js_only: bool = True) -> bool:
        query = "?js-enabled-only=true" if js_only else ""
        try:
            with urllib.request.urlopen(f"{self.monitor}/healthz{query}", timeout=1.0) as r:
                return bool(r.status == 200)
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash would; the store stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def wipe(self) -> None:
        """Remove the node's JetStream store (it must be down)."""
        assert not self.alive, f"{self.name} runs: stop or kill it first"
        shutil.rmtree(self.store, ignore_errors=True)

    def stream_last_seq(self, stream: str) -> int:
        """The last sequence of ``stream`` in this node's own copy (from its monitor)."""
        jsz = get_json(f"{self.monitor}/jsz?accounts=true&streams=true")
        for account in jsz.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    return int(detail["state"]["last_seq"])
        return 0

    def log_tail(self, n: int = 30) -> str:
        path = self.dir / "nats-server.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-n:])


def _node_config(name: str, index: int, ports: tuple[int, int, int], routes: list[int]) -> str:
    """The shipped ``nats/cluster-<name>.conf`` with its addresses moved to ``ports``."""
    lines = (CONFIGS / f"cluster-{name}.conf").read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if not line.lstrip().startswith("#"))
    client, route, http = ports
    text = text.replace(f"listen: 127.0.0.1:{_CLIENT + index}\n", f"listen: 127.0.0.1:{client}\n")
    text = text.replace(f"http_port: {_HTTP + index}", f"http_port: {http}")
    text = text.replace(f"listen: 127.0.0.1:{_ROUTE + index}\n", f"listen: 127.0.0.1:{route}\n")
    for i, port in enumerate(routes, start=1):
        text = text.replace(
            f"nats-route://127.0.0.1:{_ROUTE + i}", f"nats-route://127.0.0.1:{port}"
        )
    # every shipped address must have moved: a config changed under this helper fails loudly
    left = re.findall(r"\b2[48]2[23]\d\b", text)
    assert not left, f"nats/cluster-{name}.conf: addresses this helper did not move: {left}"
    return text


def meta_of(nodes: list[ClusterNode]) -> tuple[str | None, int]:
    """The meta group's leader and its size, as the first live node of ``nodes`` that
    knows a leader sees them."""
    for node in nodes:
        if not node.alive:
            continue
        try:
            meta = get_json(f"{node.monitor}/jsz").get("meta_cluster", {})
        except (OSError, ValueError):
            continue
        if meta.get("leader"):
            return str(meta["leader"]), int(meta.get("cluster_size") or 0)
    return None, 0


def _wait_healthy(
    nodes: list[ClusterNode], elected: Callable[[], bool], timeout: float, what: str
) -> None:
    """Until every live node of ``nodes`` is healthy and ``elected()`` (a meta leader as
    the caller wants it); a node that exited is told at once, with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server {node.name} exited ({node.proc.returncode}):\n{node.log_tail()}"
                )
        if all(n.healthy(js_only=False) for n in nodes if n.alive) and elected():
            return
        time.sleep(0.05)  # a poll, not an order: the servers offer only HTTP health
    tails = "\n".join(f"--- {n.name}\n{n.log_tail()}" for n in nodes)
    raise RuntimeError(f"{what} was not ready after {timeout}s:\n{tails}")


@dataclass
class LoopbackCluster:
    """Three nats-servers in one JetStream cluster on loopback, in ``dir``."""

    dir: Path
    nodes: list[ClusterNode] = field(default_factory=list)

    @classmethod
    def start(cls, where: Path, *, timeout: float = 30.0) -> LoopbackCluster:
        ports = free_ports(3 * len(NODES))
        client, route, http = ports[0:3], ports[3:6], ports[6:9]
        cluster = cls(Path(where))
        for i, name in enumerate(NODES, start=1):
            config = _node_config(name, i, (client[i - 1], route[i - 1], http[i - 1]), route)
            node = ClusterNode(
                name, client[i - 1], route[i - 1], http[i - 1], cluster.dir / name, config
            )
            cluster.nodes.append(node)
        for node in cluster.nodes:
            node.launch()
        try:
            cluster.wait_ready(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated (what ``--nats`` takes)."""
        return ",".join(self.urls)

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    def meta_leader(self) -> str | None:
        """The meta group's leader as a live node sees it, if one is elected."""
        for node in self.nodes:
            if not node.alive:
                continue
            try:
                leader = get_json(f"{node.monitor}/jsz").get("meta_cluster", {}).get("leader")
            except (OSError, ValueError):
                continue
            if leader:
                return str(leader)
        return None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every live node is healthy (JetStream current, a meta leader known)."""
        _wait_healthy(self.nodes, lambda: self.meta_leader() is not None, timeout, "the cluster")

    def restart(self, node: ClusterNode, *, timeout: float = 30.0) -> None:
        """Start ``node`` again on its ports and store; wait until the cluster is ready."""
        node.launch()
        self.wait_ready(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


async def stream_leader(
    cluster: LoopbackCluster, stream: str, *, timeout: float = 20.0
) -> ClusterNode:
    """The node leading ``stream``'s Raft group (asked through any live node); while
    it has none (an election after a kill or a stepdown), asked again until it has."""
    deadline = time.monotonic() + timeout
    nc = await nats.connect([n.url for n in cluster.nodes if n.alive], connect_timeout=2)
    try:
        while True:
            info = await nc.jetstream(timeout=5).stream_info(stream)
            assert info.cluster is not None, f"{stream} is not clustered: {info}"
            if info.cluster.leader:
                return cluster.node(info.cluster.leader)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stream}: no leader after {timeout}s: {info.cluster}")
            await anyio.sleep(0.05)  # the servers offer no event for an election
    finally:
        await nc.close()


async def move_leader(cluster: LoopbackCluster, stream: str, node: ClusterNode) -> None:
    """Make ``node`` the leader of ``stream`` (a stepdown naming it preferred), so a
    drill knows which node it kills and who was connected to it."""
    deadline = time.monotonic() + 20.0
    while (await stream_leader(cluster, stream)) is not node:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stream}: {node.name} did not become its leader")
        nc = await nats.connect([n.url for n in cluster.nodes if n.alive], connect_timeout=2)
        try:
            body = json.dumps({"placement": {"preferred": node.name}}).encode()
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=5)
        finally:
            await nc.close()
        # the new leader takes a moment to be elected: look again until it is this one
        for _ in range(100):
            if (await stream_leader(cluster, stream)) is node:
                return
            await anyio.sleep(0.05)


# -- two regions and a witness --------------------------------------------------------

REGION_NODES = {
    "east": ("east-1", "east-2", "east-3"),
    "west": ("west-1", "west-2", "west-3"),
    "witness": ("witness",),
}
# every port the shipped nats/region-*.conf use (client, route, gateway, monitor)
_REGION_PORT = re.compile(r"\b(?:25[234][134]\d|292[134]\d)\b")


def _region_file(name: str) -> Path:
    return CONFIGS / ("region-witness.conf" if name == "witness" else f"region-{name}.conf")


def _region_of(name: str) -> str:
    return next(region for region, group in REGION_NODES.items() if name in group)


def _node(
    name: str,
    text: str,
    where: Path,
    netns: tuple[Netns, str, str, str, dict[str, str]] | None,
) -> ClusterNode:
    """The node of config ``text``; with ``netns`` (the namespaces, the node's site, and
    :func:`_netns_config`'s block, scheme and places), run in its site's namespace."""
    client = int(re.search(r"listen: 127\.0\.0\.1:(\d+)", text).group(1))  # type: ignore[union-attr]
    http = int(re.search(r"http_port: (\d+)", text).group(1))  # type: ignore[union-attr]
    if netns is None:
        return ClusterNode(name, client, 0, http, where, text)
    spaces, site, block, scheme, place = netns
    text = _netns_config(text, client, spaces, block, scheme, place)
    prefix = spaces.exec_prefix(site)
    return ClusterNode(name, client, 0, http, where, text, None, spaces.ips[site], prefix)


def _moved_texts(files: dict[str, Path], ports: re.Pattern[str]) -> dict[str, str]:
    """Each shipped config of ``files`` (by node name), comments dropped, with every
    port ``ports`` matches moved to a free one: the same map for all of them, so the
    nodes still name each other."""
    texts = {}
    for name, path in files.items():
        lines = path.read_text().splitlines(keepends=True)
        texts[name] = "".join(line for line in lines if not line.lstrip().startswith("#"))
    shipped = sorted({int(p) for text in texts.values() for p in ports.findall(text)})
    moved = dict(zip(shipped, free_ports(len(shipped)), strict=True))
    return {n: ports.sub(lambda m: str(moved[int(m.group())]), t) for n, t in texts.items()}


def _block_port(text: str, block: str) -> str:
    """The port the ``block`` (``cluster``, ``gateway``) of a config listens on."""
    found = re.search(block + r" \{\s*name: \w+\s*listen: 127\.0\.0\.1:(\d+)", text)
    assert found is not None, f"no {block} listen line in:\n{text}"
    return found.group(1)


def _netns_config(
    text: str, client: int, netns: Netns, block: str, scheme: str, place: dict[str, str]
) -> str:
    """A node's config for a network namespace: clients and ``block`` (the gateway of a
    region, the routes of a stretch cluster) listen on every address (the test dials
    the node's site address, its workers the namespace's loopback), and each
    ``scheme://`` URL names the address of the site ``place`` gives its port."""
    text = text.replace(f"listen: 127.0.0.1:{client}\n", f"listen: 0.0.0.0:{client}\n", 1)
    text = re.sub(
        "(" + block + r" \{\s*name: \w+\s*listen: )127\.0\.0\.1:", r"\g<1>0.0.0.0:", text, count=1
    )

    def dial(m: re.Match[str]) -> str:
        return f"{scheme}://{netns.ips[place[m.group(1)]]}:{m.group(1)}"

    return re.sub(scheme + r"://127\.0\.0\.1:(\d+)", dial, text)


STRETCH_NODES = {
    "east": ("east-1", "east-2"),
    "west": ("west-1", "west-2"),
    "third": ("third-1",),
}
# every port the shipped nats/stretch-*.conf use (client, route, monitor)
_STRETCH_PORT = re.compile(r"\b(?:26[23]0[1-5]|2930[1-5])\b")


@dataclass
class LoopbackStretch:
    """The global tier: one JetStream cluster of five nats-servers stretched over three
    sites, 2 + 2 + 1 (``nats/stretch-*.conf``, ``unique_tag: "site:"``), its ports moved
    to free ones; with ``netns`` each site in its own network namespace (routes dialled
    at the site's address, so cutting a site's link cuts it off)."""

    dir: Path
    nodes: list[ClusterNode] = field(default_factory=list)

    @classmethod
    def start(
        cls, where: Path, *, timeout: float = 60.0, netns: Netns | None = None
    ) -> LoopbackStretch:
        names = [n for group in STRETCH_NODES.values() for n in group]
        texts = _moved_texts({n: CONFIGS / f"stretch-{n}.conf" for n in names}, _STRETCH_PORT)
        route_site = {_block_port(texts[n], "cluster"): _site_of(n) for n in names}
        stretch = cls(Path(where))
        for name in names:
            site = _site_of(name)
            netns_for = (
                None if netns is None else (netns, site, "cluster", "nats-route", route_site)
            )
            stretch.nodes.append(_node(name, texts[name], stretch.dir / name, netns_for))
        for node in stretch.nodes:
            node.launch()
        try:
            _wait_healthy(
                stretch.nodes,
                lambda: stretch.meta()[1] == len(stretch.nodes),
                timeout,
                "the stretch cluster",
            )
        except BaseException:
            stretch.stop()
            raise
        return stretch

    def site(self, site: str) -> list[ClusterNode]:
        return [n for n in self.nodes if n.name in STRETCH_NODES[site]]

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated (what ``--nats`` takes)."""
        return ",".join(n.url for n in self.nodes)

    def local_url(self, site: str) -> str:
        """What a process inside ``site``'s network namespace dials first: its site's
        servers on loopback, then the others at their addresses."""
        here = [f"nats://127.0.0.1:{n.port}" for n in self.site(site)]
        return ",".join(here + [n.url for n in self.nodes if n not in self.site(site)])

    def meta(self) -> tuple[str | None, int]:
        """The meta group's leader and its size, as a live node sees them."""
        return meta_of(self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _site_of(name: str) -> str:
    return next(site for site, group in STRETCH_NODES.items() if name in group)


@dataclass
class Netns:
    """Network namespaces for a region drill, made with ``ip netns`` and veth pairs
    (as root; research/reliability-lab/netns.sh): one per region, each with its own
    address on a bridge in a namespace of its own, and the test's namespace joined to
    the bridge too, so the test reaches every region. :meth:`cut` takes a region's
    link down: nothing crosses between it and the others (the test included) until
    :meth:`heal`; inside the region, servers and workers go on over its loopback.
    The names carry the test process's PID, the subnet is picked from it: two test
    processes do not collide, and :meth:`remove` leaves nothing behind."""

    tag: str
    ips: dict[str, str]

    @classmethod
    def make(cls, regions: tuple[str, ...] = ("east", "west", "witness")) -> Netns:
        """Raises ``OSError`` when namespaces cannot be made here (not root, no
        ``ip``), having removed what it made."""
        import os

        pid = os.getpid()
        tag = f"fz{pid % 100000}"
        # in 198.18.0.0/15 (RFC 2544, benchmarking): no real network's range
        subnet = f"198.{18 + pid % 2}.{(pid // 2) % 250}"
        netns = cls(tag, {r: f"{subnet}.{i + 1}" for i, r in enumerate(regions)})
        try:
            netns._up(subnet)
        except (OSError, subprocess.CalledProcessError) as exc:
            netns.remove()
            raise OSError(f"network namespaces cannot be made here: {exc}") from exc
        return netns

    def name(self, region: str) -> str:
        return f"{self.tag}-{region}"

    def exec_prefix(self, region: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name(region))

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    def _up(self, subnet: str) -> None:
        bridge = self.name("br")
        self._ip("netns", "add", bridge)
        self._ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        self._ip("-n", bridge, "link", "set", "br0", "up")
        for i, region in enumerate(self.ips):
            ns, here, there = self.name(region), f"{self.tag}v{i}", f"{self.tag}b{i}"
            self._ip("netns", "add", ns)
            self._ip("link", "add", here, "type", "veth", "peer", "name", there)
            self._ip("link", "set", here, "netns", ns)
            self._ip("link", "set", there, "netns", bridge)
            self._ip("-n", ns, "addr", "add", f"{self.ips[region]}/24", "dev", here)
            self._ip("-n", ns, "link", "set", here, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", bridge, "link", "set", there, "master", "br0", "up")
        # the test's own namespace on the bridge, last in the subnet
        here, there = f"{self.tag}vt", f"{self.tag}bt"
        self._ip("link", "add", here, "type", "veth", "peer", "name", there)
        self._ip("link", "set", there, "netns", bridge)
        self._ip("addr", "add", f"{subnet}.254/24", "dev", here)
        self._ip("link", "set", here, "up")
        self._ip("-n", bridge, "link", "set", there, "master", "br0", "up")

    def _bridge_port(self, region: str) -> str:
        return f"{self.tag}b{list(self.ips).index(region)}"

    def cut(self, region: str) -> None:
        """Take ``region``'s link to the bridge down: a partition."""
        self._ip("-n", self.name("br"), "link", "set", self._bridge_port(region), "down")

    def heal(self, region: str) -> None:
        self._ip("-n", self.name("br"), "link", "set", self._bridge_port(region), "up")

    def remove(self) -> None:
        """Delete the namespaces (their veths go with them, the test's too)."""
        for region in (*self.ips, "br"):
            subprocess.run(
                ["ip", "netns", "del", self.name(region)], capture_output=True, timeout=10
            )


@dataclass
class LoopbackRegions:
    """Two regions of three nats-servers (clusters ``east`` and ``west``) and a
    JetStream witness (cluster ``witness``), joined by gateways: the repository's
    ``nats/region-*.conf`` with every shipped port moved to a free one (the same map for
    all seven files, so routes and gateways still name each other)."""

    dir: Path
    nodes: list[ClusterNode] = field(default_factory=list)

    @classmethod
    def start(
        cls, where: Path, *, timeout: float = 60.0, netns: Netns | None = None
    ) -> LoopbackRegions:
        """The seven servers, on loopback; with ``netns``, each region's in its own
        network namespace (:class:`Netns`): routes stay on the namespace's loopback,
        clients and gateways listen on every address, and each gateway is dialled at
        its region's address, so cutting a region's link cuts what crosses regions."""
        names = [n for group in REGION_NODES.values() for n in group]
        texts = _moved_texts({n: _region_file(n) for n in names}, _REGION_PORT)
        gateway_region = {_block_port(texts[n], "gateway"): _region_of(n) for n in names}
        regions = cls(Path(where))
        for name in names:
            region = _region_of(name)
            netns_for = (
                None if netns is None else (netns, region, "gateway", "nats", gateway_region)
            )
            regions.nodes.append(_node(name, texts[name], regions.dir / name, netns_for))
        for node in regions.nodes:
            node.launch()
        try:
            regions.wait_ready(timeout)
        except BaseException:
            regions.stop()
            raise
        return regions

    def region(self, region: str) -> list[ClusterNode]:
        return [n for n in self.nodes if n.name in REGION_NODES[region]]

    def urls(self, region: str) -> list[str]:
        return [n.url for n in self.region(region)]

    def url(self, region: str) -> str:
        """The region's servers' URLs, comma-separated (what ``--nats`` takes)."""
        return ",".join(self.urls(region))

    def local_url(self, region: str) -> str:
        """The region's servers on loopback: what a process inside the region's
        network namespace dials (the same as :meth:`url` without namespaces)."""
        return ",".join(f"nats://127.0.0.1:{n.port}" for n in self.region(region))

    def meta(self) -> tuple[str | None, int]:
        """The meta group's leader and its size, as a live node sees them."""
        return meta_of(self.nodes)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every live node is healthy and a meta leader of all 7 is elected."""

        def elected() -> bool:
            leader, size = self.meta()
            return bool(leader) and size == len(self.nodes)

        _wait_healthy(self.nodes, elected, timeout, "the regions")

    def kill_region(self, region: str) -> None:
        """SIGKILL every server of ``region`` (a region lost at once); stores stay."""
        for node in self.region(region):
            node.kill()

    def freeze_region(self, region: str) -> None:
        """SIGSTOP every server of ``region``: alive but silent, as a network partition
        leaves it to the others (its connections stay open, nothing answers)."""
        for node in self.region(region):
            if node.alive:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGSTOP)

    def thaw_region(self, region: str) -> None:
        """SIGCONT every server of ``region`` (the partition heals)."""
        for node in self.region(region):
            if node.alive:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGCONT)

    def restart_region(self, region: str, *, timeout: float = 60.0) -> None:
        for node in self.region(region):
            node.launch()
        self.wait_ready(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGCONT)  # (a frozen one ignores SIGTERM)
            node.stop()
