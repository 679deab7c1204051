"""Test helpers for code built on fusee: a scripted model for offline agent tests.

Example:
    ``model = ScriptedModel(["Hello", tool_call("search", q="x"), {"category": "bug"}])``
"""

from fusee.testing.scripted_model import Reply as Reply
from fusee.testing.scripted_model import ScriptedCall as ScriptedCall
from fusee.testing.scripted_model import ScriptedModel as ScriptedModel
from fusee.testing.scripted_model import Streamed as Streamed
from fusee.testing.scripted_model import tool_call as tool_call

__all__ = ("ScriptedModel", "Streamed", "ScriptedCall", "Reply", "tool_call")
