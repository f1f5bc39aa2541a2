"""A grounded reply's sources: citations that open their passage, and "where did this come
from?" ranked by the engine's attention (on the stories260K model through the real bridge)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QObject, QUrl, Signal

from core.engine.attribution import attribute
from core.history.store import History
from core.prompt.chat_format import chat_format_for
from core.worker.attribute import token_spans
from core.worker.protocol import AttributeRequest
from gui.chat import grounded
from gui.chat.column import ChatColumn
from gui.chat.controller import ConversationController
from tests.gui.chat.test_reply import Settings
from tests.gui.ui_helpers import ScriptedBridge, bridge, loop, run, until  # noqa: F401 (fixtures)

P1 = "Lily had a big red ball in the park."
P2 = "Tom ate a small cake at home."
QUESTION = "What did Lily have?"
REPLY = "Lily had a red ball [1]. Tom had cake [2], not `[1]`."


def grounding() -> dict:
    """A stored grounding laid out as core.documents.ground lays one out."""
    head1, head2 = "[1] story.txt, lines 1-1\n", "[2] story.txt, lines 3-3\n"
    prompt = f"Answer with the sources.\n\n{head1}{P1}\n\n{head2}{P2}\n\nQuestion: {QUESTION}"
    s1, s2 = prompt.index(P1), prompt.index(P2)
    src = lambda n, a, text, line: {"number": n, "source": "/docs/story.txt", "page": None,  # noqa: E731
                                    "line_start": line, "line_end": line, "chunk_ids": [n],
                                    "span": [a, a + len(text)], "whole": False}
    return {"prompt": prompt, "question": QUESTION, "sources": [src(1, s1, P1, 1), src(2, s2, P2, 3)],
            "mode": "retrieved", "used": 2, "total": 7, "tokens": 60, "notes": []}


class Models(QObject):
    modelChanged = Signal(object)
    backendChanged = Signal(object)

    def __init__(self, info=None):
        super().__init__()
        self.info, self.backend = info, None


class ChatSettings(Settings):
    def chat_format(self):
        return "llama2"


@pytest.fixture
def chats(tmp_path, bridge):
    history = History(tmp_path / "h.sqlite3")
    c = ConversationController(bridge=bridge, history=history, models=Models({"name": "s"}), settings=ChatSettings())
    c.conversation.new()
    meta = {grounded.META_KEY: {"attachments": ["/docs/story.txt"], "collections": [], "grounding": grounding()}}
    user = c.conversation.add_user(QUESTION, meta=meta)
    reply = history.add_message(c.conversation.conv_id, role="assistant", text=REPLY, parent_id=user.id)
    c.conversation.pathChanged.emit()
    yield c, user, reply
    history.close()


def test_grounded_question_is_sent_with_its_passages_and_shows_chips(chats):
    c, user, reply = chats
    msgs = c.conversation.request_messages("", upto=user.id)
    assert msgs == [{"role": "user", "content": grounding()["prompt"]}]
    views = c.conversation.view_messages()
    assert views[0]["documents"] == ["story.txt", "2 of 7 passages used"]
    assert views[1]["sources"] == [1, 2] and "sources" not in views[0]


def test_citations_link_outside_code_only():
    html = grounded.link_citations("<p>red ball [1] and [9] <code>[1]</code> <a href='x'>[2]</a></p>", {1, 2})
    assert html.count('href="cite:1"') == 1 and "cite:9" not in html and "cite:2" not in html
    assert grounded.locate("red ball\u2029Tom", "a **red ball**\nTom") == (4, 18)
    assert grounded.locate("", "x") is None and grounded.locate("zebra", "a red ball") is None


def test_where_from_ranks_passages_by_the_engines_attention(loop, chats, bridge, fixtures, qtbot):
    c, user, reply = chats
    run(loop, bridge.load(fixtures / "stories260K.gguf"))
    got = []
    c.sources.ranking.connect(lambda rid, rows, none: got.append((rid, rows, none)))
    assert c.sources.where_from(reply.id, "Lily had a red ball")
    run(loop, until(lambda: got, 20, "the ranking"))
    rid, rows, none = got[0]
    # the same numbers computed here, straight from the engine
    from core import checkpoints
    lm = checkpoints.load(fixtures / "stories260K.gguf")
    req = AttributeRequest(messages=[{"role": "user", "content": grounding()["prompt"]}], reply=REPLY,
                           span=(0, len("Lily had a red ball")), passages=[tuple(s["span"]) for s in grounding()["sources"]])
    prompt = chat_format_for(lm.tokenizer, override="llama2").encode_dialog(req.messages)
    span, passages = token_spans(lm.tokenizer, prompt, lm.tokenizer.encode(REPLY), req)
    want = attribute(lm.model, prompt + lm.tokenizer.encode(REPLY), span, passages)
    assert rid == reply.id
    assert {r["number"]: r["share"] for r in rows} == pytest.approx({1: want.shares[0], 2: want.shares[1]}, abs=1e-6)
    assert [r["share"] for r in rows] == sorted((r["share"] for r in rows), reverse=True)
    assert none == pytest.approx(want.none, abs=1e-6)


def test_column_links_citations_and_shows_passage_and_ranking(loop, chats, bridge, fixtures, qtbot):
    c, user, reply = chats
    col = ChatColumn()
    qtbot.addWidget(col)
    col.attach(c)
    col.resize(760, 620)
    col.show()
    col.show_transcript()
    w = col.chat.widget_for(reply.id)
    assert w.body.cite == {1, 2} and not w.where_button.isHidden()
    assert 'href="cite:1"' in w.body.toHtml() and 'href="cite:2"' in w.body.toHtml()
    assert col.chat.widget_for(user.id).chips.text().count("span") >= 2
    w._anchor(QUrl("cite:2"))  # what clicking the link does
    assert col.sources.isVisible() and P2 in col.sources.body.toPlainText()
    assert "story.txt, line 3" in col.sources.title.text()
    col.grab().save("/tmp/docsgui-passage.png")
    # no model yet: an inline notice, no dialog
    w._ask_where()
    run(loop, until(lambda: "⚠" in col.sources.title.text(), 10, "the notice"))
    assert "no model" in col.sources.title.text()
    run(loop, bridge.load(fixtures / "stories260K.gguf"))
    w._ask_where()  # nothing selected: the whole reply
    run(loop, until(lambda: "Where did this" in col.sources.title.text(), 20, "the ranking"))
    text = col.sources.body.toPlainText()
    assert "[1] story.txt" in text and "no passage" in text and "%" in text
    col.grab().save("/tmp/docsgui-ranking.png")


def test_a_reply_starting_cancels_a_where_from_in_flight(loop, chats, bridge, fixtures, qtbot):
    c, user, reply = chats
    col = ChatColumn()
    qtbot.addWidget(col)
    col.attach(c)
    col.show()
    run(loop, bridge.load(fixtures / "stories260K.gguf"))
    got = []
    c.sources.ranking.connect(lambda *a: got.append(a))
    assert c.sources.where_from(reply.id, "Lily had a red ball")
    assert col.sources.isVisible() and "Measuring" in col.sources.title.text()
    c.reply.busyChanged.emit(True)  # what a reply starting says
    assert not col.sources.isVisible()
    run(loop, until(lambda: not bridge.busy, 10, "the worker to drop it"))
    assert got == []
    assert c.sources.where_from(reply.id, "Lily had a red ball")  # asked again: answered
    run(loop, until(lambda: got, 20, "the ranking"))
