"""Attaching files to a message: chips that say how each file was read (or why it cannot
be), the question sent grounded in them, bad files refused inline; real files written here."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDropEvent

from core.documents import DocumentError
from core.history.store import History
from gui.chat import grounded
from gui.chat.attachments import SETTINGS_KEY, Attachments
from gui.chat.column import ChatColumn
from gui.chat.controller import ConversationController
from tests.core.cli.helpers import run_cli
from tests.core.documents.conftest import write_pdf
from tests.gui.chat.test_controller import Models, AnyBackendBridge
from tests.gui.chat.test_reply import Settings, hello
from core.history.export import export_json, import_json
from tests.gui.ui_helpers import bridge, data_dir, load, loop, run, send, settings, until, window  # noqa: F401

NOTES = "# Garden\n\nThe blue watering can stands behind the shed.\n\nTomatoes need sun every day.\n"


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "notes.md").write_text(NOTES)
    (d / "binary.txt").write_bytes(bytes(range(256)) * 64)
    with open(d / "huge.txt", "wb") as f:  # 2 GB, sparse: refused by its size, never read
        f.truncate(2 << 30)
    write_pdf(d / "locked.pdf", ["secret plans"], user_password="pw")
    write_pdf(d / "paper.pdf", ["Photosynthesis turns light into sugar.", "Roots take up water."])
    (d / "tool.exe").write_bytes(b"MZ")
    return d


@pytest.fixture
def chats(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    models = Models()
    c = ConversationController(bridge=AnyBackendBridge(hello), history=history, models=models, settings=Settings())
    models.set_model({"name": "tiny", "context_length": 2048})
    yield c
    c.attachments.close()
    history.close()


def settle(loop, a: Attachments):
    run(loop, until(lambda: all(f.state != "reading" for f in a.files), 30, "the files to be read"))


def test_bad_files_are_refused_or_marked_with_a_reason(loop, files, tmp_path):
    a = Attachments(index_path=tmp_path / "h.sqlite3")
    notices = []
    a.notice.connect(notices.append)
    assert a.add_paths([files / "notes.md", files / "paper.pdf", files / "binary.txt", files / "huge.txt",
                        files / "locked.pdf"]) == 5
    assert a.add_paths([files, files / "gone.txt", files / "tool.exe", files / "notes.md"]) == 0
    assert "folder" in notices[-1] and "not there" in notices[-1] and "tool.exe" in notices[-1]
    settle(loop, a)
    state = {f.name: (f.state, f.detail) for f in a.files}
    assert state["notes.md"][0] == "ready" and "passage" in state["notes.md"][1]
    assert state["paper.pdf"][0] == "ready"
    for bad, why in (("binary.txt", "binary"), ("huge.txt", "more than"), ("locked.pdf", "encrypted")):
        assert state[bad][0] == "failed" and why in state[bad][1].lower(), state[bad]
    a.close()


def test_a_question_is_sent_grounded_and_shows_how_it_was_read(loop, chats, files):
    c = chats
    c.attachments.add_paths([files / "notes.md", files / "binary.txt"])
    settle(loop, c.attachments)
    assert c.send("Where is the watering can?")
    run(loop, until(lambda: not c.busy and c.conversation.path() and len(c.conversation.path()) == 2, 20, "reply"))
    sent = c.reply.bridge.requests[-1].messages[-1]["content"]
    assert "behind the shed" in sent and "Question: Where is the watering can?" in sent
    user = c.conversation.path()[0]
    assert user.text == "Where is the watering can?"
    rec = grounded.documents_of(user.meta)
    assert rec["attachments"] == [str(files / "notes.md")]  # the unreadable file is left out
    views = c.conversation.view_messages()
    assert views[0]["documents"] == ["notes.md", "read in full"]
    assert not c.attachments.pending  # the next message starts with nothing attached


def test_nothing_readable_hands_the_text_back_with_the_reason(loop, chats, files):
    c = chats
    back, notices = [], []
    c.handBack.connect(lambda text, editing: back.append(text))
    c.attachments.notice.connect(notices.append)
    c.attachments.add_paths([files / "locked.pdf"])
    settle(loop, c.attachments)
    assert c.send("What are the plans?")
    run(loop, until(lambda: back, 10, "the text handed back"))
    assert back == ["What are the plans?"] and "encrypted" in notices[-1]
    assert c.conversation.path() == [] and c.attachments.pending  # nothing stored; still attached


def test_column_attaches_pasted_files_and_shows_chips(loop, chats, files, qtbot):
    col = ChatColumn()
    qtbot.addWidget(col)
    col.attach(chats)
    col.resize(760, 520)
    col.show()
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(files / "paper.pdf")), QUrl.fromLocalFile(str(files / "locked.pdf"))])
    col.prompt.editor.insertFromMimeData(mime)  # what Ctrl+V of copied files does
    assert col.prompt.text() == "" and len(chats.attachments.files) == 2
    settle(loop, chats.attachments)
    text = col.attach_bar.chips.text()
    assert "paper.pdf" in text and "passage" in text and "encrypted" in text.lower()
    col.attach_bar.chips.linkActivated.emit("rm:1")  # the locked file's ✕
    assert [f.name for f in chats.attachments.files] == ["paper.pdf"]
    plain = QMimeData()
    plain.setText("just text")
    col.prompt.editor.insertFromMimeData(plain)
    assert col.prompt.text() == "just text"
    # a document dropped on the chat is attached; a model file is left to the window (it opens it)
    (files / "model.gguf").write_bytes(b"GGUF")
    for path, taken in ((files / "notes.md", True), (files / "model.gguf", False)):
        drop = QMimeData()
        drop.setUrls([QUrl.fromLocalFile(str(path))])
        ev = QDropEvent(QPointF(10, 10), Qt.CopyAction, drop, Qt.LeftButton, Qt.NoModifier)
        assert col.drops.eventFilter(col, ev) is taken
    assert [f.name for f in chats.attachments.files] == ["paper.pdf", "notes.md"]
    settle(loop, chats.attachments)
    col.grab().save("/tmp/docsgui-attach.png")


def test_in_the_window_a_grounded_reply_says_where_it_came_from(qtbot, loop, window, fixtures, tmp_path):
    """As a user: load the model, attach a file, ask, then ask where the reply came from."""
    run(loop, load(window, fixtures / "stories260K.gguf"))
    assert window.chats.attachments.count_tokens().key == window.info["tokenizer"]  # the model's tokens
    story = tmp_path / "story.md"
    story.write_text("# Lily\n\nLily had a big red ball. She played with it in the park every day.\n")
    window.attach_bar.add([str(story)])
    settle(loop, window.chats.attachments)
    reply = run(loop, send(qtbot, window, "What did Lily have?", max_tokens=12))
    user = window.chats.conversation.path()[0]
    assert grounded.summary(user.meta) == "read in full" and not window.chats.attachments.pending
    w = window.chat.widget_for(reply["id"])
    assert w.body.cite == {1} and w.where_button.isVisible()
    assert "read in full" in window.chat.widget_for(user.id).chips.text()
    w.where_button.click()
    panel = window.column.sources
    run(loop, until(lambda: "Where did this" in panel.title.text(), 20, "the ranking"))
    assert "[1] story.md" in panel.body.toPlainText() and "no passage" in panel.body.toPlainText()
    window.grab().save("/tmp/docsgui-window-grounded.png")
    # exported and imported, the question keeps its documents and the reply its sources
    data = export_json(window.history, window.chats.conversation.conv_id)
    conv = import_json(window.history, data)
    window.chats.open(conv.id)
    views = window.chats.conversation.view_messages()
    assert views[0]["documents"] == ["story.md", "read in full"] and views[1]["sources"] == [1]
    window.chats.attachments.configure(mode="hybrid")  # the window keeps the choice in its settings
    assert json.loads(window.settings.value(SETTINGS_KEY))["mode"] == "hybrid"


def test_retrieval_settings_decide_how_much_is_read(loop, qtbot, files, tmp_path):
    a = Attachments(index_path=tmp_path / "h.sqlite3")
    long = files / "long.md"
    long.write_text("\n\n".join(f"## Part {i}\n\nParagraph {i} is about the harbour, boats and gulls number {i}. "
                                + "Filler words about the sea. " * 20 for i in range(40))
                    + "\n\n## Shed\n\nThe blue watering can stands behind the shed.\n")
    a.add_paths([long])
    settle(loop, a)
    from gui.chat.attach_bar import AttachBar
    bar = AttachBar()
    qtbot.addWidget(bar)
    bar.attach(a)
    bar.collections_menu.aboutToShow.emit()
    sub = {act.text(): act.menu() for act in bar.collections_menu.actions() if act.menu()}
    assert set(sub) == {"Retrieval", "Embedding Model", "Passages", "Documents Budget"}
    next(x for x in sub["Passages"].actions() if x.text() == "Top 3").trigger()
    assert a.k == 3
    rec = run(loop, a.ground("Where is the watering can?", 2048))
    g = rec[grounded.META_KEY]["grounding"]
    assert g["mode"] == "retrieved" and g["used"] == 3 and "behind the shed" in g["prompt"]
    assert grounded.summary(rec) == f"3 of {g['total']} passages used"
    next(x for x in sub["Retrieval"].actions() if x.text().startswith("Dense")).trigger()
    if importlib.util.find_spec("wordllama"):  # the built-in embedding model: no download
        rec = run(loop, a.ground("Where is the watering can?", 2048))
        g = rec[grounded.META_KEY]["grounding"]
        assert a.embedder == "wordllama" and g["used"] == 3 and "behind the shed" in g["prompt"]
    next(x for x in sub["Embedding Model"].actions() if x.text().startswith("bge")).trigger()
    assert a.embedder == "bge-small"
    with pytest.raises(DocumentError, match="embedding model"):
        run(loop, a.ground("Where is the watering can?", 2048))
    a.close()


def test_the_app_grounds_a_message_as_the_cli_does(loop, bridge, fixtures, tmp_path, capsys):
    """Same file, same model: the app's grounding (counted by the worker's tokenizer, handed
    over with Loaded) is the CLI's `generate --attach`, passage for passage and token for token."""
    model = fixtures / "stories260K.gguf"
    info = run(loop, bridge.load(model, device="cpu"))
    story = tmp_path / "story.md"
    story.write_text("\n\n".join(f"## Day {i}\n\nLily took her red ball to the park on day {i}. " + "The sun was warm "
                                 "and the birds sang in the tall green trees. " * 6 for i in range(30))
                     + "\n\n## Day 31\n\nLily took her yellow kite to the park and flew it high.\n")
    a = Attachments(index_path=tmp_path / "app.sqlite3", counter=lambda: bridge.token_counter)
    a.add_paths([story])
    settle(loop, a)
    app = run(loop, a.ground("Which kite did Lily fly in the park?", info["context_length"]))[grounded.META_KEY]
    rc, out, err = run_cli(capsys, "generate", model, "--prompt", "Which kite did Lily fly in the park?", "--attach", story,
                           "--max-new-tokens", "1", "--json", "--store", tmp_path / "cli.sqlite3")
    cli = json.loads(out)["documents"]
    assert rc == 0 and json.loads(json.dumps(app["grounding"])) == cli and cli["mode"] == "retrieved"
    assert "kite" in cli["prompt"][slice(*cli["sources"][0]["span"])]
    tok = bridge.token_counter.tokenizer  # the passages are sized in the model's tokens, not words
    assert cli["tokens"] == len(tok.encode(cli["prompt"])) <= info["context_length"] // 2
    a.close()


def test_retrieval_choices_are_kept_across_runs(tmp_path):
    ini = str(tmp_path / "settings.ini")
    s = QSettings(ini, QSettings.IniFormat)
    a = Attachments(index_path=":memory:")
    a.use_settings(s)
    a.configure(mode="hybrid", k=5, share=0.25, embedder="bge-small")
    s.sync()
    b = Attachments(index_path=":memory:")  # the next run, from the file
    b.use_settings(QSettings(ini, QSettings.IniFormat))
    assert (b.mode, b.k, b.share, b.embedder) == ("hybrid", 5, 0.25, "bge-small")
    for bad in ('{"mode": "magic", "k": 7, "share": "half", "embedder": "word2vec"}', "not json", "[1]"):
        s.setValue(SETTINGS_KEY, bad)
        c = Attachments(index_path=":memory:")
        c.use_settings(s)  # what this version does not offer falls back to the defaults
        assert (c.mode, c.k, c.share, c.embedder) == ("bm25", None, 0.5, "wordllama")
