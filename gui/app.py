"""The one place that builds the QApplication and the qasync event loop, and tears them down.

Order matters: torch is imported before any window shows (importing it holds the GIL for
seconds), the worker's thread count is fixed before the worker starts, and on exit the
worker is cancelled and joined while the event loop still runs, then leftover tasks are
cancelled and awaited, and only then is the loop closed. That order is what keeps
"Task was destroyed but it is pending" and "QThread: Destroyed while thread is still
running" out of the console.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
from typing import Callable

import torch  # noqa: F401  — import cost paid here, before the UI is up

import qasync
from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from gui.bridge import Bridge

log = logging.getLogger(__name__)

WindowFactory = Callable[[Bridge, "argparse.Namespace | list[str]"], QWidget]


class UiThreadCollector(QObject):
    """Runs Python's cyclic garbage collection on the UI thread only, while it is active.

    An automatic collection runs on whichever thread happens to allocate when a threshold
    is crossed; on the worker thread it would finalise unreachable Qt objects there, and a
    QObject destroyed off its thread crashes a later event pass (seen in the GUI tests).
    So automatic collection is switched off and a timer applies the same thresholds here.

    Signals: none.
    """

    def __init__(self, interval_ms: int = 250, parent: QObject | None = None):
        super().__init__(parent)
        self._was_enabled = False
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.check)

    def start(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()
        gc.collect()
        if self._was_enabled:
            gc.enable()

    def check(self) -> None:
        """Collect the oldest generation whose count passed its threshold, as Python would."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        for gen in (2, 1, 0):
            if thresholds[gen] and counts[gen] > thresholds[gen]:
                gc.collect(gen)
                return


def run(window_factory: WindowFactory, argv: list[str], *, torch_threads: int | None = None,
        app_name: str = "LlamaDesk") -> int:
    """Run the app until the last window closes (or ``QApplication.quit()``).

    Args:
        window_factory: ``factory(bridge, argv) -> QWidget``; called once the loop
            exists, so the window may create tasks and asyncSlots. ``argv`` is passed
            through as given (the caller parses its own options).
        argv: command line (``sys.argv``); Qt's own options are honoured.
        torch_threads: torch intra-op threads (None: env LLAMADESK_THREADS, else one per
            core less one, measured in bench/bench_responsiveness.py).

    Returns:
        the process exit code.
    """
    app = QApplication.instance() or QApplication(list(argv))
    app.setApplicationName(app_name)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    collector = UiThreadCollector()
    collector.start()
    bridge = Bridge(torch_threads=torch_threads)
    window = None
    rc = 0
    try:
        window = window_factory(bridge, list(argv))
        window.show()
        rc = loop.run_forever() or 0
    finally:
        try:
            loop.run_until_complete(bridge.shutdown())
            _cancel_leftover_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            asyncio.set_event_loop(None)
            if window is not None:
                window.deleteLater()
            bridge.deleteLater()
            # deleteLater needs one pass of the (Qt) event loop to happen now.
            app.sendPostedEvents(None, 0)
            collector.stop()  # the worker has been joined: collecting anywhere is safe again
    return int(rc)


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel tasks still pending (e.g. an asyncSlot awaiting a stream) and let them unwind."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    results = loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for t, r in zip(tasks, results):
        if isinstance(r, Exception) and not isinstance(r, asyncio.CancelledError):
            log.warning("task %r ended with %s: %s", t.get_name(), type(r).__name__, r)
