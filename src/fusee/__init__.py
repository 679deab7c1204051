"""fusee: durable execution for AI agents, on NATS JetStream.

Every model call and tool call is a step: a crash resumes at the call that was
running, and nothing that finished runs again.
"""

from fusee._engine import CompletionInfo as CompletionInfo
from fusee._engine import Engine as Engine
from fusee._engine import connect as connect
from fusee._limits import LimitInfo as LimitInfo
from fusee._objects import ObjectInfo as ObjectInfo
from fusee._objects import ObjectKey as ObjectKey
from fusee._objects import ObjectType as ObjectType
from fusee._objects import object as object  # noqa: A004 - fusee.object
from fusee._regions import fail_over as fail_over
from fusee._run import Run as Run
from fusee._tokens import CreatedToken as CreatedToken
from fusee._tokens import TokenInfo as TokenInfo
from fusee._tokens import Tokens as Tokens
from fusee.actors.context import Context as Context
from fusee.actors.context import ObjectContext as ObjectContext
from fusee.actors.registry import Workflow as Workflow
from fusee.actors.registry import exclusive as exclusive
from fusee.actors.registry import shared as shared
from fusee.actors.registry import workflow as workflow
from fusee.actors.shared import SharedContext as SharedContext
from fusee.actors.steps import StepInfo as StepInfo
from fusee.actors.worker import WorkerConfig as WorkerConfig
from fusee.adapters.jetstream.failover import FailoverReport as FailoverReport
from fusee.adapters.jetstream.regions import MirrorLag as MirrorLag
from fusee.errors import ConfigError as ConfigError
from fusee.errors import ConnectionLost as ConnectionLost
from fusee.errors import DeterminismError as DeterminismError
from fusee.errors import FailedOver as FailedOver
from fusee.errors import FatalError as FatalError
from fusee.errors import FuseeError as FuseeError
from fusee.errors import HandlerCancelled as HandlerCancelled
from fusee.errors import HandlerFailed as HandlerFailed
from fusee.errors import InvalidArgument as InvalidArgument
from fusee.errors import InvalidId as InvalidId
from fusee.errors import InvalidToken as InvalidToken
from fusee.errors import NotEncodable as NotEncodable
from fusee.errors import NothingToCancel as NothingToCancel
from fusee.errors import NotPausedError as NotPausedError
from fusee.errors import PermissionDenied as PermissionDenied
from fusee.errors import RunCancelled as RunCancelled
from fusee.errors import RunExists as RunExists
from fusee.errors import RunFailed as RunFailed
from fusee.errors import RunNotFound as RunNotFound
from fusee.errors import StepError as StepError
from fusee.errors import StepFailedError as StepFailedError
from fusee.errors import StepTimeout as StepTimeout
from fusee.errors import StorageFull as StorageFull
from fusee.errors import StreamNotFound as StreamNotFound
from fusee.errors import Timeout as Timeout
from fusee.errors import Unauthorized as Unauthorized
from fusee.errors import UnknownLimit as UnknownLimit
from fusee.errors import UnknownToken as UnknownToken
from fusee.runtime.bulk import BulkSummary as BulkSummary
from fusee.runtime.completions import Completion as Completion
from fusee.runtime.index import RunInfo as RunInfo
from fusee.runtime.retry import Retry as Retry
from fusee.runtime.tokens import TokenEvent as TokenEvent

__all__ = (
    "connect",
    "Engine",
    "WorkerConfig",
    "Run",
    "RunInfo",
    "BulkSummary",
    "TokenEvent",
    "CompletionInfo",
    "workflow",
    "Workflow",
    "object",
    "shared",
    "exclusive",
    "ObjectType",
    "ObjectKey",
    "ObjectInfo",
    "HandlerFailed",
    "HandlerCancelled",
    "Context",
    "ObjectContext",
    "SharedContext",
    "StepInfo",
    "Retry",
    "FuseeError",
    "FatalError",
    "StepFailedError",
    "StepError",
    "StepTimeout",
    "DeterminismError",
    "InvalidId",
    "InvalidArgument",
    "ConfigError",
    "NotEncodable",
    "NothingToCancel",
    "RunExists",
    "RunNotFound",
    "RunFailed",
    "RunCancelled",
    "NotPausedError",
    "StreamNotFound",
    "Timeout",
    "ConnectionLost",
    "PermissionDenied",
    "FailedOver",
    "StorageFull",
    "Completion",
    "InvalidToken",
    "LimitInfo",
    "UnknownLimit",
    "Tokens",
    "TokenInfo",
    "CreatedToken",
    "Unauthorized",
    "UnknownToken",
    "fail_over",
    "FailoverReport",
    "MirrorLag",
)

__version__ = "0.1.0"
