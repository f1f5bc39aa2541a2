"""The compiled kernels, built once per test session (into the session's data folder)."""
import pytest

from core.model.kernels import build, ops


@pytest.fixture(scope="session")
def lib():
    """This process's kernel library; the tests that need it skip where none builds."""
    got = ops.kernels()
    if got is None:
        pytest.skip(f"no compiled kernels here: {build.reason()}")
    return got


@pytest.fixture
def fresh_state(monkeypatch):
    """build's per-process state, emptied for one test and put back after it."""
    for name in ("done", "lib", "path", "reason"):
        monkeypatch.setattr(build._State, name, getattr(build._State, name))
    build._State.done = False
    return build._State
