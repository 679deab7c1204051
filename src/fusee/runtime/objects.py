"""Keyed objects, the pure part: names, the state as a fold of the journal, and the view
a handler gets of it. No I/O.

An object key is an actor like a run: its actor ID is ``@<type>/<key>`` (run IDs may not
start with ``@``), so it shares the run machinery (journal subject, inbox, partitions,
fence). Its state is a map of top-level keys to JSON values. Each ``obj.done`` record
carries what one invocation changed; the state is the fold of those changes, and the KV
bucket ``<ns>_objects`` holds that fold under ``<type>.<key>`` (both escaped).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import msgspec

from fusee.errors import InvalidArgument, InvalidId
from fusee.runtime.codec import encode_value
from fusee.runtime.ids import escape, validate_id, validate_name
from fusee.runtime.records import Invocation, ObjectDone

__all__ = (
    "OBJECT_PREFIX",
    "EDIT",
    "RESERVED_TYPE_PREFIX",
    "object_id",
    "parse_object_id",
    "state_key",
    "check_run_id",
    "encode_state",
    "decode_state",
    "fold",
    "StateView",
    "ReadOnlyState",
    "edit_changes",
    "untargeted_cancel",
)

OBJECT_PREFIX = "@"
EDIT = "fusee.edit"  # the built-in exclusive handler behind objects edit / set / clear
# object types fusee keeps for its own actors ("@fusee.limit/<name>" is a limit's ID)
RESERVED_TYPE_PREFIX = "fusee."


def object_id(object_type: str, key: str) -> str:
    """The actor ID of an object key: ``@<type>/<key>``.

    Raises:
        InvalidId: the type or the key breaks the ID rules (the message names which).
    """
    object_type = validate_name(object_type, "object type")
    if "/" in object_type or object_type.startswith(OBJECT_PREFIX):
        raise InvalidId(
            f"invalid object type {object_type!r}: it must not hold '/' or start with '@'"
        )
    if object_type.startswith(RESERVED_TYPE_PREFIX):
        raise InvalidId(
            f"invalid object type {object_type!r}: types starting with "
            f"{RESERVED_TYPE_PREFIX!r} are reserved for fusee's own actors"
        )
    key = validate_id(key, f"key of object {object_type!r}")
    return validate_id(f"{OBJECT_PREFIX}{object_type}/{key}", f"object {object_type!r} key")


def parse_object_id(actor_id: str) -> tuple[str, str] | None:
    """``(type, key)`` of an object's actor ID, or None for a run ID or one of fusee's
    own actors (a type starting with ``fusee.``: a limit's)."""
    if not actor_id.startswith(OBJECT_PREFIX):
        return None
    object_type, sep, key = actor_id[1:].partition("/")
    if not sep or object_type.startswith(RESERVED_TYPE_PREFIX):
        return None
    return (object_type, key)


def state_key(object_type: str, key: str) -> str:
    """The KV key of an object's state: ``<type>.<key>``, each escaped into one token."""
    return f"{escape(object_type)}.{escape(key)}"


def check_run_id(run_id: str, what: str = "run ID") -> str:
    """Refuse run IDs that name objects' actors."""
    if run_id.startswith(OBJECT_PREFIX):
        raise InvalidId(
            f"invalid {what} {run_id!r}: IDs starting with '@' are reserved for objects"
        )
    return run_id


# -- the state -------------------------------------------------------------------------

State = dict[str, bytes]  # top-level key -> its JSON


def encode_state(state: Mapping[str, bytes]) -> bytes:
    """The state as one JSON object, keys sorted (what the KV bucket holds)."""
    return msgspec.json.encode({k: msgspec.Raw(state[k]) for k in sorted(state)})


def decode_state(data: bytes, what: str = "the state") -> State:
    """Parse a state JSON object into its keys' JSON.

    Raises:
        InvalidArgument: ``data`` is not a JSON object.
    """
    try:
        raw = msgspec.json.decode(data or b"{}", type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidArgument(f"{what} must be a JSON object: {exc}") from None
    return {k: bytes(v) for k, v in raw.items()}


def fold(state: State, done: ObjectDone) -> State:
    """The state after ``done``'s changes (a failed invocation changes nothing)."""
    if not done.ok:
        return state
    out: State = {} if done.state_cleared else dict(state)
    for k in done.state_deleted or ():
        out.pop(k, None)
    for k, v in (done.state_set or {}).items():
        out[k] = bytes(v)
    return out


class ReadOnlyState:
    """``ctx.state`` in a shared handler: the state as of the last finished exclusive
    invocation. Each ``get`` decodes afresh, so changing what it returns changes nothing."""

    def __init__(self, state: State, object_type: str) -> None:
        self._state = state
        self._type = object_type

    def get(self, name: str, default: Any = None, *, type: Any = None) -> Any:  # noqa: A002
        """The value under ``name`` (a new copy each time), or ``default``."""
        data = self._lookup(name)
        if data is None:
            return default
        return (
            msgspec.json.decode(data, type=type) if type is not None else msgspec.json.decode(data)
        )

    def keys(self) -> list[str]:
        """The state's keys, sorted."""
        return sorted(self._current())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._lookup(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def to_dict(self) -> dict[str, Any]:
        """The whole state, decoded."""
        current = self._current()
        return {k: msgspec.json.decode(current[k]) for k in sorted(current)}

    def _lookup(self, name: str) -> bytes | None:
        return self._state.get(name)

    def _current(self) -> State:
        return self._state

    def set(self, name: str, value: Any) -> None:
        self._refuse(f"set({name!r})")

    def delete(self, name: str) -> None:
        self._refuse(f"delete({name!r})")

    def clear(self) -> None:
        self._refuse("clear()")

    def _refuse(self, call: str) -> NoReturn:
        raise InvalidArgument(
            f"ctx.state.{call} in a shared handler of object {self._type!r}: shared "
            f"handlers read the state; change it in an exclusive handler"
        )


class StateView(ReadOnlyState):
    """``ctx.state`` in an exclusive handler. Changes stay with the invocation until it
    ends: they apply all at once, in its ``obj.done`` record, and not at all if it fails."""

    def __init__(self, state: State, object_type: str) -> None:
        super().__init__(state, object_type)
        self._set: State = {}
        self._deleted: set[str] = set()
        self._cleared = False

    def set(self, name: str, value: Any) -> None:
        """Set ``name`` to ``value`` (JSON-encodable; checked here, at the call)."""
        name = _state_name(name)
        self._set[name] = encode_value(value, f"state {name!r} of object {self._type!r}")
        self._deleted.discard(name)

    def delete(self, name: str) -> None:
        """Remove ``name`` (nothing happens if it is not there)."""
        name = _state_name(name)
        self._set.pop(name, None)
        self._deleted.add(name)

    def clear(self) -> None:
        """Remove every key."""
        self._set, self._deleted, self._cleared = {}, set(), True

    def _lookup(self, name: str) -> bytes | None:
        if name in self._set:
            return self._set[name]
        if self._cleared or name in self._deleted:
            return None
        return self._state.get(name)

    def _current(self) -> State:
        base = (
            {}
            if self._cleared
            else {k: v for k, v in self._state.items() if k not in self._deleted}
        )
        base.update(self._set)
        return base

    def changes(self) -> dict[str, Any]:
        """The ``obj.done`` fields for these changes (empty when there are none)."""
        deleted = [] if self._cleared else sorted(k for k in self._deleted if k in self._state)
        return _change_fields(self._set, deleted, self._cleared)


def _change_fields(sets: State, deleted: list[str], cleared: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cleared:
        out["state_cleared"] = True
    if deleted:
        out["state_deleted"] = deleted
    if sets:
        out["state_set"] = {k: msgspec.Raw(v) for k, v in sorted(sets.items())}
    return out


def _state_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a state key must be a non-empty str, got {name!r}")
    return name


def edit_changes(edit: Any, what: str) -> dict[str, Any]:
    """Check an edit from outside (``objects edit / set / clear``) and turn it into
    ``obj.done`` changes. ``{"state": {...}}`` replaces the whole state; ``{"set":
    {...}, "delete": [...], "clear": bool}`` changes keys.

    Raises:
        InvalidArgument: the edit is not one of those shapes.
        NotEncodable: a value is not JSON-encodable.
    """
    if not isinstance(edit, dict):
        raise InvalidArgument(f"{what}: an edit must be a JSON object, got {edit!r}")
    unknown = set(edit) - {"state", "set", "delete", "clear"}
    if unknown:
        raise InvalidArgument(f"{what}: unknown edit field(s) {sorted(unknown)}")
    sets: Any
    deleted: list[str]
    if "state" in edit:
        if not isinstance(edit["state"], dict):
            raise InvalidArgument(f"{what}: 'state' must be a JSON object, got {edit['state']!r}")
        sets, deleted, cleared = edit["state"], [], True
    else:
        sets, deleted, cleared = edit.get("set") or {}, edit.get("delete") or [], False
        if not isinstance(deleted, list) or not all(isinstance(k, str) and k for k in deleted):
            raise InvalidArgument(f"{what}: 'delete' must be a list of state keys")
        if not isinstance(sets, dict):
            raise InvalidArgument(f"{what}: 'set' must be a JSON object")
        cleared = bool(edit.get("clear"))
        # with clear, deleting is moot; a key both set and deleted is set
        deleted = [] if cleared else sorted(set(deleted) - set(sets))
    encoded = {_state_name(k): encode_value(v, f"{what}: state {k!r}") for k, v in sets.items()}
    return _change_fields(encoded, deleted, cleared)


def untargeted_cancel(
    seq: int, running: Invocation | None, began_at: int, *, running_here: bool = False
) -> int | None:
    """The invocation a cancel without a target, stored at inbox sequence ``seq``,
    means: the one running when it was stored. That is ``running`` when its first
    record (journal sequence ``began_at``) landed before the cancel, or when it runs in
    the actor reading the cancel (``running_here``: begun, nothing journaled yet)."""
    if running is None or not (running_here or 0 < began_at < seq):
        return None
    return running.inbox_seq
