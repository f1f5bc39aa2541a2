"""The Library tab's models: the scanned models as a table, and the search box's filter over it."""
from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QStyle

from core.library.library import human_params, human_size

ENTRY_ROLE = Qt.UserRole + 1   # the row's LibraryEntry
SORT_ROLE = Qt.UserRole + 2    # a value that sorts (numbers as numbers, unknowns first)
NUMERIC = ("params", "context_length", "size_bytes")  # columns that sort as numbers and align right


def relative_time(when, now: float | None = None) -> str:
    """'never', 'just now', '5 min ago', '3 h ago', 'yesterday', else the date."""
    if when in (None, 0, ""):
        return "never"
    t = when.timestamp() if isinstance(when, _dt.datetime) else float(when)
    age = (time.time() if now is None else now) - t
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return f"{int(age // 3600)} h ago"
    if age < 2 * 86400:
        return "yesterday"
    return _dt.datetime.fromtimestamp(t).strftime("%d %b %Y")


def stamp(when) -> float:
    if when in (None, ""):
        return -1.0
    return when.timestamp() if isinstance(when, _dt.datetime) else float(when)


COLUMNS = (("Name", "name"), ("Family", "family"), ("Parameters", "params"), ("Format", "format"),
           ("Quantization", "quant"), ("Context", "context_length"), ("Size", "size_bytes"),
           ("Last used", "last_used"), ("Folder", "location"))


def tilde(path) -> str:
    """A path with the home folder written as ``~`` (shorter, and what users recognise)."""
    p, home = Path(path), Path.home()
    return "~/" + str(p.relative_to(home)) if p.is_relative_to(home) and p != home else str(p)


def short_location(path, roots=()) -> str:
    """Where a model is, short: from the library folder that holds it (``models/Llama-3.2-1B``),
    else the whole path with ``~``. The nearest root wins (a folder inside another)."""
    p = Path(path)
    inside = [r for r in map(Path, roots) if p == r or p.is_relative_to(r)]
    if not inside:
        return tilde(p)
    root = max(inside, key=lambda r: len(r.parts))
    return str(Path(root.name or str(root)) / p.relative_to(root))


class LibraryTableModel(QAbstractTableModel):
    """The scanned models, one row each (ENTRY_ROLE: the LibraryEntry; SORT_ROLE: sortable value)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.entries: list = []
        self.roots: list = []  # the library folders: the Folder column starts from them

    def set_entries(self, entries: list, roots=None) -> None:
        self.beginResetModel()
        self.entries = list(entries)
        if roots is not None:
            self.roots = list(roots)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.entries)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return COLUMNS[section][0]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        e = self.entries[index.row()]
        key = COLUMNS[index.column()][1]
        value = getattr(e, key, None)
        if role == Qt.DisplayRole:
            return short_location(value, self.roots) if key == "location" else self.text(key, value)
        if role == SORT_ROLE:
            if key == "last_used":
                return stamp(value)
            if key in NUMERIC:
                return float(value) if value is not None else -1.0
            return str(value or "").lower()
        if role == ENTRY_ROLE:
            return e
        if role == Qt.ToolTipRole:
            err = getattr(e, "error", None)
            source = f"\nFrom the Hub: {e.source}" if getattr(e, "source", None) else ""
            return f"{e.path}{source}\n\nCannot be opened: {err}" if err else f"{e.path}{source}"
        if role == Qt.ForegroundRole and getattr(e, "error", None):
            return QApplication.palette().color(QPalette.Disabled, QPalette.Text)
        if role == Qt.DecorationRole and key == "name" and getattr(e, "error", None):
            return QApplication.style().standardIcon(QStyle.SP_MessageBoxWarning)
        if role == Qt.TextAlignmentRole and key in NUMERIC:
            return int(Qt.AlignRight | Qt.AlignVCenter)
        return None

    @staticmethod
    def text(key: str, value) -> str:
        if key == "last_used":
            return relative_time(value)
        if key == "location":
            return tilde(value) if value else "—"
        if value is None or value == "":
            return "—"
        if key == "params":
            return human_params(value)
        if key == "size_bytes":
            return human_size(value)
        if key == "context_length":
            return f"{int(value):,}"
        return str(value)


class LibraryFilter(QSortFilterProxyModel):
    """Shows rows where every word of the search box appears in some column (any case)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.words: list[str] = []
        self.setSortRole(SORT_ROLE)

    def set_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt 6.10+; invalidateFilter is deprecated there
            self.beginFilterChange()
            self.words = text.lower().split()
            self.endFilterChange()
        else:
            self.words = text.lower().split()
            self.invalidateFilter()

    def filterAcceptsRow(self, row, parent) -> bool:  # noqa: N802
        if not self.words:
            return True
        m = self.sourceModel()
        hay = " ".join(str(m.index(row, c, parent).data()) for c in range(m.columnCount())).lower()
        hay += " " + str(m.entries[row].path).lower()
        return all(w in hay for w in self.words)
