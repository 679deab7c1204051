"""AI helpers: model calls as durable steps whose tokens stream to any reader.

Example:
    ``text = await model_call(ctx, f"model-{turn}", lambda resume: llm.stream(history, prefill=resume))``
"""

from fusee.ai.model_call import model_call as model_call

__all__ = ("model_call",)
