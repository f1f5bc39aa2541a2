"""The output format editor: a kind (off, JSON schema, any JSON object, regular
expression, grammar) and its text, checked as it is typed, the reason shown inline."""
from __future__ import annotations

from PySide6.QtCore import QObject, QSignalBlocker, QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QPlainTextEdit, QWidget

from core.engine.constraint import Constraint, from_editor, syntax_error
from core.engine.settings import SCHEMA
from gui.settings.widgets import add_row, named

CONSTRAINT_KINDS = (("", "Off"), ("json_schema", "JSON schema"), ("json_object", "Any JSON object"),
                    ("regex", "Regular expression"), ("grammar", "Grammar (GBNF or Lark)"))
CONSTRAINT_HINTS = {"json_schema": '{"type": "object", "properties": {"name": {"type": "string"}}}',
                    "regex": r"[A-Z][a-z]+ is [0-9]{1,3}",
                    "grammar": 'root ::= "yes" | "no"'}
CHECK_DELAY_MS = 300  # the text is checked once typing pauses


class OutputFormatEditor(QObject):
    """The kind combo, the text editor (shown only where there is text to write) and the
    notice saying why the text cannot be used.

    Signals:
        changed(): the kind or the text was edited (not when set by :meth:`apply`).
    """

    changed = Signal()

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.combo = named(QComboBox(), "constraintCombo",
                           SCHEMA["constraint"].help + " Tokens that would break it are never sampled.")
        for key, label in CONSTRAINT_KINDS:
            self.combo.addItem(label, key)
        # Sized by a short text, not "Grammar (GBNF or Lark)": a wider row would wrap the form.
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(8)
        self.text = named(QPlainTextEdit(), "constraintText",
                          "The JSON schema, regular expression or grammar the reply must match.")
        self.text.setTabChangesFocus(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.text.setMinimumHeight(self.text.fontMetrics().lineSpacing() * 4 + 12)
        self.notice = named(QLabel(), "constraintNotice", "Why the constraint cannot be used as written.")
        self.notice.setWordWrap(True)
        self.notice.setStyleSheet("color: #b3261e;")
        self.notice.hide()
        self._timer = QTimer(self, singleShot=True, interval=CHECK_DELAY_MS)
        self._timer.timeout.connect(self.check)
        self.combo.currentIndexChanged.connect(self._edited)
        self.text.textChanged.connect(self._edited)
        self._show_editor()

    def add_to(self, f: QFormLayout) -> None:
        """Lay the editor out in a form: the kind's row, the text and the notice under it."""
        add_row(f, "Constrain &to", self.combo)
        f.addRow(self.text)
        f.addRow(self.notice)

    def constraint(self) -> Constraint | None:
        """The chosen output constraint; None when off or its text is empty."""
        return from_editor(self.combo.currentData(), self.text.toPlainText())

    def state(self) -> dict:
        """The kind and the text as shown (the text is kept while the kind is Off)."""
        return {"constraint_kind": self.combo.currentData(), "constraint_text": self.text.toPlainText()}

    def apply(self, d: dict) -> None:
        """constraint (a SamplingParams dict: {kind, text} or None), or the editor's own
        constraint_kind / constraint_text (:meth:`state`). Emits nothing."""
        kind = text = None
        if "constraint" in d:
            c = d["constraint"]
            kind, text = (c.get("kind", ""), c.get("text", "")) if isinstance(c, dict) else ("", None)
        if "constraint_kind" in d:
            kind = str(d["constraint_kind"] or "")
        if "constraint_text" in d:
            text = str(d["constraint_text"] or "")
        if text is not None and (kind != "json_object" or not text) and text != self.text.toPlainText():
            with QSignalBlocker(self.text):
                self.text.setPlainText(text)
        if kind is not None:
            with QSignalBlocker(self.combo):
                self.combo.setCurrentIndex(max(0, self.combo.findData(kind)))
        self._show_editor()
        self.check()

    def check(self) -> None:
        """Show why the constraint as written cannot be used (inline, under the editor)."""
        c = self.constraint()
        msg = syntax_error(c) if c is not None else ""
        self.notice.setText(msg[:1].upper() + msg[1:])
        self.notice.setVisible(bool(msg))

    def _show_editor(self) -> None:
        kind = self.combo.currentData()
        # The editor shows only where there is text to write: the panel stays short when off.
        self.text.setVisible(bool(kind) and kind != "json_object")
        self.text.setPlaceholderText(CONSTRAINT_HINTS.get(kind, ""))

    def _edited(self, *_) -> None:
        self._show_editor()
        self._timer.start()
        self.changed.emit()
