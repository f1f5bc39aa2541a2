"""Dropping a model on the main window: while something is dragged over it, a highlight
over the window says what a drop will do (open which model, replacing which, stopping a
reply), or why it will not open; dropping a model loads it."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel

from gui import theme
from gui.dialogs import model_dialog


def dropped_paths(event) -> list[str]:
    """The local files and folders a drag carries."""
    md = event.mimeData()
    return [u.toLocalFile() for u in md.urls() if u.isLocalFile()] if md.hasUrls() else []


def model_in(paths: list[str]) -> str | None:
    """The first of ``paths`` that looks like a model (a .gguf file or a model folder)."""
    return next((p for p in paths if model_dialog.looks_like_model(p)), None)


def drop_text(path: str | None, paths: list[str], *, current: str | None, loading: bool, busy: bool,
              server: str | None = None) -> str:
    """What dropping ``paths`` does, in a line or two (``path``: the model among them;
    ``server``: where replies come from now, if not from the local model)."""
    if path is None:
        name = Path(paths[0]).name if paths else "this"
        return (f"“{name}” is not a model\nDrop a .gguf file or a model folder "
                "(Meta or Hugging Face) to open it")
    lines = [f"Drop to open “{Path(path).name or path}”"]
    if loading:
        lines.append("The model loading now is cancelled")
    elif current:
        lines.append(f"It replaces {current}; your chats stay")
    if server:
        lines.append(f"Replies come from it instead of {server}")
    if busy:
        lines.append("The reply being written stops (what it wrote is kept)")
    return "\n".join(lines)


class ModelDrop(QObject):
    """Accepts model drops on ``window`` (a :class:`gui.main_window.MainWindow`: its
    ``models``, ``busy`` and ``load_model``) and shows the drop highlight.

    Attributes:
        overlay: the highlight (objectName ``dropOverlay``), shown only during a drag.
    """

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.overlay = QLabel(window)
        self.overlay.setObjectName("dropOverlay")
        self.overlay.setAlignment(Qt.AlignCenter)
        self.overlay.setWordWrap(True)
        self.overlay.setAttribute(Qt.WA_TransparentForMouseEvents, True)
        self.overlay.hide()
        window.setAcceptDrops(True)
        window.installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        kind = event.type()
        if obj is not self.window or kind not in (QEvent.DragEnter, QEvent.DragMove, QEvent.DragLeave, QEvent.Drop):
            return False
        if kind == QEvent.DragLeave:
            self.overlay.hide()
            return True
        paths = dropped_paths(event)
        path = model_in(paths)
        if kind == QEvent.Drop:
            self.overlay.hide()
            if path:
                event.acceptProposedAction()
                self.window.load_model(path)
            else:
                event.ignore()
            return True
        if not paths:
            event.ignore()  # text or anything else that is not a file: not ours
            return True
        if kind == QEvent.DragEnter:
            self.show(path, paths)
        # Files that are no model are taken too, so the highlight can say why they won't
        # open, and the leave or drop that ends the drag always comes here to hide it.
        event.acceptProposedAction()
        return True

    def show(self, path: str | None, paths: list[str]) -> None:
        m = self.window.models
        current = m.local_info.get("name") if m.local_info else None
        server = (m.info or {}).get("server") if m.backend is not None else None
        self.overlay.setText(drop_text(path, paths, current=current, loading=m.loading, busy=self.window.busy,
                                       server=server))
        c = theme.colors()
        bg = QColor(c["window"])  # see-through: the window stays recognisable under it
        self.overlay.setStyleSheet(
            f"QLabel#dropOverlay {{ background: rgba({bg.red()}, {bg.green()}, {bg.blue()}, 225);"
            f" color: {c['text']}; border: 3px dashed {c['accent'] if path else c['error']};"
            " border-radius: 12px; font-size: 15pt; padding: 24px; }")
        self.overlay.setGeometry(self.window.rect().adjusted(12, 12, -12, -12))
        self.overlay.raise_()
        self.overlay.show()
