"""Servers for Model → Connect to Server…: the ones remembered, and listing and connecting
to a server's models off the UI thread (:class:`ServerController`, no widgets).

Servers are remembered per URL in the app's settings (:class:`SavedServers`): the URL and
the model chosen in one entry, the API key in a separate settings key. Keys are never
written to the history database or into exported chats (replies record only the URL).
Every network call runs on a thread of its own (:func:`off_thread`): the window never waits
on a server.
"""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Callable

from PySide6.QtCore import QObject, QSettings, Signal
from shiboken6 import isValid

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


class ServerController(QObject):
    """Lists a server's models and connects to one, off the UI thread, one call at a time.

    Args:
        saved: the remembered servers (a model connected to is saved there, with its key).
        remote_factory: builds the client, ``factory(url, api_key=, model=)`` (default:
            :class:`core.remote.client.RemoteModel`).

    Signals:
        busyChanged(bool): a call to the server started or ended.
        statusChanged(str, bool): what is happening or went wrong, and whether it is an error.
        modelsChanged(list, str): the server's models as [(id, tooltip)] (empty while asking),
            and the id to select (the one saved for this server, else the first).
        connected(object): the chosen model, a connected and probed RemoteModel (now saved).
        forgotten(str): the saved server with this URL was forgotten.
    """

    busyChanged = Signal(bool)
    statusChanged = Signal(str, bool)
    modelsChanged = Signal(list, str)
    connected = Signal(object)
    forgotten = Signal(str)

    def __init__(self, saved: SavedServers, *, remote_factory: Callable = RemoteModel, parent: QObject | None = None):
        super().__init__(parent)
        self.saved = saved
        self.remote_factory = remote_factory
        self.task: asyncio.Task | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()

    def _run(self, coro) -> asyncio.Task:
        self.task = asyncio.ensure_future(coro)
        self.task.add_done_callback(self._done)
        self.busyChanged.emit(True)
        return self.task

    def _done(self, _task) -> None:
        if isValid(self):  # the dialog (and this, its child) may be gone by now
            self.busyChanged.emit(False)

    def cancel(self) -> None:
        """Drop the call under way (its thread finishes on its own; its answer is dropped)."""
        if self.busy:
            self.task.cancel()

    def _say(self, text: str, error: bool = False) -> None:
        self.statusChanged.emit(text, error)

    # -- listing -----------------------------------------------------------------------------
    def list_models(self, url: str, key: str) -> asyncio.Task | None:
        """Ask the server at ``url`` for its models (GET /v1/models)."""
        try:
            remote = self.remote_factory(url.strip(), api_key=key.strip() or None, model=None)
        except RemoteError as e:
            self._say(str(e), error=True)
            return None
        return self._run(self._list(remote, url))

    async def _list(self, remote, url: str) -> None:
        self.modelsChanged.emit([], "")
        self._say(f"Asking {public_url(remote.url)} for its models…")
        try:
            models = await off_thread(remote.models)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — every failure is shown, the dialog stays usable
            self._say(error_text(e), error=True)
            return
        if not models:
            self._say(f"{public_url(remote.url)} serves no models.", error=True)
            return
        rows = [model_row(m) for m in models]
        want = self.saved.model(url)
        pick = want if want in [mid for mid, _ in rows] else rows[0][0]
        self.modelsChanged.emit(rows, pick)
        n = len(models)
        self._say(f"{n} model{'s' if n != 1 else ''} on {public_url(remote.url)}: pick one and press Use Model.")

    # -- connecting --------------------------------------------------------------------------
    def use_model(self, url: str, key: str, model: str) -> asyncio.Task | None:
        """Connect to ``model`` and probe what the server supports; then ``connected``."""
        if self.busy:
            return None
        return self._run(self._use(self.remote_factory(url.strip(), api_key=key.strip() or None, model=model)))

    async def _use(self, remote) -> None:
        self._say(f"Connecting to {remote.model} and checking what the server supports…")
        try:
            await off_thread(remote.connect)
            caps = await off_thread(remote.probe)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            self._say(error_text(e), error=True)
            return
        if not caps.streaming:
            self._say(f"{public_url(remote.url)} cannot stream replies: "
                      f"{caps.why.get('streaming', 'no streamed reply came back')}", error=True)
            return
        self.saved.save(remote.url, remote.model, remote.api_key)
        self.connected.emit(remote)

    def forget(self, url: str) -> None:
        """Remove the server at ``url`` (and its key) from the saved servers."""
        url = url.strip()
        self.saved.forget(url)
        self._say(f"Forgot {public_url(url)} and its API key.")
        self.forgotten.emit(normal_url(url))


def model_row(m: dict) -> tuple[str, str]:
    """(id, tooltip) for one entry of a server's /v1/models."""
    mid = str(m.get("id", "?"))
    extra = [f"context {m['max_model_len']}"] if isinstance(m.get("max_model_len"), int) else []
    if m.get("owned_by"):
        extra.append(f"by {m['owned_by']}")
    return mid, " · ".join([mid, *extra])
