"""The Library tab's controller: what Open, Delete, Show in Folder and the folder menu do.

It holds no widget, so it is tested without a window: the view asks the user (a yes/no, a
folder) and hands the answer here.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.checkpoints import pack_cache
from core.library.library import human_size
from gui.library.library_table import LibraryTableModel


class LibraryController(QObject):
    """The models table's content and actions, over a :class:`~gui.library.service.LibraryService`.

    ``model`` (a :class:`LibraryTableModel`) follows the service's scans.

    Signals:
        openRequested(str): a model path to load (its use is recorded first).
        statusChanged(): the status line or the empty state changed (a scan, the count,
            the last action's outcome): read :meth:`status_text` and :meth:`empty_text`.
        scanFailed(str): a scan could not run (the message, for the status line).
    """

    openRequested = Signal(str)
    statusChanged = Signal()
    scanFailed = Signal(str)

    def __init__(self, service, parent: QObject | None = None):
        super().__init__(parent)
        self.service = service
        self.note = ""  # the last action's outcome, shown before the count
        self.model = LibraryTableModel(self)
        service.entriesChanged.connect(self.set_entries)
        service.scanningChanged.connect(lambda _on: self.statusChanged.emit())
        service.scanFailed.connect(self.scanFailed)
        self.set_entries(service.entries)

    def set_entries(self, entries: list) -> None:
        self.model.set_entries(entries, self.service.folders())
        self.statusChanged.emit()

    # -- words -------------------------------------------------------------------------------
    def status_text(self) -> str:
        """The status line: scanning, or the last outcome, the count and the folders."""
        s = self.service
        if s.scanning:
            return f"Scanning {len(s.folders())} folder(s)…"
        n = len(self.model.entries)
        more = f" and {len(s.extra_folders())} more folder(s)" if s.extra_folders() else ""
        caches = self.caches()
        fast = (f" · fast-open caches: {len(caches)}, {human_size(sum(c.bytes for c in caches))}"
                if caches else "")
        return f"{self.note}{n} model{'s' if n != 1 else ''} in {s.models_folder()}{more}{fast}"

    def is_empty(self) -> bool:
        """No model found, and no scan running (the empty state shows)."""
        return not self.model.entries and not self.service.scanning

    def empty_text(self) -> str:
        return (f"No models yet. Find one on the <a href='hub'>Hub</a>, or put .gguf files or "
                f"model folders in {self.service.models_folder()}.")

    # -- actions -----------------------------------------------------------------------------
    @staticmethod
    def can_open(entry) -> bool:
        """A model that was read without error can be opened."""
        return entry is not None and not getattr(entry, "error", None)

    def open(self, entry) -> bool:
        """Record the model's use and ask for it to be loaded; False when it cannot be opened."""
        if not self.can_open(entry):
            return False
        self.service.record_used(entry.path)
        self.openRequested.emit(str(entry.path))
        return True

    @staticmethod
    def folder_of(entry) -> Path:
        """The folder to show for a model: a model folder itself, a file's folder."""
        p = Path(entry.path)
        return p if p.is_dir() else p.parent

    @staticmethod
    def delete_question(entry) -> tuple[str, str]:
        """(title, text) of the question asked before deleting ``entry``."""
        size = LibraryTableModel.text("size_bytes", getattr(entry, "size_bytes", None))
        return "Delete model", (f"Delete “{entry.name}” ({size}) from disk?\n\n{entry.path}\n\n"
                                "This cannot be undone.")

    def delete(self, entry) -> asyncio.Task:
        """Delete ``entry`` from disk (the user agreed); the outcome goes into the status line."""
        return asyncio.ensure_future(self._delete(entry))

    async def _delete(self, entry) -> None:
        try:
            await self.service.delete(entry)
        except Exception as err:  # e.g. permission denied: the row stays, the reason shows
            self.note = f"Could not delete {entry.name}: {err} · "
        else:
            self.note = f"Deleted {entry.name} · "
        self.statusChanged.emit()

    # -- fast-open caches (core.checkpoints.pack_cache) --------------------------------------
    def caches(self) -> list:
        """The packed-layer caches that make GGUF files open fast (a few files: listed here)."""
        return pack_cache.list_caches(self.service.data_dir / pack_cache.FOLDER)

    def clear_caches_question(self) -> tuple[str, str]:
        caches = self.caches()
        return "Clear fast-open caches", (
            f"Remove {len(caches)} fast-open cache(s) ({human_size(sum(c.bytes for c in caches))})?\n\n"
            "Each holds a quantized model's weights in the layout the CPU kernels use, written at its "
            "first open so later opens take a second. The next open of each model writes its cache again.")

    def clear_caches(self) -> asyncio.Task:
        """Remove every fast-open cache (the user agreed); the outcome goes into the status line."""
        return asyncio.ensure_future(self._clear_caches())

    async def _clear_caches(self) -> None:
        caches = self.caches()
        try:
            for c in caches:
                await self.service.call(pack_cache.remove, c.path)
        except OSError as err:
            self.note = f"Could not clear the fast-open caches: {err.strerror or err} · "
        else:
            self.note = f"Cleared {len(caches)} fast-open cache(s), {human_size(sum(c.bytes for c in caches))} · "
        self.statusChanged.emit()

    def rescan(self) -> None:
        self.service.rescan()

    # -- folders -----------------------------------------------------------------------------
    def models_folder(self) -> Path:
        return self.service.models_folder()

    def extra_folders(self) -> list[Path]:
        return self.service.extra_folders()

    def change_models_folder(self, path: str | None) -> None:
        """Downloads go to ``path`` from now on, and it is scanned (None: the user declined)."""
        if path:
            self.service.set_models_folder(path)

    def add_folder(self, path: str | None) -> None:
        """Scan ``path`` too (None: the user declined)."""
        if path:
            self.service.add_folder(path)

    def remove_folder(self, path) -> None:
        self.service.remove_folder(path)
