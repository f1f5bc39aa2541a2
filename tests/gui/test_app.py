import gc
import threading
import weakref

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
