"""An MCP server written with the official SDK (its `MCPServer`, once FastMCP), for the tests of MCP tools.

    python tests/mcp_server.py                 # over stdio
    python tests/mcp_server.py http PORT       # streamable HTTP on 127.0.0.1:PORT, path /mcp

Honest tools (add, a counter that keeps state in the process, a lookup of one text argument) and hostile ones: a
call that hangs, one that kills the server mid-call, a 10 MB reply, a line of garbage on stdout where JSON-RPC
belongs, and a flood of standard error.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("arpo-test")
COUNTER = {"value": 0}


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def bump(by: int = 1) -> int:
    """Add `by` to the counter this server keeps, and return the counter."""
    COUNTER["value"] += by
    return COUNTER["value"]


@server.tool()
def define(term: str) -> str:
    """Look a term up in the glossary."""
    return {"ARPO": "Agentic Reinforced Policy Optimization"}.get(term, f"no entry for {term}")


@server.tool()
def pid() -> int:
    """The server's process id (the tests count servers by it)."""
    return os.getpid()


@server.tool()
def hang() -> str:
    """Never answers."""
    time.sleep(3600)
    return "late"


@server.tool()
def crash() -> str:
    """Exits the server in the middle of the call."""
    os._exit(3)


@server.tool()
def huge() -> str:
    """A 10 MB reply."""
    return "x" * 10_000_000


@server.tool()
def garbage() -> str:
    """Writes a line that is not JSON-RPC where the client reads JSON-RPC, then never answers."""
    sys.stdout.write("{this is not json\n")
    sys.stdout.flush()
    time.sleep(3600)
    return "late"


@server.tool()
def shout() -> str:
    """Floods standard error with 5 MB, then answers."""
    sys.stderr.write("noise " * 900_000)
    sys.stderr.flush()
    return "done"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
