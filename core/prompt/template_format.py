"""A chat format read from the model's own chat template: for models whose template declares
tools in a shape other than Llama 3.1's.

Two call shapes are read back: the Hermes / Qwen one (each call
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, results in ``tool``
messages) and Mistral's (``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}``). A
template that declares tools in another shape still renders chats; its tools are refused
with a message naming the shapes known.

The template renders in a sandboxed child process (:mod:`core.prompt.template_sandbox`), given
the messages and tools as Hugging Face's ``apply_chat_template`` passes them. Message text
must never become special tokens: before rendering, every special token's spelling inside
what the user, a tool or a server wrote is swapped for a private-use mark; the rendered text
is split on special spellings (which can then only be the template's own) and the text
between, marks swapped back, is tokenized as plain text.
"""
from __future__ import annotations

import hashlib
import json
import re

from core.errors import SettingsError
from core.prompt.template_sandbox import render_template
from core.prompt.tool_format import ToolCalling, result_text
from core.tools.parse import parse_calls, parse_tagged_calls
from core.tools.spec import Tool, ToolCall

__all__ = ["TemplateChatFormat", "TemplateToolCalling", "declares_tools", "call_style"]

_MARK = "\U000F0000"  # private use: the escape mark; the next character says which spelling
_FIRST = 0xF0001
_PROBE = "LlamaDeskProbe7"


def declares_tools(template: str) -> bool:
    """Whether a chat template takes a ``tools`` list (as Hugging Face's templates do)."""
    return re.search(r"\btools\b", template) is not None


def call_style(template: str) -> str | None:
    """How the template writes a call: "hermes", "mistral", or None (a shape not read back)."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    return None


class _Marks:
    """Swaps special spellings inside data for private-use marks, and back."""

    def __init__(self, specials: dict[str, int]):
        self.texts = sorted(specials, key=len, reverse=True)[:0xFFFFD - _FIRST] + [_MARK]
        self.index = {t: i for i, t in enumerate(self.texts)}
        self.any = re.compile("|".join(re.escape(t) for t in self.texts))
        self.split = re.compile("(" + "|".join(re.escape(t) for t in self.texts[:-1]) + ")") if specials else None
        self.back = re.compile(re.escape(_MARK) + "(.)", re.S)

    def hide(self, value):
        if isinstance(value, str):
            return self.any.sub(lambda m: _MARK + chr(_FIRST + self.index[m.group()]), value)
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(v) for v in value]
        return value

    def show(self, text: str) -> str:
        def one(m):
            k = ord(m.group(1)) - _FIRST
            return self.texts[k] if 0 <= k < len(self.texts) else m.group()
        return self.back.sub(one, text)


def _mistral_id(call_id: str) -> str:
    """Mistral's templates want nine letters or digits; other ids map to nine, the same each time."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _hf_call(tc: dict, style: str | None) -> dict:
    fn = tc.get("function") if isinstance(tc, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise SettingsError(f"a tool call needs a function with a name: {tc!r:.80}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass  # a broken call stays as the model wrote it
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if "id" in tc:
        out["id"] = _mistral_id(str(tc["id"])) if style == "mistral" else tc["id"]
    return out


def _hf_message(message: dict, style: str | None) -> dict:
    """One OpenAI-shaped message as Hugging Face's templates expect it (call arguments as
    objects, a tool result's text as text)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise SettingsError(f"a chat message needs 'role' and 'content': {message!r:.80}")
    out = dict(message)
    role = "tool" if message["role"] == "ipython" else message["role"]
    out["role"] = role
    if role == "tool":
        out["content"] = result_text(message)
        if style == "mistral" and "tool_call_id" in message:
            out["tool_call_id"] = _mistral_id(str(message["tool_call_id"]))
    elif role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_hf_call(tc, style) for tc in message["tool_calls"]]
        out["content"] = message.get("content") or ""
    elif not isinstance(message.get("content"), str):
        raise SettingsError(f"message content must be text, got {type(message.get('content')).__name__}")
    return out


class TemplateChatFormat:
    """The chat format a model's own template defines (see the module doc)."""

    name = "template"

    def __init__(self, tokenizer, template: str):
        self.tokenizer = tokenizer
        self.template = template
        self.style = call_style(template)
        self._marks = _Marks(dict(tokenizer.special_tokens))
        names = {i: t for t, i in tokenizer.special_tokens.items()}
        self._names = {"bos_token": names.get(tokenizer.bos_id, ""), "eos_token": names.get(tokenizer.eos_id, "")}
        self._stops: set[int] | None = None

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: tuple[Tool, ...] = ()) -> str:
        """The template's text, with special spellings from the data hidden (see _Marks)."""
        data = {"messages": [_hf_message(m, self.style) for m in messages],
                "tools": [t.to_openai() for t in tools] or None}
        context = {**self._marks.hide(data), **self._names, "add_generation_prompt": bool(add_generation_prompt)}
        try:
            return render_template(self.template, context)
        except SettingsError as e:
            raise SettingsError(f"{e}; choose another chat format (Llama 3, raw completion) in the settings") from None

    def encode_dialog(self, messages: list[dict], *, add_generation_prompt: bool = True,
                      tools: tuple[Tool, ...] = ()) -> list[int]:
        if tools:
            self.tool_calling(tools)  # refuses a shape it cannot read back before rendering it
        return self.encode_rendered(self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools))

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of rendered text: special spellings (the template's own) as special ids, the
        rest as plain text."""
        if self._marks.split is None:
            return self.tokenizer.encode(self._marks.show(text))
        ids: list[int] = []
        for k, part in enumerate(self._marks.split.split(text)):
            if k % 2:
                ids.append(self.tokenizer.special_tokens[part])
            elif part:
                ids.extend(self.tokenizer.encode(self._marks.show(part)))
        return ids

    def tool_calling(self, tools: tuple[Tool, ...], parallel: bool = True) -> ToolCalling:
        if self.style is None:
            raise SettingsError("this model's chat template writes tool calls in a shape LlamaDesk cannot read "
                                "back (it reads Llama 3.1 JSON, Hermes/Qwen <tool_call> and Mistral [TOOL_CALLS]): "
                                "turn the tools off")
        tag = ""
        if self.style == "mistral":
            i = self.tokenizer.special_id("[TOOL_CALLS]")
            if i is None:
                raise SettingsError("this model's template calls tools with [TOOL_CALLS], which its tokenizer lacks")
            tag = f"<[{i}]>"
        return TemplateToolCalling(tuple(tools), bool(parallel), tag, style=self.style)

    def stop_ids(self) -> set[int]:
        """The tokenizer's stop ids and the special token the template ends a reply with."""
        if self._stops is None:
            self._stops = set(self.tokenizer.stop_ids) | self._end_of_turn()
        return set(self._stops)

    def _end_of_turn(self) -> set[int]:
        try:
            text = self.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}],
                               add_generation_prompt=False)
        except SettingsError:
            return set()
        after = text[text.rfind(_PROBE) + len(_PROBE):] if _PROBE in text else ""
        found = self._marks.split.search(after) if self._marks.split is not None else None
        return {self.tokenizer.special_tokens[found.group()]} if found else set()

    def __repr__(self) -> str:
        return f"<TemplateChatFormat {self.style or 'no calls'}>"


class TemplateToolCalling(ToolCalling):
    """Calls in a template's shape: Hermes ``<tool_call>`` blocks or Mistral's ``[TOOL_CALLS]``
    list (``start_token`` is then its id in llguidance's ``<[id]>`` form)."""

    args_key = "arguments"

    def __init__(self, tools, parallel=True, start_token="", *, style: str = "hermes"):
        super().__init__(tools, parallel, start_token)
        object.__setattr__(self, "style", style)

    def _opening(self) -> str:
        return '"<tool_call>\\n" ' if self.style == "hermes" else f'{self.start_token} "[" '

    def _call_rule(self) -> str:
        if self.style == "hermes":
            one = '"<tool_call>\\n" obj "\\n</tool_call>"'
            return f"call: {one}" + (f' ("\\n" {one})*' if self.parallel else "")
        more = ' (", " obj)*' if self.parallel else ""
        return f'call: {self.start_token} "[" obj{more} "]"'

    def _answer_start(self) -> str:
        # a Mistral call opens with a special token no text can write; a Hermes one with "<"
        return "[^<\\s]" if self.style == "hermes" else "(?s:.)"

    def parse(self, text: str) -> list[ToolCall]:
        if self.style == "hermes" and "<tool_call>" in text:
            return parse_tagged_calls(text, self.tools)
        return parse_calls(text, self.tools)
