"""The tool vocabulary, shared by the chat formats, the engine's call constraint, ``serve``,
the remote backend, the CLI and the GUI.

A :class:`Tool` is an OpenAI function definition (name, description, JSON-schema
parameters) plus where it comes from; a :class:`ToolCall` is one call the model made; a
:class:`ToolResult` is what running it gave. A :class:`ToolProvider` lists tools and runs
calls (built-in tools, one MCP server each); providers run off the worker thread and off the
UI thread, each call bounded by a timeout and a cancel event.
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from core.errors import SettingsError

__all__ = ["Tool", "ToolCall", "ToolResult", "ToolProvider", "ToolError", "MAX_TOOLS",
           "MAX_RESULT_CHARS", "tools_from_openai"]

#: Names as OpenAI accepts them (``^[a-zA-Z0-9_-]{1,64}$``).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128  # OpenAI's own limit on ``tools``
MAX_SCHEMA_CHARS = 64_000  # one tool's parameters, as JSON
MAX_RESULT_CHARS = 32_000  # what goes back into the prompt; longer results are cut and say so


class ToolError(SettingsError):
    """A tool declaration, call or result that cannot be used; the message says which."""


@dataclass(frozen=True)
class Tool:
    """One callable function. ``source`` says who runs it: ``"builtin"``, ``"mcp:NAME"``
    (an MCP server from the user's configuration) or ``"client"`` (declared by an API
    client, which runs it itself)."""
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    source: str = "client"

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ToolError(f"a tool name must be 1-64 letters, digits, '_' or '-', got {self.name!r:.80}")
        if not isinstance(self.description, str):
            raise ToolError(f"tool {self.name}: the description must be text")
        if not isinstance(self.parameters, dict):
            raise ToolError(f"tool {self.name}: parameters must be a JSON schema object")
        if len(json.dumps(self.parameters)) > MAX_SCHEMA_CHARS:
            raise ToolError(f"tool {self.name}: the parameter schema is over {MAX_SCHEMA_CHARS:,} characters")

    @classmethod
    def from_openai(cls, item: object, source: str = "client") -> "Tool":
        """From ``{"type": "function", "function": {name, description?, parameters?}}``
        (or the bare function object)."""
        if isinstance(item, dict) and item.get("type", "function") != "function":
            raise ToolError(f"only function tools are supported, got type {item.get('type')!r:.40}")
        fn = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise ToolError("a tool needs a function with a name")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        return cls(fn["name"], fn.get("description") or "", params, source)

    def to_openai(self) -> dict:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


def tools_from_openai(items: object, source: str = "client") -> list[Tool]:
    """A request's ``tools`` list, each checked, names unique."""
    if not isinstance(items, list):
        raise ToolError("tools must be a list")
    if len(items) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools, got {len(items)}")
    tools = [Tool.from_openai(item, source) for item in items]
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ToolError(f"tool names must be unique: {', '.join(dup)}")
    return tools


def new_call_id() -> str:
    """An id in OpenAI's shape (``call_`` + 24 characters)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is the parsed JSON object; ``raw`` the text the model wrote
    when it did not parse (then ``arguments`` is empty and ``error`` says why)."""
    name: str
    arguments: dict = field(default_factory=dict)
    id: str = field(default_factory=new_call_id)
    raw: str = ""
    error: str = ""

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.raw or json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back, as text for the model. ``truncated`` says it was cut to
    :data:`MAX_RESULT_CHARS`; ``is_error`` that the tool failed (the text says how)."""
    call_id: str
    name: str
    content: str
    is_error: bool = False
    truncated: bool = False

    @classmethod
    def bounded(cls, call: ToolCall, content: str, *, is_error: bool = False,
                limit: int = MAX_RESULT_CHARS) -> "ToolResult":
        cut = len(content) > limit
        if cut:
            content = content[:limit] + f"\n[… cut: the result was {len(content):,} characters, over {limit:,}]"
        return cls(call.id, call.name, content, is_error, cut)


class ToolProvider(Protocol):
    """Lists tools and runs calls to them. ``call`` blocks its caller (never the UI thread)
    until the result, the ``timeout`` or ``cancel``; a failure is a result with
    ``is_error`` set, never an exception, so a conversation always gets an answer."""

    name: str

    def tools(self) -> list[Tool]: ...

    def call(self, call: ToolCall, *, cancel: threading.Event, timeout: float) -> ToolResult: ...
