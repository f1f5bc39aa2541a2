import gc
import sys
import threading
import weakref

from PySide6.QtWidgets import QLabel

from gui.app import UiThreadCollector


class _Cycle:
    died_on: list = []

    def __init__(self):
        self.me = self

    def __del__(self):
        _Cycle.died_on.append(threading.current_thread())


def test_collector_owns_collection_and_runs_it_on_the_ui_thread(qtbot):
    was = gc.isenabled()
    c = UiThreadCollector(interval_ms=10)
    c.start()
    try:
        assert not gc.isenabled()
        # Garbage made on a worker thread is not collected there...
        refs = []

        def make():
            for _ in range(5000):  # well past the generation-0 threshold
                refs.append(weakref.ref(_Cycle()))
        t = threading.Thread(target=make)
        t.start()
        t.join()
        # ...but by the collector's timer, on this (the UI) thread.
        qtbot.waitUntil(lambda: all(r() is None for r in refs), timeout=10000)
        assert _Cycle.died_on and all(th is threading.main_thread() for th in _Cycle.died_on)
    finally:
        c.stop()
    assert gc.isenabled() == was


def test_void_qt_calls_cannot_free_none(qtbot):
    """Each void PySide6 call (6.12 on Python < 3.12) drops a reference to None; importing
    gui keeps None alive through far more calls than a long session makes."""

    label = QLabel()
    qtbot.addWidget(label)
    before = sys.getrefcount(None)
    for _ in range(20_000):
        label.setText("x")
    after = sys.getrefcount(None)
    if sys.version_info < (3, 12):
        assert before > 2**39 and after > 2**39  # 20,000 calls alone would have freed it
