"""A fresh start with no argument opens the bundled demo model and chats with it."""
from __future__ import annotations


from PySide6.QtCore import Qt

from gui.model_controller import DEMO_MODEL
from tests.gui.ui_helpers import bridge, close, data_dir, loop, make_window, run, settings, until  # noqa: F401


def test_fresh_start_loads_the_demo_model_and_it_chats(qtbot, loop, bridge, settings, data_dir):
    assert DEMO_MODEL.is_dir(), "the bundled demo model is missing"
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir, autoload=True)  # no MODEL argument
    qtbot.addWidget(w)
    assert w.models.initial_model(None) == str(DEMO_MODEL)

    async def scenario():
        await until(lambda: w.info is not None, 30, "the demo model to load")
        assert w.info["name"] == "llamadesk-demo"
        assert "LlamaDesk" in w.windowTitle() and "llamadesk-demo" in w.windowTitle()
        w.panel.temperatureSpin.setValue(0.0)  # greedy: the reply is fixed for this prompt
        w.panel.maxTokensSpin.setValue(300)
        done = []
        w.replyFinished.connect(done.append)
        qtbot.keyClicks(w.prompt.editor, "Tell me a story about a cat named Tom.")
        qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: done, 60, "the reply")
        return done[0]

    try:
        reply = run(loop, scenario(), 120)
        msg = w.conversation.view_messages()[-1]
        assert msg["role"] == "assistant" and msg["stop_reason"] == "eos"  # ended its turn itself
        assert "Tom" in msg["text"] and len(msg["text"]) >= 200
        assert "<|" not in msg["text"]  # chat markers never leak into the text
        assert reply is not None
    finally:
        close(loop, w)
