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


@pytest.fixture(scope="session", params=[("x86-64-v2", "plain C"), ("haswell", "AVX2")], ids=["plain-C", "AVX2"])
def other_isa_lib(lib, request):
    """A second copy of the kernels built for an older x86-64 (-march): the plain-C path and
    the AVX2 path, to compare with this machine's own (AVX-512 here)."""
    import platform
    march, isa = request.param
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the other paths are forced through an x86-64 -march")
    built = build.build(march=march)  # the suite's shared kernels folder: built once per machine
    if built.path is None:
        pytest.skip(f"no {isa} build: {built.reason}")
    other = ops.typed(build.load(built.path))
    assert other.ld_isa().decode() == isa
    return other
