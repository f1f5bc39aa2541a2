"""What the history holds, as Python values: conversations and messages, how their fields
are stored in SQLite (JSON for dicts, valid UTF-8 for text) and read back (a damaged row
opens marked as damaged rather than failing the whole query), and the text of a
comparison that search looks in.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import LlamaDeskError
from core.history.schema import JSON_FIELDS, MESSAGE_COLUMNS
from core.tokenizer.base import valid_text

KINDS = ("chat", "comparison")


class HistoryError(LlamaDeskError):
    """A history operation that cannot be done: unknown id, bad import data, newer file."""


class HistoryDamagedError(HistoryError):
    """The store's file is damaged: SQLite cannot read it, or a table or column is missing
    (:meth:`core.history.store.History.open_or_recover` moves such a file aside)."""


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    kind: str  # "chat" | "comparison"
    current_leaf_id: int | None
    meta: dict = field(default_factory=dict)


@dataclass
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    text: str
    settings: dict | None
    seed: int | None
    model_id: str | None
    stats: dict | None
    stop_reason: str | None
    created_at: float
    meta: dict = field(default_factory=dict)
    # A reply's tool calls (OpenAI-shaped, each with its "source"); a "tool" message's call.
    tool_calls: list | None = None
    tool_result: dict | None = None


def json_default(obj: Any) -> Any:
    # Lanes may carry tensors / numpy arrays of tokens or logprobs; store their values.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, default=json_default)
    except (TypeError, ValueError) as e:
        raise HistoryError(f"cannot store value in history: {e}") from None


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class Damaged(str):
    """Text read back from bytes that were not valid UTF-8 (a damaged row)."""


def decode_text(data: bytes) -> str:
    # text_factory: a few corrupt bytes in one row must not make the whole query raise.
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return Damaged(data.decode("utf-8", "replace"))


def meta_or_empty(text: str | None) -> dict:
    try:
        v = loads(text)
    except (ValueError, TypeError):
        return {"damaged": ["meta"]}
    return v if isinstance(v, dict) else {}


def clean_text(text: str) -> tuple[str, bool]:
    """(``text`` with lone surrogates replaced by U+FFFD, whether any were): SQLite stores
    UTF-8, and a lone surrogate (broken clipboard data, invalid bytes from argv) cannot be
    encoded, which would make a message silently fail to save."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return valid_text(text), True


def conversation_from_row(row: sqlite3.Row) -> Conversation:
    return Conversation(id=row["id"], title=row["title"], created_at=row["created_at"],
                        updated_at=row["updated_at"], kind=row["kind"],
                        current_leaf_id=row["current_leaf_id"],
                        meta=meta_or_empty(row["meta"]))


def message_from_row(row: sqlite3.Row) -> Message:
    d = {k: row[k] for k in MESSAGE_COLUMNS}
    damaged = []
    for k in JSON_FIELDS:
        try:
            d[k] = loads(d[k])
        except (ValueError, TypeError):
            d[k], damaged = None, damaged + [k]
    if not isinstance(d["meta"], dict):
        d["meta"] = {}
    for k, kind in (("tool_calls", list), ("tool_result", dict)):
        if d[k] is not None and not isinstance(d[k], kind):
            d[k], damaged = None, damaged + [k]
    if isinstance(d["text"], Damaged):
        d["text"], damaged = str(d["text"]), damaged + ["text"]
    if not isinstance(d["text"], str):
        d["text"], damaged = "", damaged + ["text"]
    if damaged:  # shown as damaged; the rest of the conversation opens as usual
        d["meta"] = {**d["meta"], "damaged": damaged}
    return Message(**d)


def prompt_markdown(prompt: dict) -> str:
    if isinstance(prompt.get("messages"), list):
        return "\n\n".join(f"**{str(m.get('role', '?')).capitalize()}:** {m.get('content', m.get('text', ''))}"
                           for m in prompt["messages"] if isinstance(m, dict))
    return str(prompt.get("text", ""))


def comparison_search_text(data: dict) -> str:
    """The words of a comparison that search should find (prompt and lane texts)."""
    parts: list[str] = []
    prompt = data.get("prompt") or {}
    if isinstance(prompt, dict):
        parts.append(prompt_markdown(prompt))
    for lane in data.get("lanes") or []:
        if isinstance(lane, dict):
            parts.append(str(lane.get("text", "")))
    return "\n".join(parts).casefold()
