"""Turning a request into prompt ids that fit the model's context.

A chat that outgrows the context loses its oldest turns (the system prompt stays); a
prompt that cannot fit even then is a :class:`SettingsError` with a message a user can act
on. Pure functions over a chat format and a tokenizer: no torch, no threads.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.errors import SettingsError
from core.prompt.tool_format import ToolCalling


def reply_reserve(context: int, max_new_tokens: int) -> int:
    """Positions kept free for the reply when fitting a prompt.

    ``max_new_tokens``, but never more than half the context: a user who asks for 4096
    new tokens on a 4096-token model still gets half of it for the conversation (the
    engine then stops with "context" when the window is full), and always at least 1.
    """
    return max(1, min(int(max_new_tokens), context // 2))


def render_chat(chat_format, messages: list[dict], continue_reply: str = "", tools: tuple = ()) -> list[int]:
    """Prompt ids for a dialog, ready for the assistant's reply.

    ``continue_reply`` is a partial assistant reply to carry on from: its text follows the
    assistant header with no end-of-turn, so the model writes the rest of the same reply.
    ``tools``: the functions (:class:`core.tools.spec.Tool`) the reply may call.
    """
    if not continue_reply:
        return chat_format.encode_dialog(messages, add_generation_prompt=True, tools=tools)
    if chat_format.name == "raw":
        # Raw completion joins texts as they are: the reply simply extends the text.
        return chat_format.encode_dialog(messages + [{"role": "assistant", "content": continue_reply}], tools=tools)
    ids = chat_format.encode_dialog(messages, add_generation_prompt=True, tools=tools)
    return ids + chat_format.tokenizer.encode(continue_reply)


def fit_dialog(chat_format, messages: list[dict], max_prompt_tokens: int, *,
               continue_reply: str = "", tools: tuple = ()) -> tuple[list[int], int]:
    """Render ``messages``, dropping the oldest turns until at most ``max_prompt_tokens``.

    System messages are always kept. Other messages are dropped oldest first and a
    user message is dropped together with the assistant reply that answered it (and the
    tool results that reply asked for), so the model never sees an answer without its question. The last message is never dropped.

    Returns:
        (prompt ids, number of messages dropped).

    Raises:
        SettingsError when even the system prompt plus the last message do not fit.
    """
    if not messages:
        raise SettingsError("the conversation is empty: write a message first")
    system = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "system"]
    rest = [i for i in range(len(messages)) if i not in set(system)]

    def render(drop: int, with_tools: tuple = tools) -> list[int]:
        keep = set(system) | set(rest[drop:])
        return render_chat(chat_format, [m for i, m in enumerate(messages) if i in keep], continue_reply, with_tools)

    def too_long(what: str, ids: list[int], drop: int, fix: str) -> SettingsError:
        # the tools' definitions can be most of the prompt: a user who wrote ten words must learn that
        spent = len(ids) - len(render(drop, ())) if tools else 0
        of_tools = f", {spent} of them the tools' definitions" if spent > 0 else ""
        fix = "turn some tools off, " + fix if spent > 0 else fix
        return SettingsError(f"{what} {len(ids)} tokens{of_tools}, but only {max_prompt_tokens} fit in the prompt: "
                             + fix)

    ids = render(0)
    if len(ids) <= max_prompt_tokens or not rest:
        if len(ids) > max_prompt_tokens:
            raise too_long("the system prompt alone is", ids, 0, "shorten it or lower max tokens")
        return ids, 0
    # Cut points: drop rest[:k]; never start on an assistant reply (it would lose its question).
    cuts = [k for k in range(1, len(rest)) if messages[rest[k]].get("role") not in ("assistant", "tool", "ipython")]
    if not cuts or cuts[-1] != len(rest) - 1:
        cuts.append(len(rest) - 1)
    last = render(cuts[-1])
    if len(last) > max_prompt_tokens:
        what = "the system prompt and the last message are" if system else "the last message is"
        raise too_long(what, last, cuts[-1], "shorten the message or lower max tokens")
    # Fewer messages never render longer, so binary-search the smallest cut that fits:
    # O(log n) renders instead of one per dropped turn (tokenizing is pure Python for some
    # tokenizers and holds the GIL).
    lo, hi, best = 0, len(cuts) - 1, last  # invariant: best is the render of cuts[hi]
    while lo < hi:
        mid = (lo + hi) // 2
        cand = render(cuts[mid])
        if len(cand) <= max_prompt_tokens:
            hi, best = mid, cand
        else:
            lo = mid + 1
    return best, cuts[hi]


@dataclass(frozen=True)
class Prompt:
    """What the engine needs to answer a request: the ids, the stop tokens, and whether the
    reply's first space is SentencePiece's dummy prefix (to be dropped)."""
    ids: list[int]
    dropped_messages: int
    strip_leading_space: bool
    stop_ids: frozenset[int]
    tools: ToolCalling | None = None  # the functions a chat reply may call, and how



def strips_reply_space(tok, chat_format) -> bool:
    """Whether a new chat reply drops its first leading space: SentencePiece replies start
    with the dummy-prefix space, except in the raw format, where the reply continues the
    transcript's text. The app and ``serve`` share this rule, so both give the same text."""
    return bool(getattr(tok, "add_dummy_prefix", False)) and chat_format.name != "raw"

def build_prompt(request, chat_format, stop_ids, context: int, max_new_tokens: int) -> Prompt:
    """The prompt of a chat or completion request (``core.worker.protocol.GenerateRequest`` fields:
    mode, messages, prompt, continue_reply) for a ``context``-token model.

    Completion mode is BOS + the text; chat mode renders with ``chat_format`` (and the
    request's ``tools``), dropping the oldest turns to leave :func:`reply_reserve` positions
    for the reply. ``stop_ids`` are the
    model's; the chat format adds its end-of-turn tokens.
    """
    tok = chat_format.tokenizer
    # A branch's reply prefix: token ids of an earlier reply, kept as they were (never
    # re-tokenized from text, so the KV cache holding them matches).
    prefix = [int(t) for t in getattr(request, "reply_prefix", ())]
    if request.mode == "completion":
        if getattr(request, "tools", None):
            raise SettingsError("tools need a chat request: completion continues text and makes no calls")
        ids = tok.encode(request.prompt, bos=True) + prefix
        if len(ids) >= context:
            raise SettingsError(f"the prompt is {len(ids)} tokens, but the context holds {context}: shorten it")
        return Prompt(ids, 0, False, frozenset(stop_ids))
    budget = context - reply_reserve(context, max_new_tokens) - len(prefix)
    tools = tuple(getattr(request, "tools", ()) or ())
    calling = chat_format.tool_calling(tools, getattr(request, "parallel_tool_calls", True)) if tools else None
    ids, dropped = fit_dialog(chat_format, list(request.messages), budget, continue_reply=request.continue_reply,
                              tools=tools)
    # SentencePiece replies start with the dummy-prefix space: drop it at a reply's
    # start, but not when continuing one (that space separates words).
    strip = strips_reply_space(tok, chat_format) and not request.continue_reply and not prefix
    return Prompt(ids + prefix, dropped, strip, frozenset(stop_ids) | chat_format.stop_ids(), calling)
