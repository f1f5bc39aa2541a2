"""OpenAI's tool calling, served: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` in
a request, assistant ``tool_calls`` and ``tool`` messages in its conversation, and
``tool_calls`` in the reply, whole or streamed as OpenAI streams them (the first delta of a
call carries its index, id, type and name with empty arguments, later ones pieces of the
arguments). ``tool_constraint`` (true by default) is this server's extension: false lets
the model write calls unheld, to see what it does unaided.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from core.prompt.tool_format import CHOICES, check_choice
from core.serving.protocol import APIError, text_content
from core.tools.parse import TAGGED
from core.tools.spec import Tool, ToolCall, ToolError, new_call_id, tools_from_openai


@dataclass(frozen=True)
class ToolRequest:
    """What a request declares: its tools, its choice (auto / none / required / a name),
    whether one reply may make several calls, and whether calls are held to their schemas."""
    tools: tuple[Tool, ...] = ()
    choice: str = "none"
    parallel: bool = True
    constrained: bool = True


def tools_from_request(body: dict) -> ToolRequest:
    """The request's tool fields; APIError 400 naming the field that is wrong."""
    raw = body.get("tools")
    try:
        tools = tuple(tools_from_openai(raw)) if raw is not None else ()
    except ToolError as e:
        raise APIError(400, f"tools: {e}", param="tools") from None
    choice = _choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise APIError(400, "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    constrained = body.get("tool_constraint", True)
    if not isinstance(constrained, bool):
        raise APIError(400, "tool_constraint must be true or false", param="tool_constraint")
    return ToolRequest(tools, choice, parallel, constrained)


def _choice(value, tools: tuple[Tool, ...]) -> str:
    """OpenAI's tool_choice: "auto" (the default with tools), "none" (without), "required",
    or {"type": "function", "function": {"name": ...}}."""
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise APIError(400, 'tool_choice must be "auto", "none", "required" or '
                           '{"type": "function", "function": {"name": ...}}', param="tool_choice")
        value = name
    elif not isinstance(value, str) or value not in CHOICES:
        raise APIError(400, 'tool_choice must be "auto", "none", "required" or '
                       '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    if not tools and value != "none":
        raise APIError(400, "tool_choice needs tools: declare the functions the model may call", param="tool_choice")
    try:
        return check_choice(value, tools)
    except ToolError as e:
        raise APIError(400, f"tool_choice: {e}", param="tool_choice") from None


def tool_message(m: dict, i: int) -> dict:
    """A ``tool`` message or an assistant message with ``tool_calls``, checked and kept in
    OpenAI's shape (the chat format renders it); APIError 400 naming the message."""
    where = f"messages[{i}]"
    if m.get("role") == "tool":
        content = text_content(m.get("content"), where)
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise APIError(400, f"{where}: a tool message needs the tool_call_id it answers", param="messages")
        out = {"role": "tool", "tool_call_id": call_id, "content": content}
        return {**out, "name": m["name"]} if isinstance(m.get("name"), str) else out
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        raise APIError(400, f"{where}.tool_calls must be a list", param="messages")
    checked = []
    for k, tc in enumerate(calls):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments", ""), (str, dict))):
            raise APIError(400, f"{where}.tool_calls[{k}] must be {{\"id\", \"type\": \"function\", "
                           "\"function\": {\"name\", \"arguments\"}}", param="messages")
        checked.append({"id": str(tc.get("id") or new_call_id()), "type": "function",
                        "function": {"name": fn["name"], "arguments": fn.get("arguments") or "{}"}})
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise APIError(400, f"{where}.content must be a string or null", param="messages")
    return {"role": "assistant", "content": content, "tool_calls": checked}


def message_chars(m: dict) -> int:
    """A message's size in bytes of text, tool calls included (the request's length bound)."""
    n = len((m.get("content") or "").encode("utf-8", "surrogatepass"))
    for tc in m.get("tool_calls") or ():
        n += len(json.dumps(tc["function"]))
    return n


# The opening of a call as the Llama 3.1 format (and a constrained call) writes it: the
# first (perhaps opening a list), then each next one of a list.
_FIRST = re.compile(r'\s*(?:\[\s*)?\{"name": "([A-Za-z0-9_-]{1,64})", "parameters": ')
_NEXT = re.compile(r'\s*\}\s*,\s*\{"name": "([A-Za-z0-9_-]{1,64})", "parameters": ')
_HEAD, _TAIL = '{"name": "', '", "parameters": '


def _may_open(s: str, first: bool) -> bool:
    """Whether ``s`` may still grow into a call's opening (it is a prefix of one)."""
    s = s.lstrip()
    if first and s.startswith("["):
        s = s[1:].lstrip()
    for mark in ("}", ",") if not first else ():  # the call's closing brace, then a comma
        if not s:
            return True
        if not s.startswith(mark):
            return False
        s = s[1:].lstrip()
    if len(s) <= len(_HEAD):
        return _HEAD.startswith(s)
    if not s.startswith(_HEAD):
        return False
    name = re.match(r"[A-Za-z0-9_-]{0,64}", s[len(_HEAD):])
    rest = s[len(_HEAD) + name.end():]
    return _TAIL.startswith(rest)


@dataclass
class CallStream:
    """One choice's streamed text turned into OpenAI deltas: content for an answer,
    ``tool_calls`` deltas for calls (index, id, type and name first, then the arguments
    as they are written, the call's closing brace held back).

    Text that opens like a call is held back until the call's name is known. A call
    written in another shape (the constraint off) is sent whole when the choice ends,
    from the parsed calls (:meth:`finish`)."""
    calls_possible: bool
    text: str = ""
    mode: str = ""  # "" undecided, "content", "opening" / "arguments" (streaming calls), "held", "closed"
    at: int = 0  # how much of text the call scanner has read
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    ids: list[str] = field(default_factory=list)

    def push(self, delta: str) -> list[dict]:
        """The deltas (``{"content": ...}`` or ``{"tool_calls": [...]}``) for new text."""
        self.text += delta
        if self.mode == "content" or not self.calls_possible:
            return [{"content": delta}] if delta else []
        if not self.mode:
            stripped = self.text.lstrip()
            if not stripped:
                return []
            if stripped[0] == "<" and TAGGED[0].startswith(stripped[:len(TAGGED[0])]):
                # a Hermes / Qwen template's <tool_call> block, or the start of one: held, sent
                # whole when the choice ends (its calls as parsed, else its text)
                self.mode = "held" if stripped.startswith(TAGGED[0]) else ""
                return []
            if stripped[0] not in "{[":
                self.mode = "content"
                return [{"content": self.text}]
            self.mode = "opening"
        out: list[dict] = []
        while self.mode in ("opening", "arguments"):
            piece = self._opening() if self.mode == "opening" else self._arguments()
            if piece is None:
                break
            out.append(piece)
        return out

    def _opening(self) -> dict | None:
        first = not self.ids
        m = (_FIRST if first else _NEXT).match(self.text, self.at)
        if m is None:
            if not _may_open(self.text[self.at:], first):
                self.mode = "held" if first else "closed"
            return None
        self.ids.append(new_call_id())
        self.at, self.depth, self.mode = m.end(), 0, "arguments"
        return self._delta({"id": self.ids[-1], "type": "function", "function": {"name": m.group(1), "arguments": ""}})

    def _arguments(self) -> dict | None:
        """The arguments written since the last delta, up to where their JSON value closes."""
        start = self.at
        for i in range(self.at, len(self.text)):
            ch = self.text[i]
            if self.depth <= 0 and not self.in_string and ch.isspace():
                continue  # white space before the value (a call written unheld)
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (ch == "\\", ch != '"')
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
            if self.depth <= 0 and not self.in_string:
                self.at, self.mode = i + 1, "opening"
                return self._delta({"function": {"arguments": self.text[start:i + 1]}})
        self.at = len(self.text)
        return self._delta({"function": {"arguments": self.text[start:]}}) if self.at > start else None

    def _delta(self, call: dict) -> dict:
        return {"tool_calls": [{"index": len(self.ids) - 1, **call}]}

    def finish(self, calls: list[ToolCall]) -> list[dict]:
        """What is left to send once the choice is done: calls that were held back, sent
        whole, or held text that turned out to be an answer."""
        if self.ids:
            return []
        if calls and self.mode in ("held", "opening"):
            return [{"tool_calls": [{"index": k, **c.to_openai()}]} for k, c in enumerate(calls)]
        if self.mode in ("", "held", "opening") and self.text:
            return [{"content": self.text}]
        return []

    def final_calls(self, calls: list[ToolCall]) -> list[dict]:
        """The calls as the whole reply reports them, with the ids they streamed with."""
        out = [c.to_openai() for c in calls]
        for k, c in enumerate(out):
            if k < len(self.ids):
                c["id"] = self.ids[k]
        return out
