"""Tool use in the transcript: the approval card of a call, a reply's calls, and a call's
result as a collapsible block.

:class:`ToolCard` asks before a call runs (Run / Edit arguments / Deny, "always allow this
tool in this chat") and says while it runs; :class:`ToolResultWidget` shows a ``tool``
message folded to one line until opened, at most :data:`SHOWN_CHARS` of it, saying when
the model got a cut result; :class:`CallsReplyWidget` is a reply with the calls it made
listed under its text. :func:`message_widget` picks the widget for a message dict.
"""
from __future__ import annotations

import html
import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QCheckBox, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton,
                               QVBoxLayout)

from core.tools.parse import looks_like_call
from core.tools.spec import MAX_RESULT_CHARS

from gui import theme
from gui.chat.message import MessageWidget

SHOWN_CHARS = 20_000  # of a result, in the transcript (the store and the model have up to MAX_RESULT_CHARS)


def source_label(source: str) -> str:
    """Who runs a tool, in words: "built-in", "MCP server weather", "unknown"."""
    if source == "builtin":
        return "built-in"
    if source.startswith("mcp:"):
        return f"MCP server {source[4:]}"
    return source or "unknown source"


def pretty(arguments: dict, raw: str = "") -> str:
    return raw or json.dumps(arguments, indent=2, ensure_ascii=False)


class ToolCard(QFrame):
    """One call waiting for the user (objectName ``toolApprovalCard``).

    Signals:
        decided(str, str, object, bool): call id, "run" or "deny", the arguments to run with
            (a dict; None: as the model wrote them), and "always allow this tool in this chat".
    """

    decided = Signal(str, str, object, bool)

    def __init__(self, card: dict, parent=None):
        super().__init__(parent)
        self.setObjectName("toolApprovalCard")
        self.card = dict(card)
        self.call_id = str(card["call_id"])
        c = theme.colors()
        self.setStyleSheet(f"QFrame#toolApprovalCard {{ border: 1px solid {c['accent']}; border-radius: 8px; "
                           f"background: {c['alt']}; }}")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        self.title = QLabel(f"<b>Run tool <code>{html.escape(card['name'])}</code>?</b> "
                            f"<span style='color:{c['muted']}'>· {html.escape(source_label(card.get('source', '')))}"
                            "</span>")
        self.title.setObjectName("toolCardTitle")
        self.title.setWordWrap(True)
        lay.addWidget(self.title)
        if card.get("description"):
            desc = QLabel(card["description"][:500])
            desc.setWordWrap(True)
            desc.setStyleSheet(f"color: {c['muted']};")
            lay.addWidget(desc)
        self.arguments = QPlainTextEdit(pretty(card.get("arguments") or {}, card.get("raw", "")))
        self.arguments.setObjectName("toolArguments")
        self.arguments.setReadOnly(True)
        self.arguments.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        lines = self.arguments.toPlainText().count("\n") + 1
        self.arguments.setFixedHeight(min(220, 18 * lines + 14))
        lay.addWidget(self.arguments)
        self.always = QCheckBox("Always allow this tool in this chat")
        self.always.setObjectName("toolAlwaysCheck")
        lay.addWidget(self.always)
        self.status = QLabel()
        self.status.setObjectName("toolCardStatus")
        self.status.setWordWrap(True)
        self.status.hide()
        lay.addWidget(self.status)
        lay.addLayout(self._buttons())

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addStretch(1)
        self.deny_button = QPushButton("Deny")
        self.deny_button.setObjectName("toolDenyButton")
        self.edit_button = QPushButton("Edit arguments")
        self.edit_button.setObjectName("toolEditButton")
        self.edit_button.setCheckable(True)
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("toolRunButton")
        self.run_button.setDefault(True)
        for b in (self.deny_button, self.edit_button, self.run_button):
            row.addWidget(b)
        self.deny_button.clicked.connect(lambda: self.decided.emit(self.call_id, "deny", None, False))
        self.edit_button.toggled.connect(self._edit)
        self.run_button.clicked.connect(self.run)
        return row

    def _edit(self, on: bool) -> None:
        self.arguments.setReadOnly(not on)
        if on:
            self.arguments.setFocus()
            self.arguments.setFixedHeight(220)

    def run(self) -> None:
        """Run with the arguments shown (checked as a JSON object when they were edited)."""
        args = None
        if self.edit_button.isChecked():
            try:
                args = json.loads(self.arguments.toPlainText())
            except ValueError as e:
                self.say(f"⚠ The arguments are not valid JSON: {e}")
                return
            if not isinstance(args, dict):
                self.say("⚠ The arguments must be a JSON object ({…})")
                return
        self.decided.emit(self.call_id, "run", args, self.always.isChecked())

    def say(self, text: str) -> None:
        self.status.setText(text)
        self.status.setVisible(bool(text))

    def set_running(self) -> None:
        """The call runs: the buttons go, the card says so until its result comes."""
        for b in (self.deny_button, self.edit_button, self.run_button, self.always):
            b.setEnabled(False)
        self.arguments.setReadOnly(True)
        self.say(f"Running {self.card['name']}… (Stop cancels it)")


class ToolResultWidget(MessageWidget):
    """A ``tool`` message: "Result · name", folded to one line until opened."""

    def __init__(self, *, message: dict, streaming: bool = False, parent=None):
        self.expanded = False
        super().__init__(message=message, streaming=streaming, parent=parent)
        self.setProperty("role", "tool")
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("toolResultToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.RightArrow)
        self.toggle.toggled.connect(self.set_expanded)
        self.layout().insertWidget(1, self.toggle)
        self.update_message(message, streaming=streaming)

    def _show_buttons(self) -> None:
        for name, b in self.buttons.items():  # a result is copied or deleted, not regenerated
            b.setVisible(name in ("copy", "delete"))

    def update_message(self, message: dict, *, streaming: bool = False) -> None:
        super().update_message(message, streaming=False)
        rec = message.get("tool_result") or {}
        self.role_label.setText(f"Result · {rec.get('name') or 'tool'}")
        text = message.get("text", "")
        notes = []
        if rec.get("is_error"):
            notes.append("failed")
        if rec.get("truncated"):
            notes.append(f"cut: the model got the first {MAX_RESULT_CHARS:,} characters")
        if len(text) > SHOWN_CHARS:
            notes.append(f"showing the first {SHOWN_CHARS:,} of {len(text):,} characters")
        self.footer.setText(" · ".join(["⚠ " + n if n == "failed" else n for n in notes]))
        self.footer.setVisible(bool(notes))
        if hasattr(self, "toggle"):
            first = next((ln for ln in text.splitlines() if ln.strip()), "")[:80]
            self.toggle.setText(f"{len(text):,} characters" + (f": {first}" if first else ""))

    def set_text(self, text: str) -> None:
        self.message["text"] = text
        if self.expanded:
            shown = text[:SHOWN_CHARS]
            fence = "~~~~" if "```" in shown else "```"
            self.body.set_markdown(f"{fence}\n{shown}\n{fence}")
        self.body.setVisible(self.expanded)

    def set_expanded(self, on: bool) -> None:
        self.expanded = bool(on)
        if self.toggle.isChecked() != self.expanded:
            self.toggle.setChecked(self.expanded)
        self.toggle.setArrowType(Qt.DownArrow if on else Qt.RightArrow)
        self.set_text(self.message.get("text", ""))


class CallsReplyWidget(MessageWidget):
    """A reply that called tools: its text, then one line per call (name, source, arguments)."""

    def __init__(self, *, message: dict, streaming: bool = False, parent=None):
        super().__init__(message=message, streaming=streaming, parent=parent)
        self.calls_label = QLabel(self)
        self.calls_label.setObjectName("toolCallsLabel")
        self.calls_label.setWordWrap(True)
        self.calls_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.layout().insertWidget(self.layout().indexOf(self.footer), self.calls_label)
        self.update_message(message, streaming=streaming)

    def update_message(self, message: dict, *, streaming: bool = False) -> None:
        super().update_message(message, streaming=streaming)
        if not hasattr(self, "calls_label"):
            return
        lines = []
        for c in message.get("tool_calls") or []:
            fn = c.get("function") or {} if isinstance(c, dict) else {}
            args = str(fn.get("arguments", ""))
            args = args if len(args) <= 160 else args[:159] + "…"
            lines.append(f"→ <b>{html.escape(str(fn.get('name', '?')))}</b> "
                         f"<code>{html.escape(args)}</code> · {html.escape(source_label(str(c.get('source') or '')))}")
        self.calls_label.setText("<br>".join(lines))
        text = message.get("text", "")  # the call as the model wrote it is listed above: not twice
        self.body.setVisible(streaming or self.token_mode or bool(text.strip()) and not looks_like_call(text))


def message_widget(message: dict, **kw) -> MessageWidget:
    """The transcript widget for ``message``: a tool result, a reply with calls, or any other."""
    if message.get("role") == "tool":
        return ToolResultWidget(message=message, **kw)
    if message.get("tool_calls"):
        return CallsReplyWidget(message=message, **kw)
    return MessageWidget(message=message, **kw)
