"""Which engine an object key made without ``engine=`` uses: the one of the enclosing
``async with await fusee.connect() as engine:`` block, never "the last one connected"."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import fusee
from fusee.adapters.jetstream.layout import Layout

chats = fusee.ObjectType("chat", {})  # not registered: no worker needs it here


class _Store:
    """What an Engine needs of its store to be made, entered and closed (no NATS)."""

    def __init__(self, namespace: str) -> None:
        self.layout = Layout(namespace)
        self.followed: list[object] = []  # (hooks run after a region failover's follow)

    def reply_prefix(self) -> str:
        return "_INBOX.unused"

    async def close(self) -> None:
        return None


def _engine(namespace: str) -> fusee.Engine:
    store: Any = _Store(namespace)
    return fusee.Engine(store, url="nats://unused", server=None, partitions=1)


def test_key_is_typed_and_needs_no_engine_to_be_made() -> None:
    key = chats.key("user-7")
    assert isinstance(key, fusee.ObjectKey)
    assert key.actor_id == "@chat/user-7"


def test_outside_any_block_the_error_names_the_fixes() -> None:
    with pytest.raises(fusee.FuseeError, match=r"engine=.*async with await fusee\.connect"):
        _ = chats.key("user-7").engine


async def test_the_innermost_block_is_used_and_left_on_exit() -> None:
    key = chats.key("user-7")  # made before any block: looked up at each use
    a, b = _engine("a"), _engine("b")
    async with a:
        assert key.engine is a
        async with b:
            assert key.engine is b
            assert chats.key("other").engine is b
        assert key.engine is a
    with pytest.raises(fusee.FuseeError):
        _ = key.engine


async def test_an_explicit_engine_wins_and_tasks_see_the_block() -> None:
    a, b = _engine("a"), _engine("b")
    seen: list[fusee.Engine] = []

    async def look() -> None:
        engine = chats.key("user-7").engine
        assert isinstance(engine, fusee.Engine)
        seen.append(engine)

    async with a:
        assert chats.key("user-7", engine=b).engine is b
        assert a.object(chats, "user-7").engine is a
        async with anyio.create_task_group() as tg:
            tg.start_soon(look)  # a task started in the block (a worker's handler)
    assert seen == [a]
