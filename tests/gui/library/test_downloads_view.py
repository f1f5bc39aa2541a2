"""The Downloads tab on core.library.downloads against the local Hub (tests/hubserver.py), driven from the
GUI: a download started on the Hub tab, paused, resumed (a Range request from where it stopped),
verified and listed in the library; cancel; a checksum mismatch shown on its row; a download
that goes on after the app is closed and started again."""
from __future__ import annotations

import hashlib

import pytest
from PySide6.QtCore import Qt

from core.library import downloads
from tests.gui.ui_helpers import ARTIFACTS, bridge, data_dir, loop, make_window, run, settings, snapshot, until  # noqa: F401
from tests.hubserver import GGUF_REPO

SLOW = 150_000  # bytes/s from the local Hub while a test pauses or closes mid-file


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(dv, job=None) -> list[dict]:
    return [r for r in dv.model.rows if job is None or r["job_id"] == job]


def ranges(hub_server, path) -> list:
    """The Range header of every GET of ``path`` the local Hub answered, in order."""
    return [rng for method, p, rng in list(hub_server.requests) if method == "GET" and p.endswith("/" + path)]


@pytest.fixture
def app(qtbot, loop, bridge, settings, data_dir, hub_server):
    """The main window pointed at the local Hub, with its library window open on the Hub tab."""
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    w.library.service.set_endpoint(hub_server.url)
    return w


async def start_download(w, repo: str, path: str, qtbot, hub_server, throttle=None, cut=None) -> str:
    """Open ``repo`` on the Hub tab, select ``path`` and press Download; the switches (a slow
    server, a connection cut after ``cut`` bytes) apply to the download, not to the header
    reads of the page's estimates."""
    lw = w.open_library("hub")
    hub_server.throttle_bps = None
    await lw.hub.open_repo(repo)
    hub_server.throttle_bps = throttle
    if cut is not None:
        hub_server.cut_after[(repo, path)] = cut
    assert lw.hub.select_file(path)
    jobs = []
    lw.hub.downloadStarted.connect(jobs.append)
    qtbot.mouseClick(lw.hub.download_button, Qt.LeftButton)
    assert jobs and lw.tabs.currentWidget() is lw.downloads
    return jobs[0]


def test_pause_resume_verify_and_open(app, hub_server, hub_tree, qtbot, loop, data_dir):
    w = app
    spec = next(r for r in hub_tree if r.repo_id == GGUF_REPO).files["stories260K.gguf"]
    opened = []

    async def scenario():
        job = await start_download(w, GGUF_REPO, "stories260K.gguf", qtbot, hub_server, SLOW)
        lw = w.library.window
        dv = lw.downloads
        assert [r["file"] for r in rows(dv, job)] == ["stories260K.gguf"]
        assert rows(dv, job)[0]["repo_id"] == GGUF_REPO and rows(dv, job)[0]["total"] == spec.size
        await until(lambda: rows(dv, job)[0]["state"] == "downloading" and rows(dv, job)[0]["done"] > 0, 30,
                    "bytes flowing")
        # mid-file, for a person to look at (a plain grab: no event processing inside the scenario)
        ARTIFACTS.mkdir(exist_ok=True)
        lw.grab().save(str(ARTIFACTS / "downloads_running.png"))
        assert dv.select_job(job) and dv.pause_button.isEnabled() and not dv.resume_button.isEnabled()
        qtbot.mouseClick(dv.pause_button, Qt.LeftButton)
        await until(lambda: rows(dv, job)[0]["state"] == "paused", 30, "paused")
        kept = (data_dir / "models" / ".downloads" / job / "stories260K.gguf.part").stat().st_size
        assert 0 < kept < spec.size and dv.resume_button.isEnabled() and not dv.pause_button.isEnabled()
        assert rows(dv, job)[0]["done"] == kept  # the bar shows what is on disk
        hub_server.throttle_bps = None
        qtbot.mouseClick(dv.resume_button, Qt.LeftButton)
        await until(lambda: rows(dv, job)[0]["state"] == "done", 30, "finished")
        # resumed from where it stopped: the second request asked only for the rest
        assert ranges(hub_server, "stories260K.gguf")[-1] == f"bytes={kept}-"
        landed = data_dir / "models" / "llamadesk-test" / "stories260K-GGUF" / "stories260K.gguf"
        assert sha256(landed) == spec.sha256
        assert rows(dv, job)[0]["done"] == spec.size and "Finished and verified" in dv.status.text()
        # it is in the library now (the finish rescans), with nothing left of the partial
        await until(lambda: any(str(e.path) == str(landed) for e in w.library.service.entries), 30, "listed in the library")
        assert not (data_dir / "models" / ".downloads" / job).exists()
        assert [e.name for e in w.library.service.entries] == ["stories260K"]
        dv.select_job(job)
        dv.openRequested.connect(opened.append)
        qtbot.mouseClick(dv.open_button, Qt.LeftButton)
        assert opened == [str(landed)]
        await until(lambda: w.info is not None, 30, "the model loaded")
        assert w.info["path"] == str(landed)
        dv.table.clearSelection()  # the screenshot shows the bar, not the selection
        return lw

    snapshot(run(loop, scenario(), 90), "downloads_tab")


def test_cancel_and_checksum_failure(app, hub_server, qtbot, loop, data_dir):
    w = app
    hub_server.bad_checksum.add((GGUF_REPO, "tiny-Q8_0.gguf"))

    async def scenario():
        job = await start_download(w, GGUF_REPO, "stories260K.gguf", qtbot, hub_server, SLOW)
        dv = w.library.window.downloads
        await until(lambda: rows(dv, job)[0]["done"] > 0, 30, "bytes flowing")
        dv.select_job(job)
        qtbot.mouseClick(dv.cancel_button, Qt.LeftButton)
        await until(lambda: rows(dv, job)[0]["state"] == "cancelled", 30, "cancelled")
        assert not (data_dir / "models" / ".downloads" / job).exists()
        assert not dv.cancel_button.isEnabled() and not dv.resume_button.isEnabled()
        # a file whose bytes do not match the Hub's checksum: failed on its row, said above, not listed
        bad = await start_download(w, GGUF_REPO, "tiny-Q8_0.gguf", qtbot, hub_server)
        await until(lambda: rows(dv, bad)[0]["state"] == "failed", 30, "the checksum failure")
        row = dv.model.index(dv.model.find(bad)[0], 5).data()
        assert row.startswith("Failed:") and "checksum" in row
        assert dv.notice.isVisible() and "checksum" in dv.notice.text()
        assert not (data_dir / "models" / "llamadesk-test").exists()
        w.library.service.rescan()
        await until(lambda: not w.library.service.scanning, 20, "a rescan")
        assert w.library.service.entries == []
        qtbot.mouseClick(dv.clear_button, Qt.LeftButton)
        assert rows(dv) == [] and not dv.notice.isVisible()

    run(loop, scenario(), 90)


def test_download_goes_on_after_a_restart(qtbot, loop, bridge, settings, data_dir, hub_server, hub_tree):
    spec = next(r for r in hub_tree if r.repo_id == GGUF_REPO).files["stories260K.gguf"]
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    w.library.service.set_endpoint(hub_server.url)

    async def first_run():
        job = await start_download(w, GGUF_REPO, "stories260K.gguf", qtbot, hub_server, SLOW)
        dv = w.library.window.downloads
        await until(lambda: rows(dv, job)[0]["done"] > 0, 30, "bytes flowing")
        return job

    job = run(loop, first_run())
    w.close()  # quitting mid-download: the manager stops, its queue and partial file stay
    part = data_dir / "models" / ".downloads" / job / "stories260K.gguf.part"
    kept = part.stat().st_size
    assert 0 < kept < spec.size
    hub_server.throttle_bps = None

    w2 = make_window(bridge=bridge, settings=settings, data_dir=data_dir)  # the next start
    qtbot.addWidget(w2)
    assert w2.library.service.has_manager  # started by itself: there was a queue

    async def second_run():
        lw = w2.open_library("downloads")
        dv = lw.downloads
        await until(lambda: rows(dv, job) and rows(dv, job)[0]["state"] == "done", 30, "finished after the restart")
        assert ranges(hub_server, "stories260K.gguf")[-1] == f"bytes={kept}-"
        landed = data_dir / "models" / "llamadesk-test" / "stories260K-GGUF" / "stories260K.gguf"
        assert sha256(landed) == spec.sha256
        await until(lambda: [str(e.path) for e in w2.library.service.entries] == [str(landed)], 30, "in the library")
        # another models folder: later downloads land there
        new = data_dir / "elsewhere"
        w2.library.service.set_models_folder(new)
        again = await start_download(w2, GGUF_REPO, "tiny-Q8_0.gguf", qtbot, hub_server)
        await until(lambda: rows(dv, again) and rows(dv, again)[0]["state"] == "done", 30, "the second download")
        assert (new / "llamadesk-test" / "stories260K-GGUF" / "tiny-Q8_0.gguf").is_file()
        await until(lambda: [e.name for e in w2.library.service.entries] == ["tiny-Q8_0"], 30, "the new folder listed")

    run(loop, second_run(), 60)
    w2.close()
    # a start with only finished downloads in the queue does not start the manager
    w3 = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w3)
    assert (data_dir / "downloads.json").exists() and not w3.library.service.has_manager


def test_network_drop_fails_inline_then_resumes(app, hub_server, hub_tree, qtbot, loop, data_dir, monkeypatch):
    monkeypatch.setattr(downloads, "RETRY_WAIT_S", (0.01,) * 5)  # the manager's retries, without their waits
    w = app
    spec = next(r for r in hub_tree if r.repo_id == GGUF_REPO).files["stories260K.gguf"]
    hub_server.offline_after_cut = True  # the network goes down mid-file and stays down

    async def scenario():
        job = await start_download(w, GGUF_REPO, "stories260K.gguf", qtbot, hub_server, cut=300_000)
        dv = w.library.window.downloads
        await until(lambda: rows(dv, job)[0]["state"] == "failed", 30, "the failure")
        status = dv.model.index(dv.model.find(job)[0], 5).data()
        assert status.startswith("Failed:") and "network" in status
        assert dv.notice.isVisible() and rows(dv, job)[0]["done"] == 300_000  # the kept bytes show
        assert dv.select_job(job) and dv.resume_button.isEnabled()
        hub_server.offline = False
        qtbot.mouseClick(dv.resume_button, Qt.LeftButton)
        await until(lambda: rows(dv, job)[0]["state"] == "done", 30, "finished after the network came back")
        assert not dv.notice.isVisible()
        assert ranges(hub_server, "stories260K.gguf")[-1] == "bytes=300000-"
        landed = data_dir / "models" / "llamadesk-test" / "stories260K-GGUF" / "stories260K.gguf"
        assert sha256(landed) == spec.sha256

    run(loop, scenario(), 60)
