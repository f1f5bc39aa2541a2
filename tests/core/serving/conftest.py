"""Servers shared by the serving tests: started once per test process, not per file."""
import pytest

pytest.importorskip("openai")

from tests.core.serving.served import DEMO, Served  # noqa: E402


@pytest.fixture(scope="package")
def stories(fixtures):
    s = Served(fixtures / "stories260K.gguf")
    yield s
    s.server.stop()


@pytest.fixture(scope="package")
def demo():
    s = Served(DEMO)
    yield s
    s.server.stop()
