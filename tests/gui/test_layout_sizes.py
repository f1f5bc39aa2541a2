"""Issue 22 #15: every window at 800x600 and at 1920x1080 shows all of its texts.

Each window is shown at both sizes (it must take the size: a minimum wider than the
screen is clipping too) and its widget tree walked: no button, label, check box or combo
box needs more width than it has (``clipped_texts``); the main window's status bar stays
one line with the model's name in full, and the chat column keeps a fair share."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication, QLabel, QTableView

from gui.compare.view import CompareView
from gui.library.service import LibraryService
from gui.library.window import LibraryWindow
from gui.widgets.stats import format_stats
from gui.widgets.token_run import TokenRec
from tests.gui.compare.common import PROMPT, history, three_words  # noqa: F401  (fixtures)
from tests.gui.ui_helpers import (ScriptedBridge, bridge, clipped_texts, data_dir, loop, run, settings,  # noqa: F401
                                  until, window)

SIZES = [(800, 600), (1920, 1080)]
INFO = {"name": "TinyLlama-1.1B-Chat-v1.0", "parameters": 1_100_048_384, "context_length": 2048,
        "dtype": "bfloat16", "device": "cpu", "memory_bytes": 2_200_000_000}
REPLY = {"stop_reason": "length", "seed": 1234,
         "stats": {"generated_tokens": 61, "ttft_s": 0.042, "decode_tok_s": 38.5, "prompt_tokens": 24,
                   "cached_tokens": 20,
                   "speculative": {"kind": "draft", "draft": "/models/tiny-draft-model.gguf", "acceptance": 0.62,
                                   "drafted": 120, "mean_draft": 2.4, "speedup": 1.6}}}


def shown_at(w, size):
    w.resize(*size)
    QApplication.processEvents()
    assert (w.width(), w.height()) == size, f"{w.objectName()} cannot be {size}: minimum {w.minimumSizeHint()}"
    return clipped_texts(w)


@pytest.mark.parametrize("size", SIZES)
def test_main_window(window, size):
    w = window
    w.status.show_model(INFO)
    w.status.stats_label.setText(format_stats(REPLY))
    assert shown_at(w, size) == []
    status = w.statusBar()
    one_line = status.fontMetrics().lineSpacing()
    assert status.height() < 2 * one_line + 12, "the status bar grew past one line"
    assert QLabel.text(w.status.model_status).startswith(INFO["name"]), "the model's name is cut"
    stats = w.status.stats_label
    drawn = QLabel.text(stats)  # what is drawn; text() is the whole text
    assert drawn and "\n" not in drawn
    if drawn != stats.text():
        assert stats.toolTip() == stats.text()  # cut or joined: the whole text is its tooltip
    sizes = w.splitter.sizes()
    assert sizes[1] >= 0.4 * sum(sizes), f"the chat column has {sizes[1]} of {sum(sizes)} px"


@pytest.mark.parametrize("size", [*SIZES, (1280, 760)])
def test_compare_window(qtbot, loop, history, size):
    v = CompareView(bridge=ScriptedBridge(three_words), history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.0}, {"temperature": 0.9, "seed": 7}, {"temperature": 1.3}])
    qtbot.addWidget(v)
    v.show()
    v.bar.sweep_button.click()  # the sweep row shows too

    async def runs():
        v.run()
        await until(lambda: not v.running, 10, "the lanes")
    run(loop, runs(), 20)
    top = {"raw": [[61, 0.6], [62, 0.3], [63, 0.1]], "filtered": [[61, 0.65], [62, 0.35]]}
    v.inspector.show_token(1, 1, TokenRec(61, " x", " x", -0.5, top), "T 0.9")
    v.inspector.learn(62, " dragonfly-wings")  # a long token name in the Ban button
    assert v.inspector.select_row(62)
    assert shown_at(v, size) == []
    assert v.inspector.ban_button.isVisible() and "drag…" in v.inspector.ban_button.text()  # cut in the middle
    # Every lane whole in height, its stats too: only its text box scrolls, the lanes only sideways.
    assert v.scroll.verticalScrollBar().maximum() == 0
    stats = v.columns[0].stats
    assert stats.text() and stats.mapTo(v.scroll.viewport(), stats.rect().bottomLeft()).y() < v.scroll.viewport().height()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", ["library", "hub", "downloads"])
def test_library_window(qtbot, loop, settings, tmp_path, monkeypatch, size, tab):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    service = LibraryService(settings=settings, data_dir=tmp_path / "data")
    service.set_endpoint("http://127.0.0.1:9")  # nothing listens: the Hub tab fails at once, offline
    w = LibraryWindow(service)
    qtbot.addWidget(w)
    w.show()
    try:
        w.show_tab(tab)
        assert shown_at(w, size) == []
        if tab == "downloads":  # the file's name has room, and the columns fit without a scroll bar
            table = w.findChild(QTableView, "downloadsTable")
            assert table.columnWidth(0) >= 120 and table.horizontalScrollBar().maximum() == 0
    finally:
        service.shutdown()


def test_side_panes_give_the_middle_its_share_and_get_their_width_back(qtbot):
    from PySide6.QtCore import Qt

    from gui.widgets.side_splitter import MIDDLE_SHARE, SideSplitter
    sp = SideSplitter(Qt.Horizontal)
    for minimum in (150, 100, 240):
        pane = QLabel("pane")
        pane.setMinimumWidth(minimum)
        sp.addWidget(pane)
    sp.setStretchFactor(1, 1)
    qtbot.addWidget(sp)
    sp.resize(1200, 300)
    sp.show()
    sp.setSizes([230, 680, 290])
    sp.resize(800, 300)
    QApplication.processEvents()
    narrow = sp.sizes()
    assert narrow[1] >= MIDDLE_SHARE * sum(narrow) - 2 and narrow[0] >= 150 and narrow[2] >= 240
    sp.resize(1920, 300)  # wide again: the side panes are as they were set, the middle takes the rest
    QApplication.processEvents()
    assert sp.sizes()[0] == 230 and sp.sizes()[2] == 290
    state = sp.saveState()
    sp.setSizes([300, 1300, 300])
    assert sp.restoreState(state) and sp.wanted == {0: 230, 2: 290}  # restored widths are the wanted ones


@pytest.mark.parametrize("size", SIZES)
def test_main_window_with_the_token_inspector(window, size):
    """A reply in token view shows the inspector beside the transcript; at 800 px there is
    no room beside it (the window grew past the screen): it goes under the transcript."""
    w = window
    top = {"raw": [[61, 0.6], [62, 0.3]], "filtered": [[61, 0.65], [62, 0.35]]}
    w.inspector.show_token(3, 1, TokenRec(61, " x", " x", -0.5, top), "T 0.9", title="Reply · token 2")
    w.inspector.show()
    w.inspector.set_can_branch(True)  # as with a model loaded: Continue and Ban show
    assert w.inspector.select_row(62)
    assert shown_at(w, size) == []
    assert w.inspector.ban_button.isVisibleTo(w)
    assert w.chat.width() >= 0.4 * size[0] and w.sidebar.width() >= 150
