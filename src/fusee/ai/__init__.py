"""AI steps: model calls, structured output and agents as durable steps.

- :func:`generate`: one model call as a durable step, with structured output
  (``output=``) and a durable re-ask (``validate=``, ``reask=``).
- :func:`model_call`: a model call whose tokens stream to any reader.
- :func:`model_step`: one request to a :class:`Model` as one durable step.
- :func:`loop`: the agent loop, each turn and each tool call a step; tools are
  functions, workflows (:func:`workflow_tool`) or either behind an approval (:func:`tool`).
- :func:`openai_model`, :func:`anthropic_model`: models over the official SDKs
  (the extras ``fusee[openai]``, ``fusee[anthropic]``).
- The model layer's types: messages, :class:`ToolSpec`, :class:`ModelRequest`,
  :class:`ModelResponse`, :class:`Usage`, the :class:`Model` protocol.

Example:
    ``triage = await generate(ctx, "classify", model=model, prompt=p, output=Triage, reask=3)``
"""

from fusee.ai.anthropic_model import AnthropicModel as AnthropicModel
from fusee.ai.anthropic_model import anthropic_model as anthropic_model
from fusee.ai.errors import OutputError as OutputError
from fusee.ai.errors import OutputInvalid as OutputInvalid
from fusee.ai.errors import TruncatedStream as TruncatedStream
from fusee.ai.generate import Generation as Generation
from fusee.ai.generate import generate as generate
from fusee.ai.loop import LoopResult as LoopResult
from fusee.ai.loop import LoopState as LoopState
from fusee.ai.loop import Turn as Turn
from fusee.ai.loop import loop as loop
from fusee.ai.model_call import model_call as model_call
from fusee.ai.model_step import model_step as model_step
from fusee.ai.openai_model import OpenAIModel as OpenAIModel
from fusee.ai.openai_model import openai_model as openai_model
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
    "generate",
    "Generation",
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
    "openai_model",
    "OpenAIModel",
    "anthropic_model",
    "AnthropicModel",
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
