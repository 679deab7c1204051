"""Records and inbox messages written by released versions must keep decoding."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from fusee.runtime.inbox import Cancel, ChildEnded, Unknown, decode_message, encode_message
from fusee.runtime.limits import LimitState, Snapshot
from fusee.runtime.records import decode_record, encode_record, kind_of

HERE = Path(__file__).parent
SAMPLES = sorted(HERE.glob("journal-v*.jsonl"))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_golden_record_decodes_and_reencodes_identically(path: Path) -> None:
    lines = path.read_bytes().splitlines()
    kinds = set()
    for line in lines:
        record = decode_record(line)
        kinds.add(kind_of(record))
        assert encode_record(record) == line
    assert len(kinds) == len(lines)  # one sample of each kind


def test_there_is_a_golden_file() -> None:
    assert SAMPLES, "tests/golden/journal-v1.jsonl is missing"


# -- a limit actor's journal: its limit.state snapshots ---------------------------------

LIMIT_STATES = sorted(HERE.glob("limit-state-v*.jsonl"))


@pytest.mark.parametrize("path", LIMIT_STATES, ids=lambda p: p.name)
def test_every_golden_limit_state_restores(path: Path) -> None:
    """A limit actor's snapshots as each version wrote them restore (v1: before a
    holder said whether its attempt took it: each reads as not taken, so its attempt's
    take spends a token, at worst one too few, never one too many; v2: ``taken`` and
    the ``take`` that took it, so the same take asking again spends no second token)."""
    for line in path.read_bytes().splitlines():
        snap = msgspec.json.decode(line, type=Snapshot)
        state = LimitState.restore(snap, {})
        assert len(state.holders) == len(snap.holders)
        if path == LIMIT_STATES[-1]:
            assert msgspec.json.encode(snap) == line  # this version writes it so
            assert {h.seq: (h.taken, h.take) for h in snap.holders} == {
                7: (True, "a1b2c3d4e5f6:1"),
                9: (False, ""),
                -4: (True, "a1b2c3d4e5f6:2"),
            }
        else:
            assert not any(h.taken or h.take for h in snap.holders)


# -- inbox messages: the contract other SDKs write -------------------------------------

INBOX = sorted(HERE.glob("inbox-v*.jsonl"))
INBOX_KINDS = {
    "signal",
    "cancel",
    "timer",
    "completion",
    "child",
    "invoke",
    "resume",
    "permit",
    "grant",
    "limit",
}


@pytest.mark.parametrize("path", INBOX, ids=lambda p: p.name)
def test_every_golden_inbox_message_decodes_to_its_kind(path: Path) -> None:
    """Messages as earlier versions (and other SDKs) wrote them decode, every field read:
    re-encoded and decoded again, they are the same message."""
    kinds = set()
    for line in path.read_bytes().splitlines():
        msg = decode_message(line)
        assert msg is not None, line
        assert not isinstance(msg, Unknown), msg
        kinds.add(msgspec.json.decode(line)["kind"])
        assert decode_message(encode_message(msg)) == msg
        # nothing the writer put there is dropped on the way
        assert msgspec.json.decode(encode_message(msg)).keys() <= msgspec.json.decode(line).keys()
    assert kinds <= INBOX_KINDS
    if path == INBOX[-1]:
        assert kinds == INBOX_KINDS  # every kind has a sample in the latest


def test_this_version_writes_the_latest_inbox_samples_byte_for_byte() -> None:
    latest = INBOX[-1].read_bytes().splitlines()
    for line in latest:
        msg = decode_message(line)
        assert not isinstance(msg, Unknown | None)
        assert encode_message(msg) == line


def test_an_inbox_message_of_another_kind_is_unknown_not_an_error() -> None:
    assert decode_message(b'{"kind":"rewind","from":3}') == Unknown(
        kind="rewind", why="Invalid value 'rewind' - at `$.kind`"
    )
    assert decode_message(b'{"kind":"invoke","reply":"_INBOX.x"}') == Unknown(
        kind="invoke", why="Object missing required field `handler`", reply="_INBOX.x"
    )
    assert decode_message(b"[1, 2]") is None
    assert decode_message(b"not json") is None


def test_a_malformed_cancel_still_cancels_and_a_malformed_child_end_fails_the_wait() -> None:
    assert decode_message(b'{"kind":"cancel","reason":5}') == Cancel(reason="5")
    assert decode_message(b'{"kind":"cancel","target":"x"}') == Cancel()
    child = decode_message(b'{"kind":"child","id":"c-1","status":"completed","message":null}')
    assert isinstance(child, ChildEnded)
    assert child.outcome()["status"] == "failed"
    assert child.outcome()["error_type"] == "fusee.InvalidInput"
    assert "c-1" in child.outcome()["message"]
    assert isinstance(decode_message(b'{"kind":"completion","pos":1}'), Unknown)
