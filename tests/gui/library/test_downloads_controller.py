"""The Downloads tab's controller without a window, fed the download manager's events by hand:
rows from a queued job, progress spread over a job's files, pause / resume / cancel / open
going to the manager, a failure's notice, a finish, Clear Finished, and which buttons act."""
from __future__ import annotations

import pytest

from core.library.downloads import (DownloadFailed, DownloadFinished, DownloadProgress, DownloadStateChanged, Job,
                                    JobFile)
from core.library.hub import HubFile
from gui.library.downloads_controller import DownloadsController, allowed
from gui.library.service import LibraryService
from tests.gui.ui_helpers import data_dir, loop, settings  # noqa: F401


class Manager:
    """A download manager that only records what it is asked; ``jobs`` is what it reports."""

    def __init__(self, folder, state_path, *, hub, on_event, library_state):
        self.jobs_now: list[Job] = []
        self.calls: list[tuple] = []

    def jobs(self):
        return list(self.jobs_now)

    def enqueue(self, repo_id, names):
        return "j1"

    def __getattr__(self, name):  # pause, resume, cancel, clear_finished, set_hub, shutdown
        return lambda *a: self.calls.append((name, *a))


@pytest.fixture
def dc(loop, settings, data_dir):
    service = LibraryService(settings=settings, data_dir=data_dir, hub_factory=lambda **kw: object(),
                             manager_factory=Manager)
    c = DownloadsController(service)
    c.said = {"notice": [], "status": [], "finished": [], "open": [], "added": []}
    c.noticeChanged.connect(c.said["notice"].append)
    c.statusChanged.connect(lambda text, tip: c.said["status"].append((text, tip)))
    c.finished.connect(c.said["finished"].append)
    c.openRequested.connect(c.said["open"].append)
    c.jobAdded.connect(c.said["added"].append)
    yield c
    service.shutdown()


def rows(c) -> list[tuple]:
    return [(r["file"], r["state"], r["done"], r["total"]) for r in c.model.rows]


def test_a_job_from_queue_to_finish(dc, data_dir):
    c = dc
    job = c.service.enqueue("me/tiny-GGUF", [HubFile("me/tiny-GGUF", "a.gguf", 100, None, None, "gguf"),
                                               HubFile("me/tiny-GGUF", "b.gguf", 50, None, None, "gguf")])
    assert job == "j1" and c.said["added"] == ["j1"]
    assert rows(c) == [("a.gguf", "queued", 0, 100), ("b.gguf", "queued", 0, 50)]
    c.on_event(DownloadProgress("j1", "b.gguf", 120, 150, 1000.0, 0.03))  # the job's bytes over its files, in order
    assert rows(c) == [("a.gguf", "downloading", 100, 100), ("b.gguf", "downloading", 20, 50)]
    assert c.model.index(1, 3).data() == "1.0 KB/s" and c.model.index(0, 3).data() == "—"
    assert c.model.index(1, 2).data() == "20 B / 50 B (40%)"
    c.on_event(DownloadFinished("j1", data_dir / "models" / "me"))
    assert rows(c) == [("a.gguf", "done", 100, 100), ("b.gguf", "done", 50, 50)]
    assert c.said["finished"] == [str(data_dir / "models" / "me")]
    assert c.said["status"] == [(f"Finished and verified: {data_dir / 'models' / 'me'}", str(data_dir / "models" / "me"))]
    assert c.model.index(0, 5).data() == "Done, verified"
    row = c.model.rows[0]
    assert c.allowed(row) == {"open": True, "pause": False, "resume": False, "cancel": False, "clear": True}
    c.open(row)
    assert c.said["open"] == [str(data_dir / "models" / "me")]
    c.clear_finished()
    assert c.model.rows == [] and c.said["notice"][-1] == "" and ("clear_finished",) in c.service.manager().calls


def test_pause_resume_cancel_go_to_the_manager(dc):
    c = dc
    manager = c.service.manager()
    manager.jobs_now = [Job("j7", "me/r", [JobFile("x.gguf", 10)], state="running", done_bytes=4)]
    c.on_event(DownloadStateChanged("j7", "running"))  # a job this view has not seen: taken from the manager
    assert rows(c) == [("x.gguf", "downloading", 4, 10)]
    row = c.model.rows[0]
    assert c.allowed(row) == {"open": False, "pause": True, "resume": False, "cancel": True, "clear": False}
    c.pause(row)
    c.pause(None)  # nothing selected: nothing asked
    manager.jobs_now = [Job("j7", "me/r", [JobFile("x.gguf", 10)], state="paused", done_bytes=6)]
    c.on_event(DownloadStateChanged("j7", "paused"))
    assert rows(c) == [("x.gguf", "paused", 6, 10)]  # the last bytes, from the manager's job
    c.resume(c.model.rows[0])
    c.cancel(c.model.rows[0])
    assert manager.calls == [("pause", "j7"), ("resume", "j7"), ("cancel", "j7")]
    assert c.said["notice"] == [""]  # resuming clears a failure's notice


def test_a_failure_stays_on_its_row_and_in_the_notice(dc):
    c = dc
    manager = c.service.manager()
    manager.jobs_now = [Job("j2", "me/r", [JobFile("y.gguf", 10)], state="failed", done_bytes=3,
                            error="network: connection reset")]
    c.on_event(DownloadFailed("j2", "network: connection reset", "network"))
    assert rows(c) == [("y.gguf", "failed", 3, 10)]
    assert c.model.index(0, 5).data() == "Failed: network: connection reset"
    assert c.said["notice"] == ["Download failed: network: connection reset"]
    assert c.allowed(c.model.rows[0]) == {"open": False, "pause": False, "resume": True, "cancel": True, "clear": True}


def test_nothing_selected_allows_only_clearing_ended_rows():
    assert allowed(None, []) == {"open": False, "pause": False, "resume": False, "cancel": False, "clear": False}
    assert allowed(None, [{"state": "cancelled"}])["clear"] and not allowed(None, [{"state": "paused"}])["clear"]
