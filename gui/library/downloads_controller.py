"""The Downloads tab's controller: rows that follow the download manager's events, and what
Pause, Resume, Cancel, Open and Clear Finished do. It holds no widget (tested without a window).

Rows follow the events :class:`~gui.library.service.LibraryService` queues to the UI thread;
the manager's own ``jobs()`` fills the model when the tab opens, so downloads a previous run
left show with their progress. A failure stays on its row in words (and in the notice) until
cleared.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from core.library.downloads import DownloadFailed, DownloadFinished, DownloadProgress, DownloadStateChanged
from gui.library.downloads_model import ACTIVE, ENDED, DownloadsModel, state_text


def allowed(row: dict | None, rows: list[dict]) -> dict[str, bool]:
    """Which buttons act on the selected ``row`` (None: nothing selected) among ``rows``."""
    state = row["state"] if row else None
    return {"open": state == "done" and bool(row.get("path")),
            "pause": state in ("queued", "downloading"),
            "resume": state in ("paused", "failed"),
            "cancel": state in ACTIVE or state == "failed",
            "clear": any(r["state"] in ENDED for r in rows)}


class DownloadsController(QObject):
    """The download rows (``model``, a :class:`DownloadsModel`) over a library service.

    Signals:
        changed(): rows were added or changed state (buttons may change).
        jobAdded(str): a job was just queued (its id: select it).
        finished(str): a download finished and was verified (its path).
        openRequested(str): a finished download to load (its path; its use is recorded).
        noticeChanged(str): the notice above the table ('' hides it).
        statusChanged(str, str): the line under the table and its tooltip (a path that finished).
    """

    changed = Signal()
    jobAdded = Signal(str)
    finished = Signal(str)
    openRequested = Signal(str)
    noticeChanged = Signal(str)
    statusChanged = Signal(str, str)

    def __init__(self, service, parent: QObject | None = None):
        super().__init__(parent)
        self.service = service
        self.model = DownloadsModel(self)
        service.downloadEvent.connect(self.on_event)
        service.jobQueued.connect(self.add_job)
        if service.has_manager:
            self.sync()

    # -- state from the manager ------------------------------------------------------------
    def sync(self) -> None:
        """Rows from the manager's jobs: queued, running, paused, failed (with the reason),
        and those a previous run left, with the bytes their partial files already hold."""
        for job in self.service.manager().jobs():
            state = state_text(job.state)
            for f in job.files:
                self.model.upsert(job.job_id, f.path, repo_id=job.repo_id, state=state,
                                  message=(job.error or "") if state == "failed" else "", path=job.path or "",
                                  **({"total": f.size} if f.size is not None else {}))
            self.model.spread(job.job_id, job.done_bytes)
        self.changed.emit()

    def add_job(self, job_id: str, repo_id: str, files: list) -> None:
        """Rows for a job just queued (before its first event)."""
        for name, size in files:
            self.model.upsert(job_id, name, repo_id=repo_id, total=size, state="queued")
        self.jobAdded.emit(job_id)
        self.changed.emit()

    def on_event(self, ev) -> None:
        if not self.model.find(ev.job_id) and self.service.has_manager:
            self.sync()  # a job queued elsewhere (or before this view existed)
        for kind, handler in ((DownloadProgress, self._progress), (DownloadStateChanged, self._state_changed),
                              (DownloadFinished, self._finished), (DownloadFailed, self._failed)):
            if isinstance(ev, kind):
                handler(ev)
                self.changed.emit()
                return

    def _progress(self, ev: DownloadProgress) -> None:
        if any(self.model.rows[i]["total"] is None for i in self.model.find(ev.job_id)):
            self.sync()  # the sizes are known once the job started
        self.model.set_job(ev.job_id, state="downloading", speed=None, eta=None, message="")
        for i in self.model.find(ev.job_id, ev.file):
            self.model.rows[i].update(speed=ev.speed_bps, eta=ev.eta_s)
        self.model.spread(ev.job_id, ev.done_bytes, ev.file)

    def _state_changed(self, ev: DownloadStateChanged) -> None:
        self.model.set_job(ev.job_id, state=state_text(ev.state), speed=None, eta=None)
        if ev.state != "running":  # progress events are at most 10 a second: the last bytes from the job
            self.sync()

    def _finished(self, ev: DownloadFinished) -> None:
        self.model.finish(ev.job_id, str(ev.path))
        self.statusChanged.emit(f"Finished and verified: {ev.path}", str(ev.path))
        self.finished.emit(str(ev.path))

    def _failed(self, ev: DownloadFailed) -> None:
        self.model.set_job(ev.job_id, state="failed", speed=None, eta=None, message=str(ev.message))
        self.sync()  # what the partial files still hold (none after a checksum or disk failure)
        self.noticeChanged.emit(f"Download failed: {ev.message}")

    # -- actions on a row ------------------------------------------------------------------
    def allowed(self, row: dict | None) -> dict[str, bool]:
        return allowed(row, self.model.rows)

    def pause(self, row: dict | None) -> None:
        if row is not None:
            self.service.manager().pause(row["job_id"])  # its state event follows

    def resume(self, row: dict | None) -> None:
        if row is not None:
            self.service.manager().resume(row["job_id"])
            self.noticeChanged.emit("")

    def cancel(self, row: dict | None) -> None:
        if row is not None:
            self.service.manager().cancel(row["job_id"])

    def open(self, row: dict | None) -> None:
        if row is not None and row["state"] == "done" and row.get("path"):
            self.service.record_used(row["path"])
            self.openRequested.emit(row["path"])

    def clear_finished(self) -> None:
        if self.service.has_manager:
            self.service.manager().clear_finished()
        self.model.remove_where(lambda r: r["state"] in ENDED)
        self.noticeChanged.emit("")
        self.changed.emit()
