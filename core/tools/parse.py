"""A reply's text as tool calls: what the model wrote, checked against the declared tools.

The Llama 3.1 format writes a call as ``{"name": NAME, "parameters": {...}}`` (the reply
may begin with ``<|python_tag|>``, a special token that never reaches the text); several
calls as a JSON list, or (as some Llama 3.2 replies do) objects separated by ``;``. A reply
that does not start with ``{`` or ``[`` is an answer, not a call. With the engine's call
constraint on, every call parses and fits its schema by construction; with it off, a call
the model got wrong is still a :class:`ToolCall`, with ``raw`` (what it wrote) and
``error`` (one line saying what is wrong), so the conversation can say so in place.
"""
from __future__ import annotations

import json
from typing import Sequence

import jsonschema
from referencing.exceptions import Unresolvable

from core.tools.spec import Tool, ToolCall

__all__ = ["parse_calls", "parse_tagged_calls", "check_arguments", "looks_like_call"]

PYTHON_TAG = "<|python_tag|>"
# Hermes / Qwen templates wrap each call: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
TAGGED = ("<tool_call>", "</tool_call>")


def looks_like_call(text: str) -> bool:
    """Whether a reply's text is (the start of) a call rather than an answer."""
    s = text.lstrip()
    if s.startswith(PYTHON_TAG):
        s = s[len(PYTHON_TAG):].lstrip()
    return s[:1] in ("{", "[") or s.startswith(TAGGED[0])


def _values(text: str) -> list:
    """The JSON values in ``text``: one value, or several separated by ``;``/``,``/space."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while i < len(text):
        value, i = dec.raw_decode(text, i)
        out.append(value)
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
    return out


def parse_calls(text: str, tools: Sequence[Tool]) -> list[ToolCall]:
    """The calls ``text`` makes (empty when it is an answer, not a call).

    A call to an undeclared tool, arguments that are not an object or fail the tool's
    schema, and JSON that does not parse where a call was meant all give a ToolCall with
    ``error`` set (and ``raw``), never an exception.
    """
    if not looks_like_call(text):
        return []
    s = text.strip()
    if s.startswith(PYTHON_TAG):
        s = s[len(PYTHON_TAG):].strip()
    try:
        values = _values(s)
    except (ValueError, RecursionError) as e:
        if '"name"' not in s:
            return []  # JSON-looking text that names no function: an answer
        return [ToolCall(_guess_name(s), raw=s, error=f"the call is not valid JSON: {e}")]
    items = values[0] if len(values) == 1 and isinstance(values[0], list) else values
    if not items or not all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in items):
        if any(isinstance(v, dict) and "name" in v for v in items):
            return [ToolCall(_guess_name(s), raw=s, error="a call is an object with a \"name\" and \"parameters\"")]
        return []
    by_name = {t.name: t for t in tools}
    return [_call(v, by_name) for v in items]


def parse_tagged_calls(text: str, tools: Sequence[Tool]) -> list[ToolCall]:
    """The calls in ``<tool_call>``...``</tool_call>`` blocks (the Hermes / Qwen templates'
    shape) anywhere in ``text``: such a reply may say something before its calls. A block
    the reply did not close (cut off) is no call; one that is not a call object is said."""
    by_name, calls = {t.name: t for t in tools}, []
    open_, close = TAGGED
    at = text.find(open_)
    while at >= 0:
        end = text.find(close, at)
        if end < 0:
            break
        body = text[at + len(open_):end].strip()
        try:
            value = json.loads(body)
        except (ValueError, RecursionError) as e:
            value, error = None, f"the call is not valid JSON: {e}"
        else:
            error = "" if isinstance(value, dict) and isinstance(value.get("name"), str) else \
                'a call is an object with a "name" and "arguments"'
        calls.append(_call(value, by_name) if not error else ToolCall(_guess_name(body), raw=body, error=error))
        at = text.find(open_, end)
    return calls


def _call(obj: dict, tools: dict[str, Tool]) -> ToolCall:
    name = obj["name"]
    args = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return ToolCall(name, raw=obj["parameters" if "parameters" in obj else "arguments"],
                            error=f"{name}: the arguments are not valid JSON")
    if not isinstance(args, dict):
        return ToolCall(name, raw=json.dumps(args, ensure_ascii=False),
                        error=f"{name}: the arguments must be a JSON object")
    tool = tools.get(name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolCall(name, args, error=f"there is no tool named {name!r:.70} (declared: {known:.200})")
    return ToolCall(name, args, error=check_arguments(tool, args))


def check_arguments(tool: Tool, args: dict) -> str:
    """Why ``args`` do not fit ``tool``'s parameter schema, in one line ("" when they do)."""
    try:
        cls = jsonschema.validators.validator_for(tool.parameters)
        cls.check_schema(tool.parameters)
        error = jsonschema.exceptions.best_match(cls(tool.parameters).iter_errors(args))
    except (jsonschema.exceptions.SchemaError, Unresolvable, RecursionError) as e:
        return f"{tool.name}: its parameter schema cannot be checked: {str(e).splitlines()[0][:200]}"
    if error is None:
        return ""
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{tool.name}: the arguments do not fit its schema{' at ' + where if where else ''}: {error.message[:200]}"


def _guess_name(s: str) -> str:
    """The name a broken call meant, where it can be read (for the message)."""
    at = s.find('"name"')
    if at < 0:
        return ""
    rest = s[at + 6:].lstrip(" :")
    if rest.startswith('"'):
        end = rest.find('"', 1)
        if end > 0:
            return rest[1:end][:64]
    return ""
