"""The Library window's Downloads tab: the queue, a progress bar per file, pause / resume / cancel.

A view only: rows and actions are :class:`~gui.library.downloads_controller.DownloadsController`'s.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (QAbstractItemView, QApplication, QHBoxLayout, QHeaderView, QLabel, QPushButton,
                               QSizePolicy, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QTableView,
                               QVBoxLayout, QWidget)

from gui import theme
from gui.library.downloads_controller import DownloadsController
from gui.library.downloads_model import FRACTION_ROLE, ROW_ROLE


class ProgressDelegate(QStyledItemDelegate):
    """Draws the Progress column as a bar with its text (bytes done / total), also on a selected row."""

    def paint(self, painter, option, index) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        text, opt.text = opt.text, ""
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawControl(QStyle.CE_ItemViewItem, opt, painter, opt.widget)  # background, selection
        selected = bool(opt.state & QStyle.State_Selected)
        ink = opt.palette.color(QPalette.HighlightedText if selected else QPalette.Text)
        base = QColor(ink) if selected else QColor(theme.colors()["accent"])
        frac = max(0.0, min(1.0, index.data(FRACTION_ROLE) or 0.0))
        r = opt.rect.adjusted(3, 4, -3, -4)
        painter.save()
        base.setAlpha(140)
        painter.setPen(base)
        painter.drawRect(r.adjusted(0, 0, -1, -1))
        done = r.adjusted(1, 1, -1, -1)
        done.setWidth(round(done.width() * frac))
        base.setAlpha(70 if selected else 90)
        painter.fillRect(done, base)
        painter.setPen(ink)
        painter.drawText(r, Qt.AlignCenter, text)
        painter.restore()



class DownloadsView(QWidget):
    """The Downloads tab (objectName ``downloadsView``): lays out and forwards to its
    :class:`~gui.library.downloads_controller.DownloadsController`.

    Signals:
        finished(str): a download finished and was verified (its path).
        openRequested(str): the user chose to open a finished download (its path).
    """

    finished = Signal(str)
    openRequested = Signal(str)

    def __init__(self, service, parent=None):
        super().__init__(parent)
        self.setObjectName("downloadsView")
        self.controller = DownloadsController(service, self)
        self.model = self.controller.model
        lay = QVBoxLayout(self)
        self.notice = QLabel()
        self.notice.setObjectName("downloadsNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        lay.addWidget(self.notice)
        lay.addWidget(self._build_table(), 1)
        self.empty = QLabel("No downloads. Find a model in the Hub tab and press Download.")
        self.empty.setObjectName("downloadsEmpty")
        self.empty.setAlignment(Qt.AlignCenter)
        lay.addWidget(self.empty)
        lay.addLayout(self._build_buttons())
        c = self.controller
        c.changed.connect(self._update_buttons)
        c.jobAdded.connect(self.select_job)
        c.finished.connect(self.finished)
        c.openRequested.connect(self.openRequested)
        c.noticeChanged.connect(self._say)
        c.statusChanged.connect(self._status)
        self._update_buttons()

    def _build_table(self) -> QTableView:
        self.table = QTableView()
        self.table.setObjectName("downloadsTable")
        self.table.setAccessibleName("Downloads")
        self.table.setModel(self.model)
        self.table.setItemDelegateForColumn(2, ProgressDelegate(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.verticalHeader().setDefaultSectionSize(30)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.Interactive)
        # File and Repository share what the others leave: fixed, those two took all but 4 px at
        # 800 px (the file's name squeezed to "File", a scroll bar under an empty table).
        h.setSectionResizeMode(0, QHeaderView.Stretch)
        h.setSectionResizeMode(1, QHeaderView.Stretch)
        for col, width in ((2, 180), (3, 80), (4, 80), (5, 130)):
            self.table.setColumnWidth(col, width)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        self.model.dataChanged.connect(lambda *_: self._update_buttons())
        return self.table

    def _build_buttons(self) -> QHBoxLayout:
        buttons = QHBoxLayout()
        self.status = QLabel()
        self.status.setObjectName("downloadsStatus")
        # a long path must not widen the window: cut at the edge (the tooltip has it whole)
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        buttons.addWidget(self.status, 1)
        self.open_button = self._button("Open", "downloadOpen", self.open_selected)
        self.open_button.setToolTip("Load this model in the chat window")
        self.pause_button = self._button("Pause", "downloadPause", self.pause_selected)
        self.resume_button = self._button("Resume", "downloadResume", self.resume_selected)
        self.cancel_button = self._button("Cancel", "downloadCancel", self.cancel_selected)
        self.clear_button = self._button("Clear Finished", "downloadClear", self.clear_finished)
        for b in (self.open_button, self.pause_button, self.resume_button, self.cancel_button, self.clear_button):
            buttons.addWidget(b)
        return buttons

    @staticmethod
    def _button(text: str, name: str, slot) -> QPushButton:
        b = QPushButton(text)
        b.setObjectName(name)
        b.clicked.connect(slot)
        return b

    def _say(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    def _status(self, text: str, tooltip: str) -> None:
        self.status.setText(text)
        self.status.setToolTip(tooltip)

    # -- selection and buttons -----------------------------------------------------------
    def sync(self) -> None:
        """Rows from the manager's jobs (see :meth:`DownloadsController.sync`)."""
        self.controller.sync()

    def selected_row(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        return rows[0].data(ROW_ROLE) if rows else None

    def select_job(self, job_id) -> bool:
        found = self.model.find(job_id)
        if found:
            self.table.selectRow(found[0])
        return bool(found)

    def _update_buttons(self) -> None:
        can = self.controller.allowed(self.selected_row())
        for name, button in (("open", self.open_button), ("pause", self.pause_button),
                             ("resume", self.resume_button), ("cancel", self.cancel_button),
                             ("clear", self.clear_button)):
            button.setEnabled(can[name])
        self.empty.setVisible(not self.model.rows)

    def pause_selected(self) -> None:
        self.controller.pause(self.selected_row())

    def resume_selected(self) -> None:
        self.controller.resume(self.selected_row())

    def cancel_selected(self) -> None:
        self.controller.cancel(self.selected_row())

    def open_selected(self) -> None:
        self.controller.open(self.selected_row())

    def clear_finished(self) -> None:
        self.controller.clear_finished()
