"""What the windows look like between runs: the main window's size and position, its
splitter's widths, the open chat, and the comparison window's size and position.

Kept in the app's settings (group ``window``; :func:`gui.settings.store.default_settings`,
in :func:`core.paths.config_dir`) when a window closes; the open chat also as it changes,
so a crash keeps it. Restoring leaves Qt to put a window back on a screen that still
exists (``restoreGeometry`` moves it onto one).
"""
from __future__ import annotations

from PySide6.QtCore import QByteArray, QEvent, QObject, QSettings
from PySide6.QtWidgets import QWidget

from core.history.records import HistoryError

GEOMETRY_KEY = "window/geometry"
SPLITTER_KEY = "window/splitter"
CHAT_KEY = "window/chat"
COMPARE_KEY = "window/compare_geometry"
DEFAULT_SIZE = (1200, 780)


def _bytes(value) -> QByteArray | None:
    """A stored QByteArray, or None for a missing or unreadable value (a hand-edited file)."""
    return value if isinstance(value, QByteArray) and not value.isEmpty() else None


class WindowState(QObject):
    """Saves and restores the main window's state (see the module docstring).

    Args:
        window: the :class:`gui.main_window.MainWindow` (its ``splitter``, ``conversation``,
            ``history`` and ``open_conversation``).
        settings: where the state is kept.
    """

    def __init__(self, window, settings: QSettings):
        super().__init__(window)
        self.window = window
        self.settings = settings
        self._compare: QWidget | None = None
        window.installEventFilter(self)
        window.conversation.currentChanged.connect(self._save_chat)

    def restore(self) -> None:
        """Size, position and splitter widths as the last run left them (else the defaults),
        and the chat that was open, if it still exists."""
        geometry = _bytes(self.settings.value(GEOMETRY_KEY))
        if geometry is None or not self.window.restoreGeometry(geometry):
            self.window.resize(*DEFAULT_SIZE)
        splitter = _bytes(self.settings.value(SPLITTER_KEY))
        if splitter is not None:
            self.window.splitter.restoreState(splitter)
        chat = self._stored_chat()
        if chat is not None:
            self.window.open_conversation(chat)

    def _stored_chat(self) -> int | None:
        try:
            conv_id = int(self.settings.value(CHAT_KEY, "") or 0)
        except (TypeError, ValueError):
            return None
        if conv_id <= 0:
            return None
        try:
            self.window.history.conversation(conv_id)
        except HistoryError:
            return None  # deleted since, or another data folder's id
        return conv_id

    def save(self) -> None:
        self.settings.setValue(GEOMETRY_KEY, self.window.saveGeometry())
        self.settings.setValue(SPLITTER_KEY, self.window.splitter.saveState())
        self._save_chat()

    def _save_chat(self) -> None:
        conv_id = self.window.conversation.conv_id
        self.settings.setValue(CHAT_KEY, "" if conv_id is None else int(conv_id))

    def track_compare(self, view: QWidget) -> None:
        """A new comparison window: placed where the last one was; its place kept when it closes."""
        geometry = _bytes(self.settings.value(COMPARE_KEY))
        if geometry is not None:
            view.restoreGeometry(geometry)
        self._compare = view
        view.installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Close:
            if obj is self.window:
                self.save()
            elif obj is self._compare:
                self.settings.setValue(COMPARE_KEY, obj.saveGeometry())
        return False
