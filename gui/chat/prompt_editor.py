"""The prompt editor: a multi-line box with Send and Stop.

Ctrl+Enter (or Ctrl+Return) sends, Enter inserts a newline, Esc stops a running reply.
Sending is disabled, with the reason shown in the hint line, while no model is loaded or
the settings cannot be sent (:meth:`PromptEditor.set_problem`).
When editing an earlier user message, a banner says so and Esc cancels the edit.
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout,
                               QWidget)

from gui import theme
from gui.chat.attach_bar import local_files

HINT = "Ctrl+Enter to send · Enter for a new line · Esc to stop"


class _Editor(QPlainTextEdit):
    """The text box; turns Ctrl+Enter into submit and Esc into escape."""

    submit = Signal()
    escape = Signal()
    filesGiven = Signal(list)  # local files pasted or dropped: attached, not typed as text

    def canInsertFromMimeData(self, source) -> bool:  # noqa: N802 (Qt API)
        return bool(local_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source) -> None:  # noqa: N802 (Qt API)
        files = local_files(source)
        if files:
            self.filesGiven.emit(files)
        else:
            super().insertFromMimeData(source)

    def keyPressEvent(self, e):
        if e.key() in (Qt.Key_Return, Qt.Key_Enter) and e.modifiers() & (Qt.ControlModifier | Qt.MetaModifier):
            self.submit.emit()
            return
        if e.key() == Qt.Key_Escape:
            self.escape.emit()
            return
        super().keyPressEvent(e)


class PromptEditor(QWidget):
    """Prompt box with Send / Stop buttons and a hint line.

    Signals:
        sendRequested(str): the user asked to send this text (only when sending is allowed).
        stopRequested(): the user asked to stop the running reply (Esc or Stop).
        filesGiven(list): local files pasted or dropped into the box (to attach).
    """

    sendRequested = Signal(str)
    stopRequested = Signal()

    def __init__(self, *, parent=None):
        super().__init__(parent)
        self._model_ready = False
        self._busy = False
        self._editing: int | None = None
        self._problem = ""  # why what is written cannot be sent now ("" when it can)
        self._no_model_hint = "No model loaded — open one with File → Open (Ctrl+O) to start chatting."

        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 6, 12, 8)
        lay.setSpacing(4)
        self.edit_banner = QLabel()
        self.edit_banner.setObjectName("contextNotice")
        self.edit_banner.hide()
        lay.addWidget(self.edit_banner)

        row = QHBoxLayout()
        self.editor = _Editor(self)
        self.editor.setObjectName("promptEditor")
        self.editor.setAccessibleName("promptEditor")
        self.editor.setAccessibleDescription("Prompt. " + HINT)
        self.editor.setPlaceholderText("Message the model…")
        self.editor.setTabChangesFocus(True)
        lines = self.editor.fontMetrics().lineSpacing()
        self.editor.setFixedHeight(int(lines * 4 + 16))  # four lines; it scrolls beyond that
        self.editor.submit.connect(self.submit)
        self.editor.escape.connect(self._escape)
        self.filesGiven = self.editor.filesGiven
        self.editor.textChanged.connect(self._refresh)
        row.addWidget(self.editor, 1)

        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setAccessibleName("sendButton")
        self.send_button.setToolTip("Send (Ctrl+Enter)")
        self.send_button.setIcon(theme.icon("send", theme.colors()["accent_text"]))
        self.send_button.setIconSize(QSize(16, 16))
        self.send_button.clicked.connect(self.submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setAccessibleName("stopButton")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.setIcon(theme.icon("stop"))
        self.stop_button.setIconSize(QSize(16, 16))
        self.stop_button.clicked.connect(self.stopRequested)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        lay.addLayout(row)

        self.hint = QLabel(HINT)
        self.hint.setObjectName("promptHint")
        self.hint.setWordWrap(True)
        lay.addWidget(self.hint)
        self._refresh()

    # ---- state
    def set_model_ready(self, ready: bool, hint: str | None = None) -> None:
        self._model_ready = ready
        if hint:
            self._no_model_hint = hint
        self._refresh()

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self._refresh()

    @property
    def busy(self) -> bool:
        return self._busy

    def set_problem(self, reason: str) -> None:
        """Why a message cannot be sent now ("" when it can): Send is disabled and the
        hint line says why, until the cause is fixed."""
        self._problem = reason
        self._refresh()

    @property
    def problem(self) -> str:
        return self._problem

    def can_send(self) -> bool:
        return self._model_ready and not self._busy and not self._problem and bool(self.text().strip())

    def _refresh(self) -> None:
        self.send_button.setEnabled(self.can_send())
        self.send_button.setVisible(not self._busy)
        self.stop_button.setVisible(self._busy)
        self.stop_button.setEnabled(self._busy)
        blocked = self._model_ready and not self._busy and bool(self._problem)
        if not self._model_ready:
            self.hint.setText(self._no_model_hint)
        elif self._busy:
            self.hint.setText("Generating… Esc or Stop to stop")
        else:
            self.hint.setText(f"⚠ {self._problem}" if blocked else HINT)
        self.hint.setStyleSheet(f"color: {theme.colors()['error']};" if blocked else "")
        self.send_button.setToolTip(self._problem if blocked else "Send (Ctrl+Enter)")

    # ---- text
    def text(self) -> str:
        return self.editor.toPlainText()

    def set_text(self, text: str) -> None:
        self.editor.setPlainText(text)
        c = self.editor.textCursor()
        c.movePosition(c.MoveOperation.End)
        self.editor.setTextCursor(c)

    def clear(self) -> None:
        self.editor.clear()

    def focus(self) -> None:
        self.editor.setFocus(Qt.ShortcutFocusReason)

    # ---- edit mode
    def begin_edit(self, msg_id: int, text: str) -> None:
        """Edit an earlier user message: its text goes in the box; sending makes a new branch."""
        self._editing = msg_id
        self.edit_banner.setText("Editing an earlier message — Ctrl+Enter resends it as a new branch, Esc cancels.")
        self.edit_banner.show()
        self.set_text(text)
        self.focus()

    def end_edit(self) -> None:
        self._editing = None
        self.edit_banner.hide()

    @property
    def editing(self) -> int | None:
        return self._editing

    # ---- actions
    def submit(self) -> None:
        if self.can_send():
            self.sendRequested.emit(self.text())

    def _escape(self) -> None:
        if self._busy:
            self.stopRequested.emit()
        elif self._editing is not None:
            self.end_edit()
            self.clear()
