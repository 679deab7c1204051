"""AI steps: model calls, structured output and agents as durable steps.

- :func:`model_call`: a model call whose tokens stream to any reader.
- :func:`model_step`: one request to a :class:`Model` as one durable step.
- :func:`loop`: the agent loop, each turn and each tool call a step; tools are
  functions, workflows (:func:`workflow_tool`) or either behind an approval (:func:`tool`).
- The model layer's types: messages, :class:`ToolSpec`, :class:`ModelRequest`,
  :class:`ModelResponse`, :class:`Usage`, the :class:`Model` protocol.

Example:
    ``text = await model_call(ctx, f"model-{turn}", lambda resume: llm.stream(history, prefill=resume))``
"""

from fusee.ai.errors import OutputError as OutputError
from fusee.ai.errors import OutputInvalid as OutputInvalid
from fusee.ai.errors import TruncatedStream as TruncatedStream
from fusee.ai.loop import LoopResult as LoopResult
from fusee.ai.loop import LoopState as LoopState
from fusee.ai.loop import Turn as Turn
from fusee.ai.loop import loop as loop
from fusee.ai.model_call import model_call as model_call
from fusee.ai.model_step import model_step as model_step
from fusee.ai.tools import Tool as Tool
from fusee.ai.tools import ToolInputError as ToolInputError
from fusee.ai.tools import UnknownTool as UnknownTool
from fusee.ai.tools import WorkflowTool as WorkflowTool
from fusee.ai.tools import tool as tool
from fusee.ai.tools import workflow_tool as workflow_tool
from fusee.ai.types import AssistantMessage as AssistantMessage
from fusee.ai.types import Message as Message
from fusee.ai.types import Model as Model
from fusee.ai.types import ModelRequest as ModelRequest
from fusee.ai.types import ModelResponse as ModelResponse
from fusee.ai.types import OutputSpec as OutputSpec
from fusee.ai.types import StreamItem as StreamItem
from fusee.ai.types import SystemMessage as SystemMessage
from fusee.ai.types import ToolCall as ToolCall
from fusee.ai.types import ToolResultMessage as ToolResultMessage
from fusee.ai.types import ToolSpec as ToolSpec
from fusee.ai.types import Usage as Usage
from fusee.ai.types import UserMessage as UserMessage
from fusee.ai.types import as_messages as as_messages

__all__ = (
    "model_call",
    "model_step",
    "loop",
    "Turn",
    "LoopResult",
    "LoopState",
    "tool",
    "workflow_tool",
    "Tool",
    "WorkflowTool",
    "ToolInputError",
    "UnknownTool",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Message",
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "ToolCall",
    "ToolSpec",
    "OutputSpec",
    "Usage",
    "StreamItem",
    "as_messages",
    "TruncatedStream",
    "OutputError",
    "OutputInvalid",
)
