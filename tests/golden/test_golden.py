"""Records written by released versions must keep decoding, to the same bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

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
