"""The sidebar's conversations as a Qt model, and the proxy that filters them by search.

The list view keeps its rows between changes: :meth:`ConversationListModel.reload` updates
titles in place and inserts or removes only the rows that changed, so sending a message or
renaming a chat does not rebuild the sidebar. Search runs in the store (titles and message
text) and the proxy shows the matching ids.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QAbstractListModel, QModelIndex, QSortFilterProxyModel, Qt, Signal

from core.history.records import Conversation

ID_ROLE = Qt.UserRole


class ConversationListModel(QAbstractListModel):
    """Chat conversations, newest first (the store's order).

    Signals:
        renamed(int, str): the user edited a title in place (conversation id, new title).
    """

    renamed = Signal(int, str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[Conversation] = []

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid():
            return None
        conv = self.rows[index.row()]
        if role == Qt.EditRole:
            return conv.title
        if role == Qt.DisplayRole:
            return self.display_text(index.row())
        if role == Qt.ToolTipRole:
            return f"{conv.title}\nStarted {_when(conv.created_at)} · last changed {_when(conv.updated_at)}"
        if role == ID_ROLE:
            return conv.id
        return None

    def display_text(self, row: int) -> str:
        """The title, and for chats that share it, when each was started (and, if that is
        the same minute too, a count), so they can be told apart in the list."""
        conv = self.rows[row]
        same = [c for c in self.rows if c.title == conv.title]
        if len(same) < 2:
            return conv.title
        when = _when(conv.created_at)
        twins = [c for c in same if _when(c.created_at) == when]
        if len(twins) > 1:
            when += f" #{sorted(c.id for c in twins).index(conv.id) + 1}"
        return f"{conv.title} ({when})"

    def flags(self, index: QModelIndex):
        return super().flags(index) | Qt.ItemIsEditable if index.isValid() else super().flags(index)

    def setData(self, index: QModelIndex, value, role: int = Qt.EditRole) -> bool:  # noqa: N802 (Qt API)
        if role != Qt.EditRole or not index.isValid():
            return False
        self.renamed.emit(self.rows[index.row()].id, str(value))
        return True

    def row_of(self, conv_id: int | None) -> int | None:
        return next((i for i, c in enumerate(self.rows) if c.id == conv_id), None)

    def reload(self, conversations: list[Conversation]) -> None:
        """Show ``conversations``: rows that stay keep their place in the view."""
        new_ids = [c.id for c in conversations]
        if [c.id for c in self.rows] == new_ids:
            changed = any(old.title != new.title for old, new in zip(self.rows, conversations))
            self.rows[:] = conversations
            if changed:  # a title can add or drop another row's "(date)" too
                self.dataChanged.emit(self.index(0), self.index(len(self.rows) - 1))
            return
        keep = set(new_ids)
        for i in reversed(range(len(self.rows))):  # gone: remove those rows only
            if self.rows[i].id not in keep:
                self.beginRemoveRows(QModelIndex(), i, i)
                del self.rows[i]
                self.endRemoveRows()
        if self.rows:  # the twin of a removed chat may lose its "(date)"
            self.dataChanged.emit(self.index(0), self.index(len(self.rows) - 1))
        if [c.id for c in self.rows] == [i for i in new_ids if i in {c.id for c in self.rows}]:
            # Same relative order: insert the new ones where they belong (a new chat goes on top).
            for i, conv in enumerate(conversations):
                if i >= len(self.rows) or self.rows[i].id != conv.id:
                    self.beginInsertRows(QModelIndex(), i, i)
                    self.rows.insert(i, conv)
                    self.endInsertRows()
                    if self.rows:  # a new twin title gives the older one its "(date)" too
                        self.dataChanged.emit(self.index(0), self.index(len(self.rows) - 1))
                else:
                    changed = self.rows[i].title != conv.title
                    self.rows[i] = conv
                    if changed:
                        self.dataChanged.emit(self.index(i), self.index(i))
            return
        self.beginResetModel()  # reordered: one reset
        self.rows = list(conversations)
        self.endResetModel()


def _when(t: float) -> str:
    return time.strftime("%d %b %H:%M", time.localtime(t))


class ConversationFilter(QSortFilterProxyModel):
    """Shows the conversations whose ids matched the search (all when there is none)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._ids: set[int] | None = None

    def set_matches(self, ids: set[int] | None) -> None:
        # begin/endFilterChange replace the deprecated invalidateFilter (Qt 6.10): the
        # rows are re-filtered once, and only rows (columns never change here).
        self.beginFilterChange()
        self._ids = ids
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, row: int, parent: QModelIndex) -> bool:  # noqa: N802 (Qt API)
        if self._ids is None:
            return True
        return self.sourceModel().index(row, 0, parent).data(ID_ROLE) in self._ids
