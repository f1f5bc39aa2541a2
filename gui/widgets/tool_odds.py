"""What a reply's token records say about its tool calls (issue 25, item 6).

At the token where a reply could open a call, the alternatives the model weighed split into
those that open one (``{``, ``[``, ``<|python_tag|>``, ``<tool_call>``, after any white space) and those
that answer in words: :func:`call_odds` sums each side of the recorded top alternatives (the
rest of the probability was on tokens not recorded). Inside a call, the token that starts
the tool's name holds the model's choice of tool: :func:`name_choices` maps its
alternatives to the offered tools they begin. :func:`tool_note` puts both into a line for
the token inspector. Pure functions over the stored records: no model, no Qt.
"""
from __future__ import annotations

import html
import re

CALL_OPENERS = ("{", "[", "<|python_tag|>", "<tool_call>")  # the last: Hermes / Qwen templates
_NAME_KEY = re.compile(r'"name"\s*:\s*"')


def opens_call(piece: str) -> bool:
    """Whether a token's text would open a call (white space before it aside)."""
    s = piece.lstrip()
    return bool(s) and s.startswith(CALL_OPENERS)


def call_odds(top: dict | None) -> dict | None:
    """{"call": p, "answer": p, "unlisted": p}: the model's (raw) probability, among the
    recorded alternatives, of opening a call vs. answering, and what was not recorded."""
    if not top or not top.get("raw"):
        return None
    pieces = {int(i): str(s) for i, s in (top.get("pieces") or {}).items()}
    call = answer = 0.0
    for tid, p in top["raw"]:
        piece = pieces.get(int(tid))
        if piece is None:
            continue
        if opens_call(piece):
            call += float(p)
        else:
            answer += float(p)
    return {"call": call, "answer": answer, "unlisted": max(0.0, 1.0 - call - answer)}


def token_starts(texts: list[str], offset: int = 0) -> list[int]:
    """Where each token's text starts in the reply's text."""
    out, pos = [], offset
    for t in texts:
        out.append(pos)
        pos += len(t)
    return out


def token_at(starts: list[int], texts: list[str], char: int) -> int | None:
    """The token whose text covers character ``char`` (None past the record)."""
    for i, (s, t) in enumerate(zip(starts, texts)):
        if s <= char < s + max(1, len(t)):
            return i
    return None


def call_tokens(text: str, record: dict) -> dict:
    """{"first": index of the first token of the call (or of the reply), "names": {token
    index: the token's text before the tool name it begins}} from a reply's text and record."""
    texts = [str(t) for t in record.get("token_texts") or []]
    starts = token_starts(texts, int(record.get("offset") or 0))
    first = next((i for i, t in enumerate(texts) if t.strip() or "<|python_tag|>" in t), 0)
    names = {}
    for m in _NAME_KEY.finditer(text):
        i = token_at(starts, texts, m.end())
        if i is not None:
            names.setdefault(i, text[starts[i]:m.end()])
    return {"first": first, "names": names}


def name_choices(top: dict | None, tools: list[str], lead: str = "") -> list[tuple[str, float]]:
    """The offered tools the alternatives at a name's first token begin, with the summed
    probability of the tokens that begin each (a token that begins several counts for each);
    ``lead``: the token's text before the name (``"`` when one token holds both)."""
    if not top or not tools:
        return []
    pieces = {int(i): str(s) for i, s in (top.get("pieces") or {}).items()}
    odds: dict[str, float] = {}
    for tid, p in top.get("raw") or []:
        piece = pieces.get(int(tid), "")
        if not piece.startswith(lead) or not piece[len(lead):]:
            continue
        piece = piece[len(lead):]
        for name in tools:
            if name.startswith(piece) or piece.startswith(name):
                odds[name] = odds.get(name, 0.0) + float(p)
    return sorted(odds.items(), key=lambda kv: -kv[1])


def tool_note(message: dict, index: int, top: dict | None) -> str:
    """HTML for the inspector about token ``index`` of reply ``message`` (a view dict with
    "tokens", "tool_calls" and "tools_offered"), "" when there is nothing to say."""
    offered = list(message.get("tools_offered") or [])
    calls = message.get("tool_calls") or []
    record = message.get("tokens")
    if not (offered or calls) or not isinstance(record, dict):
        return ""
    spots = call_tokens(message.get("text", ""), record)
    if index == spots["first"]:
        odds = call_odds(top)
        if odds is None:
            return ""
        verb = "It called a tool here." if calls else "It answered here."
        return (f"<b>Call a tool: {100 * odds['call']:.1f}%</b> · answer: {100 * odds['answer']:.1f}%"
                + (f" · not recorded: {100 * odds['unlisted']:.1f}%" if odds["unlisted"] > 0.0005 else "")
                + f"<br>{verb}")
    if index in spots["names"]:
        names = offered or [str((c.get("function") or {}).get("name", "")) for c in calls if isinstance(c, dict)]
        choices = name_choices(top, names, spots["names"][index])
        if not choices:
            return "Tool name: no recorded alternative begins an offered tool."
        return "<b>Tool name</b> · " + " · ".join(f"{html.escape(n)} {100 * p:.1f}%" for n, p in choices)
    return ""
