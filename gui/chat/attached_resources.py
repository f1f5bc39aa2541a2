"""MCP resources attached to a message, as stored and as sent (no widgets).

A resource is read from its server when it is attached (off the UI thread; its chip says
"reading…", then its size or why it could not be read). Sending stores what was read in the
user message's meta under ``"resources"`` (name, address, server, text, whether it was cut),
beside the documents record (:mod:`gui.chat.grounded`): the transcript shows the typed text
and a chip per resource; the model reads the text with each resource after it as a fenced
block; a regenerated reply reads the same text (not the server's text of the moment), and
export/import carry it with the message.
"""
from __future__ import annotations

from dataclasses import dataclass

KEY = "resources"


@dataclass
class AttachedResource:
    """One attached resource: ``state`` reading | ready | failed, ``detail`` for its chip."""
    server: str
    uri: str
    name: str
    state: str = "reading"
    text: str = ""
    truncated: bool = False
    detail: str = ""

    def record(self) -> dict:
        return {"name": self.name, "uri": self.uri, "server": self.server, "text": self.text,
                "truncated": self.truncated}


def resources_of(meta: dict | None) -> list[dict]:
    """The resources stored with a message (records from elsewhere that lack text: left out)."""
    items = (meta or {}).get(KEY)
    if not isinstance(items, list):
        return []
    return [r for r in items if isinstance(r, dict) and isinstance(r.get("text"), str)]


def block(record: dict) -> str:
    """One resource as the model reads it: its name and address, then its text fenced (a
    cut text already ends saying so: the MCP client writes that)."""
    text = record["text"]
    fence = "~~~~" if "```" in text else "```"
    return f"{record.get('name', '')} ({record.get('uri', '')}):\n{fence}\n{text}\n{fence}"


def with_resources(content: str, meta: dict | None) -> str:
    """A user message's content with its resources after it."""
    blocks = [block(r) for r in resources_of(meta)]
    return "\n\n".join([content, *blocks]) if blocks else content


def chips(meta: dict | None) -> list[str]:
    """The chips of a message's resources: 'name · server'."""
    return [f"{r.get('name') or r.get('uri', '')} · {r.get('server', '')}" for r in resources_of(meta)]
