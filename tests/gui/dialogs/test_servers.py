"""Connect to Server's controller and saved servers without a window, over a client that answers
from memory: listing (the saved model picked, a failure said in words), connecting (saved with
its key; a server that cannot stream refused), forgetting, and the one call at a time."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QSettings

from core.remote.client import RemoteError, base_url
from gui.dialogs.servers import SavedServers, ServerController, model_row, normal_url
from tests.gui.ui_helpers import loop, run, until  # noqa: F401

MODELS = [{"id": "tiny", "max_model_len": 512, "owned_by": "me"}, {"id": "other"}]


class MemoryRemote:
    """A server in memory: the key 'k' is needed; ``streams`` says whether replies stream."""
    streams = True
    gate: threading.Event | None = None

    def __init__(self, url, *, api_key=None, model=None):
        self.url, self.api_key, self.model = base_url(url), api_key, model  # raises RemoteError as the client does

    def models(self):
        if self.gate is not None:
            self.gate.wait(10)
        if self.api_key != "k":
            raise RemoteError(f"{self.url}: 401 Unauthorized", kind="auth", status=401)
        return MODELS

    def connect(self):
        pass

    def probe(self):
        return SimpleNamespace(streaming=self.streams, why={} if self.streams else {"streaming": "no SSE"})


@pytest.fixture
def saved(tmp_path):
    return SavedServers(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))


@pytest.fixture
def controller(loop, saved):
    c = ServerController(saved, remote_factory=MemoryRemote)
    c.said = {"status": [], "models": [], "connected": [], "forgotten": [], "busy": []}
    c.statusChanged.connect(lambda text, error: c.said["status"].append((text, error)))
    c.modelsChanged.connect(lambda rows, pick: c.said["models"].append((rows, pick)))
    c.connected.connect(c.said["connected"].append)
    c.forgotten.connect(c.said["forgotten"].append)
    c.busyChanged.connect(c.said["busy"].append)
    return c


def test_listing_picks_the_saved_model_and_says_failures(controller, saved, loop):
    c = controller

    async def scenario():
        await c.list_models("http://127.0.0.1:8000", "wrong")
        text, error = c.said["status"][-1]
        assert error and "refused the API key (401)" in text and c.said["models"] == [([], "")]
        await c.list_models(" http://127.0.0.1:8000 ", "k")
        assert c.said["models"][-1] == ([("tiny", "tiny · context 512 · by me"), ("other", "other")], "tiny")
        assert c.said["status"][-1] == ("2 models on http://127.0.0.1:8000/v1: pick one and press Use Model.", False)
        saved.save("http://127.0.0.1:8000", "other", "k")
        await c.list_models("http://127.0.0.1:8000/v1", "k")
        assert c.said["models"][-1][1] == "other"  # the model chosen last time on this server
        assert c.said["busy"] == [True, False] * 3 and not c.busy

    run(loop, scenario())
    assert c.list_models("not a url", "") is None and c.said["status"][-1][1]  # said, nothing started


def test_connecting_saves_the_server_and_refuses_one_that_cannot_stream(controller, saved, loop, monkeypatch):
    c = controller

    async def scenario():
        monkeypatch.setattr(MemoryRemote, "streams", False)
        await c.use_model("http://127.0.0.1:8000", "k", "tiny")
        assert c.said["status"][-1] == ("http://127.0.0.1:8000/v1 cannot stream replies: no SSE", True)
        assert c.said["connected"] == [] and saved.servers() == []
        monkeypatch.setattr(MemoryRemote, "streams", True)
        await c.use_model("http://127.0.0.1:8000", " k ", "tiny")
        [remote] = c.said["connected"]
        assert (remote.url, remote.model, remote.api_key) == ("http://127.0.0.1:8000/v1", "tiny", "k")
        assert saved.servers() == [{"url": "http://127.0.0.1:8000/v1", "model": "tiny"}] and saved.key(remote.url) == "k"

    run(loop, scenario())


def test_one_call_at_a_time_and_cancel(controller, loop, monkeypatch):
    c = controller
    gate = threading.Event()
    monkeypatch.setattr(MemoryRemote, "gate", gate)

    async def scenario():
        task = c.list_models("http://127.0.0.1:8000", "k")
        await until(lambda: c.said["models"], 5, "the server asked")
        assert c.busy
        assert c.use_model("http://127.0.0.1:8000", "k", "tiny") is None  # a call is under way
        c.cancel()
        gate.set()
        await until(lambda: task.done(), 5, "the cancel")
        assert task.cancelled() and not c.busy and c.said["models"] == [([], "")]

    run(loop, scenario())


def test_forgetting_a_server_drops_its_key(controller, saved):
    saved.save("http://h:1", "m", "secret")
    saved.save("http://g:2/v1", None, None)
    assert saved.has("http://h:1/v1") and saved.key("http://h:1") == "secret" and saved.model("http://h:1") == "m"
    assert [s["url"] for s in saved.servers()] == ["http://g:2/v1", "http://h:1/v1"]  # newest first
    controller.forget(" http://h:1 ")
    assert not saved.has("http://h:1") and saved.key("http://h:1") == "" and saved.has("http://g:2")
    assert controller.said["forgotten"] == ["http://h:1/v1"]
    assert controller.said["status"][-1] == ("Forgot http://h:1 and its API key.", False)


def test_words_and_forms():
    assert normal_url("http://h:1") == "http://h:1/v1" and normal_url(" no url ") == "no url"
    assert model_row({"id": 7}) == ("7", "7") and model_row({}) == ("?", "?")
