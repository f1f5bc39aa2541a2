"""Conversations to and from files: readable Markdown, and a JSON export that imports back.

The JSON format (``llamadesk.conversation``, version 1) carries the whole message tree with
each reply's settings, seed and stats; an import is checked completely before anything is
written, then stored as a new conversation with fresh ids.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from core.engine.constraint import LABELS
from core.history.records import KINDS, Conversation, HistoryError, Message, prompt_markdown
from core.history.schema import MESSAGE_COLUMNS
from core.history.store import History
from core.history.tool_messages import TOOL_ROLE, calls_of, source_of

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "export_markdown", "export_json", "import_json", "read_export",
           "export_file_name"]

EXPORT_FORMAT = "llamadesk.conversation"
EXPORT_VERSION = 1
MESSAGE_FIELDS = tuple(k for k in MESSAGE_COLUMNS if k != "conversation_id")


def export_markdown(history: History, conv_id: int) -> str:
    """The branch on screen (or a comparison's prompt and lanes) as readable Markdown;
    each reply is followed by a one-line summary of how it was generated."""
    conv = history.conversation(conv_id)
    out = [f"# {conv.title}", "",
           f"_{conv.kind.capitalize()} · created {_fmt_time(conv.created_at)} · "
           f"exported from LlamaDesk_", ""]
    if conv.kind == "comparison":
        data = history.comparison(conv_id)
        out += ["## Prompt", "", prompt_markdown(data.get("prompt") or {}), ""]
        for i, lane in enumerate(data.get("lanes") or [], 1):
            model = lane.get("model") if isinstance(lane.get("model"), dict) else {}
            where = f" · {model.get('name')}" if model.get("name") else ""
            if model.get("server"):
                where += f" on {model['server']}"
            out += [f"## Lane {i}{where}", "", str(lane.get("text", "")), ""]
            line = _settings_line(lane.get("settings"), lane.get("seed"), lane.get("model_id"),
                                  lane.get("stats"), lane.get("stop_reason"))
            if line:
                out += [f"> {line}", ""]
            if lane.get("grounding"):  # a lane grounded in documents (gui/compare/grounding.py)
                out += [f"> Documents: {lane['grounding']}", ""]
    for m in history.current_path(conv_id):
        out += _message_markdown(m)
        if m.role == "assistant":
            line = _settings_line(m.settings, m.seed, m.model_id, m.stats, m.stop_reason)
            n = len(history.siblings(m.id))
            if n > 1:
                line = f"version {[s.id for s in history.siblings(m.id)].index(m.id) + 1} of {n}" \
                       + (f" · {line}" if line else "")
            if line:
                out += [f"> {line}", ""]
    return "\n".join(out).rstrip() + "\n"

def _message_markdown(m: Message) -> list[str]:
    """A message's heading and text; a reply's tool calls as JSON blocks, a tool result
    headed with the tool it came from."""
    if m.role == TOOL_ROLE:
        rec = m.tool_result or {}
        notes = [w for w, on in (("failed", rec.get("is_error")), ("cut", rec.get("truncated"))) if on]
        head = f"## Tool result · {rec.get('name', '?')}" + (f" ({', '.join(notes)})" if notes else "")
        return [head, "", "```", m.text, "```", ""]
    out = [f"## {m.role.capitalize()}", "", m.text, ""]
    for c in calls_of(m):
        source = source_of(m, c.id)
        out += [f"**Tool call** `{c.name}`" + (f" · {source}" if source else ""), "",
                "```json", c.raw or json.dumps(c.arguments, indent=2, ensure_ascii=False), "```", ""]
    return out


def export_json(history: History, conv_id: int) -> dict:
    """Everything about a conversation — the whole message tree with settings, seeds
    and stats — as a JSON-ready dict that :func:`import_json` reads back."""
    conv = history.conversation(conv_id)
    msgs = history.messages(conv_id)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": time.time(),
        "conversation": {
            "title": conv.title, "kind": conv.kind, "created_at": conv.created_at,
            "updated_at": conv.updated_at, "current_leaf_id": conv.current_leaf_id,
            "meta": conv.meta,
        },
        "messages": [
            {k: getattr(m, k) for k in MESSAGE_FIELDS}
            for m in msgs
        ],
    }


def import_json(history: History, data: Any) -> Conversation:
    """Create a new conversation from :func:`export_json` output (fresh ids). Raises
    HistoryError, writing nothing, when the data is not a valid export."""
    conv, msgs = _validate_export(data)
    return history.add_tree(conv, msgs)


def read_export(path: str | Path) -> Any:
    """The parsed contents of a conversation file; HistoryError in the user's words when the
    file cannot be read or is not JSON (what it holds is checked by :func:`import_json`)."""
    p = Path(path)
    not_export = f"{p.name} is not a LlamaDesk conversation file"
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise HistoryError(f"cannot read {p.name}: {e.strerror or 'input/output error'}") from None
    except UnicodeDecodeError:
        raise HistoryError(f"{not_export} (it is not a text file); import a file saved with "
                           "File → Export as JSON") from None
    try:
        return json.loads(text)
    except ValueError:
        raise HistoryError(f"{not_export} (it is not JSON); import a file saved with "
                           "File → Export as JSON") from None


def export_file_name(title: str, ext: str) -> str:
    """A file name for exporting a conversation titled ``title``: its words joined by single
    spaces, never starting or ending in punctuation ("What is 2+2?" -> "What is 2 2.md")."""
    stem = re.sub(r"[^\w\-]+", " ", title).strip(" -_")
    stem = re.sub(r"\s+", " ", stem)[:80].rstrip(" -_") or "chat"
    return f"{stem}.{ext}"


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _settings_line(settings: dict | None, seed: int | None, model_id: str | None,
                   stats: dict | None, stop_reason: str | None) -> str:
    """'temperature 0.7 · top_p 0.9 · seed 42 · model x · 12 tokens · 3.1 tok/s · stop: eos'."""
    parts: list[str] = []
    s = settings or {}
    for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens",
              "num_beams", "chat_format"):
        if k in s and s[k] is not None:
            parts.append(f"{k} {_num(s[k])}")
    if s.get("stop"):
        parts.append("stop " + ", ".join(repr(x) for x in s["stop"]))
    if s.get("logit_bias_text"):
        parts.append("logit bias " + ", ".join(str(x) for x in s["logit_bias_text"]))
    if s.get("lookup"):  # speculative decoding: the same reply, drafted
        parts.append(f"prompt lookup {_num(s['lookup'])}")
    if s.get("draft"):
        parts.append(f"draft model {s['draft']}")
    if isinstance(s.get("constraint"), dict):  # the output was held to a schema/regex/grammar
        parts.append("format " + LABELS.get(s["constraint"].get("kind"), "?"))
    if seed is None:
        seed = s.get("seed")
    if seed is not None:
        parts.append(f"seed {seed}")
    if model_id:
        parts.append(f"model {model_id}")
    st = stats or {}
    for k, label in (("tokens", "tokens"), ("new_tokens", "tokens"), ("ttft_s", "s to first token"),
                     ("tokens_per_s", "tok/s")):
        if isinstance(st.get(k), (int, float)):
            v = st[k]
            parts.append(f"{v:.2f} {label}" if isinstance(v, float) else f"{v} {label}")
    if stop_reason:
        parts.append(f"stop: {stop_reason}")
    return " · ".join(parts)


def _bad(msg: str):
    raise HistoryError(f"not a valid LlamaDesk conversation file: {msg}")


def _validate_export(data: Any) -> tuple[dict, list[dict]]:
    """Check an export dict thoroughly before anything is written."""
    if not isinstance(data, dict):
        _bad(f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != EXPORT_FORMAT:
        _bad(f"format is {data.get('format')!r}, expected {EXPORT_FORMAT!r}")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        _bad("missing or non-integer 'version'")
    if version > EXPORT_VERSION:
        raise HistoryError(f"conversation file version {version} was written by a newer "
                           f"LlamaDesk (this one reads up to {EXPORT_VERSION})")
    if version < 1:
        _bad(f"unknown version {version}")
    conv = _checked_conversation(data.get("conversation"))
    msgs = data.get("messages", [])
    if not isinstance(msgs, list):
        _bad("'messages' must be a list")
    seen: set[int] = set()
    for i, m in enumerate(msgs):
        seen.add(_checked_message_id(m, f"message #{i + 1}", seen))
    leaf = conv.get("current_leaf_id")
    if leaf is not None and leaf not in seen:
        _bad(f"current_leaf_id {leaf!r} is not one of the messages")
    return conv, msgs


def _checked_conversation(conv: Any) -> dict:
    """The export's conversation object, checked, with its kind defaulted to chat."""
    if not isinstance(conv, dict):
        _bad("missing 'conversation' object")
    if not isinstance(conv.get("title"), str):
        _bad("conversation 'title' must be a string")
    conv = dict(conv)
    conv.setdefault("kind", "chat")
    if conv["kind"] not in KINDS:
        _bad(f"conversation kind {conv['kind']!r} is not one of {', '.join(KINDS)}")
    if conv.get("meta") is not None and not isinstance(conv["meta"], dict):
        _bad("conversation 'meta' must be an object")
    for k in ("created_at", "updated_at"):
        if k in conv and not isinstance(conv[k], (int, float)):
            _bad(f"conversation '{k}' must be a number")
    return conv


def _checked_message_id(m: Any, where: str, seen: set[int]) -> int:
    """One exported message checked against the ids ``seen`` before it (its parent must be
    one of them); returns its id."""
    if not isinstance(m, dict):
        _bad(f"{where} is not an object")
    mid = m.get("id")
    if not isinstance(mid, int) or isinstance(mid, bool):
        _bad(f"{where} has no integer 'id'")
    if mid in seen:
        _bad(f"{where} repeats id {mid}")
    pid = m.get("parent_id")
    if pid is not None and pid not in seen:
        _bad(f"{where} (id {mid}) has parent_id {pid!r}, which is not an earlier message")
    where = f"{where} (id {mid})"
    if not isinstance(m.get("role"), str) or not m["role"]:
        _bad(f"{where} has no 'role'")
    if not isinstance(m.get("text"), str):
        _bad(f"{where} has no string 'text'")
    for k in ("settings", "stats", "meta", "tool_result"):
        if m.get(k) is not None and not isinstance(m[k], dict):
            _bad(f"{where}: '{k}' must be an object")
    calls = m.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)):
        _bad(f"{where}: 'tool_calls' must be a list of objects")
    seed = m.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        _bad(f"{where}: 'seed' must be an integer")
    for k in ("model_id", "stop_reason"):
        if m.get(k) is not None and not isinstance(m[k], str):
            _bad(f"{where}: '{k}' must be a string")
    if "created_at" in m and not isinstance(m["created_at"], (int, float)):
        _bad(f"{where}: 'created_at' must be a number")
    return mid
