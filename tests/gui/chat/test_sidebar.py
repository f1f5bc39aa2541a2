"""The conversations sidebar on its own: an in-memory store, no model."""
from __future__ import annotations

import pytest

from core.history.store import History
from gui.chat.conversation import ConversationModel
from gui.chat.conversation_list import ID_ROLE
from gui.chat.sidebar import ConversationSidebar


@pytest.fixture
def sidebar(qtbot):
    history = History(":memory:")
    ids = {}
    for title, text in (("Cats", "a cat sat"), ("Dogs", "a dog ran"), ("Birds", "a bird sang")):
        ids[title] = history.create_conversation(title).id
        history.add_message(ids[title], role="user", text=text)
    model = ConversationModel(history=history)
    pane = ConversationSidebar(conversation=model)
    qtbot.addWidget(pane)
    pane.resize(260, 400)
    pane.show()
    pane.ids = ids
    model.open(ids["Dogs"])
    pane.refresh()
    yield pane
    history.close()


def highlighted(pane):
    sel = pane.list.selectionModel()
    current = pane.list.currentIndex()
    return {i.data(ID_ROLE) for i in sel.selectedIndexes()} | ({current.data(ID_ROLE)} if current.isValid() else set())


def test_search_that_hides_the_open_chat_highlights_no_other(sidebar):
    assert highlighted(sidebar) == {sidebar.ids["Dogs"]}
    sidebar.search.setText("cat")  # Dogs, the open chat, is filtered out
    assert sidebar.list.model().rowCount() == 1
    assert highlighted(sidebar) == set()
    sidebar.search.setText("")  # back: the open chat is highlighted again
    assert highlighted(sidebar) == {sidebar.ids["Dogs"]}


def test_search_with_no_results_says_so(sidebar):
    assert not sidebar.no_results.isVisible()
    sidebar.search.setText("zebra")
    assert sidebar.list.model().rowCount() == 0
    assert sidebar.no_results.isVisible() and "zebra" in sidebar.no_results.text()
    assert "No chats" in sidebar.no_results.text()
    sidebar.search.setText("bird")
    assert not sidebar.no_results.isVisible()
