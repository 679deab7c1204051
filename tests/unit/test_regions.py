"""The pure core of regions: names of each epoch's journal stream, the metadata a
journal stream records, and what a failover makes of it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.errors import ConfigError, InvalidArgument
from fusee.runtime.regions import (
    DEFAULT_LEASE,
    RegionMeta,
    epoch_of_stream,
    epoch_order,
    epoch_stream,
    failover_meta,
    region_lease,
    validate_lease,
    validate_region,
)


def test_epoch_streams_are_named_and_read_back() -> None:
    assert epoch_stream("fusee", 1) == "FUSEE"  # a namespace without regions keeps its name
    assert epoch_stream("fusee", 2) == "FUSEE_E2"
    assert epoch_of_stream("fusee", "FUSEE") == 1
    assert epoch_of_stream("fusee", "FUSEE_E12") == 12
    for other in ("FUSEE_TOKENS", "FUSEE_E2_VALUES", "FUSEE_E1", "FUSEE_E02", "OTHER", "FUSEE_E"):
        assert epoch_of_stream("fusee", other) is None, other
    with pytest.raises(InvalidArgument, match="epochs count from 1"):
        epoch_stream("fusee", 0)


@given(st.integers(1, 10_000))
def test_every_epoch_round_trips(epoch: int) -> None:
    assert epoch_of_stream("ns_1", epoch_stream("ns_1", epoch)) == epoch


def test_region_names_are_checked() -> None:
    assert validate_region("east") == "east"
    assert validate_region("us-east_1") == "us-east_1"
    for bad in ("", "East", "1east", "a.b", "a b", "x" * 33, None, 3):
        with pytest.raises(ConfigError, match="invalid region"):
            validate_region(bad)


def test_metadata_round_trips_and_a_failover_bumps_the_epoch() -> None:
    meta = RegionMeta("east", 1, 8)
    assert meta.to_metadata() == {"fusee.home": "east", "fusee.epoch": "1", "fusee.partitions": "8"}
    assert RegionMeta.from_metadata(meta.to_metadata(), 1) == meta
    assert RegionMeta.from_metadata(None, 1) == RegionMeta(None, 1, None)
    # the stream's name says the epoch; metadata that says otherwise does not override it
    assert RegionMeta.from_metadata({"fusee.epoch": "9", "fusee.home": "west"}, 2).epoch == 2
    assert failover_meta(meta, "west") == RegionMeta("west", 2, 8)
    with pytest.raises(InvalidArgument, match="already the namespace's home"):
        failover_meta(meta, "east")
    with pytest.raises(InvalidArgument, match="has no home region"):
        failover_meta(RegionMeta(None), "west")
    with pytest.raises(ConfigError, match="invalid target region"):
        failover_meta(meta, "West")


async def test_a_bad_region_is_named_before_anything_is_opened() -> None:
    """``connect`` checks the names first: no server is asked (none listens here)."""
    import fusee

    with pytest.raises(ConfigError, match="invalid region 'East'"):
        await fusee.connect("nats://127.0.0.1:1", region="East")
    with pytest.raises(ConfigError, match="invalid partner region"):
        await fusee.connect("nats://127.0.0.1:1", region="east", partner="we st")
    with pytest.raises(ConfigError, match="it is this process's region"):
        await fusee.connect("nats://127.0.0.1:1", region="east", partner="east")
    with pytest.raises(ConfigError, match="without region="):
        await fusee.connect("nats://127.0.0.1:1", partner="west")


def test_the_region_lease_is_seconds_from_1_to_3600(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUSEE_REGION_LEASE", raising=False)
    assert region_lease() == DEFAULT_LEASE == 20.0
    assert region_lease("3") == 3.0
    monkeypatch.setenv("FUSEE_REGION_LEASE", "7.5")
    assert region_lease() == 7.5
    for bad in ("0.5", "nan", "soon", "-3", "3601"):
        with pytest.raises(ConfigError, match=r"region lease .*1 to 3600"):
            region_lease(bad)


def test_another_workers_epoch_is_ordered_against_mine_and_a_missing_one_is_mine() -> None:
    assert [epoch_order(e, 2) for e in (1, 2, 3)] == [-1, 0, 1]
    for unknown in (None, "3", 3.0, True, [3]):  # a worker of an earlier version, or junk
        assert epoch_order(unknown, 2) == 0
    assert validate_lease(3.0) == 3.0
    with pytest.raises(ConfigError, match=r"region lease 0\.5 .*1 to 3600"):
        validate_lease(0.5)
