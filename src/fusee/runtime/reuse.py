"""Interrupt and regenerate: which records of an ended run a new run reuses.

``engine.start(wf, new_id, arg, from_run=old_id)`` starts ``new_id`` with copies of
``old_id``'s finished calls (steps that completed, waits that ended), so its replay
returns their results instead of running them again. Pure: records in, copies out.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from fusee.runtime.records import (
    AnyRecord,
    RunStarted,
    StepCompleted,
    StepRetrying,
    Value,
    WaitDone,
    WaitStarted,
    unfold,
)

__all__ = ("reusable", "reusable_prefix")

_COPIED = (StepCompleted, StepRetrying, WaitStarted, WaitDone)


def reusable_prefix(
    records: Sequence[AnyRecord], upto: int | None = None, *, stop_prefix: str = "compensate:"
) -> int:
    """How many positions, from 1, the new run reuses: the longest prefix of calls of
    the old run's last generation that finished (a completed step, an ended wait),
    stopping at a compensation (``stop_prefix``) and at ``upto`` when given."""
    gen = _last_generation(records)
    done: set[int] = set()
    for record in (r for carrier in gen for r in unfold(carrier)):
        compensation = isinstance(record, StepCompleted) and record.name.startswith(stop_prefix)
        if isinstance(record, StepCompleted | WaitDone) and not compensation:
            done.add(record.pos)
    cut = 1
    while cut in done and (upto is None or cut <= upto):
        cut += 1
    return cut - 1


def reusable(
    records: Sequence[AnyRecord], upto: int | None = None, *, stop_prefix: str = "compensate:"
) -> list[AnyRecord]:
    """The records to copy after the new run's ``run.started``, in journal order (links
    are made when they are appended). ``ctx.now()``/``random()``/``uuid()`` values that
    rode on a record left out move to the next copied one, so they replay in order."""
    keep = reusable_prefix(records, upto, stop_prefix=stop_prefix)
    out: list[AnyRecord] = []
    carry: list[Value] = []
    # a wait's end that rode on a later record is copied as a record of its own
    for record in (r for carrier in _last_generation(records)[1:] for r in unfold(carrier)):
        values = record.values if isinstance(record.values, list) else []
        if not isinstance(record, _COPIED) or record.pos > keep:
            carry.extend(values)
            continue
        copy: AnyRecord = record
        if carry:
            copy = msgspec.structs.replace(copy, values=[*carry, *values])
            carry = []
        if isinstance(copy, WaitDone):
            copy = msgspec.structs.replace(copy, inbox_seq=0)  # another run's inbox
        out.append(copy)
    return out


def _last_generation(records: Sequence[AnyRecord]) -> Sequence[AnyRecord]:
    starts = [i for i, r in enumerate(records) if isinstance(r, RunStarted)]
    return records[starts[-1] :] if starts else []
