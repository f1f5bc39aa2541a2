"""The Downloads tab's model: one row per file of each download job, with its progress and state."""
from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QColor

from core.library.library import human_size

ROW_ROLE = Qt.UserRole + 1
FRACTION_ROLE = Qt.UserRole + 2
COLUMNS = ("File", "Repository", "Progress", "Speed", "Time left", "Status")
ACTIVE = ("queued", "downloading", "verifying", "paused")
ENDED = ("done", "cancelled", "failed")  # rows Clear Finished removes


def eta_text(seconds) -> str:
    if seconds is None or seconds < 0:
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def state_text(value) -> str:
    """A job state in the table's words (the manager's 'running' is 'downloading')."""
    v = str(getattr(value, "value", value) or "queued").lower()
    return {"running": "downloading"}.get(v, v)


class DownloadsModel(QAbstractTableModel):
    """One row per file of each job: dicts with job_id, repo_id, file, done, total, speed,
    eta, state (queued / downloading / paused / done / failed / cancelled) and message."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []

    # -- lookups
    def find(self, job_id, file=None) -> list[int]:
        return [i for i, r in enumerate(self.rows)
                if r["job_id"] == str(job_id) and (file is None or r["file"] == file)]

    def upsert(self, job_id, file, **values) -> int:
        """Update (or add) the row of ``file`` in ``job_id``; returns its row number."""
        found = self.find(job_id, file)
        if found:
            i = found[0]
            self.rows[i].update(values)
            self.dataChanged.emit(self.index(i, 0), self.index(i, len(COLUMNS) - 1))
            return i
        row = {"job_id": str(job_id), "repo_id": "", "file": file, "done": 0, "total": None, "speed": None,
               "eta": None, "state": "queued", "message": ""}
        row.update(values)
        self.beginInsertRows(QModelIndex(), len(self.rows), len(self.rows))
        self.rows.append(row)
        self.endInsertRows()
        return len(self.rows) - 1

    def set_job(self, job_id, **values) -> None:
        """Apply ``values`` to every row of a job."""
        for i in self.find(job_id):
            self.rows[i].update(values)
            self.dataChanged.emit(self.index(i, 0), self.index(i, len(COLUMNS) - 1))

    def remove_where(self, pred) -> None:
        for i in reversed(range(len(self.rows))):
            if pred(self.rows[i]):
                self.beginRemoveRows(QModelIndex(), i, i)
                del self.rows[i]
                self.endRemoveRows()

    # -- Qt
    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        r = self.rows[index.row()]
        c = index.column()
        if role == ROW_ROLE:
            return r
        if role == FRACTION_ROLE:
            return (r["done"] / r["total"]) if r["total"] else (1.0 if r["state"] == "done" else 0.0)
        if role == Qt.DisplayRole:
            return self.display(r, c)
        if role == Qt.ToolTipRole:
            return r["message"] or f"{r['repo_id']}/{r['file']}"
        if role == Qt.ForegroundRole and c == 5 and r["state"] == "failed":
            return QColor("#c0392b")
        return None

    @staticmethod
    def display(r: dict, column: int) -> str:
        """A row's text in ``column``."""
        downloading = r["state"] == "downloading"
        if column == 0:
            return r["file"]
        if column == 1:
            return r["repo_id"]
        if column == 2:
            total = human_size(r["total"]) if r["total"] else "?"
            pct = f" ({100 * r['done'] / r['total']:.0f}%)" if r["total"] else ""
            return f"{human_size(r['done'])} / {total}{pct}"
        if column == 3:
            return f"{human_size(r['speed'])}/s" if r["speed"] and downloading else "—"
        if column == 4:
            return eta_text(r["eta"]) if downloading else "—"
        s = "Done, verified" if r["state"] == "done" else r["state"].capitalize()
        return f"{s}: {r['message']}" if r["message"] and r["state"] == "failed" else s

    # -- a job's bytes over its rows
    def spread(self, job_id: str, done: int, current: str | None = None) -> None:
        """Split a job's bytes over its files' rows: the manager fetches them in order."""
        offset = 0
        found = self.find(job_id)
        for i in found:
            r = self.rows[i]
            size = r["total"] or 0
            r["done"] = max(0, min(done - offset, size)) if size else (done if current == r["file"] else 0)
            offset += size
        if found:
            self.dataChanged.emit(self.index(found[0], 0), self.index(found[-1], len(COLUMNS) - 1))

    def finish(self, job_id: str, path: str) -> None:
        """A job finished and was verified: every row full, done."""
        self.set_job(job_id, state="done", speed=None, eta=None, message="", path=path)
        for i in self.find(job_id):
            r = self.rows[i]
            if r["total"]:
                r["done"] = r["total"]
