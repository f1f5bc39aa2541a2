"""The Library window's Hub tab: search the Hugging Face Hub, a repository's files, what fits here.

A search page (text, GGUF / safetensors, sort by downloads, likes or recently updated; each
repository with its license and whether it is gated) and a repository page (its loadable
files grouped by quantization, with sizes and the memory each needs against this machine's
free RAM and VRAM, the ones that fit marked and one recommended). Every hub call runs on
the library's threads (:meth:`LibraryService.call`); a 401/403 opens an inline token field
that explains, in plain words, what the Hub wants.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import os
import re

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFrame, QHBoxLayout, QHeaderView, QInputDialog, QLabel,
                               QLineEdit, QMenu, QPushButton, QSpinBox, QStackedWidget, QTableView, QToolButton,
                               QTreeView, QVBoxLayout, QWidget)

from shiboken6 import isValid

from gui import theme

FILE_ROLE = Qt.UserRole + 1   # a file row's HubFile
REPO_ROLE = Qt.UserRole + 1   # a search row's RepoSummary
SORT_ROLE = Qt.UserRole + 2

FORMATS = (("GGUF", ("gguf",)), ("safetensors", ("safetensors",)), ("GGUF or safetensors", ("gguf", "safetensors")))
SORTS = (("Most downloaded", "downloads"), ("Most liked", "likes"), ("Recently updated", "last_modified"))
DEFAULT_CONTEXT = 4096
DEFAULT_HUB = "https://huggingface.co"
UNNAMED = "Quantization not in the name"  # core.library.hub reads it from file names (Q4_K_M, Q8_0, F16…)


def _size(n) -> str:
    from core.library.library import human_size
    return human_size(n)


def _date(v) -> str:
    if v in (None, ""):
        return "—"
    if isinstance(v, _dt.datetime):
        return v.strftime("%Y-%m-%d")
    return str(v)[:10]


def access_text(gated) -> str:
    """A repository's access in words: public, or gated (and how access is granted)."""
    if not gated:
        return "Public"
    if gated == "manual":
        return "Gated (owner approves)"
    return "Gated (accept license)"


def explain(err: Exception, *, token_given: bool = False, endpoint: str | None = None) -> tuple[str, str]:
    """(kind, plain words) for a hub error (core.errors.HubError's ``kind``): 'auth' when a
    token is needed, 'forbidden' when the token given has no access, 'not_found',
    'network', or the error's own kind with its message."""
    kind = getattr(err, "kind", None) or ("network" if isinstance(err, (ConnectionError, TimeoutError)) else "hub")
    detail = str(err) or type(err).__name__
    if kind == "auth" and not token_given:
        return "auth", ("This repository is gated or private, so the Hub wants to know who is asking. Open its "
                        "page on huggingface.co, accept the license there, create an access token (your "
                        "account → Settings → Access Tokens; “Read” is enough) and paste it here.")
    if kind == "auth":
        return "forbidden", ("The Hub refused this token for this repository: it is not valid, or its account has "
                             "not been given access yet (accept the license on the repository's page, or wait "
                             "for the owner to approve you). Paste another token to try again.")
    if kind == "not_found":
        return "not_found", f"Not on the Hub: {detail}. It may have been renamed, deleted or made private."
    if kind == "network":
        return "network", f"Could not reach the Hub at {endpoint or 'huggingface.co'}: check the network connection."
    return kind, detail


# ---------------------------------------------------------------------------- search results
SEARCH_COLUMNS = ("Repository", "Downloads", "Likes", "Updated", "License", "Access", "Formats")


class HubSearchModel(QAbstractTableModel):
    """Search results, one repository a row (REPO_ROLE: its RepoSummary)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.repos: list = []

    def set_repos(self, repos: list) -> None:
        self.beginResetModel()
        self.repos = list(repos)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.repos)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(SEARCH_COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return SEARCH_COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        r = self.repos[index.row()]
        c = index.column()
        if role == REPO_ROLE:
            return r
        if role == Qt.DisplayRole:
            return (r.repo_id, f"{r.downloads or 0:,}", f"{r.likes or 0:,}", _date(r.last_modified),
                    r.license or "—", access_text(r.gated), ", ".join(r.formats or ()) or "—")[c]
        if role == Qt.TextAlignmentRole and c in (1, 2):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.ToolTipRole and c == 5 and r.gated:
            return "Downloading needs a Hugging Face token of an account that accepted the license."
        return None


# ---------------------------------------------------------------------------- repository files
FILE_COLUMNS = ("File", "Size", "Memory needed", "Fits this machine")


class RepoFilesModel(QStandardItemModel):
    """A repository's loadable files grouped by quantization (FILE_ROLE on file rows).

    ``fits`` maps file path -> FitEstimate; ``recommended`` is the recommended file's path.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHorizontalHeaderLabels(list(FILE_COLUMNS))
        self.files: list = []
        self.fits: dict = {}
        self.recommended: str | None = None

    def set_files(self, files: list, fits: dict | None = None, recommended: str | None = None,
                  failed: dict | None = None) -> None:
        self.files, self.fits, self.recommended = list(files), dict(fits or {}), recommended
        failed = failed or {}
        self.removeRows(0, self.rowCount())
        groups: dict[str, list] = {}
        for f in self.files:
            groups.setdefault(f.quant or UNNAMED, []).append(f)
        accent = QColor(theme.colors()["accent"])
        accent.setAlpha(60)
        for quant, members in groups.items():
            total = sum(f.size or 0 for f in members)
            head = [QStandardItem(quant), QStandardItem(_size(total)), QStandardItem(""), QStandardItem("")]
            bold = QFont()
            bold.setBold(True)
            for it in head:
                it.setEditable(False)
                it.setFont(bold)
            for f in members:
                est = self.fits.get(f.path)
                label = f.path if f.kind == "gguf" else f"{f.name} (safetensors folder, {len(f.files)} files)"
                row = [QStandardItem(label), QStandardItem(_size(f.size)),
                       QStandardItem(_size(est.total_bytes) if est else ("?" if f.path in failed else "…")),
                       QStandardItem("cannot be estimated" if f.path in failed else self.fit_text(est))]
                row[0].setData(f, FILE_ROLE)
                row[0].setToolTip("\n".join(f.files) if f.files else f.path)
                if est is not None:
                    row[2].setToolTip(f"weights {_size(est.weights_bytes)} as held ({est.dtype}) + KV cache "
                                      f"{_size(est.kv_bytes)} at {est.context_length:,} tokens, on {est.device}")
                if f.path in failed:
                    row[3].setToolTip(failed[f.path])
                for it in row:
                    it.setEditable(False)
                if f.path == recommended:
                    row[3].setText("★ Recommended · " + row[3].text())
                    for it in row:
                        it.setBackground(QBrush(accent))
                        it.setFont(bold)
                head[0].appendRow(row)
            self.appendRow(head)

    @staticmethod
    def fit_text(est) -> str:
        if est is None:
            return ""
        return "✓ fits" if est.fits else "✗ too large"

    def file_rows(self) -> list[tuple[QModelIndex, object]]:
        """(index of column 0, HubFile) for every file row, in order."""
        out = []
        for g in range(self.rowCount()):
            head = self.index(g, 0)
            for r in range(self.rowCount(head)):
                i = self.index(r, 0, head)
                out.append((i, i.data(FILE_ROLE)))
        return out


# ---------------------------------------------------------------------------- the tab
class HubBrowser(QWidget):
    """The Hub tab (objectName ``hubBrowser``): search page and repository page.

    Signals:
        downloadStarted(str): a download was queued (its job id).
        busyChanged(bool): a hub request started or ended.
    """

    downloadStarted = Signal(str)
    busyChanged = Signal(bool)

    def __init__(self, service, parent=None):
        super().__init__(parent)
        self.service = service
        self.setObjectName("hubBrowser")
        self.repo = None  # the RepoSummary (or repo id) on the repository page
        self.free_ram: int | None = None
        self.free_vram: int | None = None
        self._task: asyncio.Task | None = None
        self._retry = None  # what to run again once a token is given
        self._shown = False
        lay = QVBoxLayout(self)

        # search bar
        bar = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setObjectName("hubQuery")
        self.query.setAccessibleName("Search the Hub")
        self.query.setPlaceholderText("Search the Hugging Face Hub (e.g. llama 3.2 1b instruct)")
        self.query.setClearButtonEnabled(True)
        self.query.returnPressed.connect(self.search)
        self.format_box = QComboBox()
        self.format_box.setObjectName("hubFormat")
        self.format_box.setAccessibleName("Format")
        for label, value in FORMATS:
            self.format_box.addItem(label, value)
        self.sort_box = QComboBox()
        self.sort_box.setObjectName("hubSort")
        self.sort_box.setAccessibleName("Sort by")
        for label, value in SORTS:
            self.sort_box.addItem(label, value)
        self.search_button = QPushButton("Search")
        self.search_button.setObjectName("hubSearch")
        self.search_button.clicked.connect(self.search)
        bar.addWidget(self.query, 1)
        bar.addWidget(self.format_box)
        bar.addWidget(self.sort_box)
        bar.addWidget(self.search_button)
        self.settings_button = QToolButton()
        self.settings_button.setObjectName("hubSettings")
        self.settings_button.setText("Hub Settings")
        self.settings_button.setToolTip("The Hub's address and the token used")
        self.settings_button.setPopupMode(QToolButton.InstantPopup)
        self.settings_menu = QMenu(self)
        self.settings_menu.aboutToShow.connect(self._fill_settings)
        self.settings_button.setMenu(self.settings_menu)
        bar.addWidget(self.settings_button)
        lay.addLayout(bar)

        # the token panel (401/403) and a one-line notice for other errors
        self.auth = QFrame()
        self.auth.setObjectName("hubAuth")
        self.auth.setFrameShape(QFrame.StyledPanel)
        al = QVBoxLayout(self.auth)
        self.auth_label = QLabel()
        self.auth_label.setObjectName("hubAuthText")
        self.auth_label.setWordWrap(True)
        al.addWidget(self.auth_label)
        tl = QHBoxLayout()
        self.token_edit = QLineEdit()
        self.token_edit.setObjectName("hubToken")
        self.token_edit.setAccessibleName("Hugging Face token")
        self.token_edit.setEchoMode(QLineEdit.Password)
        self.token_edit.setPlaceholderText("hf_… (kept for this session; or set HF_TOKEN / huggingface-cli login)")
        self.token_edit.returnPressed.connect(self.use_token)
        self.token_button = QPushButton("Use Token")
        self.token_button.setObjectName("hubUseToken")
        self.token_button.clicked.connect(self.use_token)
        tl.addWidget(self.token_edit, 1)
        tl.addWidget(self.token_button)
        al.addLayout(tl)
        self.auth.hide()
        lay.addWidget(self.auth)
        self.notice = QLabel()
        self.notice.setObjectName("hubNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        lay.addWidget(self.notice)

        self.pages = QStackedWidget()
        lay.addWidget(self.pages, 1)

        # page 0: results
        self.results_model = HubSearchModel(self)
        self.results = QTableView()
        self.results.setObjectName("hubResults")
        self.results.setAccessibleName("Hub repositories")
        self.results.setModel(self.results_model)
        self.results.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.results.setSelectionMode(QAbstractItemView.SingleSelection)
        self.results.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.results.verticalHeader().hide()
        self.results.setAlternatingRowColors(True)
        self.results.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.results.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.results.doubleClicked.connect(lambda i: self.open_repo(i.siblingAtColumn(0).data(REPO_ROLE)))
        self.pages.addWidget(self.results)

        # page 1: a repository
        page = QWidget()
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.back_button = QPushButton("‹ Results")
        self.back_button.setObjectName("hubBack")
        self.back_button.clicked.connect(lambda: self.pages.setCurrentIndex(0))
        self.repo_title = QLabel()
        self.repo_title.setObjectName("hubRepoTitle")
        self.repo_title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        f = self.repo_title.font()
        f.setPointSizeF(f.pointSizeF() * 1.2)
        f.setBold(True)
        self.repo_title.setFont(f)
        head.addWidget(self.back_button)
        head.addWidget(self.repo_title, 1)
        pl.addLayout(head)
        self.repo_meta = QLabel()
        self.repo_meta.setObjectName("hubRepoMeta")
        self.repo_meta.setWordWrap(True)
        pl.addWidget(self.repo_meta)
        fit_row = QHBoxLayout()
        self.machine_label = QLabel()
        self.machine_label.setObjectName("hubMachine")
        self.machine_label.setWordWrap(True)
        self.context_spin = QSpinBox()
        self.context_spin.setObjectName("hubContext")
        self.context_spin.setAccessibleName("Context length for the estimate")
        self.context_spin.setRange(256, 1 << 20)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setValue(DEFAULT_CONTEXT)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.editingFinished.connect(self.refit)
        fit_row.addWidget(self.machine_label, 1)
        fit_row.addWidget(QLabel("Context:"))
        fit_row.addWidget(self.context_spin)
        pl.addLayout(fit_row)
        self.files_model = RepoFilesModel(self)
        self.files = QTreeView()
        self.files.setObjectName("hubFiles")
        self.files.setAccessibleName("Repository files")
        self.files.setModel(self.files_model)
        self.files.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.files.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.files.header().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.files.header().setSectionResizeMode(0, QHeaderView.Stretch)
        self.files.doubleClicked.connect(lambda _i: self.download_selected())
        self.files.selectionModel().selectionChanged.connect(lambda *_: self._update_download())
        pl.addWidget(self.files, 1)
        dl = QHBoxLayout()
        self.files_status = QLabel()
        self.files_status.setObjectName("hubFilesStatus")
        self.files_status.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("hubDownload")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected)
        dl.addWidget(self.files_status, 1)
        dl.addWidget(self.download_button)
        pl.addLayout(dl)
        self.pages.addWidget(page)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt API)
        """The first time the tab shows, list the most downloaded Llama GGUF repositories."""
        super().showEvent(event)
        if not self._shown:
            self._shown = True
            if not self.results_model.repos and self._task is None:
                self.search()

    # -- helpers -------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def _run(self, job) -> asyncio.Task:
        """Run ``job()`` (a coroutine function) as the one hub request: it replaces the one still running."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.ensure_future(self._guarded(job))
        return self._task

    async def _guarded(self, job) -> None:
        self.busyChanged.emit(True)
        self.search_button.setEnabled(False)
        try:
            await job()
        finally:
            if isValid(self.search_button):  # the window may be gone (closed, deleted) by now
                self._idle()

    def _idle(self) -> None:
        self.search_button.setEnabled(True)
        self.search_button.setText("Search")
        self.busyChanged.emit(False)

    def close_down(self) -> None:
        """The window is closing: drop the running request (its thread's answer is ignored)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def show_error(self, err: Exception, retry=None) -> str:
        """Show what went wrong: the token panel for 401/403, the notice line otherwise."""
        kind, text = explain(err, token_given=self.service.has_token(), endpoint=self.service.endpoint())
        if kind in ("auth", "forbidden"):
            self._retry = retry
            self.auth_label.setText(text)
            self.auth.show()
            self.notice.hide()
            self.token_edit.setFocus()
        else:
            self.notice.setText(text)
            self.notice.show()
        return kind

    def _clear_errors(self) -> None:
        self.notice.hide()
        self.auth.hide()

    def use_token(self) -> asyncio.Task | None:
        """Use the typed token from now on and retry what the Hub refused."""
        token = self.token_edit.text().strip()
        if not token:
            self.token_edit.setFocus()
            return None
        self.service.set_token(token)
        self.token_edit.clear()
        retry, self._retry = self._retry, None
        self.auth.hide()
        return retry() if retry is not None else None

    # -- settings: the Hub's address, the token --------------------------------------------
    def _fill_settings(self) -> None:
        m = self.settings_menu
        m.clear()
        m.addAction(f"Hub address: {self.service.endpoint() or os.environ.get('HF_ENDPOINT') or DEFAULT_HUB}"
                    ).setEnabled(False)
        m.addAction("Change Hub Address…", self.change_endpoint)
        if self.service.endpoint():
            m.addAction("Use the Default Address", lambda: self.set_endpoint(""))
        m.addSeparator()
        if self.service.token:
            m.addAction("Forget the Token Typed Here", lambda: self.service.set_token(None))
        else:
            m.addAction("Token: " + ("HF_TOKEN or huggingface_hub's login" if self.service.has_token() else "none")
                        ).setEnabled(False)

    def ask_text(self, title: str, label: str, text: str) -> str | None:
        """A line of text from the user (a modal box); tests replace this method."""
        value, ok = QInputDialog.getText(self, title, label, QLineEdit.Normal, text)
        return value if ok else None

    def change_endpoint(self) -> None:
        url = self.ask_text("Hub address", "Address of the Hugging Face Hub (or a mirror); empty for the default:",
                            self.service.endpoint() or "")
        if url is not None:
            self.set_endpoint(url)

    def set_endpoint(self, url: str) -> asyncio.Task | None:
        """Use ``url`` as the Hub (saved in the settings; '' = the default) and search again."""
        url = url.strip().rstrip("/")
        if url and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            self.notice.setText(f"“{url}” is not a web address (it starts with https:// or http://).")
            self.notice.show()
            return None
        self.service.set_endpoint(url or None)
        return self.search()

    # -- search ----------------------------------------------------------------------------
    def search(self) -> asyncio.Task:
        """Search with the query and filters (results replace the table)."""
        query = self.query.text().strip()
        fmt = self.format_box.currentData()
        sort = self.sort_box.currentData()
        self.search_button.setText("Searching…")
        return self._run(lambda: self._search(query, fmt, sort))

    async def _search(self, query: str, fmt, sort) -> None:
        self._clear_errors()
        self.pages.setCurrentIndex(0)
        try:
            hub = self.service.hub()
            repos = await self.service.call(hub.search, query, formats=fmt, sort=sort, limit=50)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # every hub failure is shown, never raised into Qt
            self.show_error(e, retry=self.search)
            return
        self.results_model.set_repos(repos)
        if not repos:
            self.notice.setText(f"No Llama-family repository on the Hub matches “{query}” in {' or '.join(fmt)} format.")
            self.notice.show()
        elif self.results_model.rowCount():
            self.results.selectRow(0)

    # -- a repository ------------------------------------------------------------------------
    def open_repo(self, repo) -> asyncio.Task | None:
        """Show a repository's page (a RepoSummary or a repo id) and load its files."""
        if repo is None:
            return None
        if isinstance(repo, str):  # a name: its search result, when shown, has the details
            repo = next((r for r in self.results_model.repos if r.repo_id == repo), repo)
        self.repo = repo
        repo_id = getattr(repo, "repo_id", repo)
        self.repo_title.setText(repo_id)
        if hasattr(repo, "license"):
            self.repo_meta.setText(f"License: {repo.license or 'not stated'} · {access_text(repo.gated)} · "
                                   f"{repo.downloads or 0:,} downloads · {repo.likes or 0:,} likes · "
                                   f"updated {_date(repo.last_modified)}")
        else:
            self.repo_meta.setText("")
        self.files_model.set_files([])
        self.files_status.setText("Loading the file list…")
        self.pages.setCurrentIndex(1)
        return self._run(lambda: self._load_repo(repo_id))

    async def _load_repo(self, repo_id: str) -> None:
        self._clear_errors()
        try:
            hub = self.service.hub()
            files = await self.service.call(hub.repo_files, repo_id)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.files_status.setText("")
            self.show_error(e, retry=lambda: self.open_repo(self.repo))
            return
        self.files_model.set_files(files)
        self.files.expandAll()
        if not files:
            self.files_status.setText("No file here that LlamaDesk can load (GGUF, or a safetensors Llama model).")
            return
        await self._fit(files)

    def refit(self) -> asyncio.Task | None:
        """Estimate again for the context length now set."""
        if self.files_model.files:
            return self._run(lambda: self._fit(self.files_model.files))
        return None

    async def _fit(self, files: list) -> None:
        ctx = self.context_spin.value()

        def estimate():
            hub = self.service.hub()
            from core.errors import HubError
            from core.library.hub import free_memory
            ram, vram = free_memory()
            fits, failed = {}, {}
            for f in files:
                try:
                    fits[f.path] = hub.fit(f, context_length=ctx, free_ram=ram, free_vram=vram)
                except HubError as e:  # one odd file leaves only its own estimate out
                    if getattr(e, "kind", "") in ("auth", "network"):
                        raise
                    failed[f.path] = str(e)
            pick = hub.recommend([f for f in files if f.path in fits], context_length=ctx, free_ram=ram,
                                 free_vram=vram, estimates=fits)
            return ram, vram, fits, failed, pick

        try:
            ram, vram, fits, failed, pick = await self.service.call(estimate)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.show_error(e, retry=self.refit)
            return
        self.free_ram, self.free_vram = ram, vram
        self.machine_label.setText(f"This machine: {_size(ram) if ram else '?'} RAM free"
                                   + (f", {_size(vram)} GPU memory free" if vram is not None else ", no GPU")
                                   + " · estimate = weights as loaded + KV cache at the context below")
        pick_path = getattr(pick, "path", pick)
        self.files_model.set_files(files, fits, pick_path, failed)
        self.files.expandAll()
        n_fit = sum(1 for e in fits.values() if e.fits)
        pick_name = next((f.name for f in files if f.path == pick_path), pick_path)
        self.files_status.setText(f"{n_fit} of {len(files)} fit this machine"
                                  + (f"; recommended: {pick_name}" if pick is not None else "; none fits")
                                  + (f"; {len(failed)} cannot be estimated" if failed else ""))
        if pick is not None:
            self.select_file(pick_path)

    def select_file(self, path: str) -> bool:
        for i, f in self.files_model.file_rows():
            if f.path == path:
                self.files.selectionModel().clearSelection()
                self.files.setCurrentIndex(i)
                from PySide6.QtCore import QItemSelectionModel
                self.files.selectionModel().select(i, QItemSelectionModel.Select | QItemSelectionModel.Rows)
                return True
        return False

    def selected_files(self) -> list:
        """The HubFiles selected (a selected quantization group means all its files)."""
        out = []
        for i in self.files.selectionModel().selectedRows(0):
            f = i.data(FILE_ROLE)
            if f is not None:
                out.append(f)
            else:
                out.extend(self.files_model.index(r, 0, i).data(FILE_ROLE) for r in range(self.files_model.rowCount(i)))
        seen, unique = set(), []
        for f in out:
            if f.path not in seen:
                seen.add(f.path)
                unique.append(f)
        return unique

    def _update_download(self) -> None:
        n = len(self.selected_files())
        self.download_button.setEnabled(n > 0)
        self.download_button.setText("Download" if n <= 1 else f"Download {n} Files")

    def download_selected(self) -> str | None:
        """Queue the selected files for download; returns the job id."""
        files = self.selected_files()
        if not files or self.repo is None:
            return None
        repo_id = getattr(self.repo, "repo_id", self.repo)
        try:
            job = self.service.enqueue(repo_id, files)
        except Exception as e:  # e.g. not enough disk space: said here, nothing queued
            self.show_error(e)
            return None
        self.files_status.setText(f"Queued {len(files)} file(s) from {repo_id}: see Downloads")
        self.downloadStarted.emit(str(job))
        return job
