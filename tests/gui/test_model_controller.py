"""ModelController without a window: loads, failures, load settings, servers, recent models.

A fake bridge stands in for the worker (the controller only calls ``load`` / ``unload`` /
``cancel_all`` and listens to ``modelLoaded`` / ``modelUnloaded``)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from PySide6.QtCore import QObject, QSettings, Signal

from core.remote.client import Capabilities
from gui.bridge import BridgeError
from gui.model_controller import DEMO_MODEL, ModelController
from tests.gui.ui_helpers import loop, run, settings, until  # noqa: F401 (fixtures)


class FakeBridge(QObject):
    modelLoaded = Signal(dict)
    modelUnloaded = Signal()

    def __init__(self, fail: Exception | None = None):
        super().__init__()
        self.model_info: dict | None = None
        self.fail = fail
        self.calls: list = []
        self.cancelled = 0

    async def load(self, path, *, device, dtype, compile):
        self.calls.append((path, device, dtype, compile))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        self.model_info = {"name": path.rsplit("/", 1)[-1], "path": path, "context_length": 512}
        self.modelLoaded.emit(self.model_info)
        return self.model_info

    async def unload(self):
        self.model_info = None
        self.modelUnloaded.emit()

    def cancel_all(self):
        self.cancelled += 1


def record(ctl: ModelController) -> list:
    seen = []
    for name in ("switching", "loadStarted", "loadEnded", "loaded", "modelChanged", "backendChanged",
                 "failed", "message"):
        getattr(ctl, name).connect(lambda *args, name=name: seen.append((name, *args)))
    return seen


def remote(url="http://127.0.0.1:9/v1", **caps):
    c = Capabilities(**{f: True for f in Capabilities.FIELDS}) if not caps else Capabilities(**caps)
    return SimpleNamespace(url=url, model="tiny", card={}, caps=c, context_length=2048)


def test_a_load_says_what_happens_and_remembers_the_model(loop, settings):
    bridge = FakeBridge()
    ctl = ModelController(bridge=bridge, settings=settings, device="cpu", dtype="float32")
    seen = record(ctl)
    run(loop, ctl.load("/models/tiny.gguf"))
    assert bridge.calls == [("/models/tiny.gguf", "cpu", "float32", False)]
    names = [s[0] for s in seen]
    assert names[:2] == ["switching", "loadStarted"] and seen[1][1] == "tiny.gguf"
    assert names.index("loadEnded") < names.index("loaded") and names[-1] == "loaded"
    assert ctl.info["name"] == "tiny.gguf" and ctl.local_info == ctl.info and not ctl.loading
    assert ctl.recent.last().endswith("tiny.gguf")
    ctl.reload()
    assert ctl.loading  # the same path again
    run(loop, until(lambda: not ctl.loading, 5, "reload"))
    assert len(bridge.calls) == 2 and bridge.calls[1][0] == bridge.calls[0][0]
    run(loop, ctl.unload())
    assert ctl.info is None and ctl.local_info is None


def test_a_failed_load_keeps_the_app_usable_and_names_the_file(loop, settings):
    ctl = ModelController(bridge=FakeBridge(BridgeError("not a model — in /x/bad.gguf")), settings=settings)
    seen = record(ctl)
    run(loop, ctl.load("/x/bad.gguf"))
    failed = [s for s in seen if s[0] == "failed"]
    assert failed == [("failed", "Could not load the model", "/x/bad.gguf\n\nnot a model")]
    assert ctl.info is None and ctl.recent.last() is None and ("loadEnded",) in seen
    ctl = ModelController(bridge=FakeBridge(BridgeError("cancelled", cancelled=True)), settings=settings)
    seen = record(ctl)
    run(loop, ctl.load("/x/big.gguf"))
    assert ("message", "Loading cancelled", 4000) in seen and not [s for s in seen if s[0] == "failed"]


def test_cancel_reaches_the_bridge_only_while_loading(loop, settings):
    bridge = FakeBridge()
    ctl = ModelController(bridge=bridge, settings=settings)
    ctl.cancel_load()
    assert bridge.cancelled == 0
    task = ctl.load("/m/a.gguf")
    ctl.cancel_load()
    assert bridge.cancelled == 1
    run(loop, task)


def test_device_dtype_and_compile_are_kept_for_the_next_load(tmp_path, loop):
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    ctl = ModelController(bridge=FakeBridge(), settings=settings)
    assert (ctl.device, ctl.dtype, ctl.compile) == ("auto", "auto", False)
    seen = record(ctl)
    ctl.set_device("cpu")
    ctl.set_dtype("int4")
    ctl.set_compile(True)
    assert [s[1].split(":")[0] for s in seen] == ["Device cpu", "Data type int4", "Compiled decoding on"]
    again = ModelController(bridge=FakeBridge(), settings=settings)
    assert (again.device, again.dtype, again.compile) == ("cpu", "int4", True)
    bridge = again.bridge
    run(loop, again.load("/m/a.gguf"))
    assert bridge.calls == [("/m/a.gguf", "cpu", "int4", True)]


def test_device_dtype_and_compile_reload_the_loaded_model_at_once(loop, settings):
    bridge = FakeBridge()
    ctl = ModelController(bridge=bridge, settings=settings, device="cpu", dtype="float32")
    run(loop, ctl.load("/m/a.gguf"))
    seen = record(ctl)
    ctl.set_device("cuda")
    assert ctl.loading
    run(loop, until(lambda: not ctl.loading, 5, "the reload"))
    assert ("loadStarted", "a.gguf (device cuda)") in seen  # the progress notice says why
    ctl.set_dtype("int8")
    run(loop, until(lambda: not ctl.loading, 5, "the reload"))
    ctl.set_compile(True)
    run(loop, until(lambda: not ctl.loading, 5, "the reload"))
    assert bridge.calls[1:] == [("/m/a.gguf", "cuda", "float32", False), ("/m/a.gguf", "cuda", "int8", False),
                                ("/m/a.gguf", "cuda", "int8", True)]
    ctl.set_dtype("int8")  # the same choice again: nothing to apply
    assert not ctl.loading and len(bridge.calls) == 4
    ctl.use_remote(remote())  # replies from a server: a reload would take them back, so it waits
    seen.clear()
    ctl.set_device("cpu")
    assert not ctl.loading and len(bridge.calls) == 4
    assert ("message", "Device cpu: used for the next load (Model → Reload Model)", 4000) in seen


def test_a_change_during_a_load_restarts_it_with_the_new_choice(loop, settings):
    bridge = FakeBridge()
    ctl = ModelController(bridge=bridge, settings=settings, device="cpu", dtype="float32")
    ctl.load("/m/big.gguf")
    ctl.set_dtype("bfloat16")
    run(loop, until(lambda: not ctl.loading and ctl.info is not None, 5, "the load"))
    assert bridge.calls[-1] == ("/m/big.gguf", "cpu", "bfloat16", False) and ctl.info["name"] == "big.gguf"


def test_replies_move_to_a_server_and_back(loop, settings):
    bridge = FakeBridge()
    ctl = ModelController(bridge=bridge, settings=settings)
    run(loop, ctl.load("/m/local.gguf"))
    seen = record(ctl)
    server = remote(seed=True, streaming=True)
    ctl.use_remote(server)
    assert ctl.backend is server and ("backendChanged", server) in seen and seen[0] == ("switching",)
    assert ctl.info["server"] == "http://127.0.0.1:9/v1" and ctl.info["name"] == "tiny"
    assert "top_k" in ctl.info["server_lacks"] and "seed" not in ctl.info["server_lacks"]
    assert not ctl.note_decode("compiled")  # a server's replies say nothing of the local decode path
    ctl.forget_server("http://other/v1")
    assert ctl.backend is server
    ctl.forget_server(server.url)
    assert ctl.backend is None and ctl.info == ctl.local_info and ("backendChanged", None) in seen
    ctl.use_remote(server)
    run(loop, ctl.load("/m/other.gguf"))  # opening a local model: replies come from it again
    assert ctl.backend is None and ctl.info["name"] == "other.gguf"
    assert ctl.note_decode("compiled") and ctl.info["decode"] == "compiled" and not ctl.note_decode("compiled")


def test_what_opens_at_start(tmp_path, settings):
    ctl = ModelController(bridge=FakeBridge(), settings=settings)
    assert ctl.initial_model("/given.gguf") == "/given.gguf"
    assert ctl.initial_model(None) == (str(DEMO_MODEL) if DEMO_MODEL.is_dir() else None)
    model = tmp_path / "last.gguf"
    model.write_bytes(b"GGUF")
    ctl.recent.add(str(model))
    assert ctl.initial_model(None) == str(model)
    model.unlink()  # a last model that is gone is skipped
    assert ctl.initial_model(None) != str(model)
