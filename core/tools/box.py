"""The tools of one chat: the enabled providers' tools under one set of names, and the
calls routed to whoever offers them.

A :class:`ToolBox` is itself a :class:`~core.tools.spec.ToolProvider`, so the generate loop,
``serve``'s local tools and the GUI take it where they take any provider. When two providers
offer the same name, each copy is renamed ``<provider>_<name>`` and :attr:`ToolBox.notes`
says so. Every call is bounded (timeout, cancel, result size) and recorded (:class:`ToolRun`:
which provider ran it, under which of its names, how long it took).
"""
from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Iterable

from core.errors import one_line
from core.tools.spec import MAX_RESULT_CHARS, MAX_TOOLS, Tool, ToolCall, ToolProvider, ToolResult

__all__ = ["ToolBox", "ToolRun", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 60.0
MAX_RUNS = 1000  # the record keeps the latest calls
_BAD = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class ToolRun:
    """One call as it happened: ``call`` under the box's name, ``provider`` the source that
    ran it (``builtin``, ``mcp:NAME``), ``tool`` the name that provider knows it by."""
    call: ToolCall
    result: ToolResult
    provider: str
    tool: str
    seconds: float


@dataclass(frozen=True)
class _Route:
    provider: ToolProvider
    tool: Tool  # as the provider names it


class ToolBox:
    """The tools of ``providers`` for one chat. ``timeout``: seconds per call when the caller
    gives none (else the provider's ``default_timeout``, else 60)."""

    name = "toolbox"

    def __init__(self, providers: Iterable[ToolProvider] = (), *, timeout: float | None = None,
                 max_result_chars: int = MAX_RESULT_CHARS):
        self.providers = list(providers)
        self.timeout = timeout
        self.max_result_chars = max_result_chars
        self.notes: list[str] = []  # renamed clashes, providers that could not list, tools left out
        self.runs: list[ToolRun] = []
        self._routes: dict[str, _Route] | None = None
        self._tools: list[Tool] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ listing
    def tools(self) -> list[Tool]:
        """The tools under the box's names (listed once; :meth:`refresh` lists again)."""
        with self._lock:
            if self._routes is None:
                self._list()
            return list(self._tools)

    def refresh(self) -> list[Tool]:
        with self._lock:
            self._routes = None
        return self.tools()

    def provider_of(self, name: str) -> str | None:
        """The source (``builtin``, ``mcp:NAME``) that runs the tool the box calls ``name``."""
        self.tools()
        route = (self._routes or {}).get(name)
        return route.tool.source if route else None

    def _list(self) -> None:
        notes: list[str] = []
        offered: list[tuple[ToolProvider, Tool]] = []
        # servers start on first listing (seconds each): list them all at once
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(self.providers))), thread_name_prefix="toolbox") as pool:
            listings = list(pool.map(_listing, self.providers))
        for p, listed in zip(self.providers, listings):
            if isinstance(listed, Exception):  # a provider that fails to list is said, not fatal
                notes.append(f"{_label(p)}: cannot list its tools: {one_line(listed)}")
                continue
            if getattr(p, "error", "") and not listed:
                notes.append(p.error)
            notes.extend(getattr(p, "notes", ()) or ())
            offered.extend((p, t) for t in listed)
        counts: dict[str, list[str]] = {}
        for p, t in offered:
            counts.setdefault(t.name, []).append(_label(p))
        routes: dict[str, _Route] = {}
        for p, t in offered:
            name = t.name
            if len(counts[name]) > 1:
                name = _unique(f"{_BAD.sub('_', getattr(p, 'name', '') or 'tools')}_{t.name}"[:64], routes)
            else:
                name = _unique(name, routes)
            routes[name] = _Route(p, t)
        for name, owners in counts.items():
            if len(owners) > 1:
                renamed = [n for n, r in routes.items() if r.tool.name == name]
                notes.append(f"the tool '{name}' is offered by {', '.join(owners)}: "
                             f"they are named {', '.join(renamed)}")
        if len(routes) > MAX_TOOLS:
            notes.append(f"{len(routes)} tools are enabled; the first {MAX_TOOLS} are offered to the model")
            routes = dict(list(routes.items())[:MAX_TOOLS])
        self._routes, self.notes = routes, notes
        self._tools = [r.tool if r.tool.name == n else replace(r.tool, name=n) for n, r in routes.items()]

    # ------------------------------------------------------------------ calling
    def call(self, call: ToolCall, *, cancel: threading.Event | None = None,
             timeout: float | None = None) -> ToolResult:
        """Run ``call`` with whoever offers its tool; never raises: an unknown tool, a
        provider's failure, a timeout or a cancel is a result with ``is_error`` set."""
        self.tools()
        route = (self._routes or {}).get(call.name)
        start = time.perf_counter()
        if route is None:
            known = ", ".join(self._routes or {}) or "none"
            result = ToolResult.bounded(call, f"there is no tool named '{call.name}' (the tools are: {known})",
                                        is_error=True, limit=self.max_result_chars)
            self._record(call, result, "", call.name, start)
            return result
        if cancel is not None and cancel.is_set():
            result = ToolResult.bounded(call, f"the call to '{call.name}' was cancelled", is_error=True)
            self._record(call, result, route.tool.source, route.tool.name, start)
            return result
        limit = timeout if timeout is not None else self.timeout
        if limit is None:
            limit = getattr(route.provider, "default_timeout", DEFAULT_TIMEOUT)
        inner = replace(call, name=route.tool.name)
        try:
            got = route.provider.call(inner, cancel=cancel if cancel is not None else threading.Event(),
                                      timeout=limit)
            content, is_error, cut = got.content, got.is_error, got.truncated
        except Exception as e:  # the protocol says providers do not raise; one that does still answers
            content, is_error, cut = f"{_label(route.provider)}: '{route.tool.name}' failed: {one_line(e)}", True, False
        result = ToolResult.bounded(call, content, is_error=is_error, limit=self.max_result_chars)
        if cut and not result.truncated:
            result = replace(result, truncated=True)
        self._record(call, result, route.tool.source, route.tool.name, start)
        return result

    def _record(self, call: ToolCall, result: ToolResult, provider: str, tool: str, start: float) -> None:
        with self._lock:
            self.runs.append(ToolRun(call, result, provider, tool, time.perf_counter() - start))
            del self.runs[:-MAX_RUNS]

    def close(self) -> None:
        """Close the providers that hold something open (MCP sessions)."""
        for p in self.providers:
            close = getattr(p, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass


def _listing(provider: ToolProvider) -> list[Tool] | Exception:
    try:
        return list(provider.tools())
    except Exception as e:  # noqa: BLE001 - reported by the caller
        return e


def _label(provider: ToolProvider) -> str:
    source = getattr(provider, "source", "")
    return source or getattr(provider, "name", "") or type(provider).__name__


def _unique(name: str, taken: dict) -> str:
    out, n = name, 2
    while out in taken:
        out = f"{name[:60]}_{n}"
        n += 1
    return out
