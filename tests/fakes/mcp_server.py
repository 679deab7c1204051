"""A tiny MCP server over stdio (the ``mcp`` package's ``MCPServer``) for the Pydantic AI
adapter's tests: one tool, ``stock(item)``, that appends a line to the file named by
``FAKE_MCP_LOG`` for each call, so a test counts the calls the server got, and a line
``start`` to ``FAKE_MCP_STARTS`` each time the process starts.

    python tests/fakes/mcp_server.py
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("warehouse")


@server.tool()
def stock(item: str) -> str:
    """How many of ``item`` are in stock."""
    log = os.environ.get("FAKE_MCP_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"stock {item}\n")
    return f"{item}: 7 in stock"


if __name__ == "__main__":
    starts = os.environ.get("FAKE_MCP_STARTS")
    if starts:
        with open(starts, "a") as f:
            f.write("start\n")
    server.run("stdio")
