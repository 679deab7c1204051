"""``/v1/runs/{run_id}/streams/{name}``: a run's token stream as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Request, Response, get
from litestar.openapi import ResponseSpec
from litestar.params import HeaderParameter, QueryParameter

from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.models import StreamList, StreamSummary
from fusee.adapters.http.params import resume_offset
from fusee.adapters.http.schemas import BAD_ID, NO_RUN, Name, RunId, errors
from fusee.adapters.http.sse import FIRST_ITEM_GRACE, TokenEventLike, TokenEventStream
from fusee.adapters.http.state import api_state
from fusee.runtime.ids import validate_name

__all__ = ("handlers",)

_EVENTS = (
    "Server-sent events: `event: token` (with `id:`, the token's index), `event: "
    "restart` (an attempt started over: drop the text since the last `restart`), "
    "`event: end` (the stream is over), `event: error` (the error shape as data, then "
    "the response closes). Each `data:` is one line of JSON `{text, index, attempt}`. "
    "Comments (`: keep-alive`) come while no event does."
)


class EventStream(Response[bytes]):
    """A response that is the SSE stream's own ASGI app (it writes its own messages)."""

    def __init__(self, stream: TokenEventStream) -> None:
        super().__init__(b"", media_type="text/event-stream")
        self.stream = stream

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        return self.stream


def _accepts_event_stream(accept: str | None) -> bool:
    if not accept:
        return True  # `curl -N URL` sends */*; a client that sends nothing takes anything
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in ("text/event-stream", "text/*", "*/*"):
            return True
    return False


@get(
    "/v1/runs/{run_id:str}/streams/{name:str}",
    summary="Follow a token stream (server-sent events)",
    description="Starts after `Last-Event-ID` if sent (a reconnecting `EventSource`), "
    "else at `?from=N`, else at 0. A browser passes `?access_token=` (a stream token).",
    # an API token, or a stream token in the query (a browser's EventSource sends no header)
    security=[{"bearer": []}, {"access_token": []}],
    responses={
        200: ResponseSpec(
            data_container=str,
            media_type="text/event-stream",
            description=_EVENTS,
            generate_examples=False,
        ),
        **errors(
            e400=BAD_ID,
            e404="`run_not_found`, or `stream_not_found`: the run is over and never had this stream.",
            e406="`not_acceptable`: `Accept` excludes `text/event-stream`.",
        ),
    },
)
async def follow(
    request: Request[Any, Any, Any],
    run_id: RunId,
    name: Name,
    from_: Annotated[
        str,
        QueryParameter(
            name="from",
            description="The first token's index.",
            schema_extra={"pattern": "^[0-9]{1,15}$"},
        ),
    ] = "",
    last_event_id: Annotated[
        str,
        HeaderParameter(
            name="Last-Event-ID",
            description="The last token's index the client has.",
            schema_extra={"pattern": "^[0-9]{0,15}$"},
        ),
    ] = "",
) -> EventStream:
    state = api_state(request)
    run = state.engine.run(run_id)
    name = validate_name(name, "stream name")
    accept = request.headers.get("accept")
    if not _accepts_event_stream(accept):
        raise ApiError(406, f"this endpoint answers with text/event-stream, not {accept!r}")
    offset = resume_offset(from_ or None, last_event_id or None)
    # An unknown run is a 404 before any byte of the stream, however long a reader waits.
    info = await run.describe()
    over = info.ended or info.status == "paused"

    def open_events() -> AsyncIterator[TokenEventLike]:
        events: AsyncIterator[TokenEventLike] = run.stream_events(name, offset=offset)
        return events

    return EventStream(
        TokenEventStream(
            open_events,
            offset=offset,
            grace=FIRST_ITEM_GRACE if over else 0.0,
            registry=state.streams,
            keepalive=state.keepalive,
            context={"run_id": run.run_id, "stream": name, "offset": offset},
        )
    )


@get(
    "/v1/runs/{run_id:str}/streams",
    summary="A run's token streams",
    description="Each stream of the run that holds anything, by name, with how many "
    "messages it holds (tokens and attempt/end markers). A stream older than the "
    "tokens stream's retention is gone.",
    responses=errors(e400=BAD_ID, e404=NO_RUN),
)
async def list_streams(request: Request[Any, Any, Any], run_id: RunId) -> StreamList:
    found = await api_state(request).engine.run(run_id).streams()
    return StreamList(streams=[StreamSummary(name=n, messages=c) for n, c in found.items()])


handlers = [list_streams, follow]
