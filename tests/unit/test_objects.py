"""Keyed objects, the pure part: names, the state view, the fold, edits, and the journal
of invocations as History reads it."""

from __future__ import annotations

import msgspec
import pytest

from fusee.errors import InvalidArgument, InvalidId, JournalGap, NotEncodable
from fusee.runtime.history import History
from fusee.runtime.objects import (
    ReadOnlyState,
    StateView,
    check_run_id,
    decode_state,
    edit_changes,
    encode_state,
    fold,
    object_id,
    parse_object_id,
    state_key,
)
from fusee.runtime.records import (
    Invocation,
    ObjectDone,
    ObjectStarted,
    StepCompleted,
    encode_record,
    record_hash,
)


def test_object_ids_round_trip_and_never_collide_with_run_ids() -> None:
    assert object_id("chat", "user-7") == "@chat/user-7"
    assert parse_object_id("@chat/a/b") == ("chat", "a/b")
    assert parse_object_id("chat-7") is None
    assert state_key("chat", "user.7") == "chat.user=2E7"
    with pytest.raises(InvalidId, match="reserved for objects"):
        check_run_id("@chat/user-7")
    with pytest.raises(InvalidId, match="object type"):
        object_id("a/b", "k")
    with pytest.raises(InvalidId, match="must not be empty"):
        object_id("chat", "")


def test_get_returns_a_fresh_copy_and_changes_wait_for_the_end() -> None:
    base = {"history": b'["hi"]', "n": b"1"}
    view = StateView(base, "chat")
    history = view.get("history")
    history.append("changed in place")
    assert view.get("history") == ["hi"]  # mutating what get returned changes nothing
    view.set("n", 2)
    view.delete("history")
    assert view.get("n") == 2
    assert view.get("history", "gone") == "gone"
    assert view.keys() == ["n"]
    assert base == {"history": b'["hi"]', "n": b"1"}  # nothing applied yet
    changes = view.changes()
    assert changes == {"state_set": {"n": msgspec.Raw(b"2")}, "state_deleted": ["history"]}
    done = ObjectDone(inbox_seq=5, handler="say", result=msgspec.Raw(b"null"), **changes)
    assert fold(base, done) == {"n": b"2"}


def test_a_failed_invocation_folds_to_the_same_state() -> None:
    failed = ObjectDone(
        inbox_seq=3,
        handler="say",
        error_type="ValueError",
        message="no",
        state_set={"n": msgspec.Raw(b"9")},
    )
    assert fold({"n": b"1"}, failed) == {"n": b"1"}


def test_clear_then_set_keeps_only_what_was_set() -> None:
    view = StateView({"a": b"1", "b": b"2"}, "t")
    view.clear()
    view.set("c", 3)
    done = ObjectDone(inbox_seq=1, handler="h", result=msgspec.Raw(b"null"), **view.changes())
    assert fold({"a": b"1", "b": b"2"}, done) == {"c": b"3"}


def test_values_are_checked_when_set_and_shared_handlers_cannot_set() -> None:
    view = StateView({}, "t")
    with pytest.raises(NotEncodable, match="state 'x' of object 't'"):
        view.set("x", object())
    with pytest.raises(InvalidArgument, match="state key"):
        view.set("", 1)
    with pytest.raises(InvalidArgument, match="shared handler"):
        ReadOnlyState({}, "t").set("x", 1)


def test_state_encoding_is_one_sorted_json_object() -> None:
    assert encode_state({"b": b"2", "a": b'{"x":1}'}) == b'{"a":{"x":1},"b":2}'
    assert decode_state(b'{"a":{"x":1}}') == {"a": b'{"x":1}'}
    with pytest.raises(InvalidArgument, match="JSON object"):
        decode_state(b"[1]")


def test_edits_are_checked_before_they_are_queued() -> None:
    assert edit_changes({"set": {"n": 1}, "delete": ["m"]}, "e") == {
        "state_set": {"n": msgspec.Raw(b"1")},
        "state_deleted": ["m"],
    }
    replaced = edit_changes({"state": {"x": 1}}, "e")
    assert replaced["state_cleared"] is True
    for bad, match in [
        ("x", "must be a JSON object"),
        ({"state": []}, "'state' must be a JSON object"),
        ({"delete": "k"}, "'delete' must be a list"),
        ({"set": [1]}, "'set' must be a JSON object"),
        ({"nope": 1}, "unknown edit field"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            edit_changes(bad, "e")


def _chain(records: list[object]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    prev, prev_hash = 0, ""
    seq = 10
    for record in records:
        record = msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash)  # type: ignore[type-var]
        data = encode_record(record)  # type: ignore[arg-type]
        out.append((seq, data))
        prev, prev_hash = seq, record_hash(data)
        seq += 3
    return out


def _inv(seq: int, handler: str = "say") -> Invocation:
    return Invocation(handler=handler, input=msgspec.Raw(b'"hi"'), inbox_seq=seq, started_at=1.0)


def test_history_folds_invocations_as_generations_and_reads_from_an_anchor() -> None:
    stored = _chain(
        [
            ObjectDone(
                inbox_seq=1, handler="add", result=msgspec.Raw(b"1"), invoked=_inv(1, "add")
            ),
            ObjectStarted(invoked=_inv(4)),
            StepCompleted(pos=1, name="reply", result=msgspec.Raw(b'"x"')),
            ObjectDone(inbox_seq=4, handler="say", result=msgspec.Raw(b'"x"')),
            StepCompleted(pos=1, name="reply", result=msgspec.Raw(b'"y"'), invoked=_inv(7)),
        ]
    )
    history = History("@chat/k")
    for seq, data in stored:
        history.feed(seq, data)
    # the last invocation is running: one step done, its generation named by inbox seq 7
    assert history.invocation is not None
    assert history.invocation.inbox_seq == 7
    assert history.done is None
    assert history.started_seq == 7
    assert list(history.outcomes) == [1]
    outcome = history.outcomes[1]
    assert isinstance(outcome, StepCompleted)
    assert bytes(outcome.result) == b'"y"'

    # read from the record the projection was made at (the second obj.done)
    tail = History("@chat/k")
    for i, (seq, data) in enumerate(stored[3:]):
        tail.feed(seq, data, anchor=i == 0)
    assert tail.invocation is not None
    assert tail.invocation.inbox_seq == 7

    # a record missing after the anchor is found
    broken = History("@chat/k")
    broken.feed(*stored[1], anchor=True)
    with pytest.raises(JournalGap):
        broken.feed(*stored[3])
