"""State that survives a restart (gui/window_state.py), the window title, and model drops
(gui/model_drop.py): issue 22 items 7, 13 and 18."""
from __future__ import annotations

import asyncio

from PySide6.QtCore import QMimeData, QPointF, QRect, QSize, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDragLeaveEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import QApplication

from core.history.store import History
from gui.main_window import MainWindow
from tests.gui.ui_helpers import (bridge, close, data_dir, load, loop, run, send, settings, snapshot, until,  # noqa: F401
                                  window)


def _window(bridge, settings, data_dir) -> MainWindow:
    """A window as the app builds one: no resize after it, so what it restored shows."""
    w = MainWindow(bridge=bridge, history=History(data_dir / "history.sqlite3"), settings=settings,
                   autoload=False)
    w.show()
    return w


def test_size_splitter_open_chat_and_compare_geometry_survive_a_restart(qtbot, loop, bridge, settings, data_dir):
    first = _window(bridge, settings, data_dir)
    qtbot.addWidget(first)
    chats = [first.history.create_conversation(t).id for t in ("one", "two", "three")]
    first.sidebar.refresh()
    first.open_conversation(chats[1])
    screen = QGuiApplication.primaryScreen().availableGeometry()  # restoring keeps a window on screen
    first.setGeometry(QRect(screen.x() + 30, screen.y() + 40, screen.width() * 3 // 4, screen.height() * 3 // 4))
    first.splitter.setSizes([170, 520, 250])
    sizes = first.splitter.sizes()
    compare = first.open_compare()
    compare.setGeometry(QRect(screen.x() + 50, screen.y() + 20, screen.width() * 2 // 3, screen.height() * 2 // 3))
    compare_geometry = compare.geometry()
    compare.close()
    geometry = first.geometry()
    close(loop, first)

    second = _window(bridge, settings, data_dir)
    qtbot.addWidget(second)
    assert second.geometry() == geometry
    assert second.splitter.sizes() == sizes
    assert second.conversation.conv_id == chats[1]
    assert second.windowTitle().startswith("two")
    reopened = second.open_compare()
    assert reopened.size() == compare_geometry.size() != QSize(1280, 760)  # not its default size
    if screen.contains(compare_geometry):  # one wider than the screen is moved onto it by Qt
        assert reopened.pos() == compare_geometry.topLeft()
    reopened.close()
    close(loop, second)


def test_a_deleted_chat_or_junk_state_falls_back_to_the_defaults(qtbot, loop, bridge, settings, data_dir):
    settings.setValue("window/geometry", "not bytes")
    settings.setValue("window/splitter", 42)
    settings.setValue("window/chat", 9999)  # no such chat
    w = _window(bridge, settings, data_dir)
    qtbot.addWidget(w)
    assert (w.width(), w.height()) == (1200, 780)
    assert w.conversation.conv_id is None
    close(loop, w)


def test_the_title_follows_a_rename_at_once(window):
    conv = window.history.create_conversation("Before")
    window.sidebar.refresh()
    window.open_conversation(conv.id)
    assert window.windowTitle().startswith("Before")
    index = window.sidebar.index(0)
    window.sidebar.list.model().setData(index, "After")  # what an in-place edit (F2) does
    assert window.windowTitle().startswith("After — LlamaDesk")


def _drag(kind, paths, window):
    md = QMimeData()
    md.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    if kind == "enter":
        ev = QDragEnterEvent(QPointF(40, 40), Qt.CopyAction, md, Qt.LeftButton, Qt.NoModifier)
    else:
        ev = QDropEvent(QPointF(40, 40), Qt.CopyAction, md, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(window, ev)
    return ev


def test_dragging_a_model_over_the_window_says_what_a_drop_does(window, fixtures, tmp_path):
    overlay = window.drops.overlay
    assert not overlay.isVisible()
    ev = _drag("enter", [fixtures / "stories260K.gguf"], window)
    assert ev.isAccepted() and overlay.isVisible()
    assert overlay.text().startswith("Drop to open “stories260K.gguf”")
    assert overlay.geometry().width() > window.width() // 2
    snapshot(window, "drop-highlight")
    QApplication.sendEvent(window, QDragLeaveEvent())
    assert not overlay.isVisible()

    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    _drag("enter", [notes], window)
    assert overlay.isVisible() and overlay.text().startswith("“notes.txt” is not a model")
    snapshot(window, "drop-not-a-model")
    drop = _drag("drop", [notes], window)
    assert not drop.isAccepted() and not overlay.isVisible()
    assert not window.models.loading
    md = QMimeData()
    md.setText("just text")
    text = QDragEnterEvent(QPointF(40, 40), Qt.CopyAction, md, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(window, text)
    assert not text.isAccepted() and not overlay.isVisible()  # not a file: not the window's to take


def test_a_device_change_reloads_with_a_notice_and_ctrl_enter_waits_for_it(qtbot, window, loop, fixtures):
    """Item 9: the loaded model reloads on the new device with a progress notice that says why.
    Item 18: Ctrl+Enter during that reload is not ignored: the message waits, then goes."""
    gguf = str(fixtures / "stories260K.gguf")
    seen = {}

    def at_load_start(name):  # the window has shown its notice by now (connected before this)
        seen["status"] = window.status.model_status.text()
        seen["progress"] = window.status.load_progress.isVisible()
        snapshot(window, "reload-notice")

    async def scenario():
        await load(window, gguf)
        window.panel.maxTokensSpin.setValue(4)
        window.models.loadStarted.connect(at_load_start)
        done = []
        window.replyFinished.connect(done.append)
        window.models.set_device("cpu")  # Model → Device → cpu (was auto)
        assert window.models.loading
        qtbot.keyClicks(window.prompt.editor, "Once upon a time")
        qtbot.keyClick(window.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        assert window.send_wait.waiting and "sent when it is ready" in window.prompt.hint.text()
        assert window.prompt.text() == "Once upon a time"  # still there, not lost
        snapshot(window, "reload-message-waits")
        await until(lambda: done, 30, "the waiting message's reply")
        return done[0]

    reply = run(loop, scenario(), 60)
    assert seen["status"] == "Loading stories260K.gguf (device cpu)…" and seen["progress"]
    assert window.device == "cpu" and window.info["name"] == "stories260K"
    assert not window.send_wait.waiting and window.prompt.text() == ""
    path = window.history.current_path(window.conversation.conv_id)
    assert [m.role for m in path] == ["user", "assistant"] and path[0].text == "Once upon a time"
    assert reply["id"] == path[1].id


def test_a_message_waiting_for_a_load_that_fails_stays_and_is_said_not_sent(qtbot, window, loop, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)

    async def scenario():
        task = window.load_model(str(bad))
        qtbot.keyClicks(window.prompt.editor, "hello")
        qtbot.keyClick(window.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        assert window.send_wait.waiting
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: not window.send_wait.waiting, 5, "the wait to end")

    run(loop, scenario(), 30)
    assert window.prompt.text() == "hello" and window.conversation.conv_id is None
    assert "not sent" in window.statusBar().currentMessage()


def test_opening_another_chat_keeps_a_waiting_message_with_its_chat(qtbot, window, loop, fixtures):
    other = window.history.create_conversation("other")
    window.sidebar.refresh()

    async def scenario():
        task = window.load_model(str(fixtures / "stories260K.gguf"))
        qtbot.keyClicks(window.prompt.editor, "for the new chat")
        qtbot.keyClick(window.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        assert window.send_wait.waiting
        window.open_conversation(other.id)
        assert not window.send_wait.waiting
        await task

    run(loop, scenario(), 30)
    assert window.history.current_path(other.id) == [] and window.prompt.text() == ""
    window.open_conversation(None)
    assert window.prompt.text() == "for the new chat"  # its draft, unsent


def test_the_compiling_note_stays_until_a_token_after_the_compiled_step(qtbot):
    from gui.status_bar import MainStatusBar
    from gui.widgets.stats import format_stats
    bar = MainStatusBar()
    qtbot.addWidget(bar)
    bar.begin_reply(True)
    assert bar.stats_label.text() == "compiling (first reply only)…"
    bar.show_rate("1 tokens · 40.0 tok/s")  # the prompt's token: the compiled step has not run yet
    assert bar.stats_label.text() == "compiling (first reply only)… · 1 tokens · 40.0 tok/s"
    bar.show_rate("9 tokens · 3.1 tok/s")
    assert bar.stats_label.text() == "9 tokens · 3.1 tok/s"
    bar.begin_reply(False)
    bar.show_rate("1 tokens · 40.0 tok/s")
    assert bar.stats_label.text() == "1 tokens · 40.0 tok/s"
    line = format_stats({"stats": {"generated_tokens": 9, "ttft_s": 0.027, "decode": "compiled (inductor)",
                                   "warmup_s": 118.4}})
    assert line == "9 tokens · TTFT 27 ms · compiled · compile warm-up 118.4 s"


def test_the_token_counter_is_the_new_models_count_after_switching(qtbot, window, loop, fixtures):
    """Item 18: after switching models the counter is this chat counted by the new model's
    tokenizer and chat format (not 0, not the old model's count)."""
    from core.checkpoints import load as load_checkpoint
    from core.engine.settings import SamplingParams
    from core.prompt.prompting import build_prompt
    from core.worker.protocol import GenerateRequest
    from gui.model_controller import DEMO_MODEL

    async def scenario():
        await load(window, str(fixtures / "stories260K.gguf"))
        await send(qtbot, window, "Once upon a time there was a dog", max_tokens=6)
        before = window.status.context_used
        await load(window, str(DEMO_MODEL))
        await until(lambda: window.status.context_used > 0, 20, "the new model's count")
        return before

    before = run(loop, scenario(), 60)
    demo = load_checkpoint(DEMO_MODEL, device="cpu", dtype="float32")
    request = GenerateRequest(messages=window.conversation.request_messages(window.panel.system_prompt()),
                              params=SamplingParams(max_new_tokens=window.panel.maxTokensSpin.value()))
    expected = len(build_prompt(request, demo.chat_format, demo.stop_ids, demo.args.max_seq_len,
                                request.params.max_new_tokens).ids)
    assert window.status.context_used == expected != before
    assert window.status.context_bar.maximum() == window.context_length == demo.args.max_seq_len
    assert window.status.context_bar.format() == f"{expected} / {demo.args.max_seq_len} tokens"


def test_the_drop_text_names_what_the_drop_replaces_and_stops():
    from gui.model_drop import drop_text
    model = "/m/llama-3-8b.Q4_K_M.gguf"
    assert drop_text(model, [model], current=None, loading=False, busy=False) == \
        "Drop to open “llama-3-8b.Q4_K_M.gguf”"
    assert drop_text(model, [model], current="stories260K", loading=False, busy=True) == (
        "Drop to open “llama-3-8b.Q4_K_M.gguf”\nIt replaces stories260K; your chats stay\n"
        "The reply being written stops (what it wrote is kept)")
    assert drop_text(model, [model], current="stories260K", loading=True, busy=False).endswith(
        "The model loading now is cancelled")
    assert drop_text(model, [model], current=None, loading=False, busy=False, server="http://gpu:8000/v1").endswith(
        "Replies come from it instead of http://gpu:8000/v1")
    assert drop_text(None, ["/home/me/notes.txt"], current=None, loading=False, busy=False).startswith(
        "“notes.txt” is not a model")
