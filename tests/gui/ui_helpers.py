"""Fixtures for driving the main window end to end on a qasync loop.

A test builds the window, then runs its scenario as a coroutine with ``run(loop, coro)``;
inside the coroutine it waits with ``await until(...)`` (asyncio sleeps, never a nested
Qt event loop). Everything is isolated: a temporary history file and an INI QSettings.
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import qasync
from PySide6.QtCore import QEvent, QPoint, QSettings, Qt
from PySide6.QtWidgets import QApplication, QWidget

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture
def loop(qapp):
    # Closing a test's window must not quit the app (and stop the loop) under the test.
    qapp.setQuitOnLastWindowClosed(False)
    lp = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(lp)
    yield lp
    stuck = []
    try:
        pending = [t for t in asyncio.all_tasks(lp) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            # Bounded: a task that ignores its cancel must fail this test, not hang the
            # whole run inside Qt's event loop, where no pytest-timeout signal can land.
            lp.run_until_complete(asyncio.wait(pending, timeout=15))
            stuck = [t.get_name() + " " + repr(t.get_coro()) for t in pending if not t.done()]
    finally:
        lp.close()
        asyncio.set_event_loop(None)
    if stuck:
        pytest.fail(f"tasks still running 15 s after being cancelled: {stuck}")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(d))
    return d


@pytest.fixture
def settings(tmp_path):
    s = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    yield s
    s.sync()


_KEEP: list = []


@pytest.fixture
def bridge(loop):
    from gui.bridge import Bridge
    b = Bridge(torch_threads=1)
    yield b
    loop.run_until_complete(b.shutdown())
    _KEEP.append(b)  # never let the last reference drop on the worker thread


@pytest.fixture
def window(qtbot, loop, bridge, settings, data_dir):
    """The main window on the real bridge (no model loaded), closed after the test."""
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    yield w
    close(loop, w)


def run(loop, coro, timeout: float = 60.0):
    """Run a scenario coroutine on the qasync loop (the Qt event loop turns meanwhile)."""
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    except BaseException:
        if os.environ.get("LLAMADESK_TEST_TRACE"):
            import traceback
            traceback.print_exc()
        raise


async def until(cond, timeout: float = 20.0, what: str = "condition"):
    """Poll ``cond()`` while the loop runs; AssertionError after ``timeout`` seconds."""
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def make_window(*, bridge, settings, data_dir, **kw):
    from core.history.store import History
    from gui.main_window import MainWindow
    history = History(data_dir / "history.sqlite3")
    w = MainWindow(bridge=bridge, history=history, settings=settings, autoload=kw.pop("autoload", False), **kw)
    w.resize(1200, 780)
    w.show()
    return w


def snapshot(widget, name: str) -> Path:
    """Save a PNG of a widget under artifacts/ (git-ignored) for a person to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    # Only pending layouts: processEvents() here, inside a coroutine, ran other tasks'
    # wake-ups re-entrantly ("Cannot enter into task ... while another task is being
    # executed"), and the task it refused never woke again (test_stop_mid_reply_and_continue hung).
    QApplication.sendPostedEvents(None, QEvent.LayoutRequest)
    widget.grab().save(str(path))
    return path


def close(loop, w):
    """Close the window and let its tasks unwind while it still exists."""
    w.close()
    tasks = w.models.pending()
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def clipped_texts(root) -> list[str]:
    """Visible widgets under ``root`` whose text does not fit their width (layout checks).

    Labels that wrap or elide on purpose are skipped (word-wrapped labels; texts ending in "…").
    """
    from PySide6.QtWidgets import (QAbstractButton, QComboBox, QLabel, QStyle, QStyleOptionComboBox,
                                   QToolButton)
    QApplication.processEvents()

    def shown(text: str) -> str:  # "&Temperature" shows as "Temperature"; "&&" as "&"
        return text.replace("&&", "\0").replace("&", "").replace("\0", "&")

    out = []
    for w in [root, *root.findChildren(QWidget)]:
        if not w.isVisibleTo(root) or w.width() <= 0:
            continue
        fm = w.fontMetrics()
        name = w.objectName() or type(w).__name__
        if isinstance(w, QLabel):
            text = QLabel.text(w)  # what is drawn (an eliding subclass may return its full text)
            if not text or w.wordWrap() or text.endswith("…") or "<" in text or w.pixmap() is not None and not w.pixmap().isNull():
                continue
            need = max(fm.horizontalAdvance(shown(line)) for line in text.splitlines()) + 2 * w.margin()
            if need > w.contentsRect().width():
                out.append(f"{name} {text!r}: needs {need}px, has {w.contentsRect().width()}px")
        elif isinstance(w, QComboBox):
            opt = QStyleOptionComboBox()
            w.initStyleOption(opt)
            field = w.style().subControlRect(QStyle.CC_ComboBox, opt, QStyle.SC_ComboBoxEditField, w)
            need = fm.horizontalAdvance(w.currentText())
            if need > field.width():
                out.append(f"{name} {w.currentText()!r}: needs {need}px, has {field.width()}px")
        elif isinstance(w, QAbstractButton) and w.text() and not (isinstance(w, QToolButton)
                                                                  and w.toolButtonStyle() == Qt.ToolButtonIconOnly):
            # the text, the icon and the style's margins (not the style's 80 px minimum width)
            need = fm.horizontalAdvance(shown(w.text())) + 2 * w.style().pixelMetric(QStyle.PM_ButtonMargin, None, w)
            if not w.icon().isNull():
                need += w.iconSize().width() + 4
            if need > w.width():
                out.append(f"{name} {w.text()!r}: needs {need}px, has {w.width()}px")
    return out


class ScriptedStream:
    """A bridge stream that plays ``script(request, stream)``, an async generator of the
    events a real stream yields; ``cancelled`` tells the script that Stop was pressed."""

    pending = 0  # a script yields one event at a time

    def __init__(self, script, request):
        self.cancelled = False
        self._events = script(request, self)

    def __aiter__(self):
        return self._events.__aiter__()

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedBridge:
    """Stands in for gui.bridge.Bridge: generate() and compare() play ``script`` and
    record each request and its stream."""

    def __init__(self, script):
        self.script = script
        self.requests: list = []
        self.streams: list[ScriptedStream] = []

    def _stream(self, request) -> ScriptedStream:
        self.requests.append(request)
        self.streams.append(ScriptedStream(self.script, request))
        return self.streams[-1]

    generate = compare = _stream

    def cancel_all(self) -> None:
        for s in self.streams:
            s.cancel()


async def load(w, path):
    await w.load_model(path)
    assert w.info is not None, "model did not load"


async def send(qtbot, w, text, max_tokens=24):
    w.panel.maxTokensSpin.setValue(max_tokens)
    qtbot.keyClicks(w.prompt.editor, text)
    done = []
    w.replyFinished.connect(done.append)
    qtbot.keyClick(w.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
    await until(lambda: done, 30, "the reply")
    w.replyFinished.disconnect(done.append)
    return done[0]


def anchor_point(browser, href):
    """Viewport point inside the text of the anchor ``href``."""
    from PySide6.QtGui import QTextCursor
    doc = browser.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().anchorHref() == href:
                cur = QTextCursor(doc)
                cur.setPosition(frag.position() + max(1, frag.length() // 2))
                r = browser.cursorRect(cur)
                return r.center() - QPoint(2, 0)
            it += 1
        block = block.next()
    raise AssertionError(f"no anchor {href}")


def reference_probs(lm, prompt_ids, generated, index, settings):
    """Raw and filtered probabilities at step ``index`` computed straight from the model,
    with the filters written out here (not core.engine.sampling's)."""
    import torch
    ids = list(prompt_ids) + list(generated[:index])
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids]), 0, None)[0, -1].float()
    raw = logits.softmax(-1)
    lg = logits.clone()
    rp = settings.get("repetition_penalty", 1.0)
    if rp != 1.0:
        for t in set(ids):
            lg[t] = lg[t] / rp if lg[t] > 0 else lg[t] * rp
    lg = lg / settings["temperature"]
    k = settings.get("top_k", 0)
    if k:
        kth = torch.sort(lg, descending=True).values[k - 1]
        lg[lg < kth] = float("-inf")
    p = settings.get("top_p", 1.0)
    if p < 1.0:
        vals, order = torch.sort(lg, descending=True)
        probs = vals.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        lg[order[mass_before >= p]] = float("-inf")
    mp = settings.get("min_p", 0.0)
    if mp > 0:
        probs = lg.softmax(-1)
        lg[probs < probs.max() * mp] = float("-inf")
    return raw, lg.softmax(-1)


def wheel(widget, notches: int = -1) -> QWidget | None:
    """Turn the mouse wheel over the middle of ``widget`` (negative: down, towards the user)
    and return the widget that took it. Qt passes only a spontaneous (real) wheel event on
    to the parents while it is not accepted; a test cannot send one, so this walks the
    parents as QApplication::notify does for a real one."""
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QWheelEvent
    w, pos = widget, QPointF(widget.width() / 2, widget.height() / 2)
    while w is not None:
        ev = QWheelEvent(pos, QPointF(w.mapToGlobal(pos.toPoint())), QPoint(0, 0), QPoint(0, 120 * notches),
                         Qt.NoButton, Qt.NoModifier, Qt.NoScrollPhase, False)
        if QApplication.sendEvent(w, ev) and ev.isAccepted():
            return w
        if w.isWindow() or w.testAttribute(Qt.WA_NoMousePropagation):
            return None
        pos += QPointF(w.pos())
        w = w.parentWidget()
    return None
