"""MCP servers for the tests and the bench, built with the SDK's own server API.

``python mcp_servers.py stdio``: the good server over stdio, misbehaving on request (its
tools ``hang``, ``die``, ``big``, ``drop``). ``python mcp_servers.py noisy``: the same after
printing lines that are not JSON-RPC on stdout (as servers that log to stdout do). ``python mcp_servers.py silent``: a
process that reads stdin and never answers. ``python mcp_servers.py liar``: answers every
request with JSON-RPC that is not a valid MCP result; ``rogue`` does so only for a tool call
(after a valid handshake). :func:`http_server` runs the good
server over streamable HTTP in a thread of the test process.
"""
from __future__ import annotations

import json
import os
import sys
import threading

BIG = 10 * 1024 * 1024


def build():
    import anyio  # why: the silent and lying servers must start fast, without the SDK
    from mcp.server.mcpserver import MCPServer  # why: as above

    app = MCPServer("testserver", log_level="WARNING")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        return a + b

    @app.tool(name="text.echo")
    def echo(text: str) -> str:
        """Say the text back (a name OpenAI would not accept as it is)."""
        return text

    @app.tool()
    def env(name: str) -> str:
        """An environment variable of the server's process."""
        return os.environ.get(name, "<unset>")

    @app.tool()
    async def hang(marker: str = "") -> str:
        """Never answers; writes ``marker`` (a file) when the client cancels the call."""
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            if marker:
                with open(marker, "w") as f:
                    f.write("cancelled")
            raise
        return ""

    @app.tool()
    def die() -> str:
        """The process exits in the middle of the call."""
        os._exit(3)

    @app.tool()
    def big() -> str:
        """A 10 MB result."""
        return "x" * BIG

    @app.tool()
    def drop(name: str) -> str:
        """Remove a tool from the server's list."""
        app.remove_tool(name)
        return f"removed {name}"

    @app.tool()
    def spare() -> str:
        """A tool the tests remove."""
        return "spare"

    @app.prompt()
    def review(code: str, language: str = "python") -> str:
        """Ask for a code review."""
        return f"Review this {language} code:\n{code}"

    @app.resource("note://readme", mime_type="text/markdown")
    def readme() -> str:
        """A short note."""
        return "# Read me\nhello from the server"

    @app.resource("note://long")
    def long_note() -> str:
        return "y" * 300_000

    @app.resource("note://logo", mime_type="image/png")
    def logo() -> bytes:
        return b"\x89PNG\r\n"

    return app


def silent() -> None:
    for _ in sys.stdin:
        pass


def liar() -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" in msg:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"bogus": [1, 2]}}) + "\n")
            sys.stdout.flush()


def rogue() -> None:
    """A hand-written server: a valid handshake and listing, then a tool whose answer is not
    a valid MCP result (``invalid``) and one that writes garbage on stdout before answering
    (``garble``)."""
    def send(mid, **body):
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, **body}) + "\n")
        sys.stdout.flush()
    tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("invalid", "garble")]
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue
        if method == "initialize":
            send(mid, result={"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                              "serverInfo": {"name": "rogue", "version": "1"}})
        elif method == "tools/list":
            send(mid, result={"tools": tools})
        elif method == "tools/call" and msg["params"]["name"] == "garble":
            sys.stdout.write("<<garbage mid-session>>\n")
            send(mid, result={"content": [{"type": "text", "text": "fine"}]})
        elif method == "tools/call":
            send(mid, result={"content": "not a list", "isError": "maybe"})
        else:
            send(mid, error={"code": -32601, "message": "Method not found"})


def http_server(port: int, token: str = "") -> tuple[threading.Thread, object]:
    """The good server on 127.0.0.1:``port``/mcp in a daemon thread; requests without
    ``Authorization: Bearer token`` (when given) get 401. Returns (thread, uvicorn server)."""
    import uvicorn  # why: only the HTTP tests need it

    app = build().streamable_http_app()
    if token:
        inner = app

        async def app(scope, receive, send):  # noqa: F811 - the checked app wraps the server's
            headers = dict(scope.get("headers") or [])
            if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            await inner(scope, receive, send)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return thread, server


def running_http_server(port: int, token: str = ""):
    """:func:`http_server` once it accepts connections: (url, stop)."""
    import time
    thread, server = http_server(port, token)
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)  # uvicorn in a thread has no ready event to wait on

    def stop():
        server.should_exit = True
        thread.join(5)
    return f"http://127.0.0.1:{port}/mcp", stop


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "noisy":
        os.write(1, b"Starting server v1.0...\n{not json either\n")
    if mode == "http":  # a child on a port, for a server that dies mid-call
        build().run("streamable-http", port=int(sys.argv[2]))
        sys.exit(0)
    {"stdio": lambda: build().run(), "noisy": lambda: build().run(), "silent": silent, "liar": liar,
     "rogue": rogue}[mode]()
