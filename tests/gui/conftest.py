import gc

import pytest


@pytest.fixture(autouse=True)
def _collect_qt_garbage_here():
    """Collect each GUI test's garbage on the UI thread when the test ends.

    Unreachable Qt objects left in reference cycles are otherwise finalised by whichever
    thread next triggers a collection: in a later test that is often a worker thread,
    and a QObject destroyed off its thread crashes the next event pass.
    """
    yield
    gc.collect()
