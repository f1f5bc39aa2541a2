"""Documents → Collections…: folders indexed once and kept current, in the background.

:class:`CollectionsController` (a plain QObject, testable without a window) starts one
:class:`core.documents.IndexJob` per folder (a thread each; only files that changed are read
again), forwards its progress to the UI thread, and pauses, resumes, cancels, re-indexes and
removes. :class:`CollectionsDialog` shows it: the UI never waits on indexing, and a folder
that is gone (a disconnected drive) keeps its last index and says so.
"""
from __future__ import annotations

import os
from typing import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QLabel, QProgressBar,
                               QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout)

from core.documents import Collection, DocumentError, DocumentIndex, IndexJob, Progress

STATES = {"new": "not indexed yet", "scanning": "scanning…", "indexing": "indexing…", "paused": "paused",
          "done": "up to date", "cancelled": "cancelled (what was indexed is kept)",
          "unreachable": "not reachable: last index kept", "failed": "failed"}


class CollectionsController(QObject):
    """The indexed folders and their background indexing.

    Args:
        index: returns the shared :class:`DocumentIndex` (made on first use).

    Signals:
        changed(): the list of collections or a collection's counts changed.
        progress(object): a :class:`Progress` of a running job (on the UI thread).
        notice(str): a folder that cannot be added, and why.
    """

    changed = Signal()
    progress = Signal(object)
    notice = Signal(str)
    _from_job = Signal(object)  # emitted on an indexing thread, delivered on the UI thread

    def __init__(self, index: Callable[[], DocumentIndex], parent=None):
        super().__init__(parent)
        self._index = index
        self.jobs: dict[str, IndexJob] = {}
        self.last: dict[str, Progress] = {}
        self._removing: set[str] = set()
        self._from_job.connect(self._on_progress, Qt.QueuedConnection)

    def collections(self) -> list[Collection]:
        return self._index().collections()

    def add(self, root: str) -> bool:
        """Index folder ``root`` (in the background); False, with a notice, when it is no folder."""
        root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(root):
            self.notice.emit(f"{root} is not a folder that can be read (moved, or a drive not connected)")
            return False
        try:
            c = self._index().add_collection(root)
        except DocumentError as e:
            self.notice.emit(str(e))
            return False
        self.reindex(c.root)
        self.changed.emit()
        return True

    def reindex(self, root: str) -> None:
        """Bring ``root`` up to date: only files added, changed or removed since are touched."""
        if root in self.jobs and self.jobs[root].running:
            return
        self.jobs[root] = IndexJob(self._index(), root, progress=self._from_job.emit).start()

    def skipped(self, root: str) -> list[tuple[str, str]]:
        """[(path, why)] of what ``root``'s last indexing skipped (walk and files)."""
        c = self._index().collection(root)
        p = self.last.get(root)
        return list(dict.fromkeys([*(p.skipped if p is not None else ()), *(self._index().skipped(c.id) if c else ())]))

    def running(self, root: str) -> bool:
        job = self.jobs.get(root)
        return job is not None and job.running

    def pause(self, root: str) -> None:
        if self.running(root):
            self.jobs[root].pause()

    def resume(self, root: str) -> None:
        if self.running(root):
            self.jobs[root].resume()

    def cancel(self, root: str) -> None:
        if self.running(root):
            self.jobs[root].cancel()

    def remove(self, root: str) -> None:
        """Forget ``root`` and the passages nothing else uses; a running job is cancelled
        first and the collection goes when it has stopped (the UI never waits for it)."""
        if self.running(root):
            self._removing.add(root)
            self.jobs[root].cancel()
            return
        self._forget(root)

    def _forget(self, root: str) -> None:
        self._removing.discard(root)
        self.jobs.pop(root, None)
        self.last.pop(root, None)
        self._index().remove_collection(root)
        self.changed.emit()

    def _on_progress(self, p: Progress) -> None:
        if p.root in self._removing:
            if p.finished:
                self._forget(p.root)
            return
        self.last[p.root] = p
        self.progress.emit(p)
        if p.finished:
            self.changed.emit()

    def close(self) -> None:
        """Stop every job (the window is closing); what was indexed is kept."""
        for job in self.jobs.values():
            job.cancel()
        for job in self.jobs.values():
            job.wait(5.0)


class CollectionsDialog(QDialog):
    """The collections, their state and counts; Add Folder, Pause/Resume, Cancel, Re-index, Remove."""

    def __init__(self, controller: CollectionsController, parent=None):
        super().__init__(parent)
        self.setObjectName("collectionsDialog")
        self.setWindowTitle("Collections")
        self.controller = controller
        lay = QVBoxLayout(self)
        hint = QLabel("A collection is a folder indexed once and kept current: only changed files are read "
                      "again. Choose collections for a message with the Collections button above the prompt.")
        hint.setWordWrap(True)
        lay.addWidget(hint)
        self.tree = QTreeWidget(self)
        self.tree.setObjectName("collectionsList")
        self.tree.setHeaderLabels(["Folder", "State", "Files", "Passages", "Skipped"])
        self.tree.setRootIsDecorated(False)
        self.tree.itemSelectionChanged.connect(self._sync_buttons)
        lay.addWidget(self.tree, 1)
        self.bar = QProgressBar(self)
        self.bar.setObjectName("collectionsProgress")
        self.bar.hide()
        lay.addWidget(self.bar)
        self.detail = QLabel(self)
        self.detail.setObjectName("collectionsDetail")
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.detail)
        row = QHBoxLayout()
        self.buttons = {}
        for name, text in (("add", "Add Folder…"), ("pause", "Pause"), ("cancel", "Cancel"),
                           ("reindex", "Re-index"), ("remove", "Remove")):
            b = QPushButton(text, self)
            b.setObjectName(f"collections{name.title()}Button")
            b.clicked.connect(getattr(self, f"_{name}"))
            row.addWidget(b)
            self.buttons[name] = b
        row.addStretch(1)
        lay.addLayout(row)
        box = QDialogButtonBox(QDialogButtonBox.Close, self)
        box.rejected.connect(self.reject)
        lay.addWidget(box)
        controller.changed.connect(self.refresh)
        controller.progress.connect(self._on_progress)
        controller.notice.connect(lambda text: self.detail.setText(f"⚠ {text}"))
        self.resize(640, 360)
        self.refresh()

    def selected_root(self) -> str | None:
        items = self.tree.selectedItems()
        return items[0].data(0, Qt.UserRole) if items else None

    def refresh(self) -> None:
        keep = self.selected_root()
        self.tree.clear()
        for c in self.controller.collections():
            p = self.controller.last.get(c.root)
            state = p.state if p is not None and not p.finished else c.state
            item = QTreeWidgetItem([c.name, STATES.get(state, state), str(c.files), str(c.chunks), str(c.skipped)])
            item.setData(0, Qt.UserRole, c.root)
            item.setToolTip(0, c.root)
            if c.message:
                item.setToolTip(1, c.message)
            self.tree.addTopLevelItem(item)
            if c.root == keep or keep is None:
                item.setSelected(True)
                keep = c.root
        for i in range(self.tree.columnCount()):
            self.tree.resizeColumnToContents(i)
        self._sync_buttons()

    def _on_progress(self, p: Progress) -> None:
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item.data(0, Qt.UserRole) == p.root:
                item.setText(1, STATES.get(p.state, p.state))
                item.setText(2, f"{p.files_done} of {p.files_total}" if p.files_total and not p.finished
                             else item.text(2))
        if p.root == self.selected_root():
            self._show_progress(p)
        self._sync_buttons()

    def _show_progress(self, p: Progress | None) -> None:
        running = p is not None and not p.finished
        self.bar.setVisible(running)
        if running:
            self.bar.setMaximum(max(p.files_total, 1) if p.state != "scanning" else 0)
            self.bar.setValue(p.files_done)
        root = self.selected_root()
        skips = self.controller.skipped(root) if root else []
        skipped = "".join(f"\n  {os.path.basename(path)}: {why}" for path, why in skips[:5])
        more = f"\n  … and {len(skips) - 5} more" if len(skips) > 5 else ""
        current = (f"Reading {os.path.basename(p.current)}" if p.current and running else p.message) if p else ""
        self.detail.setText(current + (f"\nSkipped:{skipped}{more}" if skipped else ""))

    def _sync_buttons(self) -> None:
        root = self.selected_root()
        running = root is not None and self.controller.running(root)
        p = self.controller.last.get(root) if root else None
        self.buttons["pause"].setText("Resume" if p is not None and p.state == "paused" else "Pause")
        for name in ("pause", "cancel"):
            self.buttons[name].setEnabled(running)
        for name in ("reindex", "remove"):
            self.buttons[name].setEnabled(root is not None)
        self.buttons["reindex"].setEnabled(root is not None and not running)
        if root is not None:
            self._show_progress(p)
        else:
            self.detail.setText("")

    def _add(self) -> None:
        root = QFileDialog.getExistingDirectory(self, "Add a folder as a collection")
        if root:
            self.controller.add(root)

    def _pause(self) -> None:
        root = self.selected_root()
        p = self.controller.last.get(root)
        (self.controller.resume if p is not None and p.state == "paused" else self.controller.pause)(root)

    def _cancel(self) -> None:
        self.controller.cancel(self.selected_root())

    def _reindex(self) -> None:
        self.controller.reindex(self.selected_root())

    def _remove(self) -> None:
        self.controller.remove(self.selected_root())
