"""The app refuses a reply whose KV cache the memory cannot hold, saying the figure in the
conversation (issue 22, item 25)."""
from __future__ import annotations

import json
import re

import pytest
from PySide6.QtCore import Qt

from core import limits
from core.history.store import History
from gui.main_window import MainWindow
from tests.gui.ui_helpers import bridge, close, data_dir, loop, run, settings, until  # noqa: F401
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(120)
DEMO = ROOT / "assets" / "models" / "llamadesk-demo"


def test_a_reply_the_memory_cannot_hold_is_refused_with_its_figure(qtbot, loop, bridge, settings, data_dir,  # noqa: F811
                                                                  monkeypatch):
    w = MainWindow(bridge=bridge, history=History(data_dir / "history.sqlite3"), settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.resize(1200, 780)
    w.show()

    async def scenario():
        await w.load_model(str(DEMO))
        monkeypatch.setattr(limits, "available_bytes", lambda device=None: 1000)
        w.panel.maxTokensSpin.setValue(400)
        qtbot.keyClicks(w.prompt.editor, "Tell me a story.")
        qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
        await until(lambda: "needs" in w.prompt.hint.text(), 30, "the refusal")
        await until(lambda: not w.reply.busy, 30, "the reply's end")
        return w.prompt.hint.text()

    try:
        text = run(loop, scenario(), 90)
        # Said under the editor, with the figure: K and V of every layer, float32, per position.
        m = re.search(r"a request of (\d+) tokens .*? needs ([\d.]+ \w+) of memory, but only 1000 bytes", text, re.I)
        assert m, text
        params = json.loads((DEMO / "params.json").read_text())
        per_token = 2 * params["n_layers"] * params["n_kv_heads"] * params["head_dim"] * 4
        assert m.group(2) == limits.human(int(m.group(1)) * per_token) and int(m.group(1)) > 400
        assert "fewer new tokens" in text and w.prompt.hint.isVisible()
        # Nothing is lost: the message is back in the editor, and fewer new tokens lift the refusal.
        assert w.prompt.text() == "Tell me a story." and not w.prompt.send_button.isEnabled()
        monkeypatch.undo()
        w.panel.maxTokensSpin.setValue(8)
        assert w.prompt.send_button.isEnabled() and "needs" not in w.prompt.hint.text()
    finally:
        close(loop, w)
