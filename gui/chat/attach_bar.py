"""Above the prompt: the Attach button, a chip per attached file or chosen collection (how
it was read, or why it cannot be), and an inline notice; plus file drops onto the chat."""
from __future__ import annotations

import html
import os

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QActionGroup
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMenu, QToolButton, QVBoxLayout, QWidget

from core.documents import MODES, kind_of
from core.documents.embedders import EMBEDDERS

from gui import theme
from gui.chat.attachments import SHARES, TOP_K, Attachments
from gui.dialogs.collections import CollectionsController, CollectionsDialog

MODE_NAMES = {"bm25": "BM25 (words)", "dense": "Dense (embedding model)", "hybrid": "Hybrid (both, fused)"}
EMBEDDER_NAMES = {"wordllama": "WordLlama (built in)", "bge-small": "bge-small (fastembed)"}
FILTER = ("Documents (*.txt *.md *.markdown *.pdf *.docx *.html *.htm *.rst *.csv *.log *.py *.js *.ts *.c *.h "
          "*.cpp *.rs *.go *.java *.json *.yaml *.yml *.toml);;All files (*)")


def local_files(mime) -> list[str]:
    """The local files a drop or paste carries (none for text, web links or images)."""
    if mime is None or not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]


def documents_in(mime) -> list[str]:
    """The files of a drag that are documents; a model file or folder is left to the window
    (dropping a model opens it, gui/model_drop.py)."""
    return [p for p in local_files(mime) if os.path.isfile(p) and kind_of(p) is not None]


class FileDrops(QObject):
    """Documents dropped onto a widget (the chat column) are attached; other drags go on
    to the widget's parents (a model dropped anywhere on the window opens it)."""

    dropped = Signal(list)

    def eventFilter(self, obj, e) -> bool:  # noqa: N802 (Qt API)
        if e.type() not in (QEvent.DragEnter, QEvent.DragMove, QEvent.Drop):
            return False
        docs = documents_in(e.mimeData())
        if not docs:
            e.ignore()
            return False
        e.acceptProposedAction()
        if e.type() == QEvent.Drop:
            self.dropped.emit(local_files(e.mimeData()))
        return True


class AttachBar(QWidget):
    """Attach button, chips and notice (objectName ``attachBar``) for an :class:`Attachments`."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("attachBar")
        self.attachments: Attachments | None = None
        self.collections: CollectionsController | None = None
        self.dialog: CollectionsDialog | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 4, 12, 0)
        lay.setSpacing(2)
        row = QHBoxLayout()
        row.setSpacing(6)
        self.button = QToolButton(self)
        self.button.setObjectName("attachButton")
        self.button.setIcon(theme.icon("attach"))
        self.button.setIconSize(QSize(16, 16))
        self.button.setText("Attach")
        self.button.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.button.setToolTip("Attach files to the next message (or drop them on the chat, or paste them)")
        self.button.setAccessibleName("Attach files")
        self.button.setAutoRaise(True)
        self.button.clicked.connect(self.choose)
        row.addWidget(self.button)
        self.collections_button = QToolButton(self)
        self.collections_button.setObjectName("collectionsButton")
        self.collections_button.setText("Collections")
        self.collections_button.setToolTip("Search indexed folders for the next message")
        self.collections_button.setAutoRaise(True)
        self.collections_button.setPopupMode(QToolButton.InstantPopup)
        self.collections_menu = QMenu(self.collections_button)
        self.collections_menu.aboutToShow.connect(self._fill_collections)
        self.collections_button.setMenu(self.collections_menu)
        row.addWidget(self.collections_button)
        self.chips = QLabel(self)
        self.chips.setObjectName("attachChips")
        self.chips.setWordWrap(True)
        self.chips.setTextFormat(Qt.RichText)
        self.chips.linkActivated.connect(self._remove)
        row.addWidget(self.chips, 1)
        lay.addLayout(row)
        self.notice = QLabel(self)
        self.notice.setObjectName("attachNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        lay.addWidget(self.notice)

    def attach(self, attachments: Attachments, collections: CollectionsController | None = None) -> None:
        self.attachments, self.collections = attachments, collections
        attachments.changed.connect(self.refresh)
        attachments.notice.connect(self.show_notice)
        self.refresh()

    def choose(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", "", FILTER)
        if paths and self.attachments is not None:
            self.add(paths)

    def manage(self) -> CollectionsDialog | None:
        """Documents → Collections…: the dialog (one, not modal: indexing goes on behind it)."""
        if self.collections is None:
            return None
        if self.dialog is None:
            self.dialog = CollectionsDialog(self.collections, parent=self.window())
        self.dialog.refresh()
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog

    def _fill_collections(self) -> None:
        """One checkable entry per indexed collection (used by the next message), then Manage."""
        m, a = self.collections_menu, self.attachments
        m.clear()
        for c in self.collections.collections() if self.collections is not None else []:
            act = m.addAction(f"{c.name} ({c.chunks} passages)")
            act.setCheckable(True)
            act.setChecked(c.root in a.collections)
            act.setToolTip(c.root)
            act.toggled.connect(lambda on, root=c.root: a.set_collections(
                [*a.collections, root] if on else [r for r in a.collections if r != root]))
        if m.isEmpty():
            m.addAction("No collections yet").setEnabled(False)
        m.addSeparator()
        self._choices(m.addMenu("Retrieval"), [(MODE_NAMES[x], x) for x in MODES], "mode")
        models = m.addMenu("Embedding Model")
        models.setToolTipsVisible(True)
        self._choices(models, [(EMBEDDER_NAMES.get(x, x), x) for x in EMBEDDERS], "embedder")
        for act, name in zip(models.actions(), EMBEDDERS):
            act.setToolTip(EMBEDDERS[name])
        self._choices(m.addMenu("Passages"), [(f"Top {k}" if k else "As many as fit", k) for k in TOP_K], "k")
        self._choices(m.addMenu("Documents Budget"), list(SHARES), "share")
        m.addSeparator()
        m.addAction("Manage Collections…", self.manage)

    def _choices(self, menu: QMenu, choices: list[tuple[str, object]], attr: str) -> None:
        """Checkable entries setting the attachments' ``attr`` (how the next message retrieves)."""
        group = QActionGroup(menu)
        for label, value in choices:
            act = menu.addAction(label)
            act.setCheckable(True)
            act.setChecked(getattr(self.attachments, attr) == value)
            act.setActionGroup(group)
            act.triggered.connect(lambda _on=False, v=value: self.attachments.configure(**{attr: v}))

    def add(self, paths: list[str]) -> None:
        self.notice.hide()
        self.attachments.add_paths(paths)

    def show_notice(self, text: str) -> None:
        self.notice.setText(f"⚠ {text}")
        self.notice.setVisible(bool(text))

    def refresh(self) -> None:
        a = self.attachments
        if a is None:
            return
        c = theme.colors()

        def chip(label: str, detail: str, key: str, bad: bool = False) -> str:
            color = c.get("error", "#b00020") if bad else c["muted"]
            return (f'<span style="background:{c["alt"]}">&nbsp;{html.escape(label)} '
                    f'<span style="color:{color}">{html.escape(detail)}</span> '
                    f'<a href="{html.escape(key)}" style="text-decoration:none">✕</a>&nbsp;</span>')
        parts = [chip(f.name, {"reading": "reading…"}.get(f.state, f.detail), f"rm:{i}", f.state == "failed")
                 for i, f in enumerate(a.files)]
        parts += [chip(r.rstrip("/").rsplit("/", 1)[-1], "collection", f"rm:{len(a.files) + i}")
                  for i, r in enumerate(a.collections)]
        first = len(a.files) + len(a.collections)
        parts += [chip(f"{r.name} · {r.server}", {"reading": "reading…"}.get(r.state, r.detail), f"rm:{first + i}",
                       r.state == "failed") for i, r in enumerate(a.resources)]
        self.chips.setText(" ".join(parts))
        self.chips.setToolTip("\n".join([f.path for f in a.files] + a.collections + [r.uri for r in a.resources]))

    def _remove(self, key: str) -> None:
        """A chip's ✕ (``rm:i``: the i-th file, then the collections)."""
        a = self.attachments
        keys = [f.path for f in a.files] + list(a.collections) + [r.uri for r in a.resources] if a is not None else []
        i = int(key[3:]) if key.startswith("rm:") and key[3:].isdigit() else -1
        if 0 <= i < len(keys):
            a.remove(keys[i])
