"""The library's state for the whole app: model folders, the hub client, downloads, the last scan.

:class:`LibraryService` (one per main window, as long-lived as the app) owns the folder
settings, the hub client and the download manager; the library window's three tabs are
views over it. Disk scans and hub calls run on a small thread pool and are awaited on the
qasync loop; the download manager's events arrive on its own thread and are queued to the
UI thread by a Qt signal, as ``gui/bridge.py`` does with the worker's. The UI thread never
waits on the network or on a scan.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Qt, Signal

from core import paths
from core.library import library
from core.library.downloads import DownloadFinished, DownloadManager
from core.library.hub import HubClient

ENDPOINT_KEY = "hub/endpoint"
STATE_FILE = "downloads.json"
PENDING = ("queued", "running", "paused", "failed")  # job states a start picks up again


class LibraryService(QObject):
    """The library's state for the whole app: folders, hub client, downloads, last scan.

    Signals:
        entriesChanged(list): a scan finished (its LibraryEntry list).
        scanningChanged(bool): a scan started or ended.
        scanFailed(str): a scan could not run (the message).
        downloadEvent(object): a DownloadProgress / DownloadFinished / DownloadFailed, on the UI thread.
        tokenChanged(): the hub token entered this session changed.
        jobQueued(str, str, list): a download was queued: job id, repository, [(file, size)].

    Args:
        settings: where the hub endpoint is kept.
        data_dir: the app's data folder (default: where ``core.library.library`` keeps its state): the library's
            state (folders, last use) and the download manager's state live there.
        hub_factory / manager_factory / scan: replace core's HubClient, DownloadManager and
            library.scan (None: core's own).
    """

    entriesChanged = Signal(list)
    scanningChanged = Signal(bool)
    scanFailed = Signal(str)
    downloadEvent = Signal(object)
    tokenChanged = Signal()
    jobQueued = Signal(str, str, list)
    _event = Signal(object)

    def __init__(self, *, settings: QSettings, data_dir: Path | None = None, hub_factory=None,
                 manager_factory=None, scan=None, parent: QObject | None = None):
        super().__init__(parent)
        self.settings = settings
        self.data_dir = Path(paths.data_dir() if data_dir is None else data_dir)
        self._hub_factory = hub_factory or HubClient
        self._manager_factory = manager_factory or DownloadManager
        self._scan_fn = scan or library.scan
        self.state = library.LibraryState(self.data_dir / "library.json")
        self._pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="library")
        self.entries: list = []
        self.scanning = False
        self.token: str | None = None  # typed into the hub tab this session (else HF_TOKEN / stored token)
        self._hub = None
        self._manager = None
        self._scan_task: asyncio.Task | None = None
        self._scan_cancel: threading.Event | None = None
        self._closed = False
        self._event.connect(self._on_event, Qt.ConnectionType.QueuedConnection)

    # -- folders (kept in core.library.library's state file, which the CLI reads too) ----------------
    def models_folder(self) -> Path:
        """Where downloads go and the first folder scanned."""
        return self.state.models_folder()

    def set_models_folder(self, path) -> None:
        self.state.set_models_folder(path)
        if self._manager is not None:
            # downloads land in the new folder: a new manager takes the queue over there
            # (a file half done in the old folder starts again)
            self._manager.shutdown()
            self._manager = None
            self.manager()
        self.rescan()

    def extra_folders(self) -> list[Path]:
        return self.state.extra_folders()

    def add_folder(self, path) -> None:
        if Path(path) not in self.state.folders():
            self.state.set_extra_folders([*self.extra_folders(), Path(path)])
        self.rescan()

    def remove_folder(self, path) -> None:
        self.state.set_extra_folders([p for p in self.extra_folders() if p != Path(path)])
        self.rescan()

    def folders(self) -> list[Path]:
        return self.state.folders()

    # -- background work ---------------------------------------------------------------
    async def call(self, fn, *args, **kw):
        """Run ``fn`` on the library's threads and await its result here."""
        return await asyncio.wrap_future(self._pool.submit(fn, *args, **kw))

    def rescan(self) -> asyncio.Task | None:
        """Scan the folders again (a scan still running is cancelled); returns the task."""
        if self._closed:
            return None
        if self._scan_cancel is not None:
            self._scan_cancel.set()
        self._scan_cancel = cancel = threading.Event()
        self._scan_task = asyncio.ensure_future(self._scan(cancel))
        return self._scan_task

    async def _scan(self, cancel: threading.Event) -> None:
        self._set_scanning(True)
        try:
            entries = await self.call(self._scan_fn, self.folders(), cancel=cancel, state=self.state)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an unreadable folder must not end the app: say it
            if not cancel.is_set():
                self.scanFailed.emit(f"Could not scan the model folders: {e}")
            return
        finally:
            if cancel is self._scan_cancel:
                self._set_scanning(False)
        if cancel.is_set() or self._closed:
            return
        self.entries = list(entries)
        self.entriesChanged.emit(self.entries)

    def _set_scanning(self, on: bool) -> None:
        self.scanning = on
        self.scanningChanged.emit(on)

    def record_used(self, path) -> None:
        """Remember that ``path`` was opened now (on the library's threads); a listed model's
        "Last used" changes at once, without a rescan."""
        if self._closed or not path:
            return
        when = time.time()
        self._pool.submit(library.record_used, path, state=self.state, when=when)
        key = library.path_key(path)
        hit = [e for e in self.entries if library.path_key(e.path) == key]
        for e in hit:
            e.last_used = when
        if hit:
            self.entriesChanged.emit(self.entries)

    async def delete(self, entry) -> None:
        """Delete a model from disk (raises what core.library.library.delete raises); then rescan."""
        await self.call(library.delete, entry, state=self.state)
        self.entries = [e for e in self.entries if e.path != entry.path]
        self.entriesChanged.emit(self.entries)
        self.rescan()

    # -- hub -------------------------------------------------------------------------
    def endpoint(self) -> str | None:
        """The hub's address from settings (None: HF_ENDPOINT or huggingface.co)."""
        v = self.settings.value(ENDPOINT_KEY, "")
        return str(v) if v else None

    def hub(self):
        """The hub client (built on first use, and again after the token or endpoint changes)."""
        if self._hub is None:
            self._hub = self._hub_factory(endpoint=self.endpoint(), token=self.token)
        return self._hub

    def has_token(self) -> bool:
        """Whether hub requests carry a token (typed here, HF_TOKEN or huggingface_hub's login)."""
        if self.token:
            return True
        try:
            from huggingface_hub import get_token  # start-up time: huggingface_hub loads when the hub is used
            return bool(get_token())
        except Exception:  # an unreadable token file: as if there were none
            return False

    def set_token(self, token: str | None) -> None:
        """Use this token for the hub from now on (this session; None: back to HF_TOKEN / stored)."""
        self.token = (token or "").strip() or None
        self._hub = None
        if self._manager is not None:
            self._manager.set_hub(self.hub())
        self.tokenChanged.emit()

    def set_endpoint(self, url: str | None) -> None:
        self.settings.setValue(ENDPOINT_KEY, url or "")
        self._hub = None
        if self._manager is not None:
            self._manager.set_hub(self.hub())

    # -- downloads ---------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def has_manager(self) -> bool:
        return self._manager is not None

    def manager(self):
        """The download manager (built on first use; it picks up the jobs of a previous run)."""
        if self._manager is None:
            me = weakref.ref(self)

            def forward(event) -> None:  # the manager's thread: queue it to the UI thread
                service = me()
                if service is not None and not service._closed:
                    service._event.emit(event)

            folder = self.models_folder()
            folder.mkdir(parents=True, exist_ok=True)
            self._manager = self._manager_factory(folder, self.state_path, hub=self.hub(), on_event=forward, library_state=self.state)
        return self._manager

    def enqueue(self, repo_id: str, files: list) -> str:
        """Queue ``files`` (HubFiles) of ``repo_id`` for download; returns the job id."""
        rows = []  # (file name, size when known): a folder's parts have their own sizes
        for f in files:
            parts = tuple(getattr(f, "files", None) or (f.path,))
            rows += [(n, f.size if len(parts) == 1 else None) for n in parts]
        job = str(self.manager().enqueue(repo_id, [n for n, _ in rows]))
        self.jobQueued.emit(job, repo_id, rows)
        return job

    def resume_pending(self) -> bool:
        """Start the download manager when a previous run left downloads to finish (so they go
        on); a queue of finished ones only costs nothing at start (no huggingface_hub import)."""
        if self._manager is not None:
            return False
        try:
            jobs = json.loads(self.state_path.read_text(encoding="utf-8")).get("jobs", [])
        except FileNotFoundError:
            return False
        except (OSError, ValueError, AttributeError):
            jobs = [{"state": "queued"}]  # unreadable: let the manager judge (it starts empty)
        if not any(isinstance(j, dict) and j.get("state") in PENDING for j in jobs):
            return False
        self.manager()
        return True

    def _on_event(self, event) -> None:
        if self._closed:
            return
        self.downloadEvent.emit(event)
        if isinstance(event, DownloadFinished):
            self.rescan()

    def shutdown(self) -> None:
        """Stop scans and downloads (their state is kept for the next start)."""
        if self._closed:
            return
        self._closed = True
        if self._scan_cancel is not None:
            self._scan_cancel.set()
        if self._manager is not None:
            self._manager.shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
