"""Tool calling in the Llama 3.1 format: how declared tools, a reply's calls and tool
results are written into the prompt, and what a call must look like when the model writes
one (the grammar the engine holds a call to).

The shape follows the Llama 3.1 Instruct chat template (the one Llama 3.1, 3.2 and 3.3
ship, which vLLM and llama.cpp apply), with ``tools_in_user_message`` on, as it defaults:

- a system turn ``Environment: ipython`` / ``Cutting Knowledge Date: December 2023`` /
  ``Today Date: DD Mon YYYY``, then the system prompt;
- the tools (each ``{"type": "function", "function": {...}}`` as JSON indented by 4) with
  the template's instructions at the start of the first user message, or, when the
  conversation opens with another role, in the system turn (the template's other form);
- an assistant's call as ``{"name": NAME, "parameters": {...}}`` then ``<|eot_id|>``;
  several calls (the template allows one) as a JSON list: what this format's call grammar
  lets the model write when parallel calls are allowed;
- a tool's result as the ``ipython`` role, its text as it is (Meta's reference
  ``ChatFormat``: the template's ``content is iterable`` test is true for a string, so the
  template alone would JSON-quote it; we follow Meta's code and its prompt-format page).

A model's own Jinja chat template is never evaluated: the Llama 3.x templates all render
this shape, and ours keeps message text plain text (never special tokens) by construction.
Only ``<|eot_id|>`` ends a rendered call: ``<|eom_id|>`` follows Meta's built-in tools
(``<|python_tag|>`` + ``brave_search.call(...)``), which this app does not declare; both end
a reply being generated.
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Sequence

from core.errors import SettingsError
from core.tools.parse import parse_calls
from core.tools.spec import Tool, ToolCall, ToolError

__all__ = ["ToolCalling", "CHOICES", "OFF", "check_choice", "call_text", "tools_text", "result_text",
           "SYSTEM_TOOLS_INTRO", "USER_TOOLS_INTRO", "preamble"]

#: tool_choice's words; anything else names one function.
CHOICES = ("auto", "none", "required")
#: A comparison lane's own word (never a request's): the tools are left out of its prompt,
#: so the lane sees the conversation as a model without tools would (none only masks calls).
OFF = "off"
PYTHON_TAG = "<|python_tag|>"
KNOWLEDGE = "Cutting Knowledge Date: December 2023\n"
_FORMAT = ('Respond in the format {"name": function name, "parameters": dictionary of argument name '
           'and its value}.Do not use variables.\n\n')
SYSTEM_TOOLS_INTRO = ("You have access to the following functions. To call a function, please respond with "
                      "JSON for a function call." + _FORMAT)
USER_TOOLS_INTRO = ("Given the following functions, please respond with a JSON for a function call with its "
                    "proper arguments that best answers the given prompt.\n\n" + _FORMAT)
# The separators json.dumps (and so the template's tojson) writes; a constrained call uses
# the same, so what the model writes is what a rendered call looks like.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_CHARS = 100_000  # the engine's limit on one constraint's text


def today() -> str:
    """The template's ``Today Date`` (``strftime_now("%d %b %Y")`` in the 3.2+ templates)."""
    return datetime.date.today().strftime("%d %b %Y")


def preamble(date_string: str) -> str:
    return "Environment: ipython\n" + KNOWLEDGE + f"Today Date: {date_string}\n\n"


def tools_text(tools: Sequence[Tool]) -> str:
    """The declarations as the template writes them: each tool's JSON indented by 4, a
    blank line after each."""
    return "".join(json.dumps(t.to_openai(), indent=4, ensure_ascii=False) + "\n\n" for t in tools)


def _arguments(fn: dict) -> str:
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args  # a broken call stays as the model wrote it
    return json.dumps(args, ensure_ascii=False)


def call_text(tool_calls: list) -> str:
    """An assistant message's calls (OpenAI ``tool_calls``) as the model writes them."""
    if not isinstance(tool_calls, list) or not tool_calls:
        raise SettingsError("tool_calls must be a non-empty list")
    parts = []
    for tc in tool_calls:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise SettingsError(f"a tool call needs a function with a name: {tc!r:.80}")
        parts.append('{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + ', "parameters": ' + _arguments(fn) + "}")
    return parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"


def result_text(message: dict) -> str:
    """A tool message's text: a string, or OpenAI's list of text parts joined."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        if all(isinstance(t, str) for t in texts) and len(texts) == len(content):
            return "".join(texts)
    if not isinstance(content, str):
        raise SettingsError(f"a tool message's content must be text, got {type(content).__name__}")
    return content


def check_choice(choice: object, tools: Sequence[Tool]) -> str:
    """``choice`` when it is auto / none / required or names a declared tool."""
    if not isinstance(choice, str) or not choice:
        raise ToolError(f"tool_choice must be auto, none, required or a tool's name, got {choice!r:.60}")
    if choice == OFF and OFF not in {t.name for t in tools}:
        raise ToolError("tool_choice off leaves the tools out of the prompt: send this request without tools, "
                        "or use none")
    if choice in CHOICES:
        if choice == "required" and not tools:
            raise ToolError("tool_choice is required, but no tools are declared")
        return choice
    if choice not in {t.name for t in tools}:
        known = ", ".join(t.name for t in tools) or "none"
        raise ToolError(f"tool_choice names {choice!r:.70}, which is not a declared tool (declared: {known:.200})")
    return choice


def _lark(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True)
class ToolCalling:
    """The tools one request declares and how its replies may call them.

    ``parallel``: a reply may make several calls (a JSON list). ``start_token``: the
    format's special token that may open a call (``<|python_tag|>``), "" when the
    tokenizer has none.
    """
    tools: tuple[Tool, ...]
    parallel: bool = True
    start_token: str = PYTHON_TAG

    def check(self, choice: str) -> None:
        check_choice(choice, self.tools)

    def grammar(self, choice: str, constrained: bool) -> str | None:
        """The Lark grammar (llguidance's dialect) a reply is held to, or None for none.

        auto + constrained: an answer (text that does not open with ``{``, ``[`` when
        parallel, or white space) or calls, each ``{"name": N, "parameters": N's schema}``.
        required / a name + constrained: only calls (of that tool). none: any text, but
        never the call-start token (a grammar produces no special token it does not name).
        Unconstrained, required / a name force the call's opening up to the arguments and
        leave the arguments to the model; auto is not held at all.
        """
        check_choice(choice, self.tools)
        if choice == "none":
            return "start: ANY?\nANY: /(?s:.+)/\n"
        tools = [t for t in self.tools if choice in CHOICES or t.name == choice]
        if not constrained:
            if choice == "auto":
                return None
            opening, middle = _lark('{"name": '), _lark(f', "{self.args_key}": ')
            names = " | ".join(_lark(json.dumps(t.name)) for t in tools)
            return f"start: {self._opening()}{opening} NAME {middle} REST\nNAME: {names}\nREST: /(?s:.+)/\n"
        rules = [f"t{i}: %json {json.dumps(_call_schema(t, self.args_key), ensure_ascii=False)}"
                 for i, t in enumerate(tools)]
        lines = [self._call_rule(), "obj: " + " | ".join(f"t{i}" for i in range(len(tools))), *rules]
        if choice == "auto":
            lines = ["start: (TEXT | call)?", f"TEXT: /{self._answer_start()}(?s:.*)/", *lines]
        else:
            lines = ["start: call", *lines]
        text = "\n".join(lines) + "\n"
        if len(text) > MAX_GRAMMAR_CHARS:
            raise ToolError(f"the tools' schemas come to {len(text):,} characters; at most "
                            f"{MAX_GRAMMAR_CHARS:,} can hold a call: declare fewer or smaller tools")
        return text

    def parse(self, text: str) -> list[ToolCall]:
        """The calls a finished reply made (empty: it answered)."""
        return parse_calls(text, self.tools)

    # The shape of a call in the Llama 3.1 format; formats read from a model's own template
    # (core.prompt.template_format) say theirs.
    args_key = "parameters"

    def _opening(self) -> str:
        """What may come before an unconstrained call's JSON."""
        return f"{self.start_token}? " if self.start_token else ""

    def _call_rule(self) -> str:
        body = "obj" if not self.parallel else 'obj | "[" obj (", " obj)* "]"'
        return f"call: {self._opening()}({body})"

    def _answer_start(self) -> str:
        """The first character of an answer (what cannot open a call)."""
        return "[^{\\[\\s]" if self.parallel else "[^{\\s]"


def closed(schema: object) -> object:
    """``schema`` with every object that lists its properties and says nothing about
    others closed to them (``additionalProperties: false``, as OpenAI's strict mode asks):
    still valid against the tool's schema, but a small model cannot ramble on in invented
    keys until max tokens. An ``allOf`` is left open (its parts add properties together)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict) or "allOf" in schema:
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict) and not {"additionalProperties", "patternProperties"} & set(out):
        out["additionalProperties"] = False
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    for key in ("items", "additionalProperties", "anyOf", "oneOf", "prefixItems", "not"):
        if key in out:
            out[key] = closed(out[key])
    return out


def _call_schema(tool: Tool, args_key: str = "parameters") -> dict:
    """``{"name": tool's name, "parameters": its schema}`` as one JSON schema (closed:
    :func:`closed`); the tool's ``$defs``/``definitions`` move to the root so its
    ``#/$defs/...`` references resolve."""
    params = closed(dict(tool.parameters))
    root: dict = {}
    for key in ("$defs", "definitions"):
        if key in params:
            root[key] = params.pop(key)
    return {"type": "object", "properties": {"name": {"const": tool.name}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False, **root,
            "x-guidance": dict(JSON_STYLE)}
