"""The Library tab: search, the models table, Open / Show in Folder / Delete, the folders menu.

A view only: it lays the widgets out, asks the user (yes/no, a folder) and hands the
answers to its :class:`~gui.library.library_controller.LibraryController`.
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QMenu,
                               QMessageBox, QPushButton, QSizePolicy, QTableView, QToolButton, QVBoxLayout, QWidget)

from gui.library.library_controller import LibraryController
from gui.library.library_table import COLUMNS, ENTRY_ROLE, LibraryFilter

LAST_USED_COLUMN = [key for _, key in COLUMNS].index("last_used")
FOLDER_COLUMN = [key for _, key in COLUMNS].index("location")


class LibraryView(QWidget):
    """The Library tab (objectName ``libraryView``).

    Signals:
        openRequested(str): the user chose to open this model path.
        hubRequested(): the empty library's link to the Hub tab.
    """

    openRequested = Signal(str)
    hubRequested = Signal()

    def __init__(self, service, parent=None):
        super().__init__(parent)
        self.controller = LibraryController(service, self)
        self.model = self.controller.model
        self.setObjectName("libraryView")
        lay = QVBoxLayout(self)
        lay.addLayout(self._build_top())
        self.proxy = LibraryFilter(self)
        self.proxy.setSourceModel(self.model)
        self.search.textChanged.connect(self.proxy.set_text)
        lay.addWidget(self._build_table(), 1)
        lay.addWidget(self._build_empty())
        lay.addLayout(self._build_bottom())
        self._kept: str | None = None  # the selected path while the table resets
        self.model.modelAboutToBeReset.connect(self._keep_selection)
        self.model.modelReset.connect(self._restore_selection)
        self.controller.openRequested.connect(self.openRequested)
        self.controller.statusChanged.connect(self._update)
        self.controller.scanFailed.connect(self.status.setText)
        self._update()

    def _build_top(self) -> QHBoxLayout:
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
        self.refresh_button.clicked.connect(self.controller.rescan)
        top.addWidget(self.refresh_button)
        return top

    def _build_table(self) -> QTableView:
        self.table = QTableView()
        self.table.setObjectName("libraryTable")
        self.table.setAccessibleName("Models")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(LAST_USED_COLUMN, Qt.DescendingOrder)  # last used first
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        # Name and Folder share the room left; a long folder is shortened in the middle
        # (the full path is in the tooltip) so both ends of it stay readable.
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        header.setSectionResizeMode(FOLDER_COLUMN, QHeaderView.Stretch)
        self.table.setTextElideMode(Qt.ElideMiddle)
        self.table.setWordWrap(False)  # one line a model; a wrapped path hid its end
        self.table.doubleClicked.connect(lambda _i: self.open_selected())
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        return self.table

    def _build_empty(self) -> QLabel:
        self.empty = QLabel()
        self.empty.setObjectName("libraryEmpty")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.linkActivated.connect(lambda _l: self.hubRequested.emit())
        self.empty.hide()
        return self.empty

    def _build_bottom(self) -> QHBoxLayout:
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
        self.clear_caches_button = QPushButton("Clear Caches…")
        self.clear_caches_button.setObjectName("libraryClearCaches")
        self.clear_caches_button.setToolTip("Remove the fast-open caches: the weights of quantized models in "
                                            "the CPU kernels' layout, written at a model's first open")
        self.clear_caches_button.clicked.connect(self.clear_caches)
        for b in (self.open_button, self.show_button, self.delete_button, self.clear_caches_button):
            bottom.addWidget(b)
        return bottom

    # -- content ---------------------------------------------------------------------
    def _keep_selection(self) -> None:
        e = self.selected()
        self._kept = None if e is None else str(e.path)

    def _restore_selection(self) -> None:
        if self._kept is not None:
            self.select_path(self._kept)

    def _update(self) -> None:
        self.status.setText(self.controller.status_text())
        self.empty.setText(self.controller.empty_text())
        self.empty.setVisible(self.controller.is_empty())
        self._update_buttons()

    def _update_buttons(self) -> None:
        e = self.selected()
        self.open_button.setEnabled(self.controller.can_open(e))
        self.show_button.setEnabled(e is not None)
        self.delete_button.setEnabled(e is not None)
        self.clear_caches_button.setEnabled(bool(self.controller.caches()))

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
        self.controller.open(self.selected())

    def show_selected(self) -> None:
        e = self.selected()
        if e is not None:
            self.open_url(QUrl.fromLocalFile(str(self.controller.folder_of(e))))

    def open_url(self, url: QUrl) -> None:
        """Show a folder in the system's file manager; tests replace this method."""
        QDesktopServices.openUrl(url)

    def confirm(self, title: str, text: str) -> bool:
        """Ask yes/no (a modal box); tests replace this method."""
        return QMessageBox.question(self, title, text) == QMessageBox.Yes

    def ask_folder(self, title: str) -> str | None:
        """A folder from the user; tests replace this method."""
        path = QFileDialog.getExistingDirectory(self, title, str(self.controller.models_folder()))
        return path or None

    def delete_selected(self) -> asyncio.Task | None:
        e = self.selected()
        if e is None or not self.confirm(*self.controller.delete_question(e)):
            return None
        return self.controller.delete(e)

    def clear_caches(self) -> asyncio.Task | None:
        if not self.controller.caches() or not self.confirm(*self.controller.clear_caches_question()):
            return None
        return self.controller.clear_caches()

    def _fill_folders(self) -> None:
        m = self.folders_menu
        m.clear()
        m.addAction(f"Models folder: {self.controller.models_folder()}").setEnabled(False)
        m.addAction("Change Models Folder…", self._change_folder)
        m.addAction("Add a Folder to Scan…", self._add_folder)
        extra = self.controller.extra_folders()
        if extra:
            m.addSeparator()
            for p in extra:
                m.addAction(f"Stop Scanning {p}", lambda p=p: self.controller.remove_folder(p))

    def _change_folder(self) -> None:
        self.controller.change_models_folder(self.ask_folder("Models folder (downloads go here)"))

    def _add_folder(self) -> None:
        self.controller.add_folder(self.ask_folder("Add a folder to scan for models"))
