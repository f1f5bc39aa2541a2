"""Fixtures shared by the core tests."""
import pytest

from core.history.store import History


@pytest.fixture
def h(tmp_path):
    """A fresh conversation store in a temporary data folder."""
    hist = History(tmp_path / "data" / "history.sqlite3")
    yield hist
    hist.close()
