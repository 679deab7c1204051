"""The journal schema: one tagged msgspec Struct per record kind.

A run's journal is the JetStream subjects ``<ns>.run.<id>.>``: its records on ``.j``,
its end records (``run.completed``/``failed``/``cancelled``, ``obj.done``) on ``.end``
(so a result watch is sent only those). Each message holds one record as JSON, with the record's kind both in the payload (``"kind"``) and in the
``Fusee-Kind`` header, so ``nats stream view`` reads like the run did.

Compatibility rule: new fields get defaults; nothing is renamed or retyped. Encoded
samples of each released version live in ``tests/golden/`` and must keep decoding.

Every record names its predecessor: ``prev`` is the stream sequence of the record
before it (0 for the first) and ``prev_hash`` a hash of that record's bytes. Replay
checks both, so a lost or replaced record pauses the run instead of going unnoticed.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec

__all__ = (
    "Record",
    "Value",
    "ValueRef",
    "RunStarted",
    "RunContinued",
    "StepCompleted",
    "StepRetrying",
    "StepFailed",
    "WaitStarted",
    "WaitDone",
    "CallCancelled",
    "RunCompleted",
    "RunFailed",
    "RunCancelled",
    "RunPaused",
    "RunResumed",
    "Invocation",
    "ObjectStarted",
    "ObjectDone",
    "AnyRecord",
    "TERMINAL",
    "encode_record",
    "decode_record",
    "record_hash",
    "kind_of",
    "unfold",
)


class Value(msgspec.Struct, frozen=True, array_like=True):
    """One value ``ctx.now()``, ``ctx.random()`` or ``ctx.uuid()`` handed out, stored as
    ``[kind, value]``: ``["now", <epoch seconds>]``, ``["random", <float in [0, 1)>]``,
    ``["uuid", "<canonical string>"]``."""

    kind: str
    value: float | str


class ValueRef(msgspec.Struct, frozen=True, kw_only=True):
    """A value stored out of line, too large for one record: ``size`` bytes of JSON in
    ``chunks`` messages of the namespace's values stream, under run ``run`` (the escaped
    ID of the run that stored it) and ``digest`` (blake2b-16 of the bytes, hex): content
    addressed, so a writer that retries, or a zombie, can only write the same bytes."""

    run: str
    digest: str
    size: int
    chunks: int


class Invocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An object handler's invocation, taken from the object's inbox at ``inbox_seq``.

    It rides on the first record the invocation journals (``invoked``), whatever that
    record is: a handler that only changes state costs one journal write. Until then
    nothing of it is durable, and a crash runs it again from the start (as it should:
    nothing it did was journaled)."""

    handler: str
    input: msgspec.Raw
    inbox_seq: int
    started_at: float
    timeout: float | None = None
    reply: str = ""  # the core NATS subject the caller waits on ("" for a send)


class Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every record carries: the link to its predecessor, and the values the
    workflow took (``ctx.now()``, ...) since the previous record, in call order. A record
    without values omits the field (``UNSET``), so older records keep their bytes.
    ``invoked`` marks the first record of an object handler's invocation. ``waited``:
    the ends of waits resolved since the previous record and not journaled on their own
    (a signal that ends a wait rides on whatever the run writes next, see "Waits" in
    docs/design.md); replay folds them before the record that carries them, as if each
    had been journaled at its sequence. Omitted (``UNSET``) when it carries none.
    ``after``: on a record of the call at ``pos``, the position the same task took
    before it (for a task's first call, the last one its parent task had taken), when
    that is not ``pos - 1``: calls made from concurrent tasks outside ``ctx.all`` (see
    "Concurrent calls outside ctx.all" in docs/design.md); a replay that reaches them
    in another order raises a determinism error. Omitted otherwise."""

    prev: int = 0
    prev_hash: str = ""
    values: list[Value] | msgspec.UnsetType = msgspec.UNSET
    invoked: Invocation | msgspec.UnsetType = msgspec.UNSET
    waited: list[WaitDone] | msgspec.UnsetType = msgspec.UNSET
    after: int | msgspec.UnsetType = msgspec.UNSET


class RunStarted(Record, tag="run.started", frozen=True):
    """The first record: written by whoever started the run, create-if-absent."""

    workflow: str
    input: msgspec.Raw
    started_at: float
    timeout: float | None = None
    partition: int = 0
    # the run that started this one with ctx.child (omitted for a top-level run)
    parent: str | msgspec.UnsetType = msgspec.UNSET
    # engine.start(..., from_run=): the ended run whose finished steps this one reuses
    from_run: str | msgspec.UnsetType = msgspec.UNSET


class RunContinued(RunStarted, tag="run.continued", frozen=True):
    """The workflow returned ``ctx.continue_as_new(input)``: the generation before it
    ends here and the run's next generation starts here, under the same run ID, with
    ``input``. One record, so it does both at once or neither. Replay folds only the
    records from the last ``run.started``/``run.continued`` on; ``started_at`` and
    ``timeout`` are the first generation's (a run's timeout covers all generations)."""

    generation: int = 2
    continued_at: float = 0.0
    # steps journaled in the generations before (for ``max_steps``; omitted: none known)
    steps: int | msgspec.UnsetType = msgspec.UNSET


class StepCompleted(Record, tag="step.completed", frozen=True):
    """A step's result, committed once; replay returns it instead of running the step.
    A result too large for a record is stored out of line: ``result`` is ``null`` and
    ``result_ref`` names it (written before this record, so it never names nothing)."""

    pos: int
    name: str
    result: msgspec.Raw
    attempt: int = 1
    duration_ms: float = 0.0
    result_ref: ValueRef | msgspec.UnsetType = msgspec.UNSET


class StepRetrying(Record, tag="step.retrying", frozen=True):
    """An attempt failed and the step will run again after ``retry_in`` seconds."""

    pos: int
    name: str
    attempt: int
    error_type: str
    message: str
    retry_in: float
    failed_at: float = 0.0


class StepFailed(Record, tag="step.failed", frozen=True):
    """The step's final error: a fatal error, or the last of its attempts."""

    pos: int
    name: str
    attempt: int
    error_type: str
    message: str


class WaitStarted(Record, tag="wait.started", frozen=True):
    """The workflow waits at ``pos``: for a signal ``name`` (``wait`` is ``signal``), for
    time (``sleep``), or for a completion by token (``completion``). ``until`` (epoch seconds) is when it times out or wakes; a timer
    (a JetStream message schedule) delivers that moment to the run's inbox."""

    pos: int
    name: str
    wait: str
    until: float | None = None


class WaitDone(Record, tag="wait.done", frozen=True):
    """How the wait at ``pos`` ended: the signal's ``value`` (the inbox message at
    ``inbox_seq``), or ``timed_out`` (a sleep always ends so)."""

    pos: int
    name: str
    wait: str
    value: msgspec.Raw = msgspec.Raw(b"null")
    timed_out: bool = False
    inbox_seq: int = 0


class CallCancelled(Record, tag="call.cancelled", frozen=True):
    """The call at ``pos`` lost a ``ctx.race`` (or ``ctx.all`` failed fast): it was
    cancelled before it ended. ``call`` is ``step`` or the wait's kind (``sleep``,
    ``signal``, ``completion``, ``child``); ``name`` the step's or the wait's name. A
    replay raises the cancellation in that branch at once, so the same branch loses."""

    pos: int
    name: str
    call: str = "step"
    reason: str = ""


class RunCompleted(Record, tag="run.completed", frozen=True):
    """The workflow returned ``result``."""

    result: msgspec.Raw


class RunFailed(Record, tag="run.failed", frozen=True):
    """The workflow raised; ``step`` names the step whose error ended it, if one did."""

    error_type: str
    message: str
    step: str | None = None


class RunCancelled(Record, tag="run.cancelled", frozen=True):
    """The run was cancelled (by a caller, or by its own timeout)."""

    reason: str


class RunPaused(Record, tag="run.paused", frozen=True):
    """The run stopped on purpose and waits for an operator (``reason`` says why):
    its code no longer matches its journal, a value it names cannot be read back, or
    (``cause`` is ``"retries"``) the step ``step`` at ``pos`` ran out of its
    ``attempts`` under ``Retry(on_exhausted="pause")``, its last attempt raising
    ``error_type``: ``message`` (that attempt is journaled here, not as a
    ``step.retrying``). A pause of an older version has ``reason`` alone.

    ``cancelling``: the pause was made while a cancel (this reason) was being carried
    out (its replay, or its compensations, met code that does not match): the cancel
    does not end it, an operator resumes it (with code that matches) and the cancel,
    still in the inbox, is carried out then, its compensations run."""

    reason: str
    cause: str | msgspec.UnsetType = msgspec.UNSET
    pos: int | msgspec.UnsetType = msgspec.UNSET
    step: str | msgspec.UnsetType = msgspec.UNSET
    error_type: str | msgspec.UnsetType = msgspec.UNSET
    message: str | msgspec.UnsetType = msgspec.UNSET
    attempts: int | msgspec.UnsetType = msgspec.UNSET
    cancelling: str | msgspec.UnsetType = msgspec.UNSET


class RunResumed(Record, tag="run.resumed", frozen=True):
    """An operator's ``resume()`` (the inbox message at ``inbox_seq``) resumed the pause
    journaled at sequence ``paused``: the run runs on from its journal, and a step that
    paused gets a fresh retry budget (its earlier failed attempts still count in
    ``StepInfo.attempt``). ``force`` with ``gap``: the run was paused on a broken
    journal chain (``paused`` is 0); every break at a sequence up to ``gap`` is taken
    as it is from here on (an unreadable record there is skipped)."""

    paused: int = 0
    inbox_seq: int = 0
    force: bool = False
    gap: int = 0


class ObjectStarted(Record, tag="obj.started", frozen=True):
    """An object's invocation began (it carries ``invoked``): written before its first
    step runs, so the running invocation and its start time are in the journal."""


class ObjectDone(Record, tag="obj.done", frozen=True):
    """An object handler's invocation ended: its ``result`` or its error, and the state
    changes it made (applied to the object's state in this one record, so exactly once).
    A failed or cancelled invocation changes nothing. The object's state is the fold of
    the changes of its ``obj.done`` records; the KV bucket holds that fold."""

    inbox_seq: int
    handler: str
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error_type: str | msgspec.UnsetType = msgspec.UNSET
    message: str | msgspec.UnsetType = msgspec.UNSET
    state_set: dict[str, msgspec.Raw] | msgspec.UnsetType = msgspec.UNSET
    state_deleted: list[str] | msgspec.UnsetType = msgspec.UNSET
    state_cleared: bool = False
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_type is msgspec.UNSET


AnyRecord = (
    RunStarted
    | RunContinued
    | StepCompleted
    | StepRetrying
    | StepFailed
    | WaitStarted
    | WaitDone
    | CallCancelled
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunPaused
    | RunResumed
    | ObjectStarted
    | ObjectDone
)

TERMINAL: Final = (RunCompleted, RunFailed, RunCancelled)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyRecord)


def encode_record(record: AnyRecord) -> bytes:
    """The record as it is stored: compact JSON."""
    return _encoder.encode(record)


def decode_record(data: bytes) -> AnyRecord:
    """Parse a stored record; raises ``msgspec.DecodeError`` on anything else."""
    return _decoder.decode(data)


def record_hash(data: bytes) -> str:
    """The short hash a successor stores in ``prev_hash`` (blake2b, 8 bytes, hex)."""

    return hashlib.blake2b(data, digest_size=8).hexdigest()


def kind_of(record: Record) -> str:
    """The record's tag (``"step.completed"``...), as in its ``Fusee-Kind`` header."""
    return str(record.__struct_config__.tag)


def unfold(record: AnyRecord) -> list[AnyRecord]:
    """The record as if each wait end it carries (``waited``) were journaled on its own
    just before it, as earlier versions wrote them: those ``wait.done`` records, then
    the record without them (for a reader that looks at records one by one). Each
    carried one takes the carrier's link (``prev``, ``prev_hash``)."""
    if not isinstance(record.waited, list):
        return [record]
    link = {"prev": record.prev, "prev_hash": record.prev_hash}
    return [
        *(msgspec.structs.replace(done, **link) for done in record.waited),
        msgspec.structs.replace(record, waited=msgspec.UNSET),
    ]
