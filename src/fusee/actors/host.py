"""What ``ctx`` needs of the actor that runs it, as a Protocol.

:class:`~fusee.actors.context.Context` and the modules of its jobs (steps, waits,
children, combinators) depend on this, not on the concrete actor: a run's actor and an
object's both fit it, and a test can hand them a fake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fusee.actors.ports import RunStore, TokenSink
from fusee.runtime.history import History
from fusee.runtime.limits import Permit
from fusee.runtime.records import AnyRecord, ValueRef, WaitDone, WaitStarted
from fusee.runtime.waits import InboxView

if TYPE_CHECKING:
    from fusee.actors.stragglers import Stragglers

__all__ = ("ActorHost", "Stoppable")


class Stoppable(Protocol):
    """A running step, as the actor stops it: :class:`fusee.actors.steps.StepInfo`."""

    def stop(self) -> None:
        """Set its ``s.signal``: it should stop."""
        ...


class ActorHost(Protocol):
    """The actor a workflow's (or an exclusive handler's) code runs in."""

    @property
    def run_id(self) -> str:
        """The run's ID (an object's: ``@<type>/<key>``)."""
        ...

    @property
    def namespace(self) -> str: ...

    @property
    def eid(self) -> str:
        """The actor ID as stored (escaped)."""
        ...

    @property
    def store(self) -> RunStore: ...

    @property
    def tokens(self) -> TokenSink | None:
        """Where ``model_call`` writes its token streams; None: the store has none."""
        ...

    @property
    def partitions(self) -> int | None:
        """The namespace's partitions, to route messages to other runs (None: unknown)."""
        ...

    @property
    def history(self) -> History:
        """The journal as folded so far (the current generation's)."""
        ...

    @property
    def view(self) -> InboxView:
        """What the actor has read of its inbox for its waits."""
        ...

    @property
    def clock(self) -> Callable[[], float]:
        """The worker's clock (seconds since the epoch)."""
        ...

    @property
    def commits(self) -> int:
        """How many commits this actor made: one more per call, landed or not."""
        ...

    # ctx.all / ctx.race running: commits take turns, always_replay waits for their end
    combinators: int

    # the running steps (their ``s``): a cancel of the run stops them
    running_steps: set[Stoppable]

    async def commit(self, record: AnyRecord) -> int:
        """Append ``record`` under the actor's fence; its journal sequence."""
        ...

    async def flush(self) -> None:
        """Journal the waits resolved and not journaled yet (they ride on the next
        record otherwise): before anything observable depends on them."""
        ...

    async def before_step(self) -> None:
        """Called before a step's function first runs (an object's invocation is
        journaled then, so it shows as running)."""
        ...

    async def wait_out(self, started: WaitStarted) -> WaitDone:
        """Until the wait ends (raises ``Parked`` when the actor leaves memory)."""
        ...

    async def acquire_permit(self, name: str, fairness: str, key: str, *, pos: int = 0) -> Permit:
        """Wait for a permit of limit ``name`` (see ``ActorCore.acquire_permit``)."""
        ...

    async def release_permit(self, permit: Permit) -> None: ...

    # steps running now (of any task); the steps of tasks the code started itself
    steps_in_flight: int
    # steps whose body returned, their result not journaled yet (a drain waits)
    results_in_flight: int
    stragglers: Stragglers

    async def maybe_evict(self, *, in_step: bool = False) -> None:
        """At a step boundary: raise ``Evicted`` when the copy is to leave memory."""
        ...

    async def stop_workflow(self) -> None:
        """Cancel the code where it is (it reached where it was stopped before)."""
        ...

    async def store_value(self, data: bytes) -> ValueRef:
        """Store a value too large for a record, out of line."""
        ...

    async def read_value(self, ref: ValueRef) -> bytes:
        """A value the journal names, stored out of line."""
        ...
