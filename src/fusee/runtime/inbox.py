"""The inbox messages: one tagged msgspec Struct per kind, one decoder.

A run's (or an object's) inbox is the JetStream subject ``<ns>.in.<partition>.<eid>``;
anyone outside the actor's fence writes there: engines (signals, cancels, completions,
invocations), ended children, fired timers. Each message is a JSON object whose
``"kind"`` names it (the ``Fusee-Kind`` header says the same). This is a contract other
SDKs write to: ``docs/reference/nats-layout.md`` shows each kind, and encoded samples
of each live in ``tests/golden/inbox-v*.jsonl``, which must keep decoding.

Compatibility rule, as for records: new fields get defaults; nothing is renamed or
retyped. A message of a kind this version does not know decodes to :class:`Unknown`
(the actor logs it and leaves it be), not to an error; one of a known kind that does
not fit is honoured where its intent is clear (a cancel, a child's end), else
``Unknown`` too.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from fusee.runtime.codec import canonical

__all__ = (
    "Message",
    "Signal",
    "Cancel",
    "TimerFired",
    "Completion",
    "ChildEnded",
    "Invoke",
    "PermitRequest",
    "PermitGrant",
    "LimitSet",
    "Resume",
    "Unknown",
    "InboxMessage",
    "decode_message",
    "encode_message",
    "signal_message",
    "NULL",
    "KINDS",
)

NULL: Final = msgspec.Raw(b"null")


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """Fields every inbox message may carry: none yet."""


class Signal(Message, tag="signal", frozen=True):
    """``engine.signal(run_id, name, payload)``: for the run's (or the running
    invocation's) ``ctx.wait_for(name)``, the oldest unread one first."""

    name: str
    payload: msgspec.Raw = NULL


class Cancel(Message, tag="cancel", frozen=True):
    """Cancel the run; for an object, the invocation queued at inbox sequence
    ``target`` (``None``: the one running when the cancel was stored)."""

    reason: str | None = None
    target: int | None = None


class TimerFired(Message, tag="timer", frozen=True):
    """The timer of wait ``pos`` fired (a message schedule put it here). ``start``
    names the generation (or object invocation) that set it; a timer stored by an
    older version has none."""

    pos: int
    start: int | None = None


class Completion(Message, tag="completion", frozen=True):
    """``engine.complete(token, value)``: the value of the wait at ``pos`` of the
    generation (or invocation) that began at journal sequence ``start``."""

    pos: int
    start: int
    value: msgspec.Raw = NULL


class ChildEnded(Message, tag="child", frozen=True):
    """An ended child run ``id`` tells its parent how it ended (maybe more than once)."""

    id: str
    status: str = ""  # "completed" | "failed" | "cancelled"
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error_type: str | msgspec.UnsetType = msgspec.UNSET
    message: str | msgspec.UnsetType = msgspec.UNSET
    reason: str | msgspec.UnsetType = msgspec.UNSET

    def outcome(self) -> dict[str, Any]:
        """What the parent's wait receives: ``status``, then ``result``, or
        ``error_type`` and ``message``, or ``reason``."""
        out: dict[str, Any] = {"status": self.status}
        for name in ("result", "error_type", "message", "reason"):
            value = getattr(self, name)
            if value is not msgspec.UNSET:
                out[name] = value
        return out


class Invoke(Message, tag="invoke", frozen=True):
    """A call of an object's ``handler`` (an edit too: handler ``"fusee.edit"``);
    ``reply`` is the core NATS subject a waiting caller listens on ("" for a send)."""

    handler: str
    input: msgspec.Raw = NULL
    reply: str = ""


class PermitRequest(Message, tag="permit", frozen=True):
    """To a limit's inbox: attempt ``key`` (a step's key and attempt) of run ``run``
    (its escaped ID, in ``partition``) asks for a permit; ``worker`` runs it (and
    renews the permit while the attempt runs); ``fairness`` is its fairness key.
    ``take``: the take (an ID per acquire) its step asked on core NATS and got no
    answer to in time: a permit that take took already is granted as taken (its
    attempt starts on it, no second token)."""

    key: str
    run: str
    partition: int
    worker: str = ""
    fairness: str = ""
    take: str = ""


class PermitGrant(Message, tag="grant", frozen=True):
    """To a run's inbox: limit ``limit`` granted the permit asked for by its request
    at the limit's inbox sequence ``request``; ``error`` (not empty): refused (no such
    limit), the step fails with it. ``take``: the attempt takes it before it starts
    (asks the limit on core NATS, which spends the token then: a limit with a rate);
    a grant without it (of a limit with no rate, or of an earlier version) is taken
    as its run reads it."""

    limit: str
    request: int
    error: str = ""
    take: bool = False


class LimitSet(Message, tag="limit", frozen=True):
    """To a limit's inbox: its config from now on (``engine.limit``, ``fusee limits
    set``); also kept in the work bucket (``limit.<name>``) for listings."""

    per_second: float | None = None
    burst: int | None = None
    concurrent: int | None = None


class Resume(Message, tag="resume", frozen=True):
    """``engine.run(id).resume()``: resume the run paused by its ``run.paused`` record
    at journal sequence ``paused`` (a message naming another pause, or a run no longer
    paused there, is ignored: two resumes of one pause resume once). ``force``: resume
    a run paused on a broken journal chain (nothing journaled names that pause:
    ``paused`` is 0), accepting every break at a journal sequence up to ``gap`` (the
    journal's last when the operator forced it)."""

    paused: int = 0
    force: bool = False
    gap: int = 0


class Unknown(msgspec.Struct, frozen=True):
    """A JSON object whose ``kind`` this version does not know (a newer writer's), or
    one that does not fit its kind: kept so the actor can log it, never acted on (but
    a caller waiting on ``reply`` is told what was wrong)."""

    kind: str
    why: str
    reply: str = ""


InboxMessage = (
    Signal
    | Cancel
    | TimerFired
    | Completion
    | ChildEnded
    | Invoke
    | PermitRequest
    | PermitGrant
    | LimitSet
    | Resume
)
KINDS: Final = frozenset(
    {
        "signal",
        "cancel",
        "timer",
        "completion",
        "child",
        "invoke",
        "permit",
        "grant",
        "limit",
        "resume",
    }
)

_decoder: Final = msgspec.json.Decoder(InboxMessage)
_encoder: Final = msgspec.json.Encoder()


def decode_message(data: bytes) -> InboxMessage | Unknown | None:
    """One inbox message; :class:`Unknown` for an object of another kind (or one that
    does not fit its kind), ``None`` for bytes that are not a JSON object."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        try:
            body = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            return None
        if not isinstance(body, dict):
            return None
        return _lenient(body, str(exc))
    except (msgspec.DecodeError, RecursionError):
        return None


def _lenient(body: dict[str, Any], why: str) -> InboxMessage | Unknown:
    """A message of a known kind that does not fit its schema (another SDK's, an
    operator's by hand). Those whose intent is clear are honoured so nothing waits on
    them forever: a ``cancel`` cancels (its reason as text); a ``child`` end with the
    child's ID ends the parent's wait as a failure naming what was wrong. The rest are
    :class:`Unknown` (an ``invoke`` fails alone, told to its ``reply``)."""
    kind = body.get("kind")
    if kind == "cancel":
        reason, target = body.get("reason"), body.get("target")
        return Cancel(
            reason=None if reason is None else str(reason),
            target=target if isinstance(target, int) and not isinstance(target, bool) else None,
        )
    if kind == "child" and isinstance(body.get("id"), str):
        return ChildEnded(
            id=body["id"],
            status="failed",
            error_type="fusee.InvalidInput",
            message=f"the end message of child {body['id']!r} does not fit its schema: {why}",
        )
    reply = body.get("reply")
    return Unknown(kind=str(kind), why=why, reply=reply if isinstance(reply, str) else "")


def encode_message(msg: InboxMessage) -> bytes:
    return _encoder.encode(msg)


def signal_message(name: str, payload: Any, *, what: str, limit: int) -> bytes:
    """The ``signal`` message for ``payload`` (canonical JSON, at most ``limit`` bytes;
    ``what`` names it in the error).

    Raises:
        NotEncodable: the payload is not JSON-encodable, or too large.
    """
    return encode_message(
        Signal(name=name, payload=msgspec.Raw(canonical(payload, what, limit=limit)))
    )
