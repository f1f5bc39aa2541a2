"""The conversation on screen, as a Qt object over :class:`core.history.store.History`.

Lives on the UI thread. It knows which conversation is open, which branch of its message
tree is shown, and turns that branch into what the transcript shows and what the model is
sent. Every change is written to the store at once (a message is written when it
completes), so a restart finds everything.
"""
from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.history import export as chat_export
from core.history.records import Message
from core.history.store import History
from core.history.tool_messages import openai_message

from gui.chat import attached_resources, grounded

TITLE_CHARS = 48


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return (line[:TITLE_CHARS - 1] + "…") if len(line) > TITLE_CHARS else (line or "New chat")


class ConversationModel(QObject):
    """The open conversation and the list of all of them.

    Signals:
        listChanged(): conversations were added, renamed, deleted or reordered.
        currentChanged(): another conversation (or none: a fresh chat) is open.
        pathChanged(): the branch on screen changed (message deleted, version switched, a
            message added on another branch).
        messageAdded(dict): a message was added at the end of the branch on screen (its view).
    """

    listChanged = Signal()
    currentChanged = Signal()
    pathChanged = Signal()
    messageAdded = Signal(dict)

    def __init__(self, *, history: History, parent=None):
        super().__init__(parent)
        self.history = history
        self.conv_id: int | None = None

    # ---- conversations
    def conversations(self, search: str | None = None):
        return self.history.conversations(search=search or None, kind="chat")

    def new(self) -> None:
        """Start a fresh chat; it is stored once its first message is sent."""
        self.conv_id = None
        self.currentChanged.emit()
        self.pathChanged.emit()

    def open(self, conv_id: int | None) -> None:
        if conv_id is not None:
            self.history.conversation(conv_id)  # HistoryError if gone
        self.conv_id = conv_id
        self.currentChanged.emit()
        self.pathChanged.emit()

    def title(self) -> str:
        return self.history.conversation(self.conv_id).title if self.conv_id is not None else "New chat"

    def rename(self, conv_id: int, title: str) -> None:
        self.history.rename(conv_id, title.strip() or "Untitled")
        self.listChanged.emit()

    def delete_conversation(self, conv_id: int) -> None:
        self.history.delete_conversation(conv_id)
        self.listChanged.emit()
        if conv_id == self.conv_id:
            self.new()

    def _ensure(self, first_text: str) -> int:
        if self.conv_id is None:
            self.conv_id = self.history.create_conversation(title_from(first_text)).id
            self.currentChanged.emit()
        return self.conv_id

    # ---- the branch on screen
    def path(self) -> list[Message]:
        return self.history.current_path(self.conv_id) if self.conv_id is not None else []

    def leaf_id(self) -> int | None:
        p = self.path()
        return p[-1].id if p else None

    def view_messages(self) -> list[dict]:
        """The branch as the transcript shows it (with "version": (i, n) per message)."""
        out = []
        for m in self.path():
            sibs = [s.id for s in self.history.siblings(m.id)]
            out.append(self.view_message(m, version=(sibs.index(m.id) + 1, len(sibs))))
        return out

    def view_message(self, m: Message, version: tuple[int, int] | None = None) -> dict:
        if version is None:
            sibs = [s.id for s in self.history.siblings(m.id)]
            version = (sibs.index(m.id) + 1, len(sibs))
        return {"id": m.id, "role": m.role, "text": m.text, "stats": m.stats or {},
                "stop_reason": m.stop_reason, "seed": m.seed, "version": version,
                "settings": m.settings or {}, "error": (m.meta or {}).get("error"),
                "incomplete": (m.meta or {}).get("incomplete"), "tool_calls": m.tool_calls or [],
                "tool_result": m.tool_result, "tools_offered": (m.meta or {}).get("tools") or [],
                **self._documents_view(m)}

    def _documents_view(self, m: Message) -> dict:
        """A grounded question's chips; the source numbers its reply can link ([n])."""
        if m.role == "user":
            chips = grounded.chips(m.meta) + attached_resources.chips(m.meta)
            return {"documents": chips} if chips else {}
        if m.role != "assistant" or m.parent_id is None:
            return {}
        g = grounded.grounding_of(self.history.message(m.parent_id).meta)
        return {"sources": [int(s.get("number", 0)) for s in g.get("sources") or []]} if g else {}

    def request_messages(self, system_prompt: str = "", upto: int | None = None) -> list[dict]:
        """What the model is sent: the system prompt, then the branch up to ``upto`` (inclusive)."""
        msgs = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
        for m in self.path():
            msg = openai_message(m)
            if m.role == "user":  # a grounded question is sent with its passages, then its resources
                msg["content"] = attached_resources.with_resources(grounded.sent_content(m.text, m.meta), m.meta)
            msgs.append(msg)
            if m.id == upto:
                break
        return msgs

    def message(self, msg_id: int) -> Message:
        return self.history.message(msg_id)

    # ---- changes
    def add_user(self, text: str, *, parent_id: int | None = ..., meta: dict | None = None) -> Message:  # type: ignore[assignment]
        """Store a user message under ``parent_id`` (default: the end of the branch), with
        ``meta`` (a grounded question's documents: :mod:`gui.chat.grounded`)."""
        conv = self._ensure(text)
        leaf = self.leaf_id()
        if parent_id is ...:
            parent_id = leaf
        m = self.history.add_message(conv, role="user", text=text, parent_id=parent_id, meta=meta)
        self.listChanged.emit()
        if parent_id == leaf:  # the branch on screen grows by one: no need to show it anew
            self.messageAdded.emit(self.view_message(m))
        else:
            self.pathChanged.emit()
        return m

    def add_reply(self, parent_id: int, text: str, **fields) -> Message:
        """Store a finished (or stopped) reply under ``parent_id``; it goes on screen."""
        m = self.history.add_message(self.conv_id, role="assistant", text=text, parent_id=parent_id, **fields)
        self.listChanged.emit()
        return m

    def update_reply(self, msg_id: int, **fields) -> Message:
        m = self.history.update_message(msg_id, **fields)
        self.listChanged.emit()
        return m

    def show_branch_at(self, msg_id: int) -> None:
        """Show the branch that ends at ``msg_id`` (a new reply to it will follow)."""
        self.history.set_current_leaf(self.conv_id, msg_id)
        self.pathChanged.emit()

    def restore_leaf(self, conv_id: int | None, leaf: int, expected: int) -> bool:
        """Show again the branch ending at ``leaf`` in conversation ``conv_id``, if its branch
        still ends at ``expected`` (where a reply that came to nothing was to go); whether
        it did. The conversation need not be the one on screen any more."""
        if conv_id is None or leaf == expected or self.history.conversation(conv_id).current_leaf_id != expected:
            return False
        self.history.set_current_leaf(conv_id, leaf)
        if conv_id == self.conv_id:
            self.pathChanged.emit()
        return True

    def switch_version(self, msg_id: int, step: int) -> int | None:
        """Show the previous (-1) or next (+1) version of a message; returns the new id."""
        sibs = [s.id for s in self.history.siblings(msg_id)]
        i = sibs.index(msg_id) + step
        if not 0 <= i < len(sibs):
            return None
        self.history.select(sibs[i])
        self.pathChanged.emit()
        return sibs[i]

    def delete_message(self, msg_id: int) -> dict:
        """Delete a message and its replies; if it had other versions, show the nearest one.
        Returns what :meth:`restore` needs to undo it."""
        sibs = [s.id for s in self.history.siblings(msg_id)]
        snapshot = self.history.subtree_snapshot(msg_id)
        self.history.delete_message(msg_id)
        rest = [s for s in sibs if s != msg_id]
        if rest:
            before = [s for s in rest if s < msg_id]
            self.history.select(before[-1] if before else rest[0])
        self.listChanged.emit()
        self.pathChanged.emit()
        return snapshot

    def restore(self, snapshot: dict) -> None:
        """Undo :meth:`delete_message`: the messages, their branch and the branch shown."""
        self.history.restore_subtree(snapshot)
        self.listChanged.emit()
        if snapshot["conversation_id"] == self.conv_id:
            self.pathChanged.emit()

    # ---- files
    def export_markdown(self) -> str:
        return chat_export.export_markdown(self.history, self.conv_id)

    def export_json(self) -> dict:
        return chat_export.export_json(self.history, self.conv_id)

    def export_file(self, path: str, fmt: str) -> None:
        """Write the open conversation to ``path`` as Markdown ("md") or JSON (OSError,
        HistoryError when it cannot)."""
        text = self.export_markdown() if fmt == "md" else json.dumps(self.export_json(), indent=2, ensure_ascii=False)
        Path(path).write_text(text, encoding="utf-8")

    def import_file(self, path: str) -> int:
        """Import an exported conversation (JSON) and open it; HistoryError says what is wrong."""
        return self.import_json(chat_export.read_export(path))

    def import_json(self, data: dict) -> int:
        conv = chat_export.import_json(self.history, data)
        self.listChanged.emit()
        self.open(conv.id)
        return conv.id
