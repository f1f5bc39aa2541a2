"""Tool calling against an OpenAI-compatible server (vLLM, llama.cpp, LlamaDesk's serve):
the request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``, and a streamed reply's
``tool_calls`` deltas gathered back into :class:`ToolCall` s, checked against the tools as a
local reply's are (an unknown tool or arguments that do not fit say so in ``error``).
The calls then run here (the ToolBox: built-in tools, the user's MCP servers), so a model
on a server can use them.
"""
from __future__ import annotations

import json

from core.prompt.tool_format import CHOICES
from core.tools.parse import check_arguments
from core.tools.spec import Tool, ToolCall, new_call_id


def tool_fields(tools: list[Tool], choice: str, parallel: bool) -> dict:
    """The request fields that declare ``tools`` to a server with the lane's tool_choice."""
    out: dict = {"tools": [t.to_openai() for t in tools],
                 "tool_choice": choice if choice in CHOICES else {"type": "function", "function": {"name": choice}}}
    if not parallel:
        out["parallel_tool_calls"] = False
    return out


class CallDeltas:
    """A streamed reply's tool calls: OpenAI's deltas (the first of a call carries its
    index, id and name, later ones pieces of its arguments) joined per index."""

    def __init__(self, tools: list[Tool]):
        self.tools = {t.name: t for t in tools}
        self.parts: dict[int, dict] = {}

    def take(self, deltas) -> None:
        if not isinstance(deltas, list):
            return
        for k, d in enumerate(deltas):
            if not isinstance(d, dict):
                continue
            index = d.get("index", k) if isinstance(d.get("index", k), int) else k
            part = self.parts.setdefault(index, {"id": "", "name": "", "arguments": ""})
            fn = d.get("function") if isinstance(d.get("function"), dict) else {}
            if isinstance(d.get("id"), str) and d["id"]:
                part["id"] = d["id"]
            if isinstance(fn.get("name"), str):
                part["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                part["arguments"] += fn["arguments"]
            elif isinstance(fn.get("arguments"), dict):  # some servers send the object itself
                part["arguments"] += json.dumps(fn["arguments"], ensure_ascii=False)

    def done(self) -> list[ToolCall]:
        return [self._call(self.parts[i]) for i in sorted(self.parts)]

    def _call(self, part: dict) -> ToolCall:
        name, text, cid = part["name"], part["arguments"].strip() or "{}", part["id"] or new_call_id()
        try:
            args = json.loads(text)
        except ValueError as e:
            return ToolCall(name, id=cid, raw=text, error=f"{name}: the server's arguments are not valid JSON: {e}")
        if not isinstance(args, dict):
            return ToolCall(name, id=cid, raw=text, error=f"{name}: the arguments must be a JSON object")
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolCall(name, args, cid, error=f"there is no tool named {name!r:.70} (declared: {known:.200})")
        return ToolCall(name, args, cid, error=check_arguments(tool, args))
