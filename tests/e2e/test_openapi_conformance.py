"""The OpenAPI document tells the truth: schemathesis generates requests from
``/openapi.json`` for every operation and checks each answer against it (a status the
document lists, a body of the documented shape and content type), against a real API
server (tokens required, an admin token sent) and worker; and requests that break the document (a string for a number, a
field too long, a value out of range) are refused (``negative_data_rejection``: a 4xx,
not a 2xx). Examples are bounded (``MAX_EXAMPLES`` per operation, ``MAX_NEGATIVE``
broken ones), and waits are short (``timeout`` is 0.2 s), so the run takes seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

import fusee
from tests.workers.procs import HERE, api_and_worker

MAX_EXAMPLES = 10
MAX_NEGATIVE = 5


@pytest.fixture(scope="module")
def api(
    nats_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """The API's URL and the header of an admin token (the API requires one)."""
    tmp = tmp_path_factory.mktemp("openapi")
    with api_and_worker(nats_server.url, tmp, HERE / "objects.py", auth=True) as (url, ns):

        async def admin() -> str:
            async with await fusee.connect(nats_server.url, namespace=ns) as engine:
                return (await engine.tokens.create("admin", name="schemathesis")).token

        yield url, {"Authorization": f"Bearer {anyio.run(admin)}"}


def _checker(
    operation: Any,
    api_url: str,
    auth: dict[str, str],
    mode: GenerationMode = GenerationMode.POSITIVE,
) -> Any:
    """A hypothesis test of one operation: each generated request's answer is checked
    against the document (``mode``: requests that fit it, or that break it)."""

    @settings(
        max_examples=MAX_EXAMPLES if mode is GenerationMode.POSITIVE else MAX_NEGATIVE,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        if any(p.name == "timeout" for p in operation.query):
            case.query = {**(case.query or {}), "timeout": "0.2s"}  # a call waits no longer
        # with an admin token: schemathesis also sends each request without it and with
        # a bad one, and checks both are refused (401/403) as the document says
        response = case.call(base_url=api_url, timeout=15, headers=auth)
        # A 504 Timeout is the documented answer of a call that did not end within its
        # timeout (it stays queued), not a server error; any other 5xx fails.
        excluded = [schemathesis.checks.not_a_server_error] if response.status_code == 504 else []
        body = case.body if isinstance(case.body, dict) else {}
        if ("since" in body and "until" in body) or {"since", "until"} <= set(case.query or {}):
            # a bulk filter's window must not be empty (400), a rule between two fields
            # that JSON Schema cannot state: such a request is not "valid, so accepted"
            excluded.append(schemathesis.checks.positive_data_acceptance)
        if "cursor" in (case.query or {}):
            # a cursor is valid only as the server made it (next_cursor), as a token is
            excluded.append(schemathesis.checks.positive_data_acceptance)
        if operation.path == "/v1/completions/{token}" and operation.method.upper() == "POST":
            # its body (JSON or the page's form) is read as it comes and is not in the
            # document, so a request without one looks valid and is refused (400)
            excluded.append(schemathesis.checks.positive_data_acceptance)
        if operation.method.upper() in ("PUT", "POST") and _needs_what_is_stored(response):
            # a limit's partial update is valid only with what is stored: a new limit
            # needs a rate or a cap, a burst needs a rate (given or stored)
            excluded.append(schemathesis.checks.positive_data_acceptance)
        case.validate_response(response, excluded_checks=excluded)

    return check


def _needs_what_is_stored(response: Any) -> bool:
    if response.status_code != 400:
        return False
    message = response.json()["error"]["message"]
    return (
        "give per_second=, concurrent= or both" in message
        or "burst= needs per_second=" in message
        # bounds a duration string's schema cannot state
        or "a stream token lives at most 1h" in message
        or "a token lives at most 10 years" in message
    )


def test_every_answer_is_documented(api: tuple[str, dict[str, str]]) -> None:
    api_url, auth = api
    # (schemathesis's own pytest plugin does not load under pytest 9: its strategies
    # are driven by hypothesis here, one operation after the other)
    document = httpx.get(f"{api_url}/openapi.json").json()
    failures: list[str] = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for result in schemathesis.openapi.from_dict(document).get_all_operations():
            assert isinstance(result, Ok), result.err()  # the schema's every operation loads
            operation = result.ok()
            try:
                _checker(operation, api_url, auth, mode)()
            except Unsatisfiable:  # nothing of it can be broken (/healthz takes nothing)
                assert mode is GenerationMode.NEGATIVE, operation.label
            except BaseException as exc:  # noqa: BLE001 - every operation is checked, then reported
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert not failures, "\n\n".join(failures)
