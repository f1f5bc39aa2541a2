"""What an MCP server's answers become here: prompt templates, resources, and the text a
tool result, a prompt or a resource gives the model or the prompt editor. No SDK import:
the GUI takes these shapes without loading the MCP client."""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from core.tools.spec import ToolError

__all__ = ["McpError", "PromptArgument", "McpPrompt", "McpResource", "ResourceText", "prompt_text",
           "MAX_RESOURCE_CHARS", "tool_name", "blocks_text", "blob_text"]

MAX_RESOURCE_CHARS = 200_000  # a resource attached to a message
_BAD_NAME = re.compile(r"[^A-Za-z0-9_-]")


class McpError(ToolError):
    """An MCP server that could not do what was asked; one line naming the server."""


@dataclass(frozen=True)
class PromptArgument:
    name: str
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class McpPrompt:
    """A prompt template a server offers; ``get_prompt`` fills it in."""
    server: str
    name: str
    description: str = ""
    arguments: tuple[PromptArgument, ...] = ()


@dataclass(frozen=True)
class McpResource:
    """Something a server can be asked to read (a file, a record) and attach to a message."""
    server: str
    uri: str
    name: str
    description: str = ""
    mime_type: str = ""
    size: int | None = None


@dataclass(frozen=True)
class ResourceText:
    uri: str
    text: str
    mime_type: str = ""
    truncated: bool = False


def prompt_text(messages: list[dict[str, str]]) -> str:
    """A filled-in prompt as one text to put in the prompt editor: a lone user message as it
    is, several messages each under its role."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def tool_name(name: str, taken: dict) -> str:
    """An OpenAI-valid name for an MCP tool (MCP allows dots and longer names)."""
    base = _BAD_NAME.sub("_", name)[:64] or "tool"
    out, n = base, 2
    while out in taken:
        out = f"{base[:60]}_{n}"
        n += 1
    return out


def blocks_text(blocks) -> str:
    parts = []
    for b in blocks or ():
        kind = getattr(b, "type", "")
        if kind == "text":
            parts.append(b.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {b.mime_type}, {len(b.data) * 3 // 4:,} bytes, not shown to the model]")
        elif kind == "resource":
            res = b.resource
            parts.append(res.text if hasattr(res, "text") else f"[binary resource {res.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {b.uri}: {b.name}]")
    return "\n".join(parts)


def blob_text(item, server: str) -> str:
    mime = (item.mime_type or "").lower()
    if not (mime.startswith("text/") or mime in ("application/json", "application/xml")):
        raise McpError(f"MCP server '{server}': {item.uri} is binary ({mime or 'unknown type'}), "
                       "not text that can be attached")
    try:
        return base64.b64decode(item.blob).decode("utf-8", "replace")
    except ValueError:
        raise McpError(f"MCP server '{server}': {item.uri} is not valid base64") from None
