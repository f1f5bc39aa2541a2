"""A user message grounded in documents, as stored and as sent (no widgets).

A message sent with attachments or collections keeps, in its meta under ``"documents"``,
what was attached (``attachments``: paths, ``collections``: folder roots) and the
grounding made for it (``grounding``: :meth:`core.documents.ground.Grounding.to_meta`: the
prompt with its numbered sources and each source's character span in it). The transcript
shows the text the user typed; the model is sent the grounded prompt, so a regenerated reply
reads the same passages the first one did, and export/import carry it with the message.
"""
from __future__ import annotations

import re
from dataclasses import fields

from core.documents import Grounding, Source

META_KEY = "documents"
_CITE = re.compile(r"\[(\d{1,3})\]")
_TAG = re.compile(r"<\s*(/?)\s*(\w+)")


def documents_of(meta: dict | None) -> dict | None:
    """The documents record of a message's meta, or None."""
    rec = (meta or {}).get(META_KEY)
    return rec if isinstance(rec, dict) else None


def grounding_of(meta: dict | None) -> dict | None:
    """The stored grounding (prompt, sources, mode, used, total) of a message, or None."""
    rec = documents_of(meta)
    g = rec.get("grounding") if rec else None
    return g if isinstance(g, dict) and isinstance(g.get("prompt"), str) else None


def sent_content(text: str, meta: dict | None) -> str:
    """What the model reads for a user message: its grounded prompt, else its text."""
    g = grounding_of(meta)
    return g["prompt"] if g else text


def summary(meta: dict | None) -> str:
    """"read in full" / "12 of 340 passages used" / "no passage matched" ("" when none)."""
    g = grounding_of(meta)
    if not g:
        return ""
    try:
        return g.get("summary") or Grounding.from_meta(g).summary
    except (TypeError, KeyError, ValueError):  # a record from another version: say nothing wrong
        return ""


def chips(meta: dict | None) -> list[str]:
    """The chips a grounded user message shows: each file's and folder's name, then the summary."""
    rec = documents_of(meta)
    if not rec:
        return []
    names = [_name(p) for p in rec.get("attachments") or []]
    names += [f"{_name(p)} (collection)" for p in rec.get("collections") or []]
    s = summary(meta)
    return names + ([s] if s else [])


def _name(path: str) -> str:
    return str(path).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or str(path)


def source(grounding: dict, number: int) -> dict | None:
    """Source ``number`` of a stored grounding, with its ``text`` (its span of the prompt)."""
    for s in grounding.get("sources") or []:
        if int(s.get("number", -1)) == number:
            a, b = s.get("span") or (0, 0)
            return {**s, "text": grounding["prompt"][int(a):int(b)]}
    return None


def where(src: dict) -> str:
    """'notes.md, lines 3-20' / 'paper.pdf, p. 4, lines 1-9' (the source's own wording)."""
    names = {f.name for f in fields(Source)}
    try:
        return Source(**{k: v for k, v in src.items() if k in names}).where()
    except (TypeError, KeyError, ValueError):
        return _name(src.get("source", ""))


def cited_numbers(text: str, known: set[int]) -> list[int]:
    """The source numbers a reply cites ([1], [2]…) that its grounding has, in order."""
    return list(dict.fromkeys(int(m) for m in _CITE.findall(text) if int(m) in known))


def link_citations(html: str, known: set[int]) -> str:
    """``[n]`` in rendered prose as ``cite:n`` links, for the numbers in ``known`` (never
    inside code or an existing link)."""
    if not known:
        return html
    out, depth = [], 0
    for part in re.split(r"(<[^>]+>)", html):
        if part.startswith("<"):
            m = _TAG.match(part)
            if m and m.group(2).lower() in ("pre", "code", "a"):
                depth = max(0, depth - 1) if m.group(1) else depth + 1
            out.append(part)
        elif depth:
            out.append(part)
        else:
            out.append(_CITE.sub(lambda m: f'<a href="cite:{m.group(1)}">[{m.group(1)}]</a>'
                                 if int(m.group(1)) in known else m.group(0), part))
    return "".join(out)


def locate(selection: str, text: str) -> tuple[int, int] | None:
    """Where a selection of the rendered reply lies in its Markdown ``text``: exactly, else
    word by word with anything that is not a word between (Markdown marks, line breaks)."""
    sel = selection.replace("\u2029", "\n").strip()
    if not sel:
        return None
    at = text.find(sel)
    if at >= 0:
        return at, at + len(sel)
    words = re.findall(r"\w+", sel)
    if not words:
        return None
    m = re.search(r"\W*".join(map(re.escape, words)), text)
    return (m.start(), m.end()) if m else None
