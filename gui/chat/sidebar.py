"""The conversations pane: search, New chat, and the list of chats (renamed in place).

It shows what the :class:`~gui.chat.conversation.ConversationModel` holds and highlights
the open chat; what the user picks goes out as signals (the window asks the
conversation controller to open, start or delete a chat).
"""
from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QListView, QMenu, QToolButton, QVBoxLayout, QWidget

from gui import theme
from gui.chat.conversation import ConversationModel
from gui.chat.conversation_list import ID_ROLE, ConversationFilter, ConversationListModel


class ConversationSidebar(QWidget):
    """The list of chats (objectName ``conversationPane``).

    Signals:
        openRequested(int): a chat was clicked (its id; not the open one).
        newRequested(): New chat was clicked.
        deleteRequested(int): Delete was chosen in a chat's context menu.
    """

    openRequested = Signal(int)
    newRequested = Signal()
    deleteRequested = Signal(int)

    def __init__(self, *, conversation: ConversationModel, parent=None):
        super().__init__(parent)
        self.conversation = conversation
        self.setObjectName("conversationPane")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 4, 8)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setObjectName("conversationSearch")
        self.search.setAccessibleName("Search conversations")
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._search)
        self.new_button = QToolButton()
        self.new_button.setObjectName("newChatButton")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setIcon(theme.icon("new"))
        self.new_button.clicked.connect(self.newRequested)
        top.addWidget(self.search, 1)
        top.addWidget(self.new_button)
        lay.addLayout(top)
        # An empty list after a search would look like lost chats: say that nothing matched.
        self.no_results = QLabel()
        self.no_results.setObjectName("conversationSearchEmpty")
        self.no_results.setWordWrap(True)
        self.no_results.setAlignment(Qt.AlignHCenter | Qt.AlignTop)
        self.no_results.hide()
        lay.addWidget(self.no_results)
        lay.addWidget(self._build_list(), 1)

    def _build_list(self) -> QListView:
        self.model = ConversationListModel(self)
        self.model.renamed.connect(lambda conv_id, title: self.conversation.rename(conv_id, title))
        self.filter = ConversationFilter(self)
        self.filter.setSourceModel(self.model)
        self.list = QListView()
        self.list.setModel(self.filter)
        self.list.setEditTriggers(QListView.DoubleClicked | QListView.EditKeyPressed)
        self.list.setObjectName("conversationList")
        self.list.setAccessibleName("conversationList")
        # Long titles are shortened in the middle (full title in the tooltip) instead of a
        # sideways scrollbar, so the "(date)" that tells same-titled chats apart stays visible.
        self.list.setTextElideMode(Qt.ElideMiddle)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.clicked.connect(self._clicked)
        return self.list

    def refresh(self) -> None:
        """Bring the list up to date with the store (rows that stay are kept)."""
        self.model.reload(self.conversation.conversations())
        if self.search.text().strip():
            self._search()
        self.highlight_current()

    def highlight_current(self) -> None:
        """Select the open conversation (none for a new chat)."""
        row = self.model.row_of(self.conversation.conv_id)
        index = self.filter.mapFromSource(self.model.index(row)) if row is not None else None
        sel = self.list.selectionModel()
        if index is None or not index.isValid():
            sel.clearSelection()
            sel.setCurrentIndex(QModelIndex(), QItemSelectionModel.Clear)
        else:
            self.list.setCurrentIndex(index)

    def index(self, row: int):
        """The index of visible row ``row`` (its ID_ROLE is the conversation id)."""
        return self.filter.index(row, 0)

    def rename_current(self) -> None:
        """Start editing the highlighted chat's title in place."""
        index = self.list.currentIndex()
        if index.isValid():
            self.list.edit(index)

    def _search(self) -> None:
        text = self.search.text().strip()
        # The store searches titles and message text; the proxy shows what matched.
        self.filter.set_matches({c.id for c in self.conversation.conversations(text)} if text else None)
        # Hiding the highlighted row makes the view move its current index to a neighbour,
        # which would mark a chat that is not the one on screen: put the highlight back.
        self.highlight_current()
        empty = bool(text) and self.filter.rowCount() == 0
        self.no_results.setText(f"No chats match “{text}”." if empty else "")
        self.no_results.setVisible(empty)

    def _clicked(self, index) -> None:
        conv_id = index.data(ID_ROLE)
        if conv_id != self.conversation.conv_id:
            self.openRequested.emit(conv_id)

    def _menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        # The right-button press moved the highlight to this item; the transcript shows the open
        # chat, so the highlight goes back to it (the menu acts on the item clicked).
        self.highlight_current()
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.edit(index))
        menu.addAction("Delete", lambda: self.deleteRequested.emit(index.data(ID_ROLE)))
        menu.popup(self.list.viewport().mapToGlobal(pos))
