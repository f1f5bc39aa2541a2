"""Model → Library…: the models on this machine, the Hugging Face Hub and the downloads, in one window.

:class:`LibraryService` (one per main window, as long-lived as the app) owns the folder
settings, the hub client and the download manager; the window's three tabs are views over
it. Disk scans and hub calls run on a small thread pool and are awaited on the qasync loop;
the download manager's events arrive on its own thread and are queued to the UI thread by
a Qt signal, as ``gui/bridge.py`` does with the worker's. The UI thread never waits on the
network or on a scan.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import json
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PySide6.QtCore import (QAbstractTableModel, QModelIndex, QObject, QSettings, QSortFilterProxyModel, Qt,
                            QUrl, Signal)
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QMenu, QMessageBox, QPushButton, QSizePolicy, QStyle, QTableView, QTabWidget,
                               QToolButton, QVBoxLayout, QWidget)


ENDPOINT_KEY = "hub/endpoint"
STATE_FILE = "downloads.json"

ENTRY_ROLE = Qt.UserRole + 1   # the row's LibraryEntry
SORT_ROLE = Qt.UserRole + 2    # a value that sorts (numbers as numbers, unknowns first)


def relative_time(when, now: float | None = None) -> str:
    """'never', 'just now', '5 min ago', '3 h ago', 'yesterday', else the date."""
    if when in (None, 0, ""):
        return "never"
    t = when.timestamp() if isinstance(when, _dt.datetime) else float(when)
    age = (time.time() if now is None else now) - t
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return f"{int(age // 3600)} h ago"
    if age < 2 * 86400:
        return "yesterday"
    return _dt.datetime.fromtimestamp(t).strftime("%d %b %Y")


def _stamp(when) -> float:
    if when in (None, ""):
        return -1.0
    return when.timestamp() if isinstance(when, _dt.datetime) else float(when)


# ---------------------------------------------------------------------------- service
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
        if data_dir is None:
            from core.library.library import state_path
            data_dir = state_path().parent
        self.data_dir = Path(data_dir)
        self._hub_factory = hub_factory
        self._manager_factory = manager_factory
        self._scan_fn = scan
        from core.library.library import LibraryState
        self.state = LibraryState(self.data_dir / "library.json")
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
        scan = self._scan_fn
        if scan is None:
            from core.library.library import scan
        self._set_scanning(True)
        try:
            entries = await self.call(scan, self.folders(), cancel=cancel, state=self.state)
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
        from core.library.library import record_used
        self._pool.submit(record_used, path, state=self.state)

    async def delete(self, entry) -> None:
        """Delete a model from disk (raises what core.library.library.delete raises); then rescan."""
        from core.library.library import delete
        await self.call(delete, entry, state=self.state)
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
            factory = self._hub_factory
            if factory is None:
                from core.library.hub import HubClient as factory
            self._hub = factory(endpoint=self.endpoint(), token=self.token)
        return self._hub

    def has_token(self) -> bool:
        """Whether hub requests carry a token (typed here, HF_TOKEN or huggingface_hub's login)."""
        if self.token:
            return True
        try:
            from huggingface_hub import get_token
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
            factory = self._manager_factory
            if factory is None:
                from core.library.downloads import DownloadManager as factory
            me = weakref.ref(self)

            def forward(event) -> None:  # the manager's thread: queue it to the UI thread
                service = me()
                if service is not None and not service._closed:
                    service._event.emit(event)

            folder = self.models_folder()
            folder.mkdir(parents=True, exist_ok=True)
            self._manager = factory(folder, self.state_path, hub=self.hub(), on_event=forward, library_state=self.state)
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
        if not any(isinstance(j, dict) and j.get("state") in ("queued", "running", "paused", "failed") for j in jobs):
            return False
        self.manager()
        return True

    def _on_event(self, event) -> None:
        if self._closed:
            return
        self.downloadEvent.emit(event)
        from core.library.downloads import DownloadFinished
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


# ---------------------------------------------------------------------------- table model
COLUMNS = (("Name", "name"), ("Family", "family"), ("Parameters", "params"), ("Format", "format"),
           ("Quantization", "quant"), ("Context", "context_length"), ("Size", "size_bytes"),
           ("Last used", "last_used"))


class LibraryTableModel(QAbstractTableModel):
    """The scanned models, one row each (ENTRY_ROLE: the LibraryEntry; SORT_ROLE: sortable value)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.entries: list = []

    def set_entries(self, entries: list) -> None:
        self.beginResetModel()
        self.entries = list(entries)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.entries)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return COLUMNS[section][0]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        e = self.entries[index.row()]
        key = COLUMNS[index.column()][1]
        value = getattr(e, key, None)
        if role == Qt.DisplayRole:
            return self.text(key, value)
        if role == SORT_ROLE:
            if key == "last_used":
                return _stamp(value)
            if key in ("params", "context_length", "size_bytes"):
                return float(value) if value is not None else -1.0
            return str(value or "").lower()
        if role == ENTRY_ROLE:
            return e
        if role == Qt.ToolTipRole:
            err = getattr(e, "error", None)
            return f"{e.path}\n\nCannot be opened: {err}" if err else str(e.path)
        if role == Qt.ForegroundRole and getattr(e, "error", None):
            from PySide6.QtGui import QPalette
            from PySide6.QtWidgets import QApplication
            return QApplication.palette().color(QPalette.Disabled, QPalette.Text)
        if role == Qt.DecorationRole and key == "name" and getattr(e, "error", None):
            from PySide6.QtWidgets import QApplication
            return QApplication.style().standardIcon(QStyle.SP_MessageBoxWarning)
        if role == Qt.TextAlignmentRole and key in ("params", "context_length", "size_bytes"):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        return None

    @staticmethod
    def text(key: str, value) -> str:
        if key == "last_used":
            return relative_time(value)
        if value is None or value == "":
            return "—"
        from core.library.library import human_params, human_size
        if key == "params":
            return human_params(value)
        if key == "size_bytes":
            return human_size(value)
        if key == "context_length":
            return f"{int(value):,}"
        return str(value)


class LibraryFilter(QSortFilterProxyModel):
    """Shows rows where every word of the search box appears in some column (any case)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.words: list[str] = []
        self.setSortRole(SORT_ROLE)

    def set_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt 6.10+; invalidateFilter is deprecated there
            self.beginFilterChange()
            self.words = text.lower().split()
            self.endFilterChange()
        else:
            self.words = text.lower().split()
            self.invalidateFilter()

    def filterAcceptsRow(self, row, parent) -> bool:  # noqa: N802
        if not self.words:
            return True
        m = self.sourceModel()
        hay = " ".join(str(m.index(row, c, parent).data()) for c in range(m.columnCount())).lower()
        hay += " " + str(m.entries[row].path).lower()
        return all(w in hay for w in self.words)


# ---------------------------------------------------------------------------- library tab
class LibraryView(QWidget):
    """The Library tab: search, the models table, Open / Show in Folder / Delete, the folders.

    Signals:
        openRequested(str): the user chose to open this model path.
        hubRequested(): the empty library's link to the Hub tab.
    """

    openRequested = Signal(str)
    hubRequested = Signal()

    def __init__(self, service: LibraryService, parent=None):
        super().__init__(parent)
        self.service = service
        self.note = ""  # the last action's outcome, shown before the count
        self.setObjectName("libraryView")
        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setObjectName("librarySearch")
        self.search.setAccessibleName("Search models")
        self.search.setPlaceholderText("Search models (name, family, quantization…)")
        self.search.setClearButtonEnabled(True)
        top.addWidget(self.search, 1)
        self.folders_button = QToolButton()
        self.folders_button.setObjectName("libraryFolders")
        self.folders_button.setText("Folders")
        self.folders_button.setPopupMode(QToolButton.InstantPopup)
        self.folders_menu = QMenu(self)
        self.folders_menu.aboutToShow.connect(self._fill_folders)
        self.folders_button.setMenu(self.folders_menu)
        top.addWidget(self.folders_button)
        self.refresh_button = QPushButton("Rescan")
        self.refresh_button.setObjectName("libraryRescan")
        self.refresh_button.clicked.connect(lambda: service.rescan())
        top.addWidget(self.refresh_button)
        lay.addLayout(top)

        self.model = LibraryTableModel(self)
        self.proxy = LibraryFilter(self)
        self.proxy.setSourceModel(self.model)
        self.search.textChanged.connect(self.proxy.set_text)
        self.table = QTableView()
        self.table.setObjectName("libraryTable")
        self.table.setAccessibleName("Models")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(7, Qt.DescendingOrder)  # last used first
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.doubleClicked.connect(lambda _i: self.open_selected())
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        lay.addWidget(self.table, 1)
        self.empty = QLabel()
        self.empty.setObjectName("libraryEmpty")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.linkActivated.connect(lambda _l: self.hubRequested.emit())
        lay.addWidget(self.empty)
        self.empty.hide()

        bottom = QHBoxLayout()
        self.status = QLabel()
        self.status.setObjectName("libraryStatus")
        self.status.setWordWrap(True)
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # a long path never widens the window
        bottom.addWidget(self.status, 1)
        self.open_button = QPushButton("Open")
        self.open_button.setObjectName("libraryOpen")
        self.open_button.setDefault(True)
        self.open_button.clicked.connect(self.open_selected)
        self.show_button = QPushButton("Show in Folder")
        self.show_button.setObjectName("libraryShow")
        self.show_button.clicked.connect(self.show_selected)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.setObjectName("libraryDelete")
        self.delete_button.clicked.connect(self.delete_selected)
        for b in (self.open_button, self.show_button, self.delete_button):
            bottom.addWidget(b)
        lay.addLayout(bottom)

        service.entriesChanged.connect(self.set_entries)
        service.scanningChanged.connect(lambda _on: self._update_status())
        service.scanFailed.connect(self.status.setText)
        self.set_entries(service.entries)

    # -- content ---------------------------------------------------------------------
    def set_entries(self, entries: list) -> None:
        selected = self.selected()
        self.model.set_entries(entries)
        if selected is not None:
            self.select_path(selected.path)
        self._update_status()
        self._update_buttons()

    def _update_status(self) -> None:
        n = len(self.model.entries)
        folder = self.service.models_folder()
        if self.service.scanning:
            text = f"Scanning {len(self.service.folders())} folder(s)…"
        else:
            text = self.note + f"{n} model{'s' if n != 1 else ''} in {folder}" + (
                f" and {len(self.service.extra_folders())} more folder(s)" if self.service.extra_folders() else "")
        self.status.setText(text)
        none = n == 0 and not self.service.scanning
        self.empty.setText(f"No models yet. Find one on the <a href='hub'>Hub</a>, or put .gguf files or "
                           f"model folders in {folder}.")
        self.empty.setVisible(none)

    def _update_buttons(self) -> None:
        e = self.selected()
        self.open_button.setEnabled(e is not None and not getattr(e, "error", None))
        self.show_button.setEnabled(e is not None)
        self.delete_button.setEnabled(e is not None)

    def selected(self):
        rows = self.table.selectionModel().selectedRows()
        return rows[0].data(ENTRY_ROLE) if rows else None

    def select_path(self, path) -> bool:
        for r in range(self.proxy.rowCount()):
            i = self.proxy.index(r, 0)
            if str(i.data(ENTRY_ROLE).path) == str(path):
                self.table.selectRow(r)
                return True
        return False

    # -- actions ---------------------------------------------------------------------
    def open_selected(self) -> None:
        e = self.selected()
        if e is None or getattr(e, "error", None):
            return
        self.service.record_used(e.path)
        self.openRequested.emit(str(e.path))

    def show_selected(self) -> None:
        e = self.selected()
        if e is not None:
            p = Path(e.path)
            self.open_url(QUrl.fromLocalFile(str(p if p.is_dir() else p.parent)))

    def open_url(self, url: QUrl) -> None:
        """Show a folder in the system's file manager; tests replace this method."""
        QDesktopServices.openUrl(url)

    def confirm(self, title: str, text: str) -> bool:
        """Ask yes/no (a modal box); tests replace this method."""
        return QMessageBox.question(self, title, text) == QMessageBox.Yes

    def ask_folder(self, title: str) -> str | None:
        """A folder from the user; tests replace this method."""
        path = QFileDialog.getExistingDirectory(self, title, str(self.service.models_folder()))
        return path or None

    def delete_selected(self) -> asyncio.Task | None:
        e = self.selected()
        if e is None:
            return None
        size = LibraryTableModel.text("size_bytes", getattr(e, "size_bytes", None))
        if not self.confirm("Delete model", f"Delete “{e.name}” ({size}) from disk?\n\n{e.path}\n\n"
                            "This cannot be undone."):
            return None
        return asyncio.ensure_future(self._delete(e))

    async def _delete(self, entry) -> None:
        try:
            await self.service.delete(entry)
        except Exception as err:  # e.g. permission denied: the row stays, the reason shows
            self.note = f"Could not delete {entry.name}: {err} · "
        else:
            self.note = f"Deleted {entry.name} · "
        self._update_status()

    def _fill_folders(self) -> None:
        m = self.folders_menu
        m.clear()
        m.addAction(f"Models folder: {self.service.models_folder()}").setEnabled(False)
        m.addAction("Change Models Folder…", self._change_folder)
        m.addAction("Add a Folder to Scan…", self._add_folder)
        extra = self.service.extra_folders()
        if extra:
            m.addSeparator()
            for p in extra:
                m.addAction(f"Stop Scanning {p}", lambda p=p: self.service.remove_folder(p))

    def _change_folder(self) -> None:
        path = self.ask_folder("Models folder (downloads go here)")
        if path:
            self.service.set_models_folder(path)

    def _add_folder(self) -> None:
        path = self.ask_folder("Add a folder to scan for models")
        if path:
            self.service.add_folder(path)


# ---------------------------------------------------------------------------- window
class LibraryWindow(QWidget):
    """Model → Library… (objectName ``libraryWindow``): tabs Library, Hub and Downloads.

    Signals:
        openRequested(str): a model path to load in the main window.
    """

    openRequested = Signal(str)

    def __init__(self, service: LibraryService, parent=None):
        super().__init__(parent, Qt.Window)
        from gui.library.downloads_view import DownloadsView
        from gui.library.hub_browser import HubBrowser
        self.service = service
        self.setObjectName("libraryWindow")
        self.setAccessibleName("Model library")
        self.setWindowTitle("Model Library — LlamaDesk")
        lay = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("libraryTabs")
        self.library = LibraryView(service)
        self.hub = HubBrowser(service)
        self.downloads = DownloadsView(service)
        self.tabs.addTab(self.library, "Library")
        self.tabs.addTab(self.hub, "Hub")
        self.tabs.addTab(self.downloads, "Downloads")
        lay.addWidget(self.tabs)
        self.library.openRequested.connect(self.openRequested)
        self.downloads.openRequested.connect(self.openRequested)
        self.library.hubRequested.connect(lambda: self.show_tab("hub"))
        self.hub.downloadStarted.connect(lambda *_: self.show_tab("downloads"))
        self.resize(980, 620)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.hub.close_down()
        super().closeEvent(event)

    def show_tab(self, name: str) -> None:
        self.tabs.setCurrentWidget({"library": self.library, "hub": self.hub, "downloads": self.downloads}[name])


class LibraryRoom(QObject):
    """The main window's library: its service (as long-lived as the window) and the library
    window, built on the first :meth:`show`. The main window owns one and calls it; nothing
    here touches the main window.

    Signals:
        openRequested(str): a model path chosen in the library window, to load.
    """

    openRequested = Signal(str)

    def __init__(self, parent_window: QWidget, *, settings: QSettings):
        super().__init__(parent_window)
        self.parent_window = parent_window
        self.service = LibraryService(settings=settings, parent=self)
        self.window: LibraryWindow | None = None

    def resume_downloads(self) -> str | None:
        """Go on with downloads a previous run left; the reason in words when they could not."""
        try:
            self.service.resume_pending()
        except Exception as e:  # a damaged state file must not stop the app from starting
            return f"Downloads could not be resumed: {e}"
        return None

    def show(self, tab: str = "library") -> LibraryWindow:
        """Open (or raise) the library window on ``tab``; the first open scans."""
        if self.window is None:
            self.window = LibraryWindow(self.service, parent=self.parent_window)
            self.window.openRequested.connect(self.openRequested)
            self.service.rescan()
        self.window.show_tab(tab)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window

    def close(self) -> None:
        """Close the library window and stop the service's scans and downloads (app closing)."""
        if self.window is not None:
            self.window.close()
        self.service.shutdown()
