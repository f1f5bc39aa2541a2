"""Tools: what running a tool costs beyond the tool itself.

MCP round trip: one ``tools/call`` of a trivial tool (``add``) through
:class:`core.tools.mcp_client.McpServer` — the caller's thread, the hub's event loop, the
SDK's session, the transport, the server and back — over stdio (a child process) and
streamable HTTP (a server on loopback), per call p50/p99; beside it the same call through
the SDK directly from asyncio (no thread hop), so the hub's own share shows, and a built-in
tool (the calculator, in process). Also: starting a stdio server (spawn + handshake), and one
10 MB answer through our stdio transport against the SDK's (whose reader is quadratic).
Then the share of valid calls with the call constraint on and off (bench/tool_validity.py).

    python bench/bench_tools.py [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.tools.builtin import BuiltinTools  # noqa: E402
from core.tools.config import ServerConfig  # noqa: E402
from core.tools.mcp_client import McpHub, McpServer  # noqa: E402
from core.tools.spec import ToolCall  # noqa: E402
from bench.tool_validity import validity_section  # noqa: E402

BIG = 10 * 1024 * 1024


def serve(transport: str, port: int = 0) -> None:
    """The benchmark's MCP server: ``add`` and a 10 MB ``big``."""
    from mcp.server.mcpserver import MCPServer  # why: only the server process needs it

    app = MCPServer("bench", log_level="WARNING")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @app.tool()
    def big() -> str:
        """A 10 MB answer."""
        return "x" * BIG

    if transport == "stdio":
        app.run()
    else:
        app.run("streamable-http", port=port)


def _stdio_config(name: str = "bench") -> ServerConfig:
    return ServerConfig(name, command=sys.executable, args=(str(Path(__file__).resolve()), "--serve", "stdio"))


def percentiles(seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {"p50_ms": statistics.median(ms), "p99_ms": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
            "n": len(ms)}


def time_calls(provider, n: int, name: str = "add", args: dict | None = None) -> list[float]:
    args = args if args is not None else {"a": 1, "b": 2}
    cancel, out = threading.Event(), []
    for _ in range(n):
        t = time.perf_counter()
        result = provider.call(ToolCall(name, args), cancel=cancel, timeout=30)
        out.append(time.perf_counter() - t)
        assert not result.is_error, result.content
    return out


async def _interleaved(target, ours, n: int, big: bool) -> tuple[list[float], list[float], float]:
    """Per-call seconds through ``ours`` (an McpServer, from a worker thread, as the app calls
    it) and through the SDK's Client directly, in alternating blocks so load hits both alike."""
    from mcp import Client  # why: the direct-SDK baseline only
    block, sdk, mine = max(1, min(20, n)), [], []
    async with Client(target, cache=None) as client:
        await client.call_tool("add", {"a": 1, "b": 2})
        while len(sdk) < n:
            for _ in range(min(block, n - len(sdk))):
                t = time.perf_counter()
                await client.call_tool("add", {"a": 1, "b": 2})
                sdk.append(time.perf_counter() - t)
            mine += await asyncio.to_thread(time_calls, ours, min(block, n - len(mine)))
        big_s = 0.0
        if big:
            t = time.perf_counter()
            await client.call_tool("big", {})
            big_s = time.perf_counter() - t
        return mine, sdk, big_s


def _http_server() -> tuple[str, object]:
    import socket

    import uvicorn  # why: the HTTP case only
    from mcp.server.mcpserver import MCPServer  # why: as above

    app = MCPServer("bench-http", log_level="WARNING")

    @app.tool()
    def add(a: int, b: int) -> int:
        return a + b

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app.streamable_http_app(), host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)  # uvicorn in a thread offers no ready event
    return f"http://127.0.0.1:{port}/mcp", server


def measure(quick: bool) -> dict:
    from mcp import StdioServerParameters  # why: the direct-SDK baseline only
    n = 5 if quick else 400
    hub = McpHub()
    data: dict = {}
    try:
        starts = []
        for i in range(0 if quick else 4):
            s = McpServer(_stdio_config(f"start{i}"), hub=hub)
            t = time.perf_counter()
            s.start()
            starts.append(time.perf_counter() - t)
            s.close()
        stdio = McpServer(_stdio_config(), hub=hub)
        t = time.perf_counter()
        stdio.start()
        data["stdio_start_s"] = statistics.median([*starts, time.perf_counter() - t])
        params = StdioServerParameters(command=sys.executable, args=[str(Path(__file__).resolve()), "--serve", "stdio"])
        if quick:  # one server process fewer: the stdio baseline needs its own
            data["stdio"] = percentiles(time_calls(stdio, n))
        else:
            mine, sdk, big_sdk = asyncio.run(_interleaved(params, stdio, n, big=True))
            data["stdio"], data["stdio_sdk"] = percentiles(mine), percentiles(sdk)
            data["big_sdk_s"] = big_sdk
            t = time.perf_counter()
            r = stdio.call(ToolCall("big"), cancel=threading.Event(), timeout=120)
            data["big_ours_s"] = time.perf_counter() - t
            assert r.truncated, r.content[:200]
        stdio.close()
        url, server = _http_server()
        try:
            http = McpServer(ServerConfig("bench-http", url=url), hub=hub)
            http.start()
            mine, sdk, _ = asyncio.run(_interleaved(url, http, n, big=False))
            data["http"], data["http_sdk"] = percentiles(mine), percentiles(sdk)
            http.close()
        finally:
            server.should_exit = True
        calc = BuiltinTools(["calculator"])
        data["builtin"] = percentiles(time_calls(calc, n, "calculator", {"expression": "(17*23)^2"}))
        data["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    finally:
        hub.close()
    return data


def mcp_section(quick: bool) -> dict:
    d = measure(quick)
    rows = [("stdio, through McpServer (thread → hub loop → SDK)", d["stdio"]),
            *([("stdio, the SDK directly from asyncio", d["stdio_sdk"])] if "stdio_sdk" in d else []),
            ("streamable HTTP, through McpServer", d["http"]),
            ("streamable HTTP, the SDK directly from asyncio", d["http_sdk"]),
            ("built-in calculator (in process)", d["builtin"])]
    md = ["| one tool call (`add`) | p50 ms | p99 ms | calls |", "|---|---:|---:|---:|"]
    md += [f"| {label} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['n']} |" for label, r in rows]
    base = "stdio" if "stdio_sdk" in d else "http"
    hop = d[base]["p50_ms"] - d[f"{base}_sdk"]["p50_ms"]
    md += ["", f"Starting a stdio server (spawn a Python MCP server + handshake): {d['stdio_start_s']:.2f} s (median). "
           f"Through McpServer a {base} call costs {hop:+.2f} ms at p50 against the SDK alone (the thread hop to "
           "the hub's loop and back); the two were measured in alternating blocks of 20."]
    if "big_ours_s" in d:
        md.append(f"One 10 MB answer over stdio: {d['big_ours_s']:.2f} s through our transport (then cut to what "
                  f"the model sees) against {d['big_sdk_s']:.2f} s through the SDK's `stdio_client`, whose "
                  "reader re-splits its whole buffer for every chunk.")
    load = d.get("load_average")
    md.append("The machine is shared with other jobs: p99 includes their interference"
              + (f" (load average {load:.1f} on {os.cpu_count()} cores at the end of this run)." if load else "."))
    return {"title": "Tools: MCP round trip", "markdown": "\n".join(md), "data": d}


def run(quick: bool) -> dict:
    """The bench's section(s) for ``python -m bench``."""
    return mcp_section(quick)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few calls: checks the plumbing")
    ap.add_argument("--serve", choices=["stdio", "http"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        serve(a.serve, a.port)
        return 0
    for section in (run(a.quick), validity_section(a.quick)):  # validity: bench/tool_validity.py
        print(f"### {section['title']}\n\n{section['markdown']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
