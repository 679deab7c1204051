"""Records and inbox messages written by released versions must keep decoding."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from fusee.runtime.inbox import Cancel, ChildEnded, Unknown, decode_message, encode_message
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
