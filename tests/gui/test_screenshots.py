"""Screenshots of the main window, light and dark, idle and streaming (saved to artifacts/).

They are for a person to look at; the asserts check what each one shows: the conversation's
text, the reply that streamed in, and the theme's light or dark background in the pixels.
"""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from gui import theme
from tests.gui.ui_helpers import (bridge, data_dir, loop, make_window, run, settings,  # noqa: F401
                                  snapshot, until)

SAMPLE = {
    "format": "llamadesk.conversation", "version": 1,
    "conversation": {"title": "Reverse a list in Python", "kind": "chat", "current_leaf_id": 3, "meta": {}},
    "messages": [
        {"id": 1, "parent_id": None, "role": "user", "text": "How do I reverse a list in Python?"},
        {"id": 2, "parent_id": 1, "role": "assistant", "text": "Use slicing.", "stop_reason": "eos", "seed": 7,
         "stats": {"generated_tokens": 3}},
        {"id": 3, "parent_id": 1, "role": "assistant", "seed": 1234, "stop_reason": "eos",
         "settings": {"temperature": 0.7, "top_p": 0.9},
         "stats": {"generated_tokens": 61, "ttft_s": 0.042, "decode_tok_s": 38.5, "prompt_tokens": 24},
         "text": "Two common ways:\n\n1. **In place** with `list.reverse()`\n2. A reversed **copy** with slicing\n\n"
                 "```python\nitems = [1, 2, 3]\nitems.reverse()      # items is now [3, 2, 1]\n"
                 "backwards = items[::-1]  # a new list\n```\n\nUse `reversed(items)` to loop without copying."},
    ],
}


def lightness(path) -> int:
    """The median lightness (0-255) of a saved screenshot, sampled on a grid."""
    img = QImage(str(path))
    assert not img.isNull() and img.width() > 100 and img.height() > 100
    vals = sorted(img.pixelColor(x, y).lightness() for x in range(0, img.width(), 17)
                  for y in range(0, img.height(), 17))
    return vals[len(vals) // 2]


def looks(mode, path):
    shade = lightness(path)
    assert (shade < 100) if mode == "dark" else (shade > 155), (mode, shade)


@pytest.fixture(params=["light", "dark"])
def mode(request, qapp):
    theme.apply(qapp, request.param)
    yield request.param
    theme.apply(qapp, "light")
    qapp.setStyleSheet("")


def test_screenshots(qtbot, mode, loop, bridge, settings, data_dir, fixtures):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    w.retheme()
    assert theme.is_dark() == (mode == "dark")
    looks(mode, snapshot(w, f"main_nomodel_{mode}"))
    w.conversation.import_json(SAMPLE)
    shown = w.chat.toPlainText()
    # The current branch: the question and the second answer, not the first one.
    assert "How do I reverse a list in Python?" in shown and "to loop without copying" in shown
    assert "Use slicing." not in shown

    async def scenario():
        await w.load_model(str(fixtures / "stories260K.gguf"))
        assert w.info is not None
        # (no processEvents() here: inside a coroutine it re-enters other tasks, such as the
        # new model's count of this chat, and they never wake again; snapshot lays out)
        looks(mode, snapshot(w, f"main_idle_{mode}"))
        w.new_chat()
        w.panel.maxTokensSpin.setValue(300)
        qtbot.keyClicks(w.prompt.editor, "Once upon a time")
        done = []
        w.replyFinished.connect(done.append)
        qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: len(w.chat.stream_text) > 40 or done, 20, "some streamed text")
        if not done:
            snapshot(w, f"main_streaming_{mode}")
            w.stop()
        await until(lambda: done, 20, "reply end")
        looks(mode, snapshot(w, f"main_replied_{mode}"))
        shown = w.chat.toPlainText()
        reply = done[0]["text"].strip()
        assert reply and "Once upon a time" in shown and reply[:30] in shown
        return True

    assert run(loop, scenario(), 60)
    w.close()
