"""The Library window's Hub tab: search the Hugging Face Hub, a repository's files, what fits here.

A search page (text, GGUF / safetensors, sort by downloads, likes or recently updated; each
repository with its license and whether it is gated) and a repository page (its loadable
files grouped by quantization, with sizes and the memory each needs against this machine's
free RAM and VRAM, the ones that fit marked and one recommended); a 401/403 opens an inline
token field that explains, in plain words, what the Hub wants. This module only lays out and
forwards: what happens is :class:`~gui.library.hub_controller.HubController`'s.
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import QItemSelectionModel, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFrame, QHBoxLayout, QHeaderView, QInputDialog, QLabel,
                               QLineEdit, QMenu, QPushButton, QSpinBox, QStackedWidget, QStyle, QTableView,
                               QToolButton, QTreeView, QVBoxLayout, QWidget)

from gui.library.hub_controller import DEFAULT_CONTEXT, FORMATS, RESULTS_PAGE, SORTS, HubController
from gui.library.hub_models import FILE_ROLE, REPO_ROLE


def _stretch_first_column(header: QHeaderView) -> None:
    header.setSectionResizeMode(QHeaderView.ResizeToContents)
    header.setSectionResizeMode(0, QHeaderView.Stretch)


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
        self.controller = HubController(service, self)
        self.results_model = self.controller.results
        self.files_model = self.controller.files
        self.setObjectName("hubBrowser")
        self._shown = False
        lay = QVBoxLayout(self)
        lay.addLayout(self._build_search_bar())
        lay.addWidget(self._build_token_panel())
        lay.addWidget(self._build_notice())
        self.pages = QStackedWidget()
        self.pages.addWidget(self._build_results())
        self.pages.addWidget(self._build_repo_page())
        lay.addWidget(self.pages, 1)
        self._connect_controller()

    # -- layout ------------------------------------------------------------------------------
    def _build_search_bar(self) -> QHBoxLayout:
        bar = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setObjectName("hubQuery")
        self.query.setAccessibleName("Search the Hub")
        self.query.setPlaceholderText("Search the Hugging Face Hub (e.g. llama 3.2 1b instruct)")
        self.query.setClearButtonEnabled(True)
        self.query.returnPressed.connect(self.search)
        self.format_box = self._choices("hubFormat", "Format", FORMATS)
        self.sort_box = self._choices("hubSort", "Sort by", SORTS)
        self.search_button = QPushButton("Search")
        self.search_button.setObjectName("hubSearch")
        self.search_button.clicked.connect(self.search)
        self.settings_button = QToolButton()
        self.settings_button.setObjectName("hubSettings")
        self.settings_button.setText("Hub Settings")
        self.settings_button.setToolTip("The Hub's address and the token used")
        self.settings_button.setPopupMode(QToolButton.InstantPopup)
        self.settings_menu = QMenu(self)
        self.settings_menu.aboutToShow.connect(self._fill_settings)
        self.settings_button.setMenu(self.settings_menu)
        bar.addWidget(self.query, 1)
        for w in (self.format_box, self.sort_box, self.search_button, self.settings_button):
            bar.addWidget(w)
        return bar

    @staticmethod
    def _choices(name: str, accessible: str, choices) -> QComboBox:
        box = QComboBox()
        box.setObjectName(name)
        box.setAccessibleName(accessible)
        for label, value in choices:
            box.addItem(label, value)
        return box

    def _build_token_panel(self) -> QFrame:
        """The token panel a 401/403 opens."""
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
        return self.auth

    def _build_notice(self) -> QFrame:
        """The notice line (errors, no results); offline, with a warning icon and Retry."""
        self.notice_row = QFrame()
        self.notice_row.setObjectName("hubNoticeRow")
        row = QHBoxLayout(self.notice_row)
        row.setContentsMargins(0, 0, 0, 0)
        self.notice_icon = QLabel()
        self.notice_icon.setPixmap(self.style().standardIcon(QStyle.SP_MessageBoxWarning).pixmap(24, 24))
        self.notice_icon.hide()
        self.notice = QLabel()
        self.notice.setObjectName("hubNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        self.retry_button = QPushButton("Retry")
        self.retry_button.setObjectName("hubRetry")
        self.retry_button.setAccessibleName("Retry the Hub")
        self.retry_button.clicked.connect(self.retry)
        self.retry_button.hide()
        row.addWidget(self.notice_icon, 0, Qt.AlignTop)
        row.addWidget(self.notice, 1)
        row.addWidget(self.retry_button, 0, Qt.AlignTop)
        return self.notice_row

    def _offer_retry(self, on: bool) -> None:
        self.retry_button.setVisible(on)
        self.notice_icon.setVisible(on)
        if on:
            self.retry_button.setFocus()

    def _build_results(self) -> QTableView:
        self.results = QTableView()
        self.results.setObjectName("hubResults")
        self.results.setAccessibleName("Hub repositories")
        self.results.setModel(self.results_model)
        self.results.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.results.setSelectionMode(QAbstractItemView.SingleSelection)
        self.results.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.results.verticalHeader().hide()
        self.results.setAlternatingRowColors(True)
        _stretch_first_column(self.results.horizontalHeader())
        self.results.doubleClicked.connect(lambda i: self.open_repo(i.siblingAtColumn(0).data(REPO_ROLE)))
        return self.results

    def _build_repo_page(self) -> QWidget:
        page = QWidget()
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.addLayout(self._build_repo_head())
        self.repo_meta = QLabel()
        self.repo_meta.setObjectName("hubRepoMeta")
        self.repo_meta.setWordWrap(True)
        pl.addWidget(self.repo_meta)
        pl.addLayout(self._build_fit_row())
        pl.addWidget(self._build_files(), 1)
        pl.addLayout(self._build_download_row())
        return page

    def _build_repo_head(self) -> QHBoxLayout:
        head = QHBoxLayout()
        self.back_button = QPushButton("‹ Results")
        self.back_button.setObjectName("hubBack")
        self.back_button.clicked.connect(lambda: self.pages.setCurrentIndex(RESULTS_PAGE))
        self.repo_title = QLabel()
        self.repo_title.setObjectName("hubRepoTitle")
        self.repo_title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        f = self.repo_title.font()
        f.setPointSizeF(f.pointSizeF() * 1.2)
        f.setBold(True)
        self.repo_title.setFont(f)
        head.addWidget(self.back_button)
        head.addWidget(self.repo_title, 1)
        return head

    def _build_fit_row(self) -> QHBoxLayout:
        fit_row = QHBoxLayout()
        self.machine_label = QLabel()
        self.machine_label.setObjectName("hubMachine")
        self.machine_label.setWordWrap(True)
        self.context_spin = QSpinBox()
        self.context_spin.setObjectName("hubContext")
        self.context_spin.setAccessibleName("Context length for the estimate")
        self.context_spin.setRange(256, 1 << 20)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.valueChanged.connect(self.controller.set_context_length)
        self.context_spin.setValue(DEFAULT_CONTEXT)
        self.context_spin.editingFinished.connect(self.refit)
        fit_row.addWidget(self.machine_label, 1)
        fit_row.addWidget(QLabel("Context:"))
        fit_row.addWidget(self.context_spin)
        return fit_row

    def _build_files(self) -> QTreeView:
        self.files = QTreeView()
        self.files.setObjectName("hubFiles")
        self.files.setAccessibleName("Repository files")
        self.files.setModel(self.files_model)
        self.files.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.files.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.ExtendedSelection)
        _stretch_first_column(self.files.header())
        self.files.doubleClicked.connect(lambda _i: self.download_selected())
        self.files.selectionModel().selectionChanged.connect(lambda *_: self._update_download())
        return self.files

    def _build_download_row(self) -> QHBoxLayout:
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
        return dl

    def _connect_controller(self) -> None:
        c = self.controller
        c.busyChanged.connect(self._busy)
        c.noticeChanged.connect(lambda text: self._say(self.notice, text))
        c.retryOffered.connect(self._offer_retry)
        c.authChanged.connect(self._ask_token)
        c.pageChanged.connect(self.pages.setCurrentIndex)
        c.repoChanged.connect(self._show_repo)
        c.filesChanged.connect(self.files.expandAll)
        c.filesStatusChanged.connect(self.files_status.setText)
        c.machineChanged.connect(self.machine_label.setText)
        c.recommended.connect(self.select_file)
        c.resultsShown.connect(lambda n: self.results.selectRow(0) if n else None)
        c.downloadStarted.connect(self.downloadStarted)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt API)
        """The first time the tab shows, list the most downloaded Llama GGUF repositories."""
        super().showEvent(event)
        if not self._shown:
            self._shown = True
            if not self.results_model.repos and self.controller.task is None:
                self.search()

    # -- what the controller says --------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.controller.busy

    def _busy(self, on: bool) -> None:
        self.search_button.setEnabled(not on)
        if not on:
            self.search_button.setText("Search")
        self.busyChanged.emit(on)

    def _show_repo(self, title: str, details: str) -> None:
        self.repo_title.setText(title)
        self.repo_meta.setText(details)

    @staticmethod
    def _say(label: QLabel, text: str) -> None:
        label.setText(text)
        label.setVisible(bool(text))

    def _ask_token(self, text: str) -> None:
        if text:
            self.auth_label.setText(text)
        self.auth.setVisible(bool(text))
        if text:
            self.token_edit.setFocus()

    def close_down(self) -> None:
        """The window is closing: drop the running request (its thread's answer is ignored)."""
        self.controller.close_down()

    # -- what the user does ----------------------------------------------------------------------
    def use_token(self) -> asyncio.Task | None:
        """Use the typed token from now on and retry what the Hub refused."""
        token = self.token_edit.text().strip()
        if not token:
            self.token_edit.setFocus()
            return None
        self.token_edit.clear()
        return self.controller.use_token(token)

    def _fill_settings(self) -> None:
        m = self.settings_menu
        m.clear()
        m.addAction(f"Hub address: {self.controller.address_text()}").setEnabled(False)
        m.addAction("Change Hub Address…", self.change_endpoint)
        if self.controller.endpoint():
            m.addAction("Use the Default Address", lambda: self.set_endpoint(""))
        m.addSeparator()
        token = self.controller.token_text()
        if token is None:
            m.addAction("Forget the Token Typed Here", self.controller.forget_token)
        else:
            m.addAction("Token: " + token).setEnabled(False)

    def ask_text(self, title: str, label: str, text: str) -> str | None:
        """A line of text from the user (a modal box); tests replace this method."""
        value, ok = QInputDialog.getText(self, title, label, QLineEdit.Normal, text)
        return value if ok else None

    def change_endpoint(self) -> None:
        url = self.ask_text("Hub address", "Address of the Hugging Face Hub (or a mirror); empty for the default:",
                            self.controller.endpoint() or "")
        if url is not None:
            self.set_endpoint(url)

    def set_endpoint(self, url: str) -> asyncio.Task | None:
        """Use ``url`` as the Hub (saved in the settings; '' = the default) and search again."""
        return self.search() if self.controller.set_endpoint(url) else None

    def search(self) -> asyncio.Task:
        """Search with the query and filters (results replace the table)."""
        self.search_button.setText("Searching…")
        return self.controller.search(self.query.text().strip(), self.format_box.currentData(),
                                      self.sort_box.currentData())

    def retry(self) -> asyncio.Task | None:
        """Run again what failed because the Hub could not be reached."""
        return self.controller.retry_now()

    def open_repo(self, repo) -> asyncio.Task | None:
        """Show a repository's page (a RepoSummary or a repo id) and load its files."""
        return self.controller.open_repo(repo)

    def refit(self) -> asyncio.Task | None:
        """Estimate again for the context length now set."""
        return self.controller.refit()

    def select_file(self, path: str) -> bool:
        for i, f in self.files_model.file_rows():
            if f.path == path:
                self.files.selectionModel().clearSelection()
                self.files.setCurrentIndex(i)
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
        return list({f.path: f for f in out}.values())  # each file once, in the order first selected

    def _update_download(self) -> None:
        n = len(self.selected_files())
        self.download_button.setEnabled(n > 0)
        self.download_button.setText("Download" if n <= 1 else f"Download {n} Files")

    def download_selected(self) -> str | None:
        """Queue the selected files for download; returns the job id."""
        return self.controller.download(self.selected_files())
