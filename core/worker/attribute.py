"""An AttributeRequest on the worker: characters of the chat to token positions, then
:func:`core.engine.attribution.attribute` over prompt + reply.

Passages and the reply span arrive as character ranges (what the GUI and the source map
know); the model works in tokens. Each token's bytes are laid end to end, the message's
text is found in them (chat formats strip a message and SentencePiece adds a leading
space, so it is searched for rather than assumed at an offset), and a character range maps
to every token whose bytes overlap it.
"""
from __future__ import annotations

import threading
from bisect import bisect_right

from core.engine.attribution import AttributionCancelled, attribute
from core.errors import SettingsError
from core.prompt.chat_format import chat_format_for
from core.prompt.prompting import build_prompt
from core.worker.protocol import AttributeRequest, Attributed, Error


def byte_starts(tokenizer, ids: list[int]) -> tuple[bytes, list[int]]:
    """The bytes of ``ids`` laid end to end, and where each token's bytes start."""
    starts, parts, at = [], [], 0
    for t in ids:
        b = tokenizer.token_bytes(int(t))
        starts.append(at)
        parts.append(b)
        at += len(b)
    return b"".join(parts), starts


def token_range(starts: list[int], total: int, lo: int, hi: int) -> tuple[int, int]:
    """Tokens [a, b) whose bytes overlap bytes [lo, hi) (``starts`` ascending, ``total`` bytes)."""
    if hi <= lo:
        return 0, 0
    a = max(0, bisect_right(starts, lo) - 1)
    b = bisect_right(starts, hi - 1)
    # tokens with no bytes (specials) at the edges hold nothing of the text
    while a < b and (starts[a + 1] if a + 1 < len(starts) else total) <= lo:
        a += 1
    return a, b


def _locate(text: str, haystack: bytes, what: str, *, last: bool) -> tuple[int, str]:
    """Where ``text`` (stripped, as chat formats render it) starts in ``haystack``, and the
    leading characters the rendering dropped."""
    core = text.strip()
    lead = text[:len(text) - len(text.lstrip())]
    needle = core.encode("utf-8")
    at = haystack.rfind(needle) if last else haystack.find(needle)
    if at < 0 or not needle:
        raise SettingsError(f"the {what} is not in the prompt the model sees (it was shortened or edited)")
    return at, lead


def _char_bytes(text: str, lead: str, c: int) -> int:
    """Byte offset of character ``c`` of ``text`` inside its stripped rendering."""
    c = min(max(0, c - len(lead)), len(text) - len(lead))
    return len(text[len(lead):len(lead) + c].encode("utf-8"))


def token_spans(tokenizer, prompt: list[int], reply_ids: list[int], req: AttributeRequest):
    """(reply span, passages) of ``req`` as token ranges of prompt + reply_ids."""
    content = str(req.messages[req.source_message].get("content") or "")
    p_bytes, p_starts = byte_starts(tokenizer, prompt)
    base, lead = _locate(content, p_bytes, "source message", last=True)
    passages = []
    for c0, c1 in req.passages:
        lo, hi = base + _char_bytes(content, lead, c0), base + _char_bytes(content, lead, c1)
        passages.append(token_range(p_starts, len(p_bytes), lo, hi))
    r_bytes, r_starts = byte_starts(tokenizer, reply_ids)
    at, lead = _locate(req.reply, r_bytes, "reply", last=False)
    s0, s1 = req.span
    a, b = token_range(r_starts, len(r_bytes), at + _char_bytes(req.reply, lead, s0),
                       at + _char_bytes(req.reply, lead, s1))
    if a >= b:
        raise SettingsError("select some text of the reply first")
    n = len(prompt)
    return (n + a, n + b), passages


def run_attribution(loaded, engine, rid: int, req: AttributeRequest, cancel: threading.Event):
    """The Attributed event for ``req`` on ``loaded`` run by ``engine`` (or an Error event)."""
    if loaded is None or engine is None:
        return Error(rid, "no model is loaded: open a model first")
    auto = req.chat_format in ("", "auto")
    chat_format = loaded.chat_format if auto else chat_format_for(loaded.tokenizer, override=req.chat_format)
    context = engine.max_context
    if not req.messages or not -len(req.messages) <= req.source_message < len(req.messages):
        return Error(rid, "the request names no message holding the sources")
    tok = loaded.tokenizer
    reply_ids = [int(t) for t in req.reply_ids] or tok.encode(req.reply)
    try:
        prompt = build_prompt(req, chat_format, loaded.stop_ids, context, max(1, len(reply_ids))).ids
        span, passages = token_spans(tok, prompt, reply_ids, req)
        res = attribute(loaded.model, prompt + reply_ids, span, passages, cancel=cancel)
    except AttributionCancelled:
        return Error(rid, "cancelled", cancelled=True)
    except SettingsError as e:
        return Error(rid, str(e))
    return Attributed(rid, res.shares, res.none, res.layers, res.heads, res.queries)


__all__ = ["run_attribution", "token_spans", "token_range", "byte_starts"]
