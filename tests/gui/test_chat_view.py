"""The transcript and the prompt editor on their own (no model, no event loop tricks)."""
from __future__ import annotations

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication

from gui.chat_view import ChatView, close_open_fence, closed_blocks_end, render_markdown
from gui.prompt_editor import PromptEditor


def msgs(n=2, long=False):
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = ("word " * 400) if long else f"message {i}"
        out.append({"id": i + 1, "role": role, "text": text, "version": (1, 1)})
    return out


def test_markdown_code_blocks_and_no_raw_html(qapp):
    html, codes = render_markdown("Hi **bold** <b>raw</b>\n\n```python\nx = 1 < 2\n```\n\n```\nplain\n```")
    assert "<strong>bold</strong>" in html
    assert "&lt;b&gt;raw" in html  # raw HTML from the model is shown, not interpreted
    assert codes == ["x = 1 < 2", "plain"]
    assert 'href="copy:0"' in html and 'href="copy:1"' in html
    assert "color:" in html  # pygments highlighting, inline styles
    assert close_open_fence("a\n```py\nx") .endswith("```")


def test_copy_buttons(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_messages([{"id": 7, "role": "assistant", "text": "Code:\n\n```\nprint(1)\n```", "version": (1, 1)}])
    w = view.widget_for(7)
    with qtbot.waitSignal(view.copied):
        w.body.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "print(1)"
    with qtbot.waitSignal(view.copied):
        w.buttons["copy"].click()
    assert QGuiApplication.clipboard().text().startswith("Code:")


REPLY = ("# Title\n\nSome *intro* text.\n\n- one\n- two\n\n```python\nx = 1\n\ny = 2\n```\n\n"
         "## Part two\n\n1. first\n2. second\n\nClosing words")


def test_closed_blocks_end_at_blank_lines_outside_code():
    assert closed_blocks_end("# T\n\npara") == len("# T\n\n")
    text = "a\n\n```\ncode\n\nmore\n"  # the blank line inside the open fence closes nothing
    assert closed_blocks_end(text) == 3
    assert closed_blocks_end(text + "```\n") == len(text + "```\n")


def test_streaming_renders_each_block_once_and_the_end_in_full(qtbot, monkeypatch):
    import gui.chat_view as cv
    rendered = []
    real = cv.render_markdown
    monkeypatch.setattr(cv, "render_markdown", lambda text, *a, **kw: (rendered.append(text), real(text, *a, **kw))[1])
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    view.begin_stream()
    for i in range(0, len(REPLY), 3):  # three characters a frame
        view.append_stream(REPLY[i:i + 3])
    body = view.widgets[-1].body
    # Every complete block was rendered exactly once, in order; the last one is still text.
    assert "".join(rendered) == REPLY[:REPLY.rindex("Closing")]
    assert body.toPlainText().endswith("Closing words") and "```" not in body.toPlainText()
    assert body.codes == ["x = 1\n\ny = 2"]
    assert view.renders == len(range(0, len(REPLY), 3))
    rendered.clear()
    view.end_stream({"id": 9, "role": "assistant", "text": REPLY, "version": (1, 1)})
    assert rendered == [REPLY]  # one full render at the end
    full = ChatView()
    qtbot.addWidget(full)
    full.set_messages([{"id": 9, "role": "assistant", "text": REPLY, "version": (1, 1)}])
    assert view.widgets[-1].body.toPlainText() == full.widgets[-1].body.toPlainText()


def test_streaming_follows_unless_scrolled_up(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 300)
    view.show()
    view.set_messages(msgs(4, long=True))
    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 0)
    view.begin_stream()
    qtbot.waitUntil(lambda: view.widgets[-1].isVisible())
    for i in range(300):
        view.append_stream(f"tok{i} ")
    assert view.widgets[-1].body.markdown_text.startswith("tok0 tok1")
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    # the user scrolls up: streaming no longer drags the view down
    bar.setValue(0)
    assert not view.following
    for i in range(200):
        view.append_stream("more text\n\n")
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    assert bar.value() == 0
    view.end_stream({"id": 99, "role": "assistant", "text": view.stream_text, "stop_reason": "length",
                     "seed": 5, "stats": {"generated_tokens": 500, "ttft_s": 0.05, "decode_tok_s": 20.0},
                     "version": (1, 1)})
    w = view.widgets[-1]
    assert "500 tokens" in w.footer.text() and "stop: length" in w.footer.text() and "seed 5" in w.footer.text()
    assert "TTFT 50 ms" in w.footer.text() and "20.0 tok/s" in w.footer.text()
    assert w.buttons["continue"].isVisibleTo(view)  # stopped on length: can be continued
    assert not view.streaming


def test_versions_and_actions(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    m = msgs(2)
    m[1]["version"] = (2, 3)
    view.set_messages(m)
    view.show()
    w = view.widgets[1]
    assert w.version_label.text() == "2/3" and w.prev_button.isVisible() and w.next_button.isVisible()
    assert not view.widgets[0].prev_button.isVisible()
    seen = []
    view.actionRequested.connect(lambda name, mid: seen.append((name, mid)))
    w.prev_button.click()
    w.next_button.click()
    w.buttons["regenerate"].click()
    w.buttons["delete"].click()
    view.widgets[0].buttons["edit"].click()
    assert seen == [("prev", 2), ("next", 2), ("regenerate", 2), ("delete", 2), ("edit", 1)]
    assert "message 0" in view.toPlainText() and "Assistant:" in view.toPlainText()


def test_prompt_editor_keys_and_no_model(qtbot):
    p = PromptEditor()
    qtbot.addWidget(p)
    p.show()
    sent, stopped = [], []
    p.sendRequested.connect(sent.append)
    p.stopRequested.connect(lambda: stopped.append(1))
    qtbot.keyClicks(p.editor, "hello")
    assert not p.send_button.isEnabled() and "No model" in p.hint.text()
    qtbot.keyClick(p.editor, Qt.Key_Return, Qt.ControlModifier)
    assert sent == []  # no model: nothing is sent
    p.set_model_ready(True)
    assert p.send_button.isEnabled() and "Ctrl+Enter" in p.hint.text()
    qtbot.keyClick(p.editor, Qt.Key_Return)
    qtbot.keyClicks(p.editor, "world")
    assert p.text() == "hello\nworld" and sent == []
    qtbot.keyClick(p.editor, Qt.Key_Return, Qt.ControlModifier)
    assert sent == ["hello\nworld"]
    p.set_busy(True)
    assert p.stop_button.isVisible() and not p.send_button.isVisible()
    qtbot.keyClick(p.editor, Qt.Key_Escape)
    qtbot.mouseClick(p.stop_button, Qt.LeftButton)
    assert stopped == [1, 1]
    p.set_busy(False)
    p.begin_edit(3, "old text")
    assert p.editing == 3 and p.text() == "old text" and p.edit_banner.isVisible()
    qtbot.keyClick(p.editor, Qt.Key_Escape)
    assert p.editing is None and p.text() == ""
