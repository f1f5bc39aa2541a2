"""Downloads from the local fake Hub: completion and verification into the library, resume
after a dropped connection and after a restart, pause/resume/cancel, and the failures
(bad checksum, gated without a token, vanished repository, full disk, no network) that
must leave nothing in the library."""
from __future__ import annotations

import errno
import hashlib
import threading

import pytest
import json
import shutil as sh

from core.library import downloads
from core.library.downloads import (DownloadFailed, DownloadFinished, DownloadManager, DownloadProgress,
                            DownloadStateChanged)
from core.library.hub import HubClient
from core.library.library import LibraryState, scan
from tests.hubserver import GATED_REPO, GGUF_REPO, HF_REPO
from core.checkpoints import load
from core.errors import DownloadError
from tests.core.checkpoints.util import PROMPT
from tests.helpers import greedy

STORIES = "stories260K.gguf"


class Events:
    """The manager's events, with an event-based wait."""

    def __init__(self):
        self.items: list[object] = []
        self.cond = threading.Condition()

    def __call__(self, ev) -> None:
        with self.cond:
            self.items.append(ev)
            self.cond.notify_all()

    def wait(self, pred, timeout: float = 60):
        with self.cond:
            assert self.cond.wait_for(lambda: any(pred(e) for e in self.items), timeout), self.items[-5:]
            return next(e for e in self.items if pred(e))

    def end(self, job_id: str, timeout: float = 60):
        return self.wait(lambda e: isinstance(e, (DownloadFinished, DownloadFailed)) and e.job_id == job_id, timeout)

    def of(self, kind):
        with self.cond:
            return [e for e in self.items if isinstance(e, kind)]


@pytest.fixture
def env(tmp_path, monkeypatch, hub_server):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(downloads, "RETRY_WAIT_S", (0.01,) * 5)
    made = []

    class Env:
        dest = tmp_path / "data" / "models"
        state = tmp_path / "data" / "downloads.json"
        hub = hub_server

        def manager(self, client=None):
            ev = Events()
            m = DownloadManager(self.dest, self.state, hub=client or HubClient(hub_server.url), on_event=ev)
            made.append(m)
            return m, ev

        def library_files(self):
            return sorted(p.relative_to(self.dest).as_posix() for p in self.dest.rglob("*") if p.is_file())

    yield Env()
    for m in made:
        assert m.shutdown(10)


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_verifies_lands_in_the_library_and_generates(env, fixtures):
    m, ev = env.manager()
    job = m.enqueue(GGUF_REPO, [STORIES])
    done = ev.end(job)
    assert isinstance(done, DownloadFinished), done
    assert done.path == env.dest / "llamadesk-test" / "stories260K-GGUF" / STORIES
    assert sha256(done.path) == sha256(fixtures / STORIES)
    assert env.library_files() == [f"llamadesk-test/stories260K-GGUF/{STORIES}"]  # no partial left anywhere
    last = ev.of(DownloadProgress)[-1]
    assert last.done_bytes == last.total_bytes == (fixtures / STORIES).stat().st_size
    [entry] = scan([env.dest], state=LibraryState())
    assert (entry.path, entry.source, entry.error) == (done.path, GGUF_REPO, None)
    lm = load(entry.path, device="cpu", dtype="float32")
    ids, _ = greedy(lm.model, PROMPT, 16)
    assert lm.tokenizer.decode(ids).startswith(", there was a little girl named Lily. She loved to play")
    assert m.jobs()[0].state == "done" and m.jobs()[0].path == str(done.path)


def test_a_safetensors_folder_lands_whole_and_loads(env, hub_server):
    client = HubClient(hub_server.url)
    [folder] = client.repo_files(HF_REPO)
    m, ev = env.manager(client)
    done = ev.end(m.enqueue(HF_REPO, folder.files))
    assert isinstance(done, DownloadFinished), done
    assert done.path == env.dest / "llamadesk-test" / "tiny-llama-hf"
    for name in folder.files:  # small files are checked by git blob id, LFS files by sha256
        assert (done.path / name).read_bytes() == hub_server.repos[HF_REPO].files[name].open().read()
    [entry] = scan([env.dest], state=LibraryState())
    assert (entry.format, entry.source) == ("hf", HF_REPO)
    assert load(entry.path, device="cpu", dtype="float32").args.n_layers == 2


def test_a_cut_connection_resumes_where_it_stopped(env, fixtures):
    size = (fixtures / STORIES).stat().st_size
    env.hub.cut_after[(GGUF_REPO, STORIES)] = 400_000
    m, ev = env.manager()
    done = ev.end(m.enqueue(GGUF_REPO, [STORIES]))
    assert isinstance(done, DownloadFinished), done
    assert sha256(done.path) == sha256(fixtures / STORIES)
    assert env.hub.sent(GGUF_REPO, STORIES) == size  # 400,000 + the rest: nothing sent twice
    ranges = [r for meth, p, r in env.hub.requests if meth == "GET" and p.endswith("/" + STORIES)]
    assert ranges == [None, "bytes=400000-"]


def test_checksum_mismatch_is_rejected_and_nothing_is_left(env):
    env.hub.bad_checksum.add((GGUF_REPO, STORIES))
    m, ev = env.manager()
    job = m.enqueue(GGUF_REPO, [STORIES])
    failed = ev.end(job)
    assert isinstance(failed, DownloadFailed) and failed.kind == "checksum"
    assert "checksum" in failed.message and "nothing was added" in failed.message
    assert env.library_files() == []  # neither in the library nor as a partial
    assert scan([env.dest], state=LibraryState()) == []
    assert m.jobs()[0].state == "failed"


def test_gated_repo_needs_a_token_then_downloads(env, hub_server):
    m, ev = env.manager()
    job = m.enqueue(GATED_REPO, ["stories260K-gated.gguf"])
    failed = ev.end(job)
    assert isinstance(failed, DownloadFailed) and failed.kind == "auth"
    assert "gated" in failed.message and "HF_TOKEN" in failed.message
    assert env.library_files() == []
    m.set_hub(HubClient(hub_server.url, token=hub_server.token))
    ev.items.clear()
    m.resume(job)
    done = ev.end(job)
    assert isinstance(done, DownloadFinished), done
    assert done.path.name == "stories260K-gated.gguf" and done.path.is_file()


def test_a_download_survives_a_restart(env, fixtures):
    size = (fixtures / STORIES).stat().st_size
    env.hub.throttle_bps = 400_000
    m, ev = env.manager()
    job = m.enqueue(GGUF_REPO, [STORIES])
    ev.wait(lambda e: isinstance(e, DownloadProgress) and e.done_bytes >= 100_000)
    assert m.shutdown(10)  # the app quits mid-file
    partial = env.dest / ".downloads" / job / (STORIES + ".part")
    kept = partial.stat().st_size
    assert 0 < kept < size
    env.hub.throttle_bps = None
    m2, ev2 = env.manager()  # the app starts again: the job resumes by itself
    done = ev2.end(job)
    assert isinstance(done, DownloadFinished), done
    assert sha256(done.path) == sha256(fixtures / STORIES)
    first, second = env.hub.transfers
    assert (first["range"], second["range"], second["sent"]) == (None, f"bytes={kept}-", size - kept)


def test_pause_resume_and_cancel(env, fixtures):
    env.hub.throttle_bps = 300_000
    m, ev = env.manager()
    job = m.enqueue(GGUF_REPO, [STORIES])
    other = m.enqueue(GGUF_REPO, ["tiny-Q8_0.gguf"])  # waits behind the first
    ev.wait(lambda e: isinstance(e, DownloadProgress) and e.job_id == job)
    m.pause(job)
    ev.wait(lambda e: isinstance(e, DownloadStateChanged) and e.job_id == job and e.state == "paused")
    assert (env.dest / ".downloads" / job / (STORIES + ".part")).exists()
    m.cancel(other)  # cancel whatever it is doing (running now, or still queued)
    ev.wait(lambda e: isinstance(e, DownloadStateChanged) and e.job_id == other and e.state == "cancelled")
    assert not (env.dest / ".downloads" / other).exists()
    env.hub.throttle_bps = None
    m.resume(job)
    done = ev.end(job)
    assert isinstance(done, DownloadFinished) and sha256(done.path) == sha256(fixtures / STORIES)
    states = {j.job_id: j.state for j in m.jobs()}
    assert states == {job: "done", other: "cancelled"}
    assert env.library_files() == [f"llamadesk-test/stories260K-GGUF/{STORIES}"]
    ranges = [r for meth, p, r in env.hub.requests if meth == "GET" and p.endswith("/" + STORIES)]
    assert ranges[0] is None and ranges[-1].startswith("bytes=") and len(ranges) == 2


def test_a_repository_that_vanishes_mid_download(env):
    env.hub.throttle_bps = 300_000
    m, ev = env.manager()
    job = m.enqueue(GGUF_REPO, [STORIES])
    ev.wait(lambda e: isinstance(e, DownloadProgress) and e.job_id == job)
    env.hub.remove(GGUF_REPO)
    failed = ev.end(job)
    assert isinstance(failed, DownloadFailed) and failed.kind == "not_found", failed
    assert "does not exist" in failed.message
    assert env.library_files() == []


def test_full_disk_before_and_during(env, monkeypatch):
    real = sh.disk_usage
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda p: real(p)._replace(free=10_000))
    m, ev = env.manager()
    failed = ev.end(m.enqueue(GGUF_REPO, [STORIES]))
    assert isinstance(failed, DownloadFailed) and failed.kind == "disk" and "disk space" in failed.message
    assert env.hub.sent(GGUF_REPO, STORIES) == 0  # checked before a byte was asked for
    monkeypatch.setattr(downloads.shutil, "disk_usage", real)
    writes = []

    def full(f, chunk):
        if writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        writes.append(len(chunk))
        f.write(chunk)
    monkeypatch.setattr(downloads, "_write", full)
    failed = ev.end(m.enqueue(GGUF_REPO, [STORIES]))
    assert isinstance(failed, DownloadFailed) and failed.kind == "disk" and "full" in failed.message
    assert env.library_files() == []


def test_no_network_says_so_and_keeps_the_partial_for_later(env, fixtures):
    env.hub.cut_after[(GGUF_REPO, STORIES)] = 300_000
    env.hub.offline_after_cut = True  # the network goes down mid-file and stays down
    m, ev = env.manager()
    job = m.enqueue(GGUF_REPO, [STORIES])
    failed = ev.end(job)
    assert isinstance(failed, DownloadFailed) and failed.kind == "network" and "resume" in failed.message
    assert env.library_files() == [f".downloads/{job}/{STORIES}.part"]  # hidden: the scanner skips it
    assert scan([env.dest], state=LibraryState()) == []
    env.hub.offline = False
    ev.items.clear()
    m.resume(job)
    assert isinstance(ev.end(job), DownloadFinished)
    assert env.hub.sent(GGUF_REPO, STORIES) == (fixtures / STORIES).stat().st_size


def test_bad_requests_are_refused_at_once(env):
    m, _ = env.manager()
    for repo, names in [("noslash", ["a.gguf"]), ("../x", ["a.gguf"]), ("a/..", ["a.gguf"]), ("/a/b", ["a.gguf"]),
                        (GGUF_REPO, []), (GGUF_REPO, ["../../etc/passwd"]),
                        (GGUF_REPO, ["/abs.gguf"])]:
        with pytest.raises(DownloadError):
            m.enqueue(repo, names)
    with pytest.raises(DownloadError, match="no download"):
        m.pause("nope")


def test_a_damaged_or_edited_queue_file_is_not_trusted(env):
    env.state.parent.mkdir(parents=True, exist_ok=True)
    jobs = [{"job_id": "evil1", "repo_id": "../x", "files": [{"path": "a.gguf"}], "state": "queued"},
            {"job_id": "evil2", "repo_id": GGUF_REPO, "files": [{"path": "../../a.gguf"}], "state": "queued"},
            {"job_id": "odd", "repo_id": GGUF_REPO, "files": "nope", "state": "queued"}]
    env.state.write_text(json.dumps({"version": 1, "jobs": jobs}))
    m, _ = env.manager()
    assert m.jobs() == []
    m.shutdown()
    env.state.write_text("{broken")
    m2, _ = env.manager()
    assert m2.jobs() == []
