from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fusee.errors import ConfigError, InvalidId
from fusee.runtime.ids import (
    escape,
    partition_of,
    unescape,
    validate_id,
    validate_name,
    validate_namespace,
)

TOKEN = re.compile(r"[A-Za-z0-9_/=-]+")

# From research/nats.md Q6: these went through real stream subjects and KV keys.
SAMPLES = [
    ("chat-7/turn-3", "chat-7/turn-3"),
    ("user.7", "user=2E7"),
    ("a b", "a=20b"),
    ("x*y>z", "x=2Ay=3Ez"),
    ("", "="),
    ("=", "=3D"),
    ("$SYS", "=24SYS"),
    ("user:42", "user=3A42"),
    ("../etc", "=2E=2E/etc"),
    ("ünïcødé-中文-😀", "=C3=BCn=C3=AFc=C3=B8d=C3=A9-=E4=B8=AD=E6=96=87-=F0=9F=98=80"),
]


# -- escape / unescape ------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "token"), SAMPLES)
def test_escape_samples(raw: str, token: str) -> None:
    assert escape(raw) == token
    assert unescape(token) == raw


@given(st.text())
def test_escape_round_trips(s: str) -> None:
    assert unescape(escape(s)) == s


@given(st.text())
def test_escape_output_is_one_safe_token(s: str) -> None:
    token = escape(s)
    assert TOKEN.fullmatch(token)
    assert not ({".", "*", ">"} & set(token))
    assert not any(c.isspace() for c in token)


@given(st.text(), st.text())
def test_escape_is_injective(a: str, b: str) -> None:
    assume(a != b)
    assert escape(a) != escape(b)


@given(st.text(alphabet=st.sampled_from("AZaz09_-/"), min_size=1))
def test_safe_text_is_unchanged(s: str) -> None:
    assert escape(s) == s


def test_escape_rejects_lone_surrogate() -> None:
    with pytest.raises(InvalidId, match="not valid Unicode"):
        escape("a\ud800b")


@pytest.mark.parametrize(
    "bad",
    [
        "",  # escape never produces the empty token
        "a.b",  # stray unsafe character
        "a=2",  # truncated escape
        "a=",
        "a=2e",  # lower-case hex
        "a=G0",
        "=41",  # an escaped safe byte: not canonical
        "=FF",  # not UTF-8
        "=C3",  # truncated UTF-8 sequence
        "ü",  # raw non-ASCII
        "==",
    ],
)
def test_unescape_rejects_malformed(bad: str) -> None:
    with pytest.raises(InvalidId, match="cannot unescape"):
        unescape(bad)


@given(st.text(alphabet=st.sampled_from("=AF09a.g/ "), max_size=12))
def test_unescape_accepts_exactly_escape_outputs(t: str) -> None:
    try:
        s = unescape(t)
    except InvalidId:
        return
    assert escape(s) == t


# -- validate_id / validate_name --------------------------------------------------------


def test_validate_id_returns_the_id() -> None:
    assert validate_id("chat-7/turn-3") == "chat-7/turn-3"
    assert validate_id("x" * 256) == "x" * 256
    assert validate_id("é" * 128) == "é" * 128  # 256 bytes


def test_validate_id_rejects_empty() -> None:
    with pytest.raises(InvalidId, match="run ID must not be empty"):
        validate_id("")


@pytest.mark.parametrize("value", ["x" * 257, "é" * 128 + "x", "😀" * 64 + "x", "中" * 86])
def test_validate_id_rejects_more_than_256_bytes(value: str) -> None:
    with pytest.raises(InvalidId, match=r"run ID .* at most 256 UTF-8 bytes, got \d+") as info:
        validate_id(value)
    assert "..." in str(info.value)  # the value is shown, truncated
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("value", [None, 7, b"run-1", ["run-1"], 1.5])
def test_validate_id_rejects_non_str(value: object) -> None:
    with pytest.raises(InvalidId, match=f"run ID must be a str, got {type(value).__name__}"):
        validate_id(value)


@pytest.mark.parametrize("char", ["\x00", "\n", "\t", "\x1b", "\x7f", "\x85", "\x9f"])
def test_validate_id_rejects_control_characters(char: str) -> None:
    with pytest.raises(InvalidId, match="must not hold control characters") as info:
        validate_id(f"run{char}1")
    assert repr(char) in str(info.value)


def test_the_control_characters_refused_are_unicode_s_cc_category_exactly() -> None:
    # every code point but the surrogates (refused earlier, as lone surrogates)
    for code in (*range(0xD800), *range(0xE000, 0x110000)):
        c = chr(code)
        control = unicodedata.category(c) == "Cc"
        refused = False
        try:
            validate_id(f"a{c}")
        except InvalidId as exc:
            refused = "control characters" in str(exc)
        assert refused == control, (hex(code), unicodedata.category(c))


def test_validate_id_rejects_lone_surrogate() -> None:
    with pytest.raises(InvalidId, match="lone surrogate"):
        validate_id("a\udc00")


def test_validate_id_names_what() -> None:
    with pytest.raises(InvalidId, match="idempotency key must not be empty"):
        validate_id("", "idempotency key")


def test_nfc_normalizes() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert composed != decomposed
    assert validate_id(composed) == validate_id(decomposed) == composed
    assert escape(validate_id(decomposed)) == escape(composed)
    assert partition_of(composed, 64) == partition_of(decomposed, 64)


@given(st.text(min_size=1))
def test_validate_id_is_idempotent_and_nfc(s: str) -> None:
    try:
        v = validate_id(s)
    except InvalidId:
        return
    assert v == unicodedata.normalize("NFC", s)
    assert validate_id(v) == v
    assert 0 < len(v.encode()) <= 256


def test_validate_name_limit_is_128_bytes() -> None:
    assert validate_name("n" * 128, "step name") == "n" * 128
    with pytest.raises(InvalidId, match=r"step name .* at most 128 UTF-8 bytes, got 129"):
        validate_name("n" * 129, "step name")
    with pytest.raises(InvalidId, match="workflow name must be a str, got int"):
        validate_name(3, "workflow name")


# -- namespaces --------------------------------------------------------------------------


@pytest.mark.parametrize("ns", ["fusee", "a", "t0123abcd", "a_b_9", "a" + "b" * 31])
def test_valid_namespaces(ns: str) -> None:
    assert validate_namespace(ns) == ns


@pytest.mark.parametrize("ns", ["", "Fusee", "9a", "_a", "a-b", "a.b", "a b", "a" * 33, "é"])
def test_invalid_namespaces(ns: str) -> None:
    with pytest.raises(ConfigError, match="invalid namespace"):
        validate_namespace(ns)


# -- partitions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "partitions", "expected"),
    [
        # FNV-1a 32: "" -> 0x811C9DC5, "a" -> 0xE40C292C (the published test vectors).
        ("", 2**32, 0x811C9DC5),
        ("a", 2**32, 0xE40C292C),
        ("foobar", 2**32, 0xBF9CF968),
        ("chat-7", 16, 15),
        ("chat-7/turn-3", 64, 63),
        ("ünïcødé-中文-😀", 1000, 251),
        ("run-0", 2**32, 0x3D9D598F),
    ],
)
def test_partition_of_is_pinned(run_id: str, partitions: int, expected: int) -> None:
    assert partition_of(run_id, partitions) == expected


def test_partition_of_spreads_small_counts() -> None:
    # Pinned outright: a change here would move live runs to other partitions.
    assert [partition_of(f"run-{i}", 8) for i in range(8)] == [7, 4, 5, 2, 3, 0, 1, 6]


@given(st.text(), st.integers(min_value=1, max_value=10_000))
def test_partition_of_is_in_range(run_id: str, partitions: int) -> None:
    assert 0 <= partition_of(run_id, partitions) < partitions


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_partition_of_rejects_bad_counts(bad: int) -> None:
    with pytest.raises(ConfigError, match="partitions must be a positive int"):
        partition_of("x", bad)
