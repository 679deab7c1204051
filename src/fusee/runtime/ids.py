"""Run IDs, names and namespaces: validation, subject escaping and partitioning.

Pure functions, no I/O. :func:`escape` and :func:`partition_of` are part of the NATS
layout contract: every client, in any language and any version, must compute the same
subject token and the same partition for an ID, so neither may ever change.
"""

from __future__ import annotations

import re
import unicodedata

from fusee.errors import ConfigError, InvalidId

__all__ = (
    "MAX_ID_BYTES",
    "MAX_NAME_BYTES",
    "escape",
    "unescape",
    "validate_id",
    "validate_name",
    "validate_namespace",
    "partition_of",
)

MAX_ID_BYTES = 256
"""Longest run ID, in UTF-8 bytes after NFC normalization."""

MAX_NAME_BYTES = 128
"""Longest workflow or step name, in UTF-8 bytes after NFC normalization."""

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_/")
# Precomputed per byte: the safe ones map to themselves, every other one to "=XX".
_ESCAPED = tuple(chr(b) if b in _SAFE else f"={b:02X}" for b in range(256))
_NAMESPACE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHOWN = 60
# Unicode's Cc category, exactly (C0, DEL and C1: fixed since Unicode 1.1): one regex
# search instead of a category lookup per character (a step name is checked each step)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def escape(s: str) -> str:
    """Turn any string into one NATS subject token, reversibly.

    Bytes of ``[A-Za-z0-9_/-]`` stay as they are; every other UTF-8 byte becomes
    ``=XX`` (upper-case hex), so ``.``, ``*``, ``>``, whitespace and ``=`` itself never
    reach the subject. The empty string becomes a lone ``=``, which no other input
    produces. The output is also a valid KV key.

    Raises:
        InvalidId: ``s`` holds a lone surrogate, which has no UTF-8 form.

    Example:
        >>> escape("user.7")
        'user=2E7'
    """
    if not s:
        return "="
    try:
        data = s.encode()
    except UnicodeEncodeError as e:
        raise InvalidId(f"cannot escape {_show(s)}: it is not valid Unicode ({e.reason})") from e
    return "".join([_ESCAPED[b] for b in data])


def unescape(t: str) -> str:
    """Invert :func:`escape`.

    Only the exact output of :func:`escape` is accepted, so every string has one token.

    Raises:
        InvalidId: ``t`` is not something :func:`escape` produces (a stray character,
            a short or lower-case ``=XX``, an escaped safe byte, bytes that are not UTF-8).

    Example:
        >>> unescape("user=2E7")
        'user.7'
    """
    if t == "=":
        return ""
    out = bytearray()
    i, n = 0, len(t)
    while i < n:
        c = t[i]
        if c == "=":
            pair = t[i + 1 : i + 3]
            if len(pair) != 2 or not all(h in "0123456789ABCDEF" for h in pair):
                raise InvalidId(
                    f"cannot unescape {_show(t)}: '=' at index {i} must be followed by two "
                    "upper-case hex digits"
                )
            out.append(int(pair, 16))
            i += 3
        elif ord(c) < 128 and ord(c) in _SAFE:
            out.append(ord(c))
            i += 1
        else:
            raise InvalidId(
                f"cannot unescape {_show(t)}: {c!r} at index {i} is not [A-Za-z0-9_/-] or =XX"
            )
    try:
        s = out.decode()
    except UnicodeDecodeError as e:
        raise InvalidId(f"cannot unescape {_show(t)}: the bytes are not UTF-8 ({e.reason})") from e
    if escape(s) != t:  # e.g. "=41" for "A": decodable, but not what escape() writes
        raise InvalidId(f"cannot unescape {_show(t)}: not in canonical form {escape(s)!r}")
    return s


def validate_id(value: object, what: str = "run ID") -> str:
    """Check a run ID (or another caller-chosen key) and return its NFC form.

    The rules: a ``str``, non-empty, at most 256 UTF-8 bytes once NFC-normalized, and no
    control characters (C0, DEL, C1). Composed and decomposed spellings of the same text
    are the same ID.

    Raises:
        InvalidId: a rule is broken; the message names ``what``, the value and the rule.

    Example:
        >>> validate_id("chat-7/turn-3")
        'chat-7/turn-3'
    """
    return _validate(value, what, MAX_ID_BYTES)


def validate_name(value: object, what: str) -> str:
    """Check a workflow or step name and return its NFC form.

    The same rules as :func:`validate_id`, with at most 128 UTF-8 bytes.

    Raises:
        InvalidId: a rule is broken; the message names ``what``, the value and the rule.

    Example:
        >>> validate_name("summarize", "step name")
        'summarize'
    """
    return _validate(value, what, MAX_NAME_BYTES)


def validate_namespace(ns: str) -> str:
    """Check a namespace, the prefix of every stream, subject and bucket fusee creates.

    A namespace matches ``^[a-z][a-z0-9_]{0,31}$``: it is used unescaped inside stream
    and bucket names, which allow far fewer characters than subjects.

    Raises:
        ConfigError: ``ns`` does not match.

    Example:
        >>> validate_namespace("fusee")
        'fusee'
    """
    if not isinstance(ns, str) or _NAMESPACE.fullmatch(ns) is None:
        raise ConfigError(
            f"invalid namespace {_show(ns)}: it must start with a lower-case letter and hold "
            "only a-z, 0-9 and '_', at most 32 characters"
        )
    return ns


def partition_of(run_id: str, partitions: int) -> int:
    """Map a run ID to a partition in ``range(partitions)``.

    FNV-1a (32-bit) of the NFC-normalized UTF-8 bytes, modulo ``partitions``. It is
    stable across languages, platforms and fusee versions (unlike ``hash()``), and part
    of the NATS layout contract: changing it would move live runs to other partitions.

    Raises:
        ConfigError: ``partitions`` is not a positive int.

    Example:
        >>> partition_of("chat-7", 16)
        15
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions must be a positive int, got {partitions!r}")
    h = _FNV_OFFSET
    for b in unicodedata.normalize("NFC", run_id).encode():
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFF
    return h % partitions


def _validate(value: object, what: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise InvalidId(f"{what} must be a str, got {type(value).__name__}: {_show(value)}")
    plain = value.isascii()  # its own NFC form, a byte a character (most names and IDs)
    s = value if plain else unicodedata.normalize("NFC", value)
    if not s:
        raise InvalidId(f"{what} must not be empty")
    try:
        size = len(s) if plain else len(s.encode())
    except UnicodeEncodeError as e:
        raise InvalidId(
            f"invalid {what} {_show(value)}: it must be valid Unicode, but holds a lone "
            f"surrogate at index {e.start}"
        ) from e
    if size > max_bytes:
        raise InvalidId(
            f"invalid {what} {_show(value)}: it must be at most {max_bytes} UTF-8 bytes, got {size}"
        )
    control = _CONTROL.search(s)
    if control is not None:
        raise InvalidId(
            f"invalid {what} {_show(value)}: it must not hold control characters, "
            f"found {control.group()!r} at index {control.start()}"
        )
    return s


def _show(value: object) -> str:
    r = repr(value)
    return r if len(r) <= _SHOWN else f"{r[: _SHOWN - 3]}..."
