"""The transcript and the prompt editor on their own (no model, no event loop tricks)."""
from __future__ import annotations

import random

from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QToolButton
from PySide6.QtGui import QGuiApplication, QTextFrameFormat, QTextTable

import gui.chat.markdown as cv
from gui.chat.chat_view import ChatView
from gui.chat.markdown import MessageBody, close_open_fence, closed_blocks_end, render_markdown
from gui.chat.prompt_editor import PromptEditor
from tests.gui.ui_helpers import anchor_point, wheel


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
    assert closed_blocks_end("# T\n\n") == 0  # the next block has not begun yet
    text = "a\n\n```\ncode\n\nmore\n"  # the blank line inside the open fence closes nothing
    assert closed_blocks_end(text) == 3
    assert closed_blocks_end(text + "```\n") == 3
    assert closed_blocks_end(text + "```\n\nb") == len(text + "```\n\n")
    # A block that may continue the one before it (loose list, list or code indent, quote) is no cut.
    for cont in ("- b", "  b", "\tb", "2. b", "> b", "* b", "+ b"):
        assert closed_blocks_end("- a\n\n" + cont) == 0, cont
    assert closed_blocks_end("````\n```\n\nx\n````\n\nend") == len("````\n```\n\nx\n````\n\n")
    assert close_open_fence("~~~\nx\n```") == "~~~\nx\n```\n~~~"


# Blocks a reply is made of, including the ones that depend on their neighbours in Markdown
# (loose lists, lazy blockquotes, indented code after a list, a fence inside a fence, a
# reference definition that changes a link above it, a would-be fence python-markdown
# does not open).
BLOCKS = ["# Title", "Some *intro* text with `code` and a [link](http://x.org).", "- one\n- two",
          "- loose\n\n- list\n\n    indented in the list", "1. first\n2. second\n    - nested",
          "> quote\n\n> more quote", "    indented code\n\n    still code", "Title two\n=========",
          "```python\nx = 1\n\ny = 2\n```", "````\n```\ninner\n```\n````", "~~~\ntilde\n~~~",
          "``` python not a fence\ntext\n```", "| a | b |\n|---|---|\n| 1 | **2** |", "***", "___",
          "A [ref][r] link.", "[r]: http://example.com", "Paragraph\nwith a second line", "2024 was a year.",
          "```\nunclosed fence\n\nstill code"]


def random_reply(rng) -> str:
    blocks = [rng.choice(BLOCKS[:-1]) for _ in range(rng.randint(1, 9))]
    if rng.random() < 0.2:
        blocks.append(BLOCKS[-1])
    return "".join(b + rng.choice(["\n\n", "\n\n\n", "\n\n"]) for b in blocks)[:rng.choice([None, -1, -2])]


def stream_into(body, text, rng) -> None:
    body.begin_stream()
    i = 0
    while i < len(text):
        n = rng.randint(1, 12)
        body.append_stream(text[i:i + n])
        i += n


def test_a_streamed_reply_ends_as_the_same_document_as_a_one_shot_render(qtbot):
    """The final document of a streamed reply (blocks rendered as they closed, then only
    the rest) is the document a one-shot render of the whole Markdown gives: same HTML
    document, same code blocks, same height."""

    rng = random.Random(11)
    streamed, whole = MessageBody(), MessageBody()
    for b in (streamed, whole):
        qtbot.addWidget(b)
        b.resize(500, 300)
    pieces = 0
    for case in range(60):
        text = random_reply(rng)
        stream_into(streamed, text, rng)
        pieces += streamed.rendered > 0
        streamed.finish_stream(text)
        whole.set_markdown(text)
        assert streamed.document().toHtml() == whole.document().toHtml(), (case, text)
        assert streamed.codes == whole.codes and streamed.height() == whole.height(), (case, text)
    assert pieces > 40  # most replies were really rendered block by block while streaming


def test_streaming_renders_each_block_once_and_only_the_rest_at_the_end(qtbot, monkeypatch):
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
    # Every complete block was rendered exactly once, in order (the lists with what they
    # could still continue); the last one is still text.
    assert rendered == ["# Title\n\n", "Some *intro* text.\n\n- one\n- two\n\n",
                        "```python\nx = 1\n\ny = 2\n```\n\n", "## Part two\n\n1. first\n2. second\n\n"]
    assert body.toPlainText().endswith("Closing words") and "```" not in body.toPlainText()
    assert body.codes == ["x = 1\n\ny = 2"]
    assert view.renders == len(range(0, len(REPLY), 3))
    rendered.clear()
    view.end_stream({"id": 9, "role": "assistant", "text": REPLY, "version": (1, 1)})
    assert rendered == ["Closing words"]  # only what was not final yet
    full = ChatView()
    qtbot.addWidget(full)
    full.resize(600, 400)
    full.show()
    full.set_messages([{"id": 9, "role": "assistant", "text": REPLY, "version": (1, 1)}])
    assert view.widgets[-1].body.document().toHtml() == full.widgets[-1].body.document().toHtml()


def test_a_final_text_that_changes_rendered_blocks_is_rendered_whole(qtbot):
    body, whole = MessageBody(), MessageBody()
    qtbot.addWidget(body)
    qtbot.addWidget(whole)
    body.begin_stream("A [ref][r] link.\n\nmore\n\nx")
    assert body.rendered > 0
    for final in ("A [ref][r] link.\n\nmore\n\n[r]: http://example.com",  # a definition arrives
                  "A [ref] link.\n\nmore"):  # the final text differs from what streamed
        body.begin_stream("A [ref][r] link.\n\nmore\n\nx")
        body.finish_stream(final)
        whole.set_markdown(final)
        assert body.document().toHtml() == whole.document().toHtml()
        assert ("example.com" in body.document().toHtml()) == ("example.com" in final)  # the link resolved


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


LONG_CODE = ("Two ways:\n\n```python\nitems = [1, 2, 3]\nvery_long_line = [" + ", ".join(map(str, range(60)))
             + "]\n```\n\n| Method | Copies |\n|---|---|\n| reverse() | no |\n| [::-1] | yes |\n\nEnd.")


def test_a_long_code_line_scrolls_sideways_and_copy_code_stays_in_view(qtbot):
    """Issue 22 #16: a code line longer than the transcript pushed "Copy code" out of
    sight and could not be read to its end."""
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(420, 500)
    view.show()
    view.set_messages([{"id": 3, "role": "assistant", "text": LONG_CODE, "version": (1, 1)}])
    body = view.widget_for(3).body
    qtbot.waitUntil(lambda: 300 < body.viewport().width() < 420
                    and body.viewport().height() >= body.document().size().height() - 1)
    copy_at = anchor_point(body, "copy:0")
    assert 0 < copy_at.x() < body.viewport().width(), (copy_at.x(), body.viewport().width())
    bar = body.horizontalScrollBar()
    assert bar.maximum() > 0 and bar.isVisibleTo(body)  # the long line can be scrolled to
    assert body.findChild(QToolButton, "pinnedCopyCode") is None or body.findChild(QToolButton, "pinnedCopyCode").isHidden()
    bar.setValue(bar.maximum())
    assert body.viewport().height() >= body.document().size().height() - 1  # the scrollbar hides no text
    # Scrolled to the line's end, the block's header (and its link) moved out of view: a
    # "Copy code" button stands at the right edge over it.
    pinned = body.findChild(QToolButton, "pinnedCopyCode")
    assert pinned is not None and pinned.isVisible()
    assert body.viewport().rect().contains(pinned.geometry()) and pinned.y() < copy_at.y() + 8
    QGuiApplication.clipboard().setText("")
    with qtbot.waitSignal(view.copied):
        qtbot.mouseClick(pinned, Qt.LeftButton)
    assert QGuiApplication.clipboard().text().endswith("58, 59]")
    with qtbot.waitSignal(view.copied):
        bar.setValue(0)
        qtbot.mouseClick(body.viewport(), Qt.LeftButton, pos=anchor_point(body, "copy:0"))
    assert QGuiApplication.clipboard().text().endswith("58, 59]") and pinned.isHidden()
    # A plain vertical wheel over the body still scrolls the transcript, not the code.
    assert wheel(body, -1) is not body


def test_markdown_tables_have_borders(qtbot):
    body = MessageBody()
    qtbot.addWidget(body)
    body.set_markdown(LONG_CODE)
    tables = [f for f in body.document().rootFrame().childFrames() if isinstance(f, QTextTable)]
    grid = [t for t in tables if t.columns() == 2]
    assert len(grid) == 1 and grid[0].rows() == 3
    fmt = grid[0].format()
    assert fmt.border() >= 1 and fmt.borderStyle() != QTextFrameFormat.BorderStyle_None
    assert fmt.borderCollapse()
