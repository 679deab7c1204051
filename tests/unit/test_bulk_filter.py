"""The run filter (runtime/bulk.py): what it matches, where it reads, and what it
refuses; and how ``fusee runs list`` shows a paused run."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.adapters.cli.render import format_runs_table
from fusee.errors import ConfigError
from fusee.runtime.bulk import STATUSES, make_filter, matches, parse_time, sources
from fusee.runtime.index import RunInfo

NOW = 1_800_000_000.0

infos = st.builds(
    RunInfo,
    run_id=st.text(min_size=1, max_size=6),
    workflow=st.sampled_from(["a", "b", "c.d"]),
    status=st.sampled_from(STATUSES),
    created_at=st.floats(NOW - 10_000, NOW),
)
maybe_time = st.none() | st.floats(NOW - 10_000, NOW)


@given(
    info=infos,
    status=st.none() | st.sampled_from(STATUSES),
    workflow=st.none() | st.sampled_from(["a", "b", "c.d"]),
    since=maybe_time,
    until=maybe_time,
    prefix=st.none() | st.text(min_size=1, max_size=2),
)
def test_a_filter_matches_exactly_what_each_field_says_and_reads_where_they_are(
    info: RunInfo,
    status: str | None,
    workflow: str | None,
    since: float | None,
    until: float | None,
    prefix: str | None,
) -> None:
    if since is not None and until is not None and until <= since:
        with pytest.raises(ConfigError, match="is not after"):
            make_filter(since=since, until=until, now=NOW)
        return
    f = make_filter(
        status=status, workflow=workflow, since=since, until=until, id_prefix=prefix, now=NOW
    )
    want = (
        (status is None or info.status == status)
        and (workflow is None or info.workflow == workflow)
        and (since is None or info.created_at >= since)
        and (until is None or info.created_at < until)
        and (prefix is None or info.run_id.startswith(prefix))
    )
    assert matches(info, f) == want
    # the run's status is read where its filter reads
    where = {"completed": "listed", "failed": "listed", "cancelled": "listed", "paused": "paused"}
    if want:
        assert where.get(info.status, "active") in sources(f)


def test_times_are_durations_back_from_now_or_moments() -> None:
    assert parse_time("1h", "since", now=NOW) == NOW - 3600
    assert parse_time(datetime.timedelta(minutes=2), "since", now=NOW) == NOW - 120
    assert parse_time("2026-12-01T10:00:00Z", "since", now=NOW) == 1796119200.0
    assert parse_time("2026-12-01T10:00:00", "since", now=NOW) == 1796119200.0  # UTC
    assert parse_time(12.5, "since", now=NOW) == 12.5  # seconds since the epoch
    assert parse_time(None, "since", now=NOW) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": "sleeping"}, "not a run status"),
        ({"since": "-1h"}, "must not be negative"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01T00:00:00"}, "not an ISO 8601 time"),
        ({"since": "1h", "until": "2h"}, "is not after"),
        ({"workflow": ""}, "non-empty"),
        ({"id_prefix": ""}, "non-empty"),
    ],
)
def test_bad_input_is_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_filter(**kwargs, now=NOW)


def test_a_paused_run_shows_its_reason_and_failing_step() -> None:
    info = RunInfo(
        run_id="support-42",
        workflow="support",
        status="paused",
        created_at=NOW - 60,
        reason="step 'model' ran out of its 5 attempts",
        error_type="ConnectionError",
        message="the provider is down",
        step="model",
        attempts=5,
    )
    row = format_runs_table([info], now=NOW)[1]
    assert "step model ran out of attempts (5): ConnectionError: the provider is down" in row
