"""Chat prompt formats: Llama 3, Llama 2 and raw completion.

Every format builds token ids directly: control tokens come from the tokenizer's special
ids and message text goes through :meth:`Tokenizer.encode`, which treats it as plain text.
So a user who types ``<|eot_id|>`` or ``[INST]`` cannot forge a turn boundary (for Llama 2
the markers *are* plain text, so there typed ``[INST]`` reads like the real one — that is
the format's own limitation).

Chat templates from GGUF / HF files are recognised by their markers; only a template that
declares tools in another shape than Llama 3.1's is rendered, sandboxed
(:mod:`core.prompt.template_format`), and it keeps the same promise.
"""
from __future__ import annotations

from core.errors import SettingsError
from core.prompt.template_format import TemplateChatFormat, declares_tools
from core.prompt.tool_format import (PYTHON_TAG, SYSTEM_TOOLS_INTRO, USER_TOOLS_INTRO, ToolCalling, call_text,
                                     preamble, result_text, today, tools_text)
from core.tokenizer import Tokenizer
from core.tools.spec import Tool

__all__ = [
    "Message",
    "ChatFormat",
    "Llama3ChatFormat",
    "Llama2ChatFormat",
    "RawFormat",
    "chat_format_for",
    "describe",
    "FORMAT_NAMES",
]

# {"role": "system" | "user" | "assistant", "content": str}; in OpenAI's shape with tools:
# {"role": "assistant", "content": str | None, "tool_calls": [...]} and
# {"role": "tool", "tool_call_id": ..., "name": ..., "content": str}.
Message = dict

#: Values accepted by ``chat_format_for(override=...)``.
FORMAT_NAMES = ("auto", "llama3", "llama2", "raw")

_LLAMA3_MARKERS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


class ChatFormat:
    """Turns a list of messages into the prompt ids a model was trained on."""

    name: str = ""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def encode_dialog(self, messages: list[dict], *, add_generation_prompt: bool = True,
                      tools: tuple[Tool, ...] = ()) -> list[int]:
        """Prompt ids for ``messages`` (BOS first); with ``add_generation_prompt`` the model
        is left ready to write the assistant's reply. ``tools``: the functions it may call
        (formats that have no tool calling refuse them)."""
        raise NotImplementedError

    def tool_calling(self, tools: tuple[Tool, ...], parallel: bool = True) -> ToolCalling:
        """How a reply in this format calls ``tools`` (SettingsError where it cannot)."""
        raise SettingsError(f"the {describe(self)} chat format has no tool calling: "
                            "use a Llama 3.1 or later model, or turn the tools off")

    def stop_ids(self) -> set[int]:
        """Ids that end the assistant's reply."""
        return set(self.tokenizer.stop_ids)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def _content(message: dict) -> str:
    try:
        content = message["content"]
    except (KeyError, TypeError):
        raise SettingsError(f"a chat message needs 'role' and 'content': {message!r:.80}") from None
    if not isinstance(content, str):
        raise SettingsError(f"message content must be text, got {type(content).__name__}")
    return content


def _role(message: dict) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    if not isinstance(role, str) or not role:
        raise SettingsError(f"a chat message needs 'role' and 'content': {message!r:.80}")
    return role


class Llama3ChatFormat(ChatFormat):
    """Meta's Llama 3 format (``ChatFormat.encode_dialog_prompt``).

    Works with any tokenizer holding ``<|start_header_id|>``, ``<|end_header_id|>`` and
    ``<|eot_id|>`` as special tokens; BOS is ``<|begin_of_text|>`` when present, else the
    tokenizer's own BOS.
    """

    name = "llama3"

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer)
        ids = {text: tokenizer.special_id(text) for text in _LLAMA3_MARKERS}
        missing = [text for text, i in ids.items() if i is None]
        if missing:
            raise SettingsError(
                f"the Llama 3 chat format needs the special tokens {', '.join(missing)}, "
                "which this model's tokenizer lacks"
            )
        self.start_header_id = ids["<|start_header_id|>"]
        self.end_header_id = ids["<|end_header_id|>"]
        self.eot_id = ids["<|eot_id|>"]
        begin = tokenizer.special_id("<|begin_of_text|>")
        self.bos_id = begin if begin is not None else tokenizer.bos_id
        self.date_string = today()  # the template's "Today Date" where tools are declared

    def encode_header(self, role: str) -> list[int]:
        """``<|start_header_id|> role <|end_header_id|> "\\n\\n"``."""
        enc = self.tokenizer.encode
        return [self.start_header_id, *enc(role), self.end_header_id, *enc("\n\n")]

    def encode_message(self, message: dict) -> list[int]:
        """One message: its header, its stripped content, then ``<|eot_id|>``. An
        assistant's calls are its JSON calls; a tool's result is the ``ipython`` role with
        its text as it is (tool_format's module doc says why)."""
        role, enc = _role(message), self.tokenizer.encode
        if role in ("tool", "ipython"):
            return [*self.encode_header("ipython"), *enc(result_text(message)), self.eot_id]
        if role == "assistant" and message.get("tool_calls"):
            return [*self.encode_header("assistant"), *enc(call_text(message["tool_calls"])), self.eot_id]
        return [*self.encode_header(role), *enc(_content(message).strip()), self.eot_id]

    def encode_dialog(self, messages: list[dict], *, add_generation_prompt: bool = True,
                      tools: tuple[Tool, ...] = ()) -> list[int]:
        ids = [] if self.bos_id is None else [self.bos_id]
        messages = list(messages)
        if tools:
            ids.extend(self._encode_tools(messages, tools))
        for message in messages:
            ids.extend(self.encode_message(message))
        if add_generation_prompt:
            ids.extend(self.encode_header("assistant"))
        return ids

    def _encode_tools(self, messages: list[dict], tools: tuple[Tool, ...]) -> list[int]:
        """The system turn and, when the conversation opens with one, the first user turn
        as the Llama 3.1 template writes them with tools (taken off the front of ``messages``)."""
        system = _content(messages.pop(0)).strip() if messages and _role(messages[0]) == "system" else ""
        in_user = bool(messages) and _role(messages[0]) == "user"
        text = preamble(self.date_string) + ("" if in_user else SYSTEM_TOOLS_INTRO + tools_text(tools)) + system
        ids = [*self.encode_header("system"), *self.tokenizer.encode(text), self.eot_id]
        if in_user:
            first = _content(messages.pop(0)).strip()
            ids += [*self.encode_header("user"), *self.tokenizer.encode(USER_TOOLS_INTRO + tools_text(tools) + first),
                    self.eot_id]
        return ids

    def tool_calling(self, tools: tuple[Tool, ...], parallel: bool = True) -> ToolCalling:
        tag = PYTHON_TAG if self.tokenizer.special_id(PYTHON_TAG) is not None else ""
        return ToolCalling(tuple(tools), bool(parallel), tag)

    def stop_ids(self) -> set[int]:
        return set(self.tokenizer.stop_ids) | {self.eot_id}


B_INST, E_INST = "[INST]", "[/INST]"
B_SYS, E_SYS = "<<SYS>>\n", "\n<</SYS>>\n\n"


class Llama2ChatFormat(ChatFormat):
    """Meta's Llama 2 chat format (``Llama.chat_completion``).

    A leading system message is folded into the first user message inside
    ``<<SYS>>``/``<</SYS>>``. Each finished (user, assistant) pair is
    ``BOS [INST] u [/INST] a EOS``; a final user message is ``BOS [INST] u [/INST]``.

    Meta's code asserts strictly alternating roles; a chat app meets other shapes (two
    user messages after a failed reply, an edited transcript), so consecutive messages of
    one role are joined with a blank line and a reply with no question before it is paired
    with an empty user turn.
    """

    name = "llama2"

    def encode_dialog(self, messages: list[dict], *, add_generation_prompt: bool = True,
                      tools: tuple[Tool, ...] = ()) -> list[int]:
        if tools:
            self.tool_calling(tools)  # refuses: Llama 2 has no tool calling
        turns = self._turns(messages)
        enc = self.tokenizer.encode
        ids: list[int] = []
        for user, answer in turns:
            if answer is None:
                # The open [INST] ... [/INST] *is* the generation prompt, so it is kept
                # whether or not one was asked for: dropping it would lose the question.
                ids.extend(enc(f"{B_INST} {user.strip()} {E_INST}", bos=True))
            else:
                ids.extend(enc(f"{B_INST} {user.strip()} {E_INST} {answer.strip()} ", bos=True, eos=True))
        return ids

    @staticmethod
    def _turns(messages: list[dict]) -> list[tuple[str, str | None]]:
        items = []
        for message in messages:
            role, content = _role(message), _content(message)
            if role not in ("system", "user", "assistant"):
                raise SettingsError(f"the Llama 2 chat format has no role {role!r}")
            items.append([role, content])
        items = _merge_runs(items)
        if items and items[0][0] == "system":
            system = B_SYS + items.pop(0)[1] + E_SYS
            if items and items[0][0] == "user":
                items[0][1] = system + items[0][1]
            else:
                items.insert(0, ["user", system])
        # A later system message has no Llama 2 form; it goes in as user text.
        items = _merge_runs([["user" if r == "system" else r, c] for r, c in items])
        turns: list[tuple[str, str | None]] = []
        i = 0
        while i < len(items):
            role, content = items[i]
            if role == "assistant":
                turns.append(("", content))
                i += 1
            elif i + 1 < len(items):
                turns.append((content, items[i + 1][1]))
                i += 2
            else:
                turns.append((content, None))
                i += 1
        return turns

    def stop_ids(self) -> set[int]:
        eos = self.tokenizer.eos_id
        return {eos} if eos is not None else set(self.tokenizer.stop_ids)


def _merge_runs(items: list[list[str]]) -> list[list[str]]:
    merged: list[list[str]] = []
    for role, content in items:
        if merged and merged[-1][0] == role:
            merged[-1][1] += "\n\n" + content
        else:
            merged.append([role, content])
    return merged


class RawFormat(ChatFormat):
    """Plain completion: BOS followed by the messages' text, concatenated as is.

    No separator is added so that an assistant message continues the user's text exactly,
    as completion does.
    """

    name = "raw"

    def encode_dialog(self, messages: list[dict], *, add_generation_prompt: bool = True,
                      tools: tuple[Tool, ...] = ()) -> list[int]:
        if tools:
            self.tool_calling(tools)  # refuses: raw completion has no tool calling
        text = "".join(_content(m) for m in messages)
        return self.tokenizer.encode(text, bos=True)


_BY_NAME = {"llama3": Llama3ChatFormat, "llama2": Llama2ChatFormat, "raw": RawFormat}
_DESCRIPTIONS = {"llama3": "Llama 3", "llama2": "Llama 2", "raw": "Raw completion", "template": "the model's template"}


def _has_llama3_markers(tokenizer: Tokenizer) -> bool:
    return all(tokenizer.special_id(t) is not None for t in _LLAMA3_MARKERS)


def chat_format_for(tokenizer: Tokenizer, *, template: str | None = None,
                    override: str | None = None) -> ChatFormat | TemplateChatFormat:
    """The chat format to use for a model.

    ``override`` ("llama3", "llama2", "raw") forces one; None or "auto" decides from
    evidence, in order: a chat template's markers (``<|start_header_id|>`` -> Llama 3,
    ``[INST]`` with ``<<SYS>>`` -> Llama 2, another template that declares tools -> that
    template, rendered), then the tokenizer's own Llama 3 special tokens. Without evidence the answer is raw completion: a base model has no chat
    format, and a Llama 2 vocabulary alone cannot tell a chat model from a base one.
    """
    if override is not None and override not in FORMAT_NAMES:
        raise SettingsError(f"unknown chat format {override!r}; choose one of {', '.join(FORMAT_NAMES)}")
    if override in _BY_NAME:
        return _BY_NAME[override](tokenizer)
    if template:
        if "<|start_header_id|>" in template and _has_llama3_markers(tokenizer):
            return Llama3ChatFormat(tokenizer)
        if "[INST]" in template and "<<SYS>>" in template:
            return Llama2ChatFormat(tokenizer)
        if declares_tools(template):
            return TemplateChatFormat(tokenizer, template)
    if _has_llama3_markers(tokenizer):
        return Llama3ChatFormat(tokenizer)
    return RawFormat(tokenizer)


def describe(fmt: ChatFormat | str) -> str:
    """A short name for people: "Llama 3", "Llama 2" or "Raw completion"."""
    name = fmt if isinstance(fmt, str) else fmt.name
    return _DESCRIPTIONS.get(name, name)
