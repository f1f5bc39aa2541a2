"""The app with the store's failures: a reply saved while it streams, a damaged store
moved aside at start-up with a notice (issue 12)."""
from __future__ import annotations

import os
import sqlite3

import pytest
from PySide6.QtCore import Qt

from core.history.partial import INCOMPLETE
from core.history.store import History
from gui.main_window import MainWindow
from tests.gui.ui_helpers import bridge, close, data_dir, loop, run, settings, until  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def test_a_streaming_reply_is_in_the_store_before_it_ends(qtbot, loop, bridge, settings, data_dir, fixtures):  # noqa: F811
    w = MainWindow(bridge=bridge, history=History(data_dir / "history.sqlite3"), settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.show()
    reader = History(data_dir / "history.sqlite3")  # what a crash now would leave on disk

    def on_disk():
        if w.conversation.conv_id is None:
            return []
        return [m for m in reader.messages(w.conversation.conv_id) if m.role == "assistant"]

    async def scenario():
        await w.load_model(str(fixtures / "stories260K.gguf"))
        w.panel.maxTokensSpin.setValue(2000)
        w.panel.temperatureSpin.setValue(1.0)
        done = []
        w.replyFinished.connect(done.append)
        qtbot.keyClicks(w.prompt.editor, "Once upon a time")
        qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: on_disk() or done, 30, "the partial reply on disk")
        if done:
            pytest.skip("the reply ended before it was seen streaming")
        partial = on_disk()[0]
        assert partial.stop_reason == INCOMPLETE and partial.text
        qtbot.keyClick(w.prompt.editor, Qt.Key_Escape)
        await until(lambda: done, 30, "the stopped reply")
        final = on_disk()
        assert len(final) == 1 and final[0].id == partial.id  # the same message, finished
        assert final[0].stop_reason in ("cancelled", "eos", "length") and final[0].text == done[0]["text"]
        assert reader.current_path(w.conversation.conv_id)[-1].id == partial.id
        return True

    try:
        assert run(loop, scenario(), 90)
    finally:
        reader.close()
        close(loop, w)


def test_a_damaged_store_at_start_up_is_kept_and_said(qtbot, loop, bridge, settings, data_dir):  # noqa: F811
    bad = data_dir / "history.sqlite3"
    bad.write_bytes(b"this is not a database " * 200)
    w = MainWindow(bridge=bridge, settings=settings, autoload=False)  # the default store, as the app opens it
    qtbot.addWidget(w)
    w.show()
    try:
        assert "damaged" in w.chat.notice.text() and w.chat.notice.isVisible()
        kept = [p for p in data_dir.iterdir() if ".damaged-" in p.name]
        assert len(kept) == 1 and kept[0].read_bytes() == b"this is not a database " * 200
        assert w.history.conversations() == []
    finally:
        close(loop, w)



def test_a_message_that_cannot_be_saved_stays_in_the_editor_with_a_retry(qtbot, loop, bridge, settings, data_dir,  # noqa: F811
                                                                         fixtures):
    h = History(data_dir / "history.sqlite3")
    w = MainWindow(bridge=bridge, history=h, settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.show()
    text = "Once upon a time"
    errors = []
    w.reply.failed.connect(lambda title, msg: errors.append(title))

    async def scenario():
        await w.load_model(str(fixtures / "stories260K.gguf"))
        w.panel.maxTokensSpin.setValue(4)
        done = []
        w.replyFinished.connect(done.append)
        h._conn.execute("PRAGMA query_only = ON")  # every write now fails as on a read-only store
        w.prompt.set_text(text)
        qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        assert w.send_notice.isVisible() and "readonly" in w.send_notice.text()
        assert w.prompt.text() == text and not w.busy  # kept, nothing sent
        assert w.conversation.conv_id is None or not h.messages(w.conversation.conv_id)
        qtbot.mouseClick(w.send_notice.button, Qt.LeftButton)  # still full: still there, still said
        assert w.send_notice.isVisible() and w.prompt.text() == text and not w.busy
        h._conn.execute("PRAGMA query_only = OFF")  # writable again
        qtbot.mouseClick(w.send_notice.button, Qt.LeftButton)
        assert not w.send_notice.isVisible() and w.prompt.text() == ""
        await until(lambda: done, 30, "the reply")
        msgs = h.messages(w.conversation.conv_id)
        assert [m.role for m in msgs] == ["user", "assistant"] and msgs[0].text == text
        assert msgs[1].id == done[0]["id"] and msgs[1].stop_reason in ("length", "eos")
        return True

    try:
        assert run(loop, scenario(), 90)
        assert errors == []  # said inline, not by a dialog
    finally:
        close(loop, w)


def test_text_repaired_before_sending_is_said(qtbot, loop, bridge, settings, data_dir, fixtures):  # noqa: F811
    h = History(data_dir / "history.sqlite3")
    w = MainWindow(bridge=bridge, history=h, settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.show()

    async def scenario():
        await w.load_model(str(fixtures / "stories260K.gguf"))
        w.panel.maxTokensSpin.setValue(2)
        done = []
        w.replyFinished.connect(done.append)
        w.send("fine text")
        await until(lambda: done, 30, "the first reply")
        assert "\ufffd" not in w.statusBar().currentMessage()
        w.send("a\ud800b " + os.fsdecode(b"\xff"))  # a lone surrogate and an undecodable byte
        assert "replaced with \ufffd" in w.statusBar().currentMessage()
        await until(lambda: len(done) == 2, 30, "the second reply")
        user = h.messages(w.conversation.conv_id)[2]
        assert user.text == "a\ufffdb \ufffd" and user.meta["text_repaired"] is True
        return True

    try:
        assert run(loop, scenario(), 90)
    finally:
        close(loop, w)


def test_a_store_missing_its_messages_table_is_kept_and_said(qtbot, loop, bridge, settings, data_dir):  # noqa: F811
    path = data_dir / "history.sqlite3"
    with History(path) as h:
        h.create_conversation("old chat")
    con = sqlite3.connect(path)
    con.execute("DROP TABLE messages")
    con.commit()
    con.close()
    w = MainWindow(bridge=bridge, settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.show()
    try:
        assert "damaged" in w.chat.notice.text() and w.chat.notice.isVisible()
        assert len([p for p in data_dir.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]) == 1
        c = w.history.create_conversation("new")  # the fresh store holds messages again
        w.history.add_message(c.id, role="user", text="hi")
    finally:
        close(loop, w)


def test_a_data_folder_that_is_a_file_is_said_in_the_window(qtbot, loop, bridge, settings, tmp_path, monkeypatch):  # noqa: F811
    blocker = tmp_path / "LlamaDesk"
    blocker.write_text("a file where the data folder should be")
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(blocker))
    w = MainWindow(bridge=bridge, settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.show()
    try:
        text = w.chat.notice.text()
        assert w.chat.notice.isVisible() and f"{blocker} is a file, not a folder" in text and "memory only" in text
    finally:
        close(loop, w)
    assert blocker.read_text() == "a file where the data folder should be"
