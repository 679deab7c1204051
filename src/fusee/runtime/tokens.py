"""Token streams, the pure part: what a reader gets, what a writer resumes from, and
when a stream is over. No I/O; the JetStream adapter (``adapters/jetstream/tokens.py``)
feeds these.

A token stream holds one message per chunk of text a model produced in one
``model_call`` step, in order. Three kinds of messages (header ``Fusee-Kind``):

- ``token``: a chunk of text. ``Fusee-Index`` counts the token messages of the stream
  from 0, across attempts, so an index names one token for good.
- ``attempt``: the step's new attempt restarted from scratch (its provider could not
  continue the stored text). Readers drop the text of earlier attempts.
- ``end``: the provider finished. Nothing is written after it. Its payload is what a
  streamed model step needs besides the text to rebuild its result (the final
  response without its text, JSON), or empty.

Markers carry the index the next token would have. ``Fusee-Attempt`` counts restarts
from 1 (it is the number of ``attempt`` markers before, plus one), not step attempts: a
retry that continues the stored text keeps its number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from fusee.runtime.records import (
    TERMINAL,
    AnyRecord,
    ObjectDone,
    RunContinued,
    RunPaused,
    StepCompleted,
    StepFailed,
)

__all__ = (
    "TokenEvent",
    "TokenKind",
    "KIND_HEADER",
    "INDEX_HEADER",
    "ATTEMPT_HEADER",
    "event_from",
    "StoredState",
    "StreamEnd",
    "generation_stream",
    "invocation_stream",
    "parse_invocation_stream",
)

TokenKind = Literal["token", "attempt", "end"]

KIND_HEADER: Final = "Fusee-Kind"
INDEX_HEADER: Final = "Fusee-Index"
ATTEMPT_HEADER: Final = "Fusee-Attempt"
_KINDS: Final = frozenset(("token", "attempt", "end"))


class TokenEvent(msgspec.Struct, frozen=True):
    """One stored message of a token stream, as a reader sees it.

    Attributes:
        kind: ``"token"`` (a chunk of text), ``"attempt"`` (the step restarted from
            scratch: drop the text of earlier attempts) or ``"end"`` (the provider
            finished; the last event of a complete stream).
        index: the token's index in the stream (0-based, counting only tokens, across
            attempts); for a marker, the index the next token would have. Resume a
            reader with ``offset=index + 1`` after a token.
        text: the chunk (empty for markers).
        attempt: which restart the event belongs to, from 1.
        cursor: the stream sequence it is stored at (opaque, increasing).
    """

    kind: TokenKind
    index: int
    text: str
    attempt: int
    cursor: int


def event_from(seq: int, headers: dict[str, str], data: bytes) -> TokenEvent | None:
    """The event a stored message holds; None for a message that is not one (foreign)."""
    kind = headers.get(KIND_HEADER)
    if kind not in _KINDS:
        return None
    try:
        index = int(headers.get(INDEX_HEADER, ""))
        attempt = int(headers.get(ATTEMPT_HEADER, "1"))
    except ValueError:
        return None
    text = data.decode(errors="replace") if kind == "token" else ""
    return TokenEvent(kind=kind, index=index, text=text, attempt=attempt, cursor=seq)  # type: ignore[arg-type]  # checked against _KINDS


@dataclass
class StoredState:
    """A stream folded for its writer: where a new attempt of the step starts from.

    Attributes:
        attempt: the latest attempt's number (1 when the stream is empty).
        next_index: the index of the next token.
        chunks: the token texts of the latest attempt, in order.
        ended: the latest attempt has its end marker (its text is the step's result).
        final: the end marker's payload (empty without one, or for a marker that has
            none: a plain ``model_call``'s, or one written before payloads were).
        broken: the latest attempt's indexes are not contiguous (a publish was lost
            while later ones landed): its text cannot be continued, only restarted.
    """

    attempt: int = 1
    next_index: int = 0
    chunks: list[str] = field(default_factory=list)
    ended: bool = False
    broken: bool = False
    final: bytes = b""
    messages: int = 0

    def feed(self, event: TokenEvent, data: bytes = b"") -> None:
        """Fold one stored event; ``data`` is its message's payload."""
        self.messages += 1
        if event.kind == "attempt":
            self.attempt = event.attempt
            self.chunks = []
            self.ended = False
            self.broken = False
            self.final = b""
        elif event.kind == "end":
            self.ended = True
            self.final = data
        else:
            if event.index != self.next_index or event.attempt != self.attempt:
                self.broken = True
            self.chunks.append(event.text)
        self.next_index = max(self.next_index, event.index + (event.kind == "token"))

    @property
    def text(self) -> str:
        """The stored text of the latest attempt."""
        return "".join(self.chunks)


@dataclass
class StreamEnd:
    """The run's journal, folded for a reader of stream ``name``: is the stream over?

    A stream is over once its step is: the journal holds ``step.completed`` for it (its
    writer stored the end marker before the step returned, so the stored stream is
    complete) or ``step.failed`` (no further attempt comes). It is also over when the
    run ended or paused without reaching the step. Everything stored when the reader
    sees that is everything the stream will ever hold.
    """

    name: str
    started: bool = False
    completed: bool = False
    failed: bool = False
    run_over: bool = False
    # an object's invocation (its inbox sequence): only its records count, and its
    # obj.done ends the stream (see ``invocation_stream``)
    invocation: int = 0
    _inside: bool = field(default=False, repr=False)

    def feed(self, record: AnyRecord) -> None:
        self.started = True
        if self.invocation:
            if record.invoked:
                self._inside = record.invoked.inbox_seq == self.invocation
            if isinstance(record, ObjectDone):
                if record.inbox_seq == self.invocation:
                    self.run_over = True
                self._inside = False
                return
            if not self._inside:
                return
        if isinstance(record, StepCompleted) and record.name == self.name:
            self.completed = True
        elif isinstance(record, StepFailed) and record.name == self.name:
            self.failed = True
        elif isinstance(record, (*TERMINAL, RunPaused, RunContinued)):
            # a generation's streams end with it (the next one's have their own names)
            self.run_over = True

    def is_over(self) -> bool:
        return self.completed or self.failed or self.run_over


def invocation_stream(inbox_seq: int, name: str) -> str:
    """The token stream name of ``model_call(ctx, name)`` in an object's invocation:
    ``<inbox seq>/<name>``, so each invocation of a handler has its own stream."""
    return f"{inbox_seq}/{name}"


def generation_stream(started_seq: int, first: bool, name: str) -> str:
    """The token stream name of ``model_call(ctx, name)`` in a workflow's generation:
    ``name`` in the first, ``<its run.continued seq>/<name>`` in a later one (the
    invocation's shape), so a step name used again after ``continue_as_new`` streams
    into a new stream, not into the ended one of an earlier generation."""
    return name if first else invocation_stream(started_seq, name)


def parse_invocation_stream(name: str) -> tuple[int, str] | None:
    """``(inbox seq, step name)`` of an invocation's stream name, else None."""
    head, sep, rest = name.partition("/")
    if sep and head.isdigit() and rest:
        return int(head), rest
    return None
