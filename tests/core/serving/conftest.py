"""Servers shared by the serving tests: started once per test process, not per file."""
import pytest

try:
    from tests.core.serving.served import DEMO, Served
except ImportError:  # the openai client is missing: the files that need it skip themselves (importorskip)
    DEMO = Served = None


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
