"""The names fusee uses in one namespace, and what a read of a stored message gives.

The NATS layout is a public contract (``docs/reference/nats-layout.md``): every subject,
stream, bucket and header fusee writes is named here, so the store, the token streams and
the journal watch agree on them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusee.runtime.ids import escape
from fusee.runtime.regions import epoch_bucket_stream, epoch_stream

__all__ = (
    "BUCKETS",
    "Layout",
    "StoredMsg",
    "EXPECTED_SEQ",
    "EXPECTED_SUBJECT",
    "MSG_ID",
    "KIND",
    "JOURNAL_SEQ",
    "CURSOR",
    "END_KINDS",
    "EXPECTED_STREAM",
    "WRONG_STREAM",
    "EPOCH",
)

# Headers the server reads; nats-py has no constant for the subtree fence.
EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
MSG_ID = "Nats-Msg-Id"
# the stream that must store an append (10060 otherwise): the epoch's journal stream
EXPECTED_STREAM = "Nats-Expected-Stream"
# what the server answers a write whose Nats-Expected-Stream is not the stream that
# would store it: the writer's epoch is over (the namespace failed over)
WRONG_STREAM = 10060
EPOCH = "Fusee-Epoch"  # on a regional namespace's appends: the writer's epoch
KIND = "Fusee-Kind"
JOURNAL_SEQ = "Fusee-Journal-Seq"  # on a state projection: the record it was made at
CURSOR = "Fusee-Cursor"  # on a state projection: the last invocation's inbox sequence

# The records that end a run or an object's invocation: stored on the run's ``.end``
# subject, not on ``.j``, so a caller waiting for one hears of nothing else (watch.py).
# Journals of earlier versions have them on ``.j``; a journal is read as its whole tree.
END_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled", "obj.done"})


# The namespace's KV buckets, by kind (``Layout.bucket``): the run index, the work
# bucket (markers, notes, owners, config, limits), objects' state, API tokens. A
# bucket's name and subjects are the same in every epoch, its stream is the epoch's
# (``Layout.kv_stream``): a failover promotes the partner region's mirror of each in
# place, as it does the journal's.
BUCKETS = ("runs", "work", "objects", "auth")


@dataclass(frozen=True)
class StoredMsg:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Layout:
    """Every name fusee uses in one namespace (a public contract, see the NATS layout doc)."""

    namespace: str
    # regions (runtime/regions.py): the epoch names the journal stream (FUSEE, FUSEE_E2,
    # ...); ``home`` is the region (NATS cluster) the namespace's streams are placed in,
    # None for a namespace without regions (placed where the server puts them)
    epoch: int = 1
    home: str | None = None

    @property
    def stream(self) -> str:
        return epoch_stream(self.namespace, self.epoch)

    @property
    def regional(self) -> bool:
        """Whether appends name their epoch's stream (a namespace with a home region)."""
        return self.home is not None or self.epoch > 1

    @property
    def tokens_stream(self) -> str:
        return f"{self.stream}_TOKENS"

    @property
    def values_stream(self) -> str:
        # values too large for a record (step results), stored out of line
        return f"{self.stream}_VALUES"

    def value(self, eid: str, digest: str, chunk: int) -> str:
        return f"{self.namespace}.val.{eid}.{digest}.{chunk}"

    def bucket(self, kind: str) -> str:
        """The KV bucket ``kind`` (one of :data:`BUCKETS`): the same name in every epoch."""
        return f"{self.namespace}_{kind}"

    def kv_stream(self, bucket: str) -> str:
        """The stream of KV bucket ``bucket`` in this epoch: ``KV_<bucket>``, then
        ``KV_<bucket>_E2``, ... (``epoch_bucket_stream``)."""
        return epoch_bucket_stream(bucket, self.epoch)

    @property
    def runs_bucket(self) -> str:
        return f"{self.namespace}_runs"

    @property
    def work_bucket(self) -> str:
        return f"{self.namespace}_work"

    @property
    def auth_bucket(self) -> str:
        # API tokens: their hashes, scopes and expiries (made when first needed)
        return f"{self.namespace}_auth"

    @property
    def objects_bucket(self) -> str:
        return f"{self.namespace}_objects"

    def shared_calls(self, object_type: str) -> str:
        # core NATS request/reply, answered by one worker of the queue group
        return f"_fusee.{self.namespace}.shared.{escape(object_type)}"

    def journal(self, eid: str) -> str:
        return f"{self.namespace}.run.{eid}.j"

    def ends(self, eid: str) -> str:
        return f"{self.namespace}.run.{eid}.end"

    def record(self, eid: str, kind: str) -> str:
        """Where a record of ``kind`` goes: an end record on ``ends``, the rest on ``journal``."""
        return self.ends(eid) if kind in END_KINDS else self.journal(eid)

    def tree(self, eid: str) -> str:
        # the fence's subtree, and what a read of the journal reads: every record
        return f"{self.namespace}.run.{eid}.>"

    def inbox(self, partition: int, eid: str) -> str:
        return f"{self.namespace}.in.{partition}.{eid}"

    def marker(self, partition: int, eid: str) -> str:
        # A run's active marker, in the journal stream (so it rides the start's batch):
        # inside the inbox tree, which every stream binds, never read as an inbox message.
        return f"{self.inbox(partition, eid)}.a"

    def parse_marker(self, subject: str) -> tuple[int, str] | None:
        """``(partition, eid)`` of a run's active marker subject (:meth:`marker`), or
        None for another subject."""
        part, _, rest = subject.removeprefix(f"{self.namespace}.in.").partition(".")
        eid, dot, tail = rest.rpartition(".")
        if not (part.isdigit() and eid and dot and tail == "a"):
            return None
        return int(part), eid

    @property
    def markers(self) -> str:
        # every run's active marker (a subject filter)
        return f"{self.namespace}.in.*.*.a"

    def index_entry(self, eid: str) -> str:
        # A run's index entry, in the journal stream (so an end's rides the removal of
        # the run's marker): inside the inbox tree, where "x" is no partition.
        return f"{self.namespace}.in.x.{eid}"

    @property
    def index_entries(self) -> str:
        return f"{self.namespace}.in.x.*"

    def listing(self, status: str, workflow: str, eid: str) -> str:
        # A run's listing entry, named by its status and (escaped) workflow so that a
        # subject filter answers "status S of workflow W" without reading other runs:
        # an ended run's (final) rides its end's index entry, a paused run's its
        # marker's removal. Six tokens: never an index entry (four) nor a marker (five).
        return f"{self.namespace}.in.x.{status}.{escape(workflow)}.{eid}"

    def listings(self, status: str | None = None, workflow: str | None = None) -> str:
        # the listing entries of ``status`` and ``workflow`` (None: any), a subject filter
        s = status or "*"
        w = "*" if workflow is None else escape(workflow)
        return f"{self.namespace}.in.x.{s}.{w}.*"

    def parse_listing(self, subject: str) -> tuple[str, str, str] | None:
        """``(status, escaped workflow, eid)`` of a listing subject, or None."""
        parts = subject.removeprefix(f"{self.namespace}.in.x.").split(".")
        if len(parts) != 3 or not all(parts):
            return None
        return parts[0], parts[1], parts[2]

    def wake(self, partition: int) -> str:
        # Core NATS, not stored: a hint that a partition has new work. The active
        # markers are the durable truth; a lost hint is found by the owner's next
        # reconcile.
        return f"_fusee.{self.namespace}.wake.{partition}"

    def heartbeat(self, worker: str) -> str:
        return f"_fusee.{self.namespace}.hb.{worker}"

    def ping(self, worker: str) -> str:
        return f"_fusee.{self.namespace}.ping.{worker}"

    def take(self, worker: str) -> str:
        # core NATS: a partition owner hands ``worker`` a run or key it lacks the code of
        return f"_fusee.{self.namespace}.take.{worker}"

    @staticmethod
    def active_key(partition: int, eid: str) -> str:
        return f"active.{partition}.{eid}"

    @staticmethod
    def owner_key(partition: int) -> str:
        return f"owner.{partition}"
