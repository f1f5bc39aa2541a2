"""The main window end to end: the real bridge and worker, the stories260K fixture model."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch
from PySide6.QtCore import QMimeData, QPointF, QSize, Qt, QUrl
from PySide6.QtGui import QAction, QColor, QContextMenuEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QApplication, QLabel, QMenu, QMessageBox, QSlider, QWidget

from core.history.export import export_json
from gui import actions, theme
from gui.bridge import BridgeError
from gui.widgets.stats import format_stats
from gui.dialogs.model_dialog import ModelInfoDialog
from tests.gui.ui_helpers import (ROOT, bridge, clipped_texts, close, data_dir, load, loop, make_window,  # noqa: F401
                                  run, send, settings, snapshot, until, window)

NAMES = ["mainWindow", "promptEditor", "sendButton", "stopButton", "temperatureSlider", "temperatureSpin",
         "topPSlider", "topPSpin", "topKSpin", "maxTokensSpin", "seedSpin", "systemPrompt", "transcript",
         "conversationList", "modelStatus", "statsLabel"]


@pytest.fixture
def gguf(fixtures):
    return str(fixtures / "stories260K.gguf")


def last_view(w):
    return w.chat.widgets[-1].message if w.chat.widgets else None


def test_names_and_no_model_state(window):
    for name in NAMES:
        w = window if name == "mainWindow" else window.findChild(QWidget, name)
        assert w is not None, name
        assert w.accessibleName(), name
    assert "LlamaDesk" in window.windowTitle()
    assert not window.prompt.send_button.isEnabled()
    assert "No model" in window.prompt.hint.text()
    # the transcript says how to get a model; the line under the prompt only why Send is off
    assert window.prompt.hint.text() not in window.chat.empty_hint.text()
    assert window.focusWidget() is window.prompt.editor  # focus starts in the prompt


def test_chat_end_to_end(qtbot, window, loop, gguf, data_dir):
    async def scenario():
        window.ask_model_path = lambda: gguf  # the dialog's answer
        window.open_model_dialog()
        await until(lambda: window.info is not None, 30, "model load")
        assert "stories260K" in window.windowTitle() and "LlamaDesk" in window.windowTitle()
        assert window.prompt.send_button.isEnabled() is False  # empty prompt
        assert "260" in window.status.model_status.text() or "stories" in window.status.model_status.text()

        # Enter is a newline, Ctrl+Enter sends
        qtbot.keyClicks(window.prompt.editor, "Once upon a time")
        qtbot.keyClick(window.prompt.editor, Qt.Key_Return)
        assert "\n" in window.prompt.text() and not window.busy
        window.prompt.clear()

        # temperature by the slider: 0 = greedy, recorded with the reply
        slider = window.findChild(QSlider, "temperatureSlider")
        slider.setValue(slider.minimum())
        assert window.panel.params().temperature == 0
        chunks = []
        streamed = []
        window.busyChanged.connect(lambda b: streamed.append(b))
        view = await send(qtbot, window, "Once upon a time", max_tokens=32)
        assert view["settings"]["temperature"] == 0
        assert view["text"].strip()
        assert view["stop_reason"] in ("eos", "length", "stop", "context")
        assert view["seed"] is not None
        assert "tokens" in window.status.stats_label.text() and "stop:" in window.status.stats_label.text()
        assert view["text"] in window.chat.toPlainText()
        assert window.status.context_used > 0 and window.status.context_bar.maximum() == window.context_length
        # stored
        path = window.history.current_path(window.conversation.conv_id)
        assert [m.role for m in path] == ["user", "assistant"]
        assert path[1].text == view["text"] and path[1].settings["temperature"] == 0
        assert window.sidebar.list.model().rowCount() == 1

        # regenerate (Ctrl+R) keeps versions, switch between them
        slider.setValue(slider.maximum() // 2)  # temperature 1: another version
        done = []
        window.replyFinished.connect(done.append)
        qtbot.keyClick(window.prompt.editor, Qt.Key_R, Qt.ControlModifier)
        await until(lambda: done, 30, "regenerated reply")
        second = done[0]
        assert second["version"] == (2, 2)
        assert second["settings"]["temperature"] == pytest.approx(1.0, abs=0.05)
        w = window.chat.widgets[-1]
        assert w.version_label.text() == "2/2" and w.prev_button.isVisible()
        qtbot.mouseClick(w.prev_button, Qt.LeftButton)
        await until(lambda: window.chat.widgets[-1].message["version"] == (1, 2), 5, "switch")
        assert window.chat.widgets[-1].message["text"] == view["text"]
        window.chat.widgets[-1].next_button.click()
        await until(lambda: window.chat.widgets[-1].message["version"] == (2, 2), 5, "switch back")

        # edit the user message and resend: a new branch, the old one stays reachable
        user_id = window.chat.widgets[0].msg_id
        window.chat.widgets[0].buttons["edit"].click()
        assert window.prompt.editing == user_id and window.prompt.text() == "Once upon a time"
        window.prompt.set_text("The little dog")
        done.clear()
        qtbot.keyClick(window.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: done, 30, "reply to the edit")
        assert window.chat.widgets[0].message["text"] == "The little dog"
        assert window.chat.widgets[0].message["version"] == (2, 2)
        window.chat.widgets[0].prev_button.click()
        await until(lambda: window.chat.widgets[0].message["text"] == "Once upon a time", 5, "old branch")
        assert len(window.chat.widgets) == 2

        # delete a message
        window.chat.widgets[-1].buttons["delete"].click()
        await until(lambda: len(window.chat.widgets) == 2 and window.chat.widgets[-1].message["version"] == (1, 1), 5,
                    "deleted version")
        return True

    assert run(loop, scenario(), 90)


def test_stop_mid_reply_and_continue(qtbot, window, loop, gguf):
    async def scenario():
        await load(window, gguf)
        window.panel.maxTokensSpin.setValue(400)
        done = []
        window.replyFinished.connect(done.append)
        # The story model may end a story (eos) before Esc lands on a busy machine: retry.
        for attempt in range(3):
            done.clear()
            window.new_chat()
            qtbot.keyClicks(window.prompt.editor, "Once upon a time")
            renders = window.chat.renders
            qtbot.mouseClick(window.prompt.send_button, Qt.LeftButton)
            await until(lambda: window.chat.renders > renders or done, 20, "first streamed text")
            if not done:
                assert window.prompt.stop_button.isVisible() and window.busy
                snapshot(window, "main_streaming_light")
                qtbot.keyClick(window.prompt.editor, Qt.Key_Escape)
            await until(lambda: done, 20, "stopped reply")
            if done[0]["stop_reason"] == "cancelled":
                break
        assert done[0]["stop_reason"] == "cancelled"
        assert not window.busy and window.prompt.send_button.isVisible()
        m = window.history.current_path(window.conversation.conv_id)[-1]
        assert m.stop_reason == "cancelled" and m.text == done[0]["text"]

        # a reply that stops on length can be continued
        window.panel.maxTokensSpin.setValue(4)
        qtbot.keyClicks(window.prompt.editor, "Tell me more")
        done.clear()
        qtbot.keyClick(window.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: done, 20, "short reply")
        first = done[0]
        if first["stop_reason"] != "length":
            pytest.skip("the model ended its reply within 4 tokens")
        w = window.chat.widgets[-1]
        assert w.buttons["continue"].isVisible()
        done.clear()
        w.buttons["continue"].click()
        await until(lambda: done, 20, "continued reply")
        assert done[0]["id"] == first["id"]
        assert done[0]["text"].startswith(first["text"]) and len(done[0]["text"]) > len(first["text"])
        assert done[0]["stats"]["generated_tokens"] > first["stats"]["generated_tokens"]
        return True

    assert run(loop, scenario(), 60)


def test_broken_model_gives_dialog_and_app_keeps_working(qtbot, window, loop, gguf, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")

    async def scenario():
        for path in (str(bad), str(notes), str(tmp_path / "missing")):
            await window.load_model(path)
            box = await until(lambda: next((b for b in window.findChildren(QMessageBox) if b.isVisible()), None),
                              5, "error dialog")
            assert "Could not load" in box.text() or "Could not load" in box.windowTitle()
            assert box.text().count(path) == 1, box.text()  # the path once, not twice
            assert not any(raw in box.text() for raw in ("Traceback", "Error:", "we cannot handle")), box.text()
            box.accept()
            assert window.info is None
        # still usable: a good model loads and replies
        await load(window, gguf)
        view = await send(qtbot, window, "Hi", max_tokens=8)
        assert view["id"] is not None
        return True

    assert run(loop, scenario(), 60)


def test_quit_mid_generation_then_restart(qtbot, loop, bridge, settings, data_dir, gguf):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)

    async def scenario():
        await load(w, gguf)
        w.panel.maxTokensSpin.setValue(400)
        qtbot.keyClicks(w.prompt.editor, "Once upon a time")
        qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: w.chat.stream_text, 20, "streamed text")
        qtbot.keyClick(w.prompt.editor, Qt.Key_Q, Qt.ControlModifier)  # Ctrl+Q
        assert not w.isVisible()
        await until(lambda: not bridge.busy, 10, "worker idle")
        return w.conversation.conv_id

    conv_id = run(loop, scenario(), 60)
    w.history.close()
    # "restart": a new window over the same data finds the conversation and the partial reply
    w2 = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w2)
    assert w2.sidebar.list.model().rowCount() == 1
    w2.open_conversation(conv_id)
    roles = [m["role"] for m in w2.conversation.view_messages()]
    assert roles == ["user", "assistant"]
    reply = w2.conversation.view_messages()[-1]
    assert reply["stop_reason"] == "cancelled" and reply["text"]
    # it opens the last model by default
    assert w2.models.initial_model(None) == gguf
    close(loop, w2)


def test_export_import_round_trip(qtbot, window, loop, gguf, tmp_path):
    async def scenario():
        await load(window, gguf)
        await send(qtbot, window, "Once upon a time", max_tokens=8)
        await send(qtbot, window, "And then?", max_tokens=8)
        return True

    run(loop, scenario(), 60)
    conv_id = window.conversation.conv_id
    md_path, js_path = tmp_path / "c.md", tmp_path / "c.json"
    window.ask_save_path = lambda title, name, filt: str(md_path if name.endswith(".md") else js_path)
    assert window.export_conversation("md") == str(md_path)
    assert window.export_conversation("json") == str(js_path)
    md = md_path.read_text()
    texts = [m.text for m in window.history.current_path(conv_id)]
    for t in texts:
        assert t.strip() in md
    data = json.loads(js_path.read_text())
    # Token probabilities are recorded on demand only (View → Record Token Probabilities):
    # by default an export holds the text, settings and stats, not ~1 KB per token.
    assert not window.action("record_probs").isChecked()
    assert all("tokens" not in (m.get("meta") or {}) for m in data["messages"])
    # Ctrl+Shift+C copies the last reply; Ctrl+L comes back to the prompt
    window.sidebar.list.setFocus()
    qtbot.keyClick(window.sidebar.list, Qt.Key_C, Qt.ControlModifier | Qt.ShiftModifier)
    assert QGuiApplication.clipboard().text() == texts[-1]
    qtbot.keyClick(window.sidebar.list, Qt.Key_L, Qt.ControlModifier)
    assert window.focusWidget() is window.prompt.editor
    window.ask_open_path = lambda title, filt: str(js_path)
    new_id = window.import_conversation()
    assert new_id != conv_id and window.conversation.conv_id == new_id
    assert [m.text for m in window.history.current_path(new_id)] == texts
    assert window.sidebar.list.model().rowCount() == 2
    assert json.loads(json.dumps(export_json(window.history, new_id)))["messages"][0]["text"] == data["messages"][0]["text"]


def test_conversation_list_new_rename_search_delete(qtbot, window, loop, gguf):
    async def scenario():
        await load(window, gguf)
        await send(qtbot, window, "Once upon a time", max_tokens=4)
        qtbot.keyClick(window.prompt.editor, Qt.Key_N, Qt.ControlModifier)
        assert window.conversation.conv_id is None and not window.chat.widgets
        await send(qtbot, window, "A cat sat", max_tokens=4)
        return True

    run(loop, scenario(), 60)
    assert window.sidebar.list.model().rowCount() == 2
    index = window.sidebar.index(0)
    cid = index.data(Qt.UserRole)
    window.sidebar.list.model().setData(index, "Cats")  # what an in-place edit (F2 / double-click) does
    assert window.history.conversation(cid).title == "Cats" and window.sidebar.index(0).data() == "Cats"
    window.sidebar.search.setText("upon")
    assert window.sidebar.list.model().rowCount() == 1
    window.sidebar.search.setText("")
    first = window.sidebar.index(1)
    first_id = first.data(Qt.UserRole)
    qtbot.mouseClick(window.sidebar.list.viewport(), Qt.LeftButton, pos=window.sidebar.list.visualRect(first).center())
    assert window.conversation.conv_id == first_id
    assert window.chat.widgets[0].message["text"] == "Once upon a time"
    window.confirm = lambda title, text: True
    window.delete_current()
    assert window.sidebar.list.model().rowCount() == 1 and window.conversation.conv_id is None


def test_drop_and_recent_models(qtbot, window, loop, gguf, settings):

    md = QMimeData()
    md.setUrls([QUrl.fromLocalFile(gguf)])
    ev = QDropEvent(QPointF(10, 10), Qt.CopyAction, md, Qt.LeftButton, Qt.NoModifier)

    async def scenario():
        # A drag enters (the drop handler, gui/model_drop.py, takes it), then drops.
        QApplication.sendEvent(window, QDragEnterEvent(QPointF(10, 10), Qt.CopyAction, md, Qt.LeftButton, Qt.NoModifier))
        QApplication.sendEvent(window, ev)
        await until(lambda: window.info is not None, 30, "dropped model loads")
        return True

    run(loop, scenario(), 40)
    window.fill_recent(window.menu("recent"))
    assert gguf in [a.text() for a in window.menu("recent").actions()]
    assert window.recent.last() == gguf


def test_context_bar_and_dropped_turns_notice(qtbot, window, loop, gguf):
    story = "Once upon a time there was a little dog who liked to play in the park. " * 60
    msgs = []
    for i in range(6):
        msgs.append({"id": i + 1, "parent_id": i or None, "role": "user" if i % 2 == 0 else "assistant",
                     "text": f"{i}: {story}"})
    window.conversation.import_json({"format": "llamadesk.conversation", "version": 1,
                                     "conversation": {"title": "Long", "kind": "chat", "current_leaf_id": 6},
                                     "messages": msgs})
    assert not window.chat.notice.isVisible()

    async def scenario():
        await load(window, gguf)
        view = await send(qtbot, window, "And then?", max_tokens=8)
        return view

    view = run(loop, scenario(), 60)
    ctx = window.info["context_length"]
    assert window.status.context_bar.maximum() == ctx
    assert 0 < window.status.context_used <= ctx
    assert window.chat.notice.isVisible() and "left out" in window.chat.notice.text()
    assert window.history.message(view["id"]).meta.get("dropped_messages", 0) > 0


def test_model_info_dialog_and_device_choice(qtbot, window, loop, gguf, settings):
    run(loop, load(window, gguf), 30)
    window.show_model_info()
    dlg = next(d for d in window.findChildren(ModelInfoDialog) if d.isVisible())
    text = " ".join(lbl.text() for lbl in dlg.findChildren(QLabel))
    for word in ("Parameters", "Context length", "Data type", "Device", "Memory", "float32", "cpu"):
        assert word in text, word
    dlg.accept()
    window.findChild(QAction, "device_cpu").trigger()
    window.findChild(QAction, "dtype_float32").trigger()
    assert window.device == "cpu" and window.dtype == "float32"
    assert settings.value("models/device") == "cpu"
    run(loop, window.load_model(gguf), 30)
    assert window.info["device"] == "cpu" and window.info["dtype"] == "float32"
    window.findChild(QAction, "dtype_int4").trigger()  # quantize linear weights at load
    run(loop, window.load_model(gguf), 30)
    assert window.dtype == "int4" and window.info["linear_paths"].get("int4 int4-packed", 0) > 0


def test_load_progress_and_cancel(qtbot, window, loop, bridge, monkeypatch):
    """Progress shows stage and fraction; Cancel ends the load without an error dialog."""
    cancelled = asyncio.Event()

    async def slow_load(path, **kw):
        bridge.loadProgress.emit(0.4, "Reading tensors")
        await cancelled.wait()
        raise BridgeError("load cancelled", cancelled=True)

    monkeypatch.setattr(bridge, "load", slow_load)
    monkeypatch.setattr(bridge, "cancel_all", cancelled.set)

    async def scenario():
        task = window.load_model("/some/model")
        await until(lambda: window.status.load_progress.isVisible() and window.status.load_progress.bar.value() == 400, 5,
                    "progress")
        assert window.status.load_progress.stage.text() == "Reading tensors"
        snapshot(window, "main_loading")
        assert not window.prompt.send_button.isEnabled()
        window.status.load_progress.cancel.click()
        await task
        assert not window.status.load_progress.isVisible() and window.info is None
        assert not [b for b in window.findChildren(QMessageBox) if b.isVisible()]
        assert "No model" in window.status.model_status.text()
        return True

    assert run(loop, scenario(), 20)


def test_import_of_a_file_that_is_not_an_export_says_so(qtbot, window, loop, tmp_path):
    for name, data in [("notes.txt", b"just some notes"), ("photo.json", b"\x89PNG\r\n\x1a\n\x00\xff")]:
        path = tmp_path / name
        path.write_bytes(data)
        window.ask_open_path = lambda title, filt: str(path)
        assert window.import_conversation() is None
        box = next(b for b in window.findChildren(QMessageBox) if b.isVisible())
        text = box.text()
        assert "is not a LlamaDesk conversation file" in text and "Export as JSON" in text
        assert "Expecting value" not in text and "codec" not in text and text.count(str(path)) == 1, text
        box.accept()
    assert window.sidebar.list.model().rowCount() == 0  # nothing was imported


def test_export_file_names_are_the_title_without_trailing_punctuation(window, tmp_path):
    conv = window.history.create_conversation("What is 2+2?")
    window.open_conversation(conv.id)
    window.history.add_message(conv.id, role="user", text="What is 2+2?")
    names = []
    window.ask_save_path = lambda title, name, filt: names.append(name)
    window.export_conversation("md")
    window.export_conversation("json")
    assert names == ["What is 2 2.md", "What is 2 2.json"]


def test_ctrl_o_is_the_one_open_model_action(qtbot, window):
    w = window
    opens = [a for a in w.findChildren(QAction) if a.text().replace("&", "").startswith("Open")]
    assert [a.objectName() for a in opens] == ["openModelAction"]
    assert opens[0].shortcut() == QKeySequence("Ctrl+O")
    asked = []
    w.ask_model_path = lambda: asked.append(True)
    qtbot.keyClick(w, Qt.Key_O, Qt.ControlModifier)
    assert asked == [True]


def _readable(keys) -> str:
    # Ctrl+Return and keypad Ctrl+Enter are one "Ctrl+Enter" to a reader.
    return " / ".join(sorted({k.toString(QKeySequence.PortableText).replace("Return", "Enter") for k in keys}))


def test_readme_shortcut_table_matches_the_actions_table(window):
    """README's key table is gui/actions.py's table, and the window's shortcuts are that table's."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Keyboard shortcuts", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in section.splitlines()[2:] if line.startswith("|")]
    documented = {(keys.strip(), action.strip().split(" (")[0]) for keys, action in rows}
    table = {(_readable(actions.key_sequences(row)), row.text.replace("&", "").rstrip("…"))
             for row in actions.ACTIONS if isinstance(row, actions.Action) and row.shortcut}
    assert documented == table
    actual = {(_readable(a.shortcuts()), a.text().replace("&", "").rstrip("…"))
              for a in window.findChildren(QAction) if a.shortcuts()}
    assert actual == table


def _contrast(a, b) -> float:
    def lum(c):
        def ch(v):
            v /= 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
        return 0.2126 * ch(c.red()) + 0.7152 * ch(c.green()) + 0.0722 * ch(c.blue())
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_context_bar_text_reads_on_the_fill(qapp, window, mode):
    theme.apply(qapp, mode)
    try:
        window.status.show_context(600, 1000)
        bar = window.status.context_bar
        img = bar.grab().toImage()
        text = QColor(theme.colors()["text"])
        # the fill, left of the centred text, and the track, right of it
        for x in (6, bar.width() - 6):
            bg = img.pixelColor(x, img.height() // 2)
            assert _contrast(text, bg) >= 4.5, (mode, x, bg.name(), text.name())
    finally:
        theme.apply(qapp, "light")


@pytest.mark.parametrize("size", ["800x560", "minimum"])
def test_preset_box_shows_a_user_preset_name_whole(window, size):
    window.panel.save_preset("Balanced (mine)")
    assert window.panel.presetCombo.currentText() == "Balanced (mine)"
    if size == "minimum":
        window.resize(window.minimumSizeHint())
    else:
        window.resize(800, 560)
    problems = [p for p in clipped_texts(window.panel) if "preset" in p.lower()]
    assert problems == []


def _chat_with_history(window, title, messages):
    """A stored chat (no model needed): [(role, text, stats, model_id, stop_reason)]."""
    conv = window.history.create_conversation(title)
    parent = None
    for role, text, stats, model_id, stop in messages:
        parent = window.history.add_message(conv.id, role=role, text=text, parent_id=parent, stats=stats,
                                            model_id=model_id, stop_reason=stop).id
    window.sidebar.refresh()
    return conv.id


def test_status_bar_follows_the_shown_version_the_model_and_unload(qtbot, window, loop, gguf):

    async def scenario():
        await load(window, gguf)
        await send(qtbot, window, "Once upon a time", max_tokens=6)
        window.panel.maxTokensSpin.setValue(12)
        done = []
        window.replyFinished.connect(done.append)
        window.chats.regenerate()
        await until(lambda: done, 30, "regenerated reply")
        return True

    run(loop, scenario(), 60)
    path = window.conversation.path()
    v2 = path[-1]
    assert window.status.stats_label.text() == format_stats(window.conversation.view_message(v2))
    v1_id = window.conversation.switch_version(v2.id, -1)  # what ‹ does
    v1 = window.history.message(v1_id)
    assert window.status.stats_label.text() == format_stats(window.conversation.view_message(v1))
    assert window.status.stats_label.text() != format_stats(window.conversation.view_message(v2))
    assert window.status.context_used == v1.stats["prompt_tokens"] + v1.stats["generated_tokens"]

    # another model (another tokenizer): the old count is not shown as this model's
    window.models.set_model({**window.info, "name": "another-model", "context_length": 4096})
    assert window.status.context_used == 0 and window.status.context_bar.maximum() == 4096

    run(loop, window.bridge.unload(), 30)
    assert window.info is None
    assert window.status.stats_label.text() == "" and window.status.context_used == 0
    assert "—" in window.status.context_bar.format()


def test_continue_and_regenerate_hidden_without_a_model(qtbot, window, loop, gguf):
    _chat_with_history(window, "Cut short", [("user", "Hi", None, None, None),
                                             ("assistant", "Once upon", {"generated_tokens": 2}, "stories260K", "length")])
    window.open_conversation(window.sidebar.index(0).data(Qt.UserRole))
    reply = window.chat.widgets[-1]
    assert window.info is None
    shown = lambda name: not reply.buttons[name].isHidden()  # noqa: E731  (buttons show on hover)
    assert not shown("continue") and not shown("regenerate") and shown("copy")

    run(loop, load(window, gguf), 30)
    reply = window.chat.widgets[-1]
    assert shown("continue") and shown("regenerate")


def test_right_click_in_the_chat_list_keeps_list_and_transcript_together(qtbot, window):
    a = _chat_with_history(window, "Apples", [("user", "about apples", None, None, None)])
    b = _chat_with_history(window, "Bananas", [("user", "about bananas", None, None, None)])
    window.open_conversation(a)
    item_b = next(window.sidebar.index(i) for i in range(window.sidebar.list.model().rowCount())
                  if window.sidebar.index(i).data(Qt.UserRole) == b)
    pos = window.sidebar.list.visualRect(item_b).center()
    vp = window.sidebar.list.viewport()
    qtbot.mousePress(vp, Qt.RightButton, pos=pos)
    qtbot.mouseRelease(vp, Qt.RightButton, pos=pos)
    QApplication.sendEvent(vp, QContextMenuEvent(QContextMenuEvent.Mouse, pos, vp.mapToGlobal(pos)))

    def agree():
        current = window.sidebar.list.currentIndex()
        selected = [i.data(Qt.UserRole) for i in window.sidebar.list.selectionModel().selectedIndexes()]
        return (current.isValid() and current.data(Qt.UserRole) == window.conversation.conv_id == a
                and selected == [a] and window.chat.widgets[0].message["text"] == "about apples"
                and window.windowTitle().startswith("Apples"))

    assert agree()
    menu = next(m for m in window.findChildren(QMenu) if m.isVisible())
    menu.close()
    window.confirm = lambda title, text: False  # Delete of the right-clicked chat, cancelled
    window.delete_current(b)
    assert agree() and window.sidebar.list.model().rowCount() == 2


def test_prompt_draft_stays_with_its_chat(qtbot, window):
    a = _chat_with_history(window, "Apples", [("user", "about apples", None, None, None)])
    b = _chat_with_history(window, "Bananas", [("user", "about bananas", None, None, None)])
    window.open_conversation(a)
    qtbot.keyClicks(window.prompt.editor, "half a thought about apples")
    window.open_conversation(b)
    assert window.prompt.text() == ""  # not carried over
    qtbot.keyClicks(window.prompt.editor, "bananas draft")
    window.new_chat()
    assert window.prompt.text() == ""
    window.open_conversation(a)
    assert window.prompt.text() == "half a thought about apples"
    window.open_conversation(b)
    assert window.prompt.text() == "bananas draft"


@pytest.mark.parametrize("size", ["800x560", "minimum"])
def test_status_bar_texts_never_overlap(window, size):
    window.status.model_status.setText("stories260K · llama · 0.3M params · float32 · cpu · context 512")
    window.status.stats_label.setText("24 tokens · TTFT 12 ms · 310.2 tok/s · stop: length · seed 123456")
    window.status.show_context(300, 512)
    window.resize(window.minimumSizeHint() if size == "minimum" else QSize(800, 560))
    QApplication.processEvents()
    parts = [w for w in (window.status.model_status, window.status.load_progress, window.status.context_bar, window.status.stats_label)
             if w.isVisible()]
    assert window.status.stats_label in parts and window.status.model_status in parts
    for i, a in enumerate(parts):
        assert a.width() > 0, a.objectName()
        for b in parts[i + 1:]:
            assert not a.geometry().intersects(b.geometry()), (a.objectName(), b.objectName())
    assert clipped_texts(window.statusBar()) == []
    assert window.status.stats_label.text().endswith("seed 123456")  # the whole text, even when shown shortened


def _messages_fit(window) -> list[str]:
    """Each message within the transcript's width: its text wrapped to a width that fits
    the viewport, and every shown message button wholly visible once scrolled to."""
    QApplication.processEvents()
    chat, problems = window.chat, []
    vp = chat.viewport()
    for m in chat.widgets:
        left = m.body.mapTo(vp, m.body.rect().topLeft()).x()
        if m.body.document().textWidth() + left > vp.width() or m.body.width() + left > vp.width():
            problems.append(f"message {m.msg_id}: text {m.body.document().textWidth()}px from x={left}, "
                            f"viewport {vp.width()}px")
        buttons = [*m.buttons.values(), m.inspect_button, m.prev_button, m.next_button]
        for b in buttons:
            if not b.isVisibleTo(m):
                continue
            chat.ensureWidgetVisible(b, 0, 0)
            QApplication.processEvents()
            r = b.rect().translated(b.mapTo(vp, b.rect().topLeft()))
            if not vp.rect().contains(r):
                problems.append(f"message {m.msg_id} {b.objectName()} at {r.getRect()} outside {vp.rect().getRect()}")
    return problems


@pytest.mark.parametrize("size", ["inspector", "800x560", "minimum"])
def test_messages_rewrap_and_keep_their_buttons_when_the_column_narrows(window, size):
    text = "Once upon a time there was a little cat named Whiskers who loved the garden. " * 4
    cid = _chat_with_history(window, "Cat", [("user", "Tell me a story about a cat", None, None, None),
                                             ("assistant", text, None, None, None)])
    window.open_conversation(cid)
    msgs = window.conversation.view_messages()
    words = text.split(" ")
    msgs[1].update(stats={"generated_tokens": 240, "ttft_s": 0.012, "decode_tok_s": 310.2}, stop_reason="length",
                   seed=123456, version=(2, 3),
                   tokens={"tokens": list(range(len(words))), "token_texts": [t + " " for t in words],
                           "logprobs": [-0.5] * len(words)})
    window.chat.set_messages(msgs)
    window.resize(1200, 780)
    if size == "inspector":  # the token view opens the inspector beside the transcript
        assert window.chat.show_tokens(msgs[1]["id"])
    else:
        QApplication.processEvents()  # the layout takes in the new messages' minimum widths
        window.resize(window.minimumSizeHint() if size == "minimum" else QSize(800, 560))
    QApplication.processEvents()
    assert window.inspector.isVisible() == (size == "inspector")
    assert _messages_fit(window) == []
    assert window.chat.widget().width() <= window.chat.viewport().width()
    assert clipped_texts(window.chat) == []


def test_chats_with_the_same_long_title_can_be_told_apart_in_the_list(window):
    title = "Once upon a time there was a little cat who loved the garden behind the house"
    a = _chat_with_history(window, title, [("user", "first", None, None, None)])
    b = _chat_with_history(window, title, [("user", "second", None, None, None)])
    _chat_with_history(window, "Apples", [("user", "about apples", None, None, None)])
    QApplication.processEvents()
    view = window.sidebar.list
    rows = {window.sidebar.index(i).data(Qt.UserRole): window.sidebar.index(i)
            for i in range(view.model().rowCount())}
    # What the list draws: each row's text shortened to the row's width as the view does.
    shown = {cid: view.fontMetrics().elidedText(idx.data(Qt.DisplayRole), view.textElideMode(),
                                                view.visualRect(idx).width() - 8)
             for cid, idx in rows.items()}
    assert shown[a] != shown[b], shown
    assert rows[a].data(Qt.DisplayRole) != rows[b].data(Qt.DisplayRole)
    for cid in (a, b):
        tip = rows[cid].data(Qt.ToolTipRole)
        assert title in tip and "Started" in tip
        assert rows[cid].data(Qt.EditRole) == title  # renaming starts from the plain title
    assert [idx.data(Qt.DisplayRole) for cid, idx in rows.items() if cid not in (a, b)] == ["Apples"]
    window.conversation.rename(b, "Bananas")  # no longer twins: the plain title again
    window.sidebar.refresh()
    assert window.sidebar.index(next(i for i in range(view.model().rowCount())
                                           if window.sidebar.index(i).data(Qt.UserRole) == a)
                                     ).data(Qt.DisplayRole) == title


def test_deleting_a_message_offers_undo_that_restores_it_and_its_branch(qtbot, window):
    cid = _chat_with_history(window, "Cats", [("user", "tell me about cats", None, None, None),
                                              ("assistant", "cats purr", None, None, None),
                                              ("user", "and dogs?", None, None, None),
                                              ("assistant", "dogs bark", None, None, None)])
    window.open_conversation(cid)
    before = [(m.id, m.parent_id, m.role, m.text) for m in window.history.messages(cid)]
    leaf = window.history.conversation(cid).current_leaf_id
    assert not window.status.undo_notice.isVisible()
    target = window.chat.widgets[1]  # the first reply: it and the two messages below it go
    window.confirm = lambda *a: pytest.fail("deleting a message asks no question")
    qtbot.mouseClick(target.buttons["delete"], Qt.LeftButton)
    assert [w.message["text"] for w in window.chat.widgets] == ["tell me about cats"]
    assert len(window.history.messages(cid)) == 1
    assert window.status.undo_notice.isVisible() and "deleted" in window.status.undo_notice.text()
    qtbot.mouseClick(window.status.undo_notice.button, Qt.LeftButton)
    assert [(m.id, m.parent_id, m.role, m.text) for m in window.history.messages(cid)] == before
    assert window.history.conversation(cid).current_leaf_id == leaf
    assert [w.message["text"] for w in window.chat.widgets] == ["tell me about cats", "cats purr", "and dogs?",
                                                                "dogs bark"]
    assert not window.status.undo_notice.isVisible()
    # Unused, the offer goes away by itself and the deletion stays.
    window.chats.undo_ms = 50
    qtbot.mouseClick(window.chat.widgets[3].buttons["delete"], Qt.LeftButton)
    assert window.status.undo_notice.isVisible()
    qtbot.waitUntil(lambda: not window.status.undo_notice.isVisible(), timeout=5000)
    window.chats.undo_delete()  # nothing offered: nothing happens
    assert [m.text for m in window.history.current_path(cid)] == ["tell me about cats", "cats purr", "and dogs?"]


def test_a_reply_with_prompt_lookup_shows_its_drafting_in_the_stats(qtbot, window, loop, gguf):
    """The Speed setting reaches the engine; the reply's stats line says how drafting went,
    and the reply is the one plain greedy decoding gives."""

    async def scenario():
        await load(window, gguf)
        window.panel.from_dict({"temperature": 0.0, "speculative": "off"})
        plain = await send(qtbot, window, "Once upon a time", max_tokens=40)
        window.panel.from_dict({"speculative": "lookup", "lookup_n": 2})
        window.new_chat()
        spec = await send(qtbot, window, "Once upon a time", max_tokens=40)
        return plain, spec

    plain, spec = run(loop, scenario(), 90)
    last = window.conversation.path()[-1]
    sp = last.stats["speculative"]
    assert sp["kind"] == "lookup" and sp["lookup"] == 2 and sp["accepted"] <= sp["drafted"]
    assert last.settings["lookup"] == 2
    assert "speculative (lookup 2)" in window.status.stats_label.text()
    assert window.status.stats_label.text() == format_stats(window.conversation.view_message(last))
    assert spec["text"] == plain["text"]
    assert "speculative" not in format_stats({"stats": plain["stats"]})
    snapshot(window, "reply_with_prompt_lookup")


def test_compiled_decoding_menu_reaches_the_engine_and_the_status_bar_says_what_ran(
        qtbot, window, loop, gguf, settings, monkeypatch):
    """Model → Compile Decoding is kept in the settings and reloads the model at once; the
    first reply says it waits for the compiler, its stats the warm-up, and the status bar
    the decode path (here torch.compile fails, as on a machine without a compiler: the
    reply falls back to eager, is the same text, and the bar says so)."""

    def no_compiler(fn, **kw):
        def compiled(*a, **k):
            raise RuntimeError("no C++ compiler here")
        return compiled

    at_start = []
    window.reply.started.connect(lambda _view: at_start.append(window.status.stats_label.text()))

    async def scenario():
        await load(window, gguf)
        window.panel.from_dict({"temperature": 0.0})
        plain = await send(qtbot, window, "Once upon a time", max_tokens=16)
        assert "decode" not in plain["stats"] and "eager" not in window.status.model_status.text()
        monkeypatch.setattr(torch, "compile", no_compiler)
        window.findChild(QAction, "compileDecode").trigger()  # reloads the model with it
        assert window.compile and settings.value("models/compile") == "true" and window.models.loading
        await until(lambda: not window.models.loading and window.info is not None, 60, "the reload")
        assert window.info["decode"] == "compiles at the first decode step (inductor)"
        assert "compiling…" in window.status.model_status.text()
        window.new_chat()
        compiled = await send(qtbot, window, "Once upon a time", max_tokens=16)
        return plain, compiled

    plain, compiled = run(loop, scenario(), 150)
    assert at_start == ["", "compiling (first reply only)…"]
    assert compiled["stats"]["warmup_s"] > 0 and "compile warm-up" in window.status.stats_label.text()
    assert compiled["text"] == plain["text"]
    assert compiled["stats"]["decode"].startswith("eager: compiling failed (RuntimeError: no C++ compiler")
    assert "eager (compile failed)" in window.status.stats_label.text()
    assert "eager (compile failed)" in window.status.model_status.text()
    assert "no C++ compiler" in window.status.model_status.toolTip()
    snapshot(window, "compiled_decoding_fell_back")
