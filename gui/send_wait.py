"""Ctrl+Enter while a model loads (opening one, or a reload after a device / data type /
compile change) is never silently ignored: the message waits in the prompt box, the hint
says it goes when the model is ready, and it is sent then. Esc keeps it unsent; a load that
fails or is cancelled leaves it in the box, and the status bar says it was not sent."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QTimer

WAIT_HINT = "Loading {name}… your message is sent when it is ready (Esc keeps it here)."
LOADING_HINT = "Loading {name}…"
NOT_SENT = "Your message was not sent: the model did not load. It is still in the box."


class SendWhenLoaded(QObject):
    """Holds a message submitted during a load for ``window`` (a
    :class:`gui.main_window.MainWindow`: its ``prompt``, ``models`` and ``statusBar``).

    Attributes:
        waiting: a message waits for the model being loaded.
    """

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.waiting = False
        # Ctrl+Enter reaches Chat → Send (a window shortcut), or the editor's own key handling
        # when that action is off: both lead here (a second call changes nothing).
        window.action("send").triggered.connect(self._submitted)
        window.prompt.editor.submit.connect(self._submitted)
        window.prompt.editor.escape.connect(self.cancel)
        window.conversation.currentChanged.connect(self.cancel)  # the message stays with its chat
        window.models.loaded.connect(self._loaded)
        window.models.loadEnded.connect(self._load_ended)

    def _name(self) -> str:
        path = self.window.models.loading_path or ""
        return Path(path).name or path or "the model"

    def _submitted(self) -> None:
        prompt = self.window.prompt
        if not self.window.models.loading or prompt.busy or not prompt.text().strip():
            return  # the editor sent it, or there is nothing to send
        self.waiting = True
        prompt.set_model_ready(False, WAIT_HINT.format(name=self._name()))

    def cancel(self) -> None:
        """Esc, or another chat opened: the message stays with its chat, unsent."""
        if self.waiting:
            self.waiting = False
            if self.window.models.loading:
                self.window.prompt.set_model_ready(False, LOADING_HINT.format(name=self._name()))

    def _loaded(self, _info: dict) -> None:
        if self.waiting:
            self.waiting = False
            self.window.prompt.submit()  # the window made the prompt ready before this signal

    def _load_ended(self) -> None:
        # A load that succeeds says `loaded` right after this, in the same step: look once
        # that has run. Still waiting then, with no other load begun, means it did not load.
        QTimer.singleShot(0, self._gave_up)

    def _gave_up(self) -> None:
        if self.waiting and not self.window.models.loading:
            self.waiting = False
            self.window.statusBar().showMessage(NOT_SENT, 10000)
