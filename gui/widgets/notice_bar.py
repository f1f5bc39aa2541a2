"""A one-line notice with one action button and, optionally, a dismiss button.

The main window shows three of them: a message the store could not save (Retry sends it
again), a server reply that failed (Retry asks again) and a deleted message (Undo). They
differ only in names and texts, so they are one widget with those as arguments.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget


class NoticeBar(QWidget):
    """A label, an action button and (``dismissible``) a ✕; hidden until :meth:`show_notice`.

    Args:
        name: the bar's objectName (tests and accessibility tools find it by it).
        action: the button's text ("Retry", "Undo").
        action_name: the button's objectName.
        action_tip: the button's tooltip.
        label_name: the label's objectName (the theme styles ``contextNotice``).
        dismissible: with a ✕ that hides the bar.
        wrap: long text wraps (the label takes the spare width); off for the status bar.
        selectable: the text can be selected (to copy an error message).
        margins: the layout's margins (left, top, right, bottom).

    Signals:
        actionTriggered(): the action button was clicked.
        dismissed(): the ✕ was clicked (the bar hides itself).
    """

    actionTriggered = Signal()
    dismissed = Signal()

    def __init__(self, *, name: str, action: str, action_name: str, action_tip: str = "",
                 label_name: str = "", dismissible: bool = True, wrap: bool = True, selectable: bool = False,
                 margins: tuple[int, int, int, int] = (8, 4, 8, 0), parent=None):
        super().__init__(parent)
        self.setObjectName(name)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(*margins)
        self.label = QLabel()
        if label_name:
            self.label.setObjectName(label_name)
        self.label.setWordWrap(wrap)
        if selectable:
            self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.button = QPushButton(action)
        self.button.setObjectName(action_name)
        if action_tip:
            self.button.setToolTip(action_tip)
        self.button.clicked.connect(self.actionTriggered)
        lay.addWidget(self.label, 1 if wrap else 0)
        lay.addWidget(self.button)
        self.dismiss_button: QToolButton | None = None
        if dismissible:
            self.dismiss_button = QToolButton()
            self.dismiss_button.setText("✕")
            self.dismiss_button.setAccessibleName("Dismiss")
            self.dismiss_button.clicked.connect(self._dismiss)
            lay.addWidget(self.dismiss_button)
        self.hide()

    def show_notice(self, text: str, kind: str | None = None) -> None:
        """Show ``text``; ``kind`` (a failure's kind) is kept as the bar's "kind" property."""
        self.label.setText(text)
        if kind is not None:
            self.setProperty("kind", kind)
        self.show()

    def text(self) -> str:
        return self.label.text()

    def _dismiss(self) -> None:
        self.hide()
        self.dismissed.emit()
