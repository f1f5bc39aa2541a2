"""Which model replies come from: the local model the worker loads, or a server.

:class:`ModelController` loads, unloads and reloads the local model through the bridge,
keeps the device / data type / compile choices and the recent models, and switches
replies between the local model and a connected server. It owns no widget: the main
window shows what its signals say, and a test drives it with a bridge and no window.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QSettings, Signal

from core.paths import assets_dir
from core.remote.runner import context_length as remote_context_length
from core.remote.runner import public_url

from gui.dialogs.model_dialog import COMPILE_KEY, DEVICE_KEY, DTYPE_KEY, RecentModels

DEMO_MODEL = assets_dir() / "models" / "llamadesk-demo"


def with_path(path: str, message: str) -> str:
    """An error's text naming ``path`` once: loader messages often end "— in PATH" already."""
    message = message.replace(f" — in {path}", "")
    return message if path in message else f"{path}\n\n{message}"


class ModelController(QObject):
    """The model replies come from, and the local model's load settings.

    Args:
        bridge: the :class:`gui.bridge.Bridge` (``load``, ``unload``, ``cancel_all``,
            ``model_info`` and the ``modelLoaded`` / ``modelUnloaded`` signals).
        settings: where device, data type, compile and recent models are kept.
        device, dtype: this run's choices (None: the saved ones, else "auto").

    Attributes:
        info: the model replies come from (a local model's info, or a server's), or None.
        local_info: the model loaded in the worker, if any (kept while a server answers).
        backend: the connected ``core.remote.client.RemoteModel`` replies come from, or
            None for the local model.

    Signals:
        switching(): the model is about to change (a load, a server): a running reply stops.
        loadStarted(str): loading began; the model's name (and, for a reload because a
            load setting changed, which one: "tiny.gguf (device cpu)").
        loadEnded(): loading ended (loaded, failed or cancelled).
        loaded(dict): a model asked for by :meth:`load` is ready (its info).
        modelChanged(object): the model replies come from changed: its info, or None.
        backendChanged(object): replies come from this server now (a RemoteModel), or from
            the local model again (None).
        failed(str, str): a title and message for an error dialog.
        message(str, int): a line for the status bar and how long to show it (ms).
    """

    switching = Signal()
    loadStarted = Signal(str)
    loadEnded = Signal()
    loaded = Signal(dict)
    modelChanged = Signal(object)
    backendChanged = Signal(object)
    failed = Signal(str, str)
    message = Signal(str, int)

    def __init__(self, *, bridge, settings: QSettings, device: str | None = None, dtype: str | None = None,
                 parent=None):
        super().__init__(parent)
        self.bridge = bridge
        self.settings = settings
        self.recent = RecentModels(settings=settings)
        self.info: dict | None = None
        self.local_info: dict | None = None
        self.backend = None
        self.device = device or str(settings.value(DEVICE_KEY, "auto"))
        self.dtype = dtype or str(settings.value(DTYPE_KEY, "auto"))
        self.compile = str(settings.value(COMPILE_KEY, "false")).lower() == "true"
        self._tasks: set[asyncio.Task] = set()
        self._load_task: asyncio.Task | None = None
        self._loading_path: str | None = None
        self._load_seq = 0  # which load is the current one (a newer one replaces it)
        bridge.modelLoaded.connect(self._on_local_loaded)
        bridge.modelUnloaded.connect(self._on_local_unloaded)

    @property
    def loading(self) -> bool:
        return self._loading_path is not None

    def initial_model(self, arg: str | None) -> str | None:
        """What to open at start: the argument, else the last model, else the demo model."""
        if arg:
            return arg
        last = self.recent.last()
        if last and os.path.exists(last):
            return last
        if DEMO_MODEL.is_dir():
            return str(DEMO_MODEL)
        return None

    # ---- the local model
    @property
    def loading_path(self) -> str | None:
        """The model being loaded now, if any."""
        return self._loading_path

    def compiling(self) -> bool:
        """Whether the next local reply waits for the compiler first (Compile Decoding: the
        first decode step after a load compiles, minutes on a CPU)."""
        return (self.backend is None and self.info is not None
                and str(self.info.get("decode", "")).startswith("compiles"))

    def load(self, path: str, *, why: str = "") -> asyncio.Task:
        """Start loading a model (stopping a running reply, cancelling another load);
        ``why``: what the progress notice says beside the name (a reload's reason).

        ``loadStarted`` is said before this returns, so the prompt stops offering to send
        to the model being replaced at once, not when the load's task first runs."""
        self.switching.emit()
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        self._loading_path = str(path)
        self._load_seq += 1
        name = Path(path).name or str(path)
        self.loadStarted.emit(f"{name} ({why})" if why else name)
        self._load_task = self._spawn(self._load(str(path), self._load_seq))
        return self._load_task

    async def _load(self, path: str, seq: int) -> None:
        # A load replaced by a newer one ends quietly: the newer one owns the state and notices.
        current = lambda: seq == self._load_seq  # noqa: E731
        try:
            info = await self.bridge.load(path, device=self.device, dtype=self.dtype, compile=self.compile)
        except asyncio.CancelledError:
            if current():
                self._end_load()
                self.message.emit("Loading cancelled", 4000)
            raise
        except Exception as e:  # BridgeError and anything unexpected: the app stays usable
            if current():
                self._end_load()
                if getattr(e, "cancelled", False):
                    self.message.emit("Loading cancelled", 4000)
                else:
                    self.failed.emit("Could not load the model", with_path(path, str(e)))
            return
        if not current():
            return
        self._end_load(restore=False)
        self.recent.add(path)
        self.set_model(info)
        self.loaded.emit(info)

    def _end_load(self, restore: bool = True) -> None:
        """Loading is over; ``restore``: it failed, replies come from whatever is loaded now."""
        self._loading_path = None
        if restore:
            self.set_model(self.current_info())
        self.loadEnded.emit()

    def cancel_load(self) -> None:
        if self._load_task is not None and not self._load_task.done():
            self.bridge.cancel_all()  # the load ends with a "cancelled" BridgeError

    def reload(self) -> None:
        path = (self.info or {}).get("path") or self.recent.last()
        if path:
            self.load(path)

    def count(self, request, then: Callable[[int], object]) -> asyncio.Task | None:
        """Count the prompt ``request`` makes for the local model (on the worker, with its
        tokenizer and chat format) and call ``then(tokens)``. Nothing while replies come from
        a server, no model is loaded, or a load begins before the count is done."""
        if self.backend is not None or self.local_info is None or self.loading:
            return None

        counted_by = self.local_info

        async def run() -> None:
            try:
                tokens = await self.bridge.count(request)
            except Exception:  # BridgeError: a load cancelled it, or the model went away
                return
            if self.local_info is counted_by and self.backend is None and not self.loading:
                then(int(tokens))
        return self._spawn(run())

    def unload(self) -> asyncio.Task:
        return self._spawn(self.bridge.unload())

    def close(self) -> None:
        """The app is closing: a load in progress is cancelled."""
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()

    def set_device(self, device: str) -> None:
        self._apply("device", device, DEVICE_KEY, f"Device {device}")

    def set_dtype(self, dtype: str) -> None:
        self._apply("dtype", dtype, DTYPE_KEY, f"Data type {dtype}")

    def set_compile(self, on: bool) -> None:
        self._apply("compile", bool(on), COMPILE_KEY, f"Compiled decoding {'on' if on else 'off'}")

    def _apply(self, attr: str, value, key: str, what: str) -> None:
        """A load setting changed: kept for the next start, and applied now by reloading the
        local model (the status bar shows the load's progress and why). With no local model,
        or while replies come from a server (a reload would switch them back), it waits for
        the next load, and the status bar says so."""
        changed = getattr(self, attr) != value
        setattr(self, attr, value)
        self.settings.setValue(key, ("true" if value else "false") if isinstance(value, bool) else value)
        path = self._loading_path or (self.local_info or {}).get("path")
        if changed and path and self.backend is None:
            self.load(path, why=what[0].lower() + what[1:])
        else:
            self.message.emit(f"{what}: used for the next load (Model → Reload Model)", 4000)

    def current_info(self) -> dict | None:
        if self.backend is not None:
            return self.info
        return getattr(self.bridge, "model_info", None)

    def set_model(self, info: dict | None) -> None:
        """Replies come from the model ``info`` describes (None: no model)."""
        self.info = dict(info) if info else None
        self.modelChanged.emit(self.info)

    def note_decode(self, decode: str) -> bool:
        """A local reply decoded on ``decode`` (the first reply compiled, or fell back);
        True when that is news, so the model's status should say so."""
        if not decode or self.info is None or self.backend is not None or decode == self.info.get("decode"):
            return False
        self.info["decode"] = decode
        return True

    def _on_local_loaded(self, info: dict) -> None:
        """A local model was loaded (the user opened one): replies come from it again."""
        self.local_info = dict(info)
        if self.backend is not None:
            self._leave_server()
        self.set_model(info)

    def _on_local_unloaded(self) -> None:
        self.local_info = None
        if self.backend is None:
            self.set_model(None)

    # ---- servers
    def use_remote(self, remote) -> None:
        """Replies come from ``remote`` (a connected, probed core.remote.client.RemoteModel) from now on."""
        self.switching.emit()
        self.backend = remote
        self.backendChanged.emit(remote)
        caps = remote.caps
        name = remote.model or (remote.card or {}).get("id") or "model"
        info = {"name": name, "format": "server", "server": public_url(remote.url),
                "context_length": remote_context_length(remote)}
        if caps is not None:
            missing = [f for f in caps.FIELDS if not getattr(caps, f)]
            info["server_lacks"] = ", ".join(missing) if missing else "nothing"
        self.set_model(info)
        self.message.emit(f"Replies now come from {name} on {info['server']}", 4000)

    def use_local(self) -> None:
        """Replies come from the model loaded here (if any) again."""
        if self.backend is None:
            return
        self.switching.emit()
        self._leave_server()
        self.set_model(self.local_info)

    def forget_server(self, url: str) -> None:
        """The server at ``url`` was forgotten: if replies came from it, they no longer do."""
        if self.backend is not None and self.backend.url == url:
            self.use_local()

    def _leave_server(self) -> None:
        self.backend = None
        self.backendChanged.emit(None)

    def pending(self) -> list[asyncio.Task]:
        """Loads and unloads still running (the app waits for them when it closes)."""
        return [t for t in self._tasks if not t.done()]

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
