"""The Library window's Downloads tab: the queue, a progress bar per file, pause / resume / cancel.

Rows follow the download manager's events (queued to the UI thread by
:class:`~gui.library.window.LibraryService`); the manager's own ``jobs()`` fills the table
when the tab opens, so downloads a previous run left show with their progress. A failure
stays on its row in words (and in the notice above the table) until cleared.
"""
from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (QAbstractItemView, QApplication, QHBoxLayout, QHeaderView, QLabel, QPushButton,
                               QSizePolicy, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QTableView,
                               QVBoxLayout, QWidget)

from core.library.downloads import DownloadFailed, DownloadFinished, DownloadProgress, DownloadStateChanged

from gui import theme

ROW_ROLE = Qt.UserRole + 1
FRACTION_ROLE = Qt.UserRole + 2
COLUMNS = ("File", "Repository", "Progress", "Speed", "Time left", "Status")
ACTIVE = ("queued", "downloading", "verifying", "paused")


def _size(n) -> str:
    from core.library.library import human_size
    return human_size(n)


def eta_text(seconds) -> str:
    if seconds is None or seconds < 0:
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _state(value) -> str:
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
            if c == 0:
                return r["file"]
            if c == 1:
                return r["repo_id"]
            if c == 2:
                total = _size(r["total"]) if r["total"] else "?"
                pct = f" ({100 * r['done'] / r['total']:.0f}%)" if r["total"] else ""
                return f"{_size(r['done'])} / {total}{pct}"
            if c == 3:
                return f"{_size(r['speed'])}/s" if r["speed"] and r["state"] == "downloading" else "—"
            if c == 4:
                return eta_text(r["eta"]) if r["state"] == "downloading" else "—"
            if c == 5:
                s = "Done, verified" if r["state"] == "done" else r["state"].capitalize()
                return f"{s}: {r['message']}" if r["message"] and r["state"] == "failed" else s
        if role == Qt.ToolTipRole:
            return r["message"] or f"{r['repo_id']}/{r['file']}"
        if role == Qt.ForegroundRole and c == 5 and r["state"] == "failed":
            return QColor("#c0392b")
        return None


class ProgressDelegate(QStyledItemDelegate):
    """Draws the Progress column as a bar with its text (bytes done / total), also on a selected row."""

    def paint(self, painter, option, index) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        text, opt.text = opt.text, ""
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawControl(QStyle.CE_ItemViewItem, opt, painter, opt.widget)  # background, selection
        selected = bool(opt.state & QStyle.State_Selected)
        ink = opt.palette.color(QPalette.HighlightedText if selected else QPalette.Text)
        base = QColor(ink) if selected else QColor(theme.colors()["accent"])
        frac = max(0.0, min(1.0, index.data(FRACTION_ROLE) or 0.0))
        r = opt.rect.adjusted(3, 4, -3, -4)
        painter.save()
        base.setAlpha(140)
        painter.setPen(base)
        painter.drawRect(r.adjusted(0, 0, -1, -1))
        done = r.adjusted(1, 1, -1, -1)
        done.setWidth(round(done.width() * frac))
        base.setAlpha(70 if selected else 90)
        painter.fillRect(done, base)
        painter.setPen(ink)
        painter.drawText(r, Qt.AlignCenter, text)
        painter.restore()


class DownloadsView(QWidget):
    """The Downloads tab (objectName ``downloadsView``).

    Signals:
        finished(str): a download finished and was verified (its path).
        openRequested(str): the user chose to open a finished download (its path).
    """

    finished = Signal(str)
    openRequested = Signal(str)

    def __init__(self, service, parent=None):
        super().__init__(parent)
        self.service = service
        self.setObjectName("downloadsView")
        lay = QVBoxLayout(self)
        self.notice = QLabel()
        self.notice.setObjectName("downloadsNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        lay.addWidget(self.notice)
        self.model = DownloadsModel(self)
        self.table = QTableView()
        self.table.setObjectName("downloadsTable")
        self.table.setAccessibleName("Downloads")
        self.table.setModel(self.model)
        self.table.setItemDelegateForColumn(2, ProgressDelegate(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.verticalHeader().setDefaultSectionSize(30)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.Interactive)
        h.setSectionResizeMode(0, QHeaderView.Stretch)
        for col, width in ((1, 200), (2, 220), (3, 90), (4, 90), (5, 150)):
            self.table.setColumnWidth(col, width)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        self.model.dataChanged.connect(lambda *_: self._update_buttons())
        lay.addWidget(self.table, 1)
        self.empty = QLabel("No downloads. Find a model in the Hub tab and press Download.")
        self.empty.setObjectName("downloadsEmpty")
        self.empty.setAlignment(Qt.AlignCenter)
        lay.addWidget(self.empty)
        buttons = QHBoxLayout()
        self.status = QLabel()
        self.status.setObjectName("downloadsStatus")
        # a long path must not widen the window: cut at the edge (the tooltip has it whole)
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        buttons.addWidget(self.status, 1)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setObjectName("downloadPause")
        self.pause_button.clicked.connect(self.pause_selected)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setObjectName("downloadResume")
        self.resume_button.clicked.connect(self.resume_selected)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("downloadCancel")
        self.cancel_button.clicked.connect(self.cancel_selected)
        self.open_button = QPushButton("Open")
        self.open_button.setObjectName("downloadOpen")
        self.open_button.setToolTip("Load this model in the chat window")
        self.open_button.clicked.connect(self.open_selected)
        self.clear_button = QPushButton("Clear Finished")
        self.clear_button.setObjectName("downloadClear")
        self.clear_button.clicked.connect(self.clear_finished)
        for b in (self.open_button, self.pause_button, self.resume_button, self.cancel_button, self.clear_button):
            buttons.addWidget(b)
        lay.addLayout(buttons)
        service.downloadEvent.connect(self.on_event)
        service.jobQueued.connect(self.add_job)
        if service.has_manager:
            self.sync()
        self._update_buttons()

    # -- state from the manager ------------------------------------------------------------
    def sync(self) -> None:
        """Rows from the manager's jobs: queued, running, paused, failed (with the reason),
        and those a previous run left, with the bytes their partial files already hold."""
        for job in self.service.manager().jobs():
            self._from_job(job)
        self._update_buttons()

    def _from_job(self, job) -> None:
        state = _state(job.state)
        for f in job.files:
            self.model.upsert(job.job_id, f.path, repo_id=job.repo_id, state=state,
                              message=(job.error or "") if state == "failed" else "", path=job.path or "",
                              **({"total": f.size} if f.size is not None else {}))
        self._spread(job.job_id, job.done_bytes)

    def _spread(self, job_id: str, done: int, current: str | None = None) -> None:
        """Split a job's bytes over its files' rows: the manager fetches them in order."""
        offset = 0
        for i in self.model.find(job_id):
            r = self.model.rows[i]
            size = r["total"] or 0
            r["done"] = max(0, min(done - offset, size)) if size else (done if current == r["file"] else 0)
            offset += size
        rows = self.model.find(job_id)
        if rows:
            self.model.dataChanged.emit(self.model.index(rows[0], 0), self.model.index(rows[-1], len(COLUMNS) - 1))

    def add_job(self, job_id: str, repo_id: str, files: list) -> None:
        """Rows for a job just queued (before its first event)."""
        for name, size in files:
            self.model.upsert(job_id, name, repo_id=repo_id, total=size, state="queued")
        self.select_job(job_id)
        self._update_buttons()

    def on_event(self, ev) -> None:
        if not self.model.find(ev.job_id) and self.service.has_manager:
            self.sync()  # a job queued elsewhere (or before this view existed)
        if isinstance(ev, DownloadProgress):
            if any(self.model.rows[i]["total"] is None for i in self.model.find(ev.job_id)):
                self.sync()  # the sizes are known once the job started
            self.model.set_job(ev.job_id, state="downloading", speed=None, eta=None, message="")
            for i in self.model.find(ev.job_id, ev.file):
                self.model.rows[i].update(speed=ev.speed_bps, eta=ev.eta_s)
            self._spread(ev.job_id, ev.done_bytes, ev.file)
        elif isinstance(ev, DownloadStateChanged):
            self.model.set_job(ev.job_id, state=_state(ev.state), speed=None, eta=None)
            if ev.state != "running":  # progress events are at most 10 a second: the last bytes from the job
                self.sync()
        elif isinstance(ev, DownloadFinished):
            self.model.set_job(ev.job_id, state="done", speed=None, eta=None, message="", path=str(ev.path))
            for i in self.model.find(ev.job_id):
                r = self.model.rows[i]
                if r["total"]:
                    r["done"] = r["total"]
            self.status.setText(f"Finished and verified: {ev.path}")
            self.status.setToolTip(str(ev.path))
            self.finished.emit(str(ev.path))
        elif isinstance(ev, DownloadFailed):
            self.model.set_job(ev.job_id, state="failed", speed=None, eta=None, message=str(ev.message))
            self.sync()  # what the partial files still hold (none after a checksum or disk failure)
            self.notice.setText(f"Download failed: {ev.message}")
            self.notice.show()
        else:
            return
        self._update_buttons()

    # -- actions -------------------------------------------------------------------------
    def selected_row(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        return rows[0].data(ROW_ROLE) if rows else None

    def select_job(self, job_id) -> bool:
        found = self.model.find(job_id)
        if found:
            self.table.selectRow(found[0])
        return bool(found)

    def _update_buttons(self) -> None:
        r = self.selected_row()
        state = r["state"] if r else None
        self.open_button.setEnabled(state == "done" and bool(r.get("path")))
        self.pause_button.setEnabled(state in ("queued", "downloading"))
        self.resume_button.setEnabled(state in ("paused", "failed"))
        self.cancel_button.setEnabled(state in ACTIVE or state == "failed")
        self.clear_button.setEnabled(any(x["state"] in ("done", "cancelled", "failed") for x in self.model.rows))
        self.empty.setVisible(not self.model.rows)

    def pause_selected(self) -> None:
        r = self.selected_row()
        if r is not None:
            self.service.manager().pause(r["job_id"])  # its state event follows

    def resume_selected(self) -> None:
        r = self.selected_row()
        if r is not None:
            self.service.manager().resume(r["job_id"])
            self.notice.hide()

    def cancel_selected(self) -> None:
        r = self.selected_row()
        if r is not None:
            self.service.manager().cancel(r["job_id"])

    def open_selected(self) -> None:
        r = self.selected_row()
        if r is not None and r["state"] == "done" and r.get("path"):
            self.service.record_used(r["path"])
            self.openRequested.emit(r["path"])

    def clear_finished(self) -> None:
        if self.service.has_manager:
            self.service.manager().clear_finished()
        self.model.remove_where(lambda r: r["state"] in ("done", "cancelled", "failed"))
        self.notice.hide()
        self._update_buttons()
