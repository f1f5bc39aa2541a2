"""MCP servers as tool providers, over the official ``mcp`` SDK (stdio and streamable HTTP).

The SDK is asyncio; LlamaDesk's callers are threads (the GUI's thread pool, the CLI, the
generate loop). One background thread runs one event loop (:class:`McpHub`) that owns every
session; :class:`McpServer`'s methods are synchronous, thread-safe, and each waits at most
its timeout and stops waiting when its cancel event is set. Never call them on the UI thread.

A server starts on first use. Whatever goes wrong (the command is missing, the server exits
or never answers, sends garbage or a 10 MB result, or no longer has the tool called) comes
back as a :class:`ToolResult` with ``is_error`` (``call``) or an :class:`McpError` (the other
methods), one line naming the server; the next call starts the server again when it died.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import sys
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Awaitable, Callable

import httpx2
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from core.errors import one_line
from core.tools.config import ServerConfig
from core.tools.mcp_stdio import MAX_MESSAGE_BYTES, StdioStats, bounded_stdio
from core.tools.mcp_shapes import (MAX_RESOURCE_CHARS, McpError, McpPrompt, McpResource, PromptArgument,
                                   ResourceText, blob_text, blocks_text, prompt_text, tool_name)
from core.tools.spec import MAX_RESULT_CHARS, MAX_TOOLS, Tool, ToolCall, ToolError, ToolResult

__all__ = ["McpError", "McpHub", "McpServer", "McpPrompt", "PromptArgument", "McpResource", "ResourceText",
           "MAX_RESOURCE_CHARS", "prompt_text"]

MAX_LISTED = 1024  # tools, prompts or resources one server may list
MAX_PAGES = 50
MAX_STDERR_BYTES = 4 << 20  # a server's log kept for error messages
_CLOSE_TIMEOUT = 8.0  # the SDK's own stdio shutdown is bounded at about 6 s
_POLL = 0.05  # how often a waiting caller looks at its cancel event
# The SDK logs a traceback for each line a server writes that is not JSON-RPC; a server that
# logs to stdout would fill the terminal. What matters is said per server instead (notes).
logging.getLogger("mcp").addHandler(logging.NullHandler())




# ----------------------------------------------------------------------------- the loop

class McpHub:
    """One daemon thread running one asyncio loop that owns every MCP session."""

    _shared: "McpHub | None" = None
    _shared_lock = threading.Lock()

    def __init__(self):
        self._loop = asyncio.new_event_loop()
        self._servers: "set[McpServer]" = set()
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-hub", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> "McpHub":
        """The process's hub, started on first use; its servers are stopped at exit."""
        with cls._shared_lock:
            if cls._shared is None or not cls._shared._thread.is_alive():
                cls._shared = cls()
                atexit.register(cls._shared.close)
            return cls._shared

    def run(self, make: Callable[[], Awaitable[Any]], *, timeout: float, cancel: threading.Event | None,
            what: str) -> Any:
        """Run ``make()`` on the loop and wait for it: at most ``timeout`` seconds (then
        :class:`McpError` "… did not answer within …"), less if ``cancel`` is set."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("McpHub.run called on the hub's own thread")
        fut = asyncio.run_coroutine_threadsafe(make(), self._loop)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return fut.result(timeout=max(0.0, min(_POLL if cancel is not None else left, left)))
            except (concurrent.futures.TimeoutError, TimeoutError):
                if fut.done():
                    raise
            except concurrent.futures.CancelledError:
                raise McpError(f"{what}: cancelled") from None
            if cancel is not None and cancel.is_set():
                fut.cancel()
                raise McpError(f"{what}: cancelled")
            if time.monotonic() >= deadline:
                fut.cancel()
                raise McpError(f"{what} did not answer within {timeout:g} s")

    def close(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        """Stop every server (bounded), then the loop."""
        if not self._thread.is_alive():
            return
        servers = list(self._servers)
        if servers:
            async def stop_all():
                await asyncio.gather(*(s._stop_owner() for s in servers), return_exceptions=True)
            try:
                asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(timeout)
            except Exception:
                pass  # a server that would not stop in time is killed with its process group at exit
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


# ----------------------------------------------------------------------------- one server

class McpServer:
    """One configured MCP server as a :class:`ToolProvider` (plus its prompts and resources).

    ``status``: "stopped", "ready" or "failed" (then ``error`` says why, one line)."""

    def __init__(self, config: ServerConfig, *, hub: McpHub | None = None,
                 max_result_chars: int = MAX_RESULT_CHARS):
        self.config = config
        self.name = config.name
        self.source = f"mcp:{config.name}"
        self.hub = hub or McpHub.shared()
        self.max_result_chars = max_result_chars
        self.status = "stopped"
        self.error = ""
        self.notes: list[str] = []  # tools left out (bad name or schema) and why
        self._client: Client | None = None
        self._owner: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._starting: asyncio.Future | None = None
        self._names: dict[str, str] = {}  # our tool name -> the server's
        self._listed: list[Tool] = []
        self.stats = StdioStats()
        self.http_status = 0  # the last HTTP error status the server answered (the SDK hides it)
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") \
            if config.kind == "stdio" else None

    def __repr__(self):
        return f"McpServer({self.name!r}, {self.status})"

    @property
    def default_timeout(self) -> float:
        return self.config.timeout

    # ---------------------------------------------------------------- synchronous API
    def start(self, *, cancel: threading.Event | None = None) -> None:
        """Start the server and handshake (no-op when it runs); McpError when it cannot."""
        self._run(self._ensure, self.config.start_timeout + 1.0, cancel, "starting")

    def list_tools(self, *, cancel: threading.Event | None = None, timeout: float | None = None) -> list[Tool]:
        """The server's tools with their schemas, under names OpenAI accepts."""
        return self._run(self._list_tools, self._budget(timeout), cancel, "listing tools")

    def cached_tools(self) -> list[Tool]:
        """The tools of the last listing, without any I/O (safe on the UI thread)."""
        return list(self._listed)

    def tools(self) -> list[Tool]:
        """:meth:`list_tools`, or none when the server cannot be reached (``error`` says why).
        It may start the server: not on the UI thread (see :meth:`cached_tools`)."""
        try:
            return self.list_tools()
        except McpError:
            return []

    def call(self, call: ToolCall, *, cancel: threading.Event | None = None,
             timeout: float | None = None) -> ToolResult:
        """Run one tool call; every failure is a result with ``is_error`` saying what happened."""
        if call.error:
            return ToolResult.bounded(call, f"the call's arguments are not valid JSON: {call.error}", is_error=True)
        timeout = self.config.timeout if timeout is None else timeout
        try:
            if not self._names:
                self.list_tools(cancel=cancel)
            remote = self._names.get(call.name)
            if remote is None:
                return ToolResult.bounded(call, f"MCP server '{self.name}' has no tool '{call.name}' (its tools: "
                                          f"{', '.join(self._names)[:300] or 'none'})", is_error=True)
            text, is_error = self._run(lambda: self._call(remote, call.arguments), self._budget(timeout),
                                       cancel, f"tool '{call.name}'")
        except McpError as e:
            text, is_error = str(e), True
            if self._names.get(call.name):
                text = self._gone_or(call.name, text, cancel)
        else:
            if is_error:
                text = self._gone_or(call.name, text, cancel)
        self._bound_stderr()
        return ToolResult.bounded(call, text, is_error=is_error, limit=self.max_result_chars)

    def prompts(self, *, cancel: threading.Event | None = None, timeout: float | None = None) -> list[McpPrompt]:
        return self._run(self._prompts, self._budget(timeout), cancel, "listing prompts")

    def get_prompt(self, name: str, arguments: dict[str, str] | None = None, *,
                   cancel: threading.Event | None = None, timeout: float | None = None) -> list[dict[str, str]]:
        """The prompt's messages as ``[{"role": "user"|"assistant", "content": text}]``."""
        args = {str(k): str(v) for k, v in (arguments or {}).items()}
        return self._run(lambda: self._get_prompt(name, args), self._budget(timeout), cancel, f"prompt '{name}'")

    def resources(self, *, cancel: threading.Event | None = None,
                  timeout: float | None = None) -> list[McpResource]:
        return self._run(self._resources, self._budget(timeout), cancel, "listing resources")

    def read_resource(self, uri: str, *, cancel: threading.Event | None = None, timeout: float | None = None,
                      limit: int = MAX_RESOURCE_CHARS) -> ResourceText:
        """The resource as text to attach to a message, cut at ``limit`` characters (and saying so)."""
        return self._run(lambda: self._read(uri, limit), self._budget(timeout), cancel, f"resource {uri[:80]}")

    def stderr_tail(self, chars: int = 2000) -> str:
        """The end of what a stdio server wrote on stderr (its log), for a details view."""
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0, 2)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - chars))
            return self._stderr.read()
        except (OSError, ValueError):
            return ""

    def _bound_stderr(self) -> None:
        """A chatty server's log must not fill the disk: past the bound it starts over (the
        child shares the file offset, so it writes from the start again)."""
        try:
            if self._stderr is not None and os.fstat(self._stderr.fileno()).st_size > MAX_STDERR_BYTES:
                self._stderr.truncate(0)
                self._stderr.seek(0)
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Stop the server (its process, or its HTTP session); it starts again on next use."""
        try:
            self.hub.run(self._stop_owner, timeout=_CLOSE_TIMEOUT + 1, cancel=None, what="stopping")
        except McpError:
            pass
        self.status = "stopped"

    # ---------------------------------------------------------------- helpers (threads)
    def _budget(self, timeout: float | None) -> float:
        # a call that must start the server first gets the start's time too
        base = self.config.timeout if timeout is None else timeout
        return base if self.status == "ready" else base + self.config.start_timeout

    def _run(self, make, timeout: float, cancel, what: str):
        try:
            return self.hub.run(make, timeout=timeout, cancel=cancel, what=f"MCP server '{self.name}': {what}")
        except McpError:
            raise
        except Exception as e:  # noqa: BLE001 - the SDK raises many types; each becomes one line
            raise McpError(self._describe(e, what)) from None

    def _gone_or(self, name: str, message: str, cancel) -> str:
        """``message``, or that the tool was removed when a fresh listing lacks it."""
        if "cancelled" in message or self.status != "ready":
            return message
        try:
            self.list_tools(cancel=cancel, timeout=min(self.config.timeout, 5.0))
        except McpError:
            return message
        if name not in self._names:
            now = ", ".join(self._names) or "none"
            return f"MCP server '{self.name}' no longer offers the tool '{name}' (its tools now: {now[:300]})"
        return message

    def _describe(self, exc: BaseException, what: str) -> str:
        exc = _root(exc)
        head = f"MCP server '{self.name}'"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
            text = f"{head} closed the connection ({what})"
        elif isinstance(exc, FileNotFoundError):
            text = f"{head} did not start: no program '{self.config.command}' (is it installed and on PATH?)"
        elif isinstance(exc, PermissionError):
            text = f"{head} did not start: '{self.config.command}' cannot be run (permission denied)"
        elif isinstance(exc, httpx2.HTTPStatusError) or (isinstance(exc, MCPError) and self.http_status):
            status = exc.response.status_code if isinstance(exc, httpx2.HTTPStatusError) else self.http_status
            hint = " (check its headers: a token may be missing or wrong)" if status in (401, 403) else ""
            text = f"{head} answered HTTP {status} ({what}){hint}"
        elif isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
            text = f"{head} cannot be reached at {self.config.url} ({one_line(exc, 120)})"
        elif isinstance(exc, ValidationError):
            text = f"{head} sent an answer that is not valid MCP ({what}): {exc.title}, {exc.error_count()} errors"
        elif isinstance(exc, MCPError):
            text = f"{head}: {what} failed: {one_line(exc, 200)}"
        else:
            text = f"{head}: {what} failed: {type(exc).__name__}: {one_line(exc, 200)}"
        # the server's last words explain a death or a failed start, not a failed request
        closed = isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED
        last = self._last_stderr_line() if closed or what == "starting" else ""
        return f"{text}; it said: {last}" if last else text

    async def _saw_response(self, response) -> None:
        if response.status_code >= 400:
            self.http_status = response.status_code

    def _last_stderr_line(self) -> str:
        lines = [ln.strip() for ln in self.stderr_tail(1000).splitlines() if ln.strip()]
        return one_line(lines[-1], 160) if lines else ""

    # ---------------------------------------------------------------- on the loop
    async def _ensure(self) -> Client:
        """The live session: started once even when several callers ask at the same time."""
        if self._client is not None:
            return self._client
        if self._starting is None or self._starting.done():
            self._starting = asyncio.get_running_loop().create_task(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> Client:
        self.hub._servers.add(self)
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even when abandoned
        self._stop = asyncio.Event()
        self._owner = loop.create_task(self._own(ready, self._stop))
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.config.start_timeout)
        except asyncio.TimeoutError:
            self._background(self._detach())
            self._fail(f"MCP server '{self.name}' did not start within {self.config.start_timeout:g} s")
        except Exception as e:  # noqa: BLE001 - see _describe
            self._background(self._detach())
            self._fail(self._describe(e, "starting").replace(": starting failed:", " did not start:"))
        self.status, self.error = "ready", ""
        return client

    def _background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.hub._tasks.add(task)  # a task nobody holds can be collected mid-way
        task.add_done_callback(self.hub._tasks.discard)

    def _fail(self, message: str):
        self.status, self.error = "failed", message
        raise McpError(message)

    async def _own(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Holds the session open from its own task (the SDK's task groups need one owner)."""
        try:
            async with Client(self._transport(), mode="auto", cache=None) as client:
                self._client = client
                ready.set_result(client)
                await stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported, never raised on the loop
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else McpError("the session ended"))
            elif not stop.is_set():
                self.status, self.error = "failed", self._describe(e, "running")
        finally:
            if self._stop is stop:  # not a newer session's
                self._client = None

    def _transport(self):
        if self.config.kind == "http":
            return _http_transport(self.config.url, self.config.headers, self._saw_response)
        c = self.config
        if sys.platform == "win32":  # the SDK's transport knows Job Objects and .cmd shims
            params = StdioServerParameters(command=c.command, args=list(c.args), env=dict(c.env) or None,
                                           cwd=c.cwd or None)
            return stdio_client(params, errlog=self._stderr)
        return bounded_stdio(c.command, list(c.args), dict(c.env), c.cwd or None, self._stderr, self.stats)

    def _detach(self) -> Awaitable[None]:
        """Let go of the session now (the next use starts a new one); the returned
        coroutine waits, bounded, for the old one to wind down."""
        owner, stop = self._owner, self._stop
        self._owner = self._stop = None
        self._client = None
        if stop is not None:
            stop.set()
        self.hub._servers.discard(self)
        return _wind_down(owner)

    async def _stop_owner(self) -> None:
        await self._detach()

    async def _dead(self, exc: BaseException) -> None:
        """After a lost connection: stop what is left so the next use starts afresh."""
        if isinstance(_root(exc), MCPError) and _root(exc).code == CONNECTION_CLOSED:
            self.status, self.error = "failed", self._describe(exc, "running")
            self._background(self._detach())

    async def _session_call(self, fn):
        client = await self._ensure()
        try:
            return await fn(client)
        except BaseException as e:
            await self._dead(e)
            raise

    async def _pages(self, fetch, items_of) -> list:
        out, cursor = [], None
        for _ in range(MAX_PAGES):
            page = await self._session_call(lambda c: fetch(c, cursor))
            out.extend(items_of(page))
            cursor = page.next_cursor
            if not cursor or len(out) >= MAX_LISTED:
                break
        return out[:MAX_LISTED]

    async def _list_tools(self) -> list[Tool]:
        listed = await self._pages(lambda c, cur: c.list_tools(cursor=cur), lambda p: p.tools)
        tools, names, notes = [], {}, []
        for t in listed:
            name = tool_name(t.name, names)
            try:
                tools.append(Tool(name, (t.description or "")[:4000], dict(t.input_schema or {}), self.source))
            except ToolError as e:
                notes.append(f"MCP server '{self.name}': tool '{t.name[:64]}' left out: {e}")
                continue
            names[name] = t.name
        if len(tools) > MAX_TOOLS:
            notes.append(f"MCP server '{self.name}' lists {len(tools)} tools; the first {MAX_TOOLS} are used")
            tools = tools[:MAX_TOOLS]
            names = {t.name: names[t.name] for t in tools}
        if self.stats.garbage_lines:
            notes.append(f"MCP server '{self.name}' wrote {self.stats.garbage_lines} lines on stdout that are not "
                         f"MCP messages (the last: {self.stats.last_garbage[:80]!r}); they were skipped")
        self._names, self.notes, self._listed = names, notes, tools
        return tools

    async def _call(self, remote: str, arguments: dict) -> tuple[str, bool]:
        result = await self._session_call(lambda c: c.call_tool(remote, arguments))
        text = blocks_text(result.content)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        return text, bool(result.is_error)

    async def _prompts(self) -> list[McpPrompt]:
        listed = await self._pages(lambda c, cur: c.list_prompts(cursor=cur), lambda p: p.prompts)
        return [McpPrompt(self.name, p.name, p.description or "", tuple(
            PromptArgument(a.name, a.description or "", bool(a.required)) for a in (p.arguments or ())))
            for p in listed]

    async def _get_prompt(self, name: str, args: dict[str, str]) -> list[dict[str, str]]:
        result = await self._session_call(lambda c: c.get_prompt(name, args))
        out, total = [], 0
        for m in result.messages:
            text = blocks_text([m.content])
            total += len(text)
            if total > MAX_RESOURCE_CHARS:
                raise McpError(f"MCP server '{self.name}': prompt '{name}' is over {MAX_RESOURCE_CHARS:,} characters")
            out.append({"role": str(m.role), "content": text})
        return out

    async def _resources(self) -> list[McpResource]:
        listed = await self._pages(lambda c, cur: c.list_resources(cursor=cur), lambda p: p.resources)
        return [McpResource(self.name, str(r.uri), r.name, r.description or "", r.mime_type or "", r.size)
                for r in listed]

    async def _read(self, uri: str, limit: int) -> ResourceText:
        result = await self._session_call(lambda c: c.read_resource(uri))
        parts, mime = [], ""
        for item in result.contents:
            mime = mime or (item.mime_type or "")
            text = getattr(item, "text", None)
            if text is None:
                text = blob_text(item, self.name)
            parts.append(text)
        text = "\n".join(parts)
        cut = len(text) > limit
        if cut:
            text = text[:limit] + f"\n[… cut: the resource is {len(text):,} characters, over {limit:,}]"
        return ResourceText(uri, text, mime, cut)


async def _wind_down(owner: asyncio.Task | None) -> None:
    if owner is None or owner.done():
        return
    try:
        await asyncio.wait_for(asyncio.shield(owner), _CLOSE_TIMEOUT)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - stopping is best effort
        owner.cancel()


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str], on_response):
    # our own HTTP client so the configured headers go with every request
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0),
                                  event_hooks={"response": [on_response]}) as http:
        async with streamable_http_client(url, http_client=http, max_sse_event_size=MAX_MESSAGE_BYTES) as streams:
            yield streams


def _root(exc: BaseException) -> BaseException:
    """The first real cause inside the SDK's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc
