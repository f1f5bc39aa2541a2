"""Tool use in the history (issue 25): a reply's calls and each call's result as messages.

A reply that called tools keeps its calls in the ``tool_calls`` column, OpenAI-shaped
(``{"id", "type": "function", "function": {"name", "arguments"}}``) plus the ``source``
that runs each one ("builtin", "mcp:NAME"); every result is a message of its own with
role ``tool`` below the reply (the next result below it, the continued reply below the
last), its ``tool_result`` naming the call it answers. :func:`openai_message` turns a
stored message into what the worker and a server are sent.
"""
from __future__ import annotations

import json

from core.history.records import Message
from core.tools.spec import ToolCall, ToolResult

__all__ = ["stored_calls", "calls_of", "source_of", "result_record", "openai_message", "TOOL_ROLE"]

TOOL_ROLE = "tool"


def stored_calls(calls: list[ToolCall], sources: dict[str, str] | None = None) -> list[dict]:
    """The ``tool_calls`` column of a reply that made ``calls``; ``sources`` maps a tool's
    name to who runs it (a tool not in it: "" — unknown, e.g. removed meanwhile)."""
    out = []
    for c in calls:
        item = c.to_openai()
        item["source"] = (sources or {}).get(c.name, "")
        if c.error:
            item["error"] = c.error
        out.append(item)
    return out


def calls_of(m: Message) -> list[ToolCall]:
    """The calls a stored reply made, as :class:`ToolCall` (arguments parsed again; ones
    that do not parse keep their text in ``raw`` and say why in ``error``)."""
    out = []
    for item in m.tool_calls or []:
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        raw = fn.get("arguments")
        args, error = ({}, "")
        if isinstance(raw, dict):
            args, raw = raw, ""
        else:
            try:
                args = json.loads(raw or "{}")
                raw = "" if isinstance(args, dict) else raw
            except (TypeError, ValueError) as e:
                args, error = {}, f"the arguments are not valid JSON ({e})"
            if not isinstance(args, dict):
                args, error = {}, "the arguments are not a JSON object"
        error = error or str(item.get("error") or "")
        out.append(ToolCall(fn["name"], args, id=str(item.get("id") or ""), raw=raw or "", error=error))
    return out


def source_of(m: Message, call_id: str) -> str:
    """The source a stored reply recorded for its call ``call_id`` ("" when unknown)."""
    return next((str(c.get("source") or "") for c in m.tool_calls or []
                 if isinstance(c, dict) and c.get("id") == call_id), "")


def result_record(result: ToolResult, source: str = "") -> dict:
    """The ``tool_result`` column of the message that holds ``result`` (its text is the
    message's text)."""
    return {"call_id": result.call_id, "name": result.name, "source": source,
            "truncated": result.truncated, "is_error": result.is_error}


def openai_message(m: Message) -> dict:
    """A stored message as an OpenAI chat message: a reply with its ``tool_calls``, a
    tool message with its ``tool_call_id`` and ``name``."""
    if m.role == TOOL_ROLE:
        rec = m.tool_result or {}
        return {"role": "tool", "tool_call_id": str(rec.get("call_id") or ""), "name": str(rec.get("name") or ""),
                "content": m.text}
    msg: dict = {"role": m.role, "content": m.text}
    if m.role == "assistant" and m.tool_calls:
        msg["tool_calls"] = [{k: c[k] for k in ("id", "type", "function") if k in c}
                             for c in m.tool_calls if isinstance(c, dict)]
    return msg
