"""``/v1/runs/{run_id}/streams/{name}``: a run's token stream as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.params import resume_offset
from fusee.adapters.http.sse import FIRST_ITEM_GRACE, TokenEventLike, TokenEventStream
from fusee.adapters.http.state import api_state
from fusee.runtime.ids import validate_name

__all__ = ("routes",)


def _accepts_event_stream(accept: str | None) -> bool:
    if not accept:
        return True  # `curl -N URL` sends */*; a client that sends nothing takes anything
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in ("text/event-stream", "text/*", "*/*"):
            return True
    return False


async def follow(request: Request) -> Response:
    """``GET /v1/runs/{run_id}/streams/{name}``: the stream's events from an offset.

    The offset is ``Last-Event-ID`` + 1 if the header is sent (a reconnecting
    ``EventSource``), else ``?from=N``, else 0.
    """
    state = api_state(request)
    run = state.engine.run(request.path_params["run_id"])
    name = validate_name(request.path_params["name"], "stream name")
    if not _accepts_event_stream(request.headers.get("accept")):
        raise ApiError(
            406,
            f"this endpoint answers with text/event-stream, not {request.headers['accept']!r}",
        )
    offset = resume_offset(request.query_params.get("from"), request.headers.get("last-event-id"))
    # An unknown run is a 404 before any byte of the stream, however long a reader waits.
    info = await run.describe()
    over = info.ended or info.status == "paused"

    def open_events() -> AsyncIterator[TokenEventLike]:
        events: AsyncIterator[TokenEventLike] = run.stream_events(name, offset=offset)
        return events

    return TokenEventStream(
        open_events,
        offset=offset,
        grace=FIRST_ITEM_GRACE if over else 0.0,
        registry=state.streams,
        keepalive=state.keepalive,
        context={"run_id": run.run_id, "stream": name, "offset": offset},
    )


routes: list[BaseRoute] = [
    Route(
        "/v1/runs/{run_id:id}/streams/{name:id}",
        follow,
        methods=["GET"],
        name="run_stream",
    ),
]
