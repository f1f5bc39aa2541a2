"""The Hub tab's controller without a window, over a hub that answers from memory: search and
its notice, a repository's files with the estimates and the pick, a 401 that asks for a token
and runs again once one is given, the Hub's address, and a queued download."""
from __future__ import annotations

import pytest

from core.errors import HubAuthError, HubError, HubNetworkError
from core.library.hub import FitEstimate, HubFile, RepoSummary
from gui.library.hub_controller import REPO_PAGE, RESULTS_PAGE, Estimates, HubController, estimate
from gui.library.service import LibraryService
from tests.gui.ui_helpers import data_dir, loop, run, settings  # noqa: F401

REPO = RepoSummary("me/tiny-GGUF", 1500, 12, None, "mit", False, ("gguf",))
GATED = RepoSummary("me/gated-GGUF", 10, 99, None, "llama3.2", "auto", ("gguf",))
FILES = [HubFile(REPO.repo_id, "tiny-Q8_0.gguf", 1000, None, "Q8_0", "gguf"),
         HubFile(REPO.repo_id, "tiny-F16.gguf", 2000, None, "F16", "gguf"),
         HubFile(REPO.repo_id, "odd.gguf", 10, None, None, "gguf")]
FREE_RAM = 1800


class MemoryHub:
    """A hub in memory: GATED wants the token 'hf_ok'; 'odd.gguf' has no readable header."""

    def __init__(self, endpoint=None, token=None):
        self.endpoint, self.token = endpoint, token
        self.offline = False

    def search(self, query, formats, sort, limit):
        if self.offline:
            raise HubNetworkError("no route to host")
        return [r for r in (REPO, GATED) if query in r.repo_id]

    def repo_files(self, repo_id):
        if repo_id == GATED.repo_id and self.token != "hf_ok":
            raise HubAuthError("401")
        return [f for f in FILES if f.repo_id == repo_id] or [HubFile(repo_id, "g.gguf", 5, None, "Q4_0", "gguf")]

    def fit(self, f, *, context_length, free_ram, free_vram):
        if f.path == "odd.gguf":
            raise HubError("no header")
        total = f.size * 4096 // context_length
        return FitEstimate(f.size, total - f.size, total, total <= free_ram, context_length=context_length)

    def recommend(self, files, *, context_length, free_ram, free_vram, estimates):
        fitting = [f for f in files if estimates[f.path].fits]
        return max(fitting, key=lambda f: f.size) if fitting else None


class Manager:
    def __init__(self, folder, state_path, *, hub, on_event, library_state):
        self.queued = []

    def enqueue(self, repo_id, names):
        self.queued.append((repo_id, names))
        return f"job{len(self.queued)}"

    def set_hub(self, hub):
        pass

    def shutdown(self):
        pass


@pytest.fixture
def controller(loop, settings, data_dir, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)  # nor one stored at a login
    monkeypatch.setattr("core.library.hub.free_memory", lambda: (FREE_RAM, None))
    service = LibraryService(settings=settings, data_dir=data_dir, hub_factory=MemoryHub, manager_factory=Manager)
    c = HubController(service)
    said = {name: [] for name in ("busyChanged", "noticeChanged", "authChanged", "pageChanged", "repoChanged",
                                  "filesStatusChanged", "machineChanged", "recommended", "resultsShown",
                                  "downloadStarted")}
    for name, got in said.items():
        getattr(c, name).connect(lambda *a, got=got: got.append(a[0] if len(a) == 1 else a))
    c.said = said
    yield c
    service.shutdown()


def test_search_fills_the_results_and_says_when_none(controller, loop):
    c = controller

    async def scenario():
        await c.search("tiny", ("gguf",), "downloads")
        assert c.results.repos == [REPO] and c.said["resultsShown"] == [1] and c.said["pageChanged"] == [RESULTS_PAGE]
        assert c.said["busyChanged"] == [True, False] and not c.busy
        await c.search("nothing", ("gguf", "safetensors"), "likes")
        assert c.results.repos == [] and "“nothing” in gguf or safetensors format" in c.said["noticeChanged"][-1]
        c.service.hub().offline = True
        await c.search("tiny", ("gguf",), "downloads")
        assert "Cannot reach the Hub" in c.said["noticeChanged"][-1] and c.results.repos == []

    run(loop, scenario())


def test_a_repository_is_estimated_and_one_file_recommended(controller, loop):
    c = controller

    async def scenario():
        await c.search("tiny", ("gguf",), "downloads")
        await c.open_repo(REPO.repo_id)  # by name: the search result's details are used
        assert c.repo is REPO and c.said["pageChanged"][-1] == REPO_PAGE
        assert c.said["repoChanged"][-1][0] == REPO.repo_id and "License: mit · Public · 1,500 downloads" in \
            c.said["repoChanged"][-1][1]
        assert c.files.files == FILES and c.files.fits["tiny-Q8_0.gguf"].fits and not c.files.fits["tiny-F16.gguf"].fits
        assert c.files.recommended == "tiny-Q8_0.gguf" and c.said["recommended"] == ["tiny-Q8_0.gguf"]
        assert c.said["filesStatusChanged"][-1] == "1 of 3 fit this machine; recommended: tiny-Q8_0.gguf; " \
                                                    "1 cannot be estimated"
        assert c.said["machineChanged"][-1].startswith("This machine: 1.8 KB RAM free, no GPU")
        c.set_context_length(8192)  # half the KV cache in this hub's sums: both fit, the larger is picked
        await c.refit()
        assert c.files.recommended == "tiny-F16.gguf" and c.said["filesStatusChanged"][-1].startswith("2 of 3 fit")

    run(loop, scenario())


def test_estimate_leaves_out_only_the_odd_file(monkeypatch):
    monkeypatch.setattr("core.library.hub.free_memory", lambda: (FREE_RAM, None))
    est = estimate(MemoryHub(), FILES, 4096)
    assert isinstance(est, Estimates) and est.free_ram == FREE_RAM
    assert set(est.fits) == {"tiny-Q8_0.gguf", "tiny-F16.gguf"} and est.failed == {"odd.gguf": "no header"}
    assert est.pick_path == "tiny-Q8_0.gguf"


def test_a_gated_repository_asks_for_a_token_then_runs_again(controller, loop):
    c = controller

    async def scenario():
        await c.open_repo(GATED)
        assert "accept the license" in c.said["authChanged"][-1] and c.retry is not None
        assert c.files.files == [] and c.said["filesStatusChanged"][-1] == ""
        await c.use_token("hf_wrong")
        assert "refused this token" in c.said["authChanged"][-1]  # a token was given: other words
        await c.use_token("hf_ok")
        assert c.said["authChanged"][-1] == "" and [f.path for f in c.files.files] == ["g.gguf"]
        assert c.retry is None and c.service.token == "hf_ok" and c.token_text() is None
        c.forget_token()
        assert c.token_text() == "none"

    run(loop, scenario())


def test_the_hub_address_is_checked_and_kept(controller, loop):
    c = controller
    assert c.address_text() == "https://huggingface.co"
    assert not c.set_endpoint("huggingface dot co") and "not a web address" in c.said["noticeChanged"][-1]
    assert c.endpoint() is None
    assert c.set_endpoint(" http://127.0.0.1:9/hub/ ")
    assert c.endpoint() == c.address_text() == "http://127.0.0.1:9/hub"
    assert c.service.hub().endpoint == "http://127.0.0.1:9/hub"
    assert c.set_endpoint("") and c.endpoint() is None


def test_download_queues_the_files_of_the_repository_shown(controller, loop):
    c = controller
    assert c.download(FILES[:1]) is None  # no repository shown yet

    async def scenario():
        await c.open_repo(REPO)
        assert c.download([]) is None
        job = c.download(FILES[:2])
        assert job == "job1" and c.said["downloadStarted"] == ["job1"]
        assert c.service.manager().queued == [(REPO.repo_id, ["tiny-Q8_0.gguf", "tiny-F16.gguf"])]
        assert c.said["filesStatusChanged"][-1] == "Queued 2 file(s) from me/tiny-GGUF: see Downloads"

    run(loop, scenario())
