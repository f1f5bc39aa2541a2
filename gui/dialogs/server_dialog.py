"""Model → Connect to Server…: pick a model on an OpenAI-compatible server.

The dialog asks for a base URL and an optional API key, lists the server's models (its
``/v1/models``) and, once one is chosen, probes what the server supports
(:meth:`core.remote.client.RemoteModel.probe`) and hands the connected model over through
``connected``. Every network call runs on a thread of its own (:func:`off_thread`): the
window never waits on a server.

Servers are remembered per URL in the app's settings (:class:`SavedServers`): the URL and
the model chosen in one entry, the API key in a separate settings key. Keys are never
written to the history database or into exported chats (replies record only the URL).
"""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Callable

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout)

from core.remote.client import RemoteError, RemoteModel, base_url
from core.remote.runner import describe_error, public_url

SERVERS_KEY = "servers/saved"  # JSON list of {"url", "model"}: what the menu and the dialog offer
KEYS_KEY = "servers/keys"      # JSON {url: api_key}, apart from the list (and never in a chat)


async def off_thread(fn: Callable, *args):
    """Run blocking ``fn(*args)`` on a new daemon thread; await its result (or exception)
    without blocking the event loop."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(ok: bool, value) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 — handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, False, e)
        else:
            loop.call_soon_threadsafe(settle, True, result)
    threading.Thread(target=work, name="llamadesk-net", daemon=True).start()
    return await fut


def error_text(e: BaseException) -> str:
    """What to tell the user about a failed server call."""
    if isinstance(e, RemoteError):
        return describe_error(e.kind, str(e))
    return f"{type(e).__name__}: {e}"


def normal_url(url: str) -> str:
    """The form a server is saved under (``.../v1``); text that is no URL stays as it is."""
    try:
        return base_url(url)
    except RemoteError:
        return url.strip()


class SavedServers:
    """Servers remembered in QSettings, newest first; the key is kept apart from the list.
    URLs are compared in :func:`normal_url` form."""

    def __init__(self, settings: QSettings):
        self.settings = settings

    def _load(self, key: str, default):
        try:
            value = json.loads(str(self.settings.value(key, "") or "null"))
        except ValueError:
            return default
        return value if isinstance(value, type(default)) else default

    def servers(self) -> list[dict]:
        return [s for s in self._load(SERVERS_KEY, []) if isinstance(s, dict) and isinstance(s.get("url"), str)]

    def key(self, url: str) -> str:
        return str(self._load(KEYS_KEY, {}).get(normal_url(url)) or "")

    def model(self, url: str) -> str | None:
        return next((s.get("model") for s in self.servers() if s["url"] == normal_url(url)), None)

    def has(self, url: str) -> bool:
        return any(s["url"] == normal_url(url) for s in self.servers())

    def save(self, url: str, model: str | None, api_key: str | None) -> None:
        url = normal_url(url)
        servers = [s for s in self.servers() if s["url"] != url]
        self.settings.setValue(SERVERS_KEY, json.dumps([{"url": url, "model": model}, *servers]))
        keys = self._load(KEYS_KEY, {})
        if api_key:
            keys[url] = api_key
        else:
            keys.pop(url, None)
        self.settings.setValue(KEYS_KEY, json.dumps(keys))
        self.settings.sync()

    def forget(self, url: str) -> None:
        url = normal_url(url)
        self.settings.setValue(SERVERS_KEY, json.dumps([s for s in self.servers() if s["url"] != url]))
        keys = self._load(KEYS_KEY, {})
        keys.pop(url, None)
        self.settings.setValue(KEYS_KEY, json.dumps(keys))
        self.settings.sync()


class ServerDialog(QDialog):
    """Connect to a server (objectName ``serverDialog``); open it with ``open()``.

    Signals:
        connected(object): the chosen model, a connected and probed
            :class:`core.remote.client.RemoteModel`; the dialog closes.
        forgotten(str): the user forgot the saved server with this URL.

    Widgets (objectNames): ``serverUrl`` (editable, the saved servers in its list),
    ``serverKey``, ``serverListButton`` (List Models), ``serverModels``,
    ``serverForgetButton``, ``serverStatus``, and the OK button (Use Model).
    """

    connected = Signal(object)
    forgotten = Signal(str)

    def __init__(self, *, saved: SavedServers, url: str = "", parent=None):
        super().__init__(parent)
        self.setObjectName("serverDialog")
        self.setAccessibleName("Connect to Server")
        self.setWindowTitle("Connect to Server")
        self.saved = saved
        self._task: asyncio.Task | None = None
        self._listed: str | None = None  # the URL whose models are listed
        lay = QVBoxLayout(self)
        intro = QLabel("Chat with a model on an OpenAI-compatible server: <code>python -m core serve</code>, "
                       "vLLM, llama.cpp's server, Ollama or LM Studio.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        form = QFormLayout()
        self.url = QComboBox()
        self.url.setObjectName("serverUrl")
        self.url.setAccessibleName("Server URL")
        self.url.setEditable(True)
        self.url.setInsertPolicy(QComboBox.NoInsert)
        self.url.lineEdit().setPlaceholderText("http://127.0.0.1:8000")
        self.url.setToolTip("The server's address, e.g. http://127.0.0.1:8000 or https://host/v1")
        for s in saved.servers():
            self.url.addItem(s["url"], s.get("model"))
        self.url.setCurrentText(url or (self.url.itemText(0) if self.url.count() else ""))
        self.url.currentTextChanged.connect(self._url_changed)
        self.key = QLineEdit()
        self.key.setObjectName("serverKey")
        self.key.setAccessibleName("API key")
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText("none")
        self.key.setToolTip("Sent as 'Authorization: Bearer KEY'. Kept in the app's settings for this "
                            "server only, never in chats or exports.")
        self.key.setText(saved.key(self.url.currentText().strip()))
        form.addRow("Server &URL", self.url)
        form.addRow("API &key", self.key)
        lay.addLayout(form)
        row = QHBoxLayout()
        self.list_button = QPushButton("&List Models")
        self.list_button.setObjectName("serverListButton")
        self.list_button.setToolTip("Ask the server for its models (GET /v1/models)")
        self.list_button.clicked.connect(self.list_models)
        self.forget_button = QPushButton("&Forget Server")
        self.forget_button.setObjectName("serverForgetButton")
        self.forget_button.setToolTip("Remove this server and its API key from the saved servers")
        self.forget_button.clicked.connect(self.forget)
        row.addWidget(self.list_button)
        row.addStretch(1)
        row.addWidget(self.forget_button)
        lay.addLayout(row)
        self.models = QListWidget()
        self.models.setObjectName("serverModels")
        self.models.setAccessibleName("Models on the server")
        self.models.itemDoubleClicked.connect(lambda *_: self.use_model())
        self.models.currentItemChanged.connect(lambda *_: self._update_buttons())
        lay.addWidget(self.models, 1)
        self.status = QLabel("")
        self.status.setObjectName("serverStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.status)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.ok = self.buttons.button(QDialogButtonBox.Ok)
        self.ok.setText("&Use Model")
        self.ok.setObjectName("serverUseButton")
        self.buttons.accepted.connect(self.use_model)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.rejected.connect(self._cancel_task)
        self.resize(520, 420)
        self._update_buttons()

    # -- state -------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def _update_buttons(self) -> None:
        url = self.url.currentText().strip()
        self.list_button.setEnabled(bool(url) and not self.busy)
        self.forget_button.setEnabled(self.saved.has(url) and not self.busy)
        self.ok.setEnabled(self.models.currentItem() is not None and not self.busy)
        self.url.setEnabled(not self.busy)
        self.key.setEnabled(not self.busy)

    def _url_changed(self, text: str) -> None:
        self.key.setText(self.saved.key(text.strip()))
        self.models.clear()
        self._listed = None
        self.status.setText("")
        self._update_buttons()

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setProperty("error", error)
        self.status.setStyleSheet("color: #c0392b;" if error else "")

    def _remote(self, model: str | None = None) -> RemoteModel:
        return RemoteModel(self.url.currentText().strip(), api_key=self.key.text().strip() or None, model=model)

    def _run(self, coro) -> asyncio.Task:
        self._task = asyncio.ensure_future(coro)
        self._task.add_done_callback(lambda *_: self._update_buttons())
        self._update_buttons()
        return self._task

    def _cancel_task(self) -> None:
        if self.busy:
            self._task.cancel()  # the thread finishes on its own; its answer is dropped

    # -- actions ------------------------------------------------------------------------------

    def list_models(self) -> asyncio.Task | None:
        """Ask the server for its models (off the UI thread); fills ``serverModels``."""
        try:
            remote = self._remote()
        except RemoteError as e:
            self._set_status(str(e), error=True)
            return None
        return self._run(self._list(remote))

    async def _list(self, remote: RemoteModel) -> None:
        self.models.clear()
        self._set_status(f"Asking {public_url(remote.url)} for its models…")
        try:
            models = await off_thread(remote.models)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — every failure is shown, the dialog stays usable
            self._set_status(error_text(e), error=True)
            return
        if not models:
            self._set_status(f"{public_url(remote.url)} serves no models.", error=True)
            return
        want = self.saved.model(self.url.currentText())
        for m in models:
            mid = str(m.get("id", "?"))
            item = QListWidgetItem(mid)
            item.setData(Qt.UserRole, mid)
            extra = [f"context {m['max_model_len']}"] if isinstance(m.get("max_model_len"), int) else []
            if m.get("owned_by"):
                extra.append(f"by {m['owned_by']}")
            item.setToolTip(" · ".join([mid, *extra]))
            self.models.addItem(item)
            if mid == want or self.models.currentItem() is None:
                self.models.setCurrentItem(item)
        self._listed = remote.url
        n = len(models)
        self._set_status(f"{n} model{'s' if n != 1 else ''} on {public_url(remote.url)}: pick one and press Use Model.")

    def use_model(self) -> asyncio.Task | None:
        """Connect to the chosen model and probe the server (off the UI thread); then
        ``connected`` and the dialog closes. Until then the dialog says what it is doing."""
        item = self.models.currentItem()
        if item is None or self.busy:
            return None
        return self._run(self._use(self._remote(item.data(Qt.UserRole))))

    async def _use(self, remote: RemoteModel) -> None:
        self._set_status(f"Connecting to {remote.model} and checking what the server supports…")
        try:
            await off_thread(remote.connect)
            caps = await off_thread(remote.probe)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            self._set_status(error_text(e), error=True)
            return
        if not caps.streaming:
            self._set_status(f"{public_url(remote.url)} cannot stream replies: "
                             f"{caps.why.get('streaming', 'no streamed reply came back')}", error=True)
            return
        self.saved.save(remote.url, remote.model, remote.api_key)
        self.connected.emit(remote)
        self.accept()

    def forget(self) -> None:
        """Remove the server in the URL box (and its key) from the saved servers."""
        url = self.url.currentText().strip()
        self.saved.forget(url)
        for i in reversed(range(self.url.count())):
            if normal_url(self.url.itemText(i)) == normal_url(url):
                self.url.removeItem(i)
        self.url.setCurrentText("")
        self.key.clear()
        self._set_status(f"Forgot {public_url(url)} and its API key.")
        self.forgotten.emit(normal_url(url))
        self._update_buttons()
