"""``python3 -m tests [pytest options]``: the README's test command.

Sets up the project's ``.venv`` with the test extras on first use (tools/bootstrap.py),
then runs pytest in it with the given options, spread over one pytest-xdist worker per
core unless the options already say how to run (``-n N``, ``-p no:xdist``, ``--pdb``).
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.bootstrap import ensure  # noqa: E402

# Options that choose the process layout themselves, or need the tests in this process
# (a debugger's prompt cannot reach a worker).
OWN_LAYOUT = ("-n", "--numprocesses", "--dist", "-d", "--pdb", "--trace", "--looponfail", "-f")


def parallel_args(argv: list[str]) -> list[str]:
    """pytest's arguments for ``argv``: the tests spread over one worker per core (each on
    one torch thread, see tests/conftest.py), a test file at a time, so a module's shared
    fixtures (a model, a ``serve`` process) are built by one worker only; ``argv`` as
    given when it picks its own layout."""
    words = [a.split("=", 1)[0] for a in argv]
    if any(w in OWN_LAYOUT or (w.startswith("-n") and w[2:].isdigit()) for w in words):
        return list(argv)
    if any(a in ("no:xdist", "-pno:xdist") for a in argv):
        return list(argv)
    # A crashed worker (a segfault) ends the run with the crash reported: pytest-xdist 3.8
    # replacing it under --dist loadfile can wait forever (pytest-xdist issues 784, 1323).
    return ["-n", "auto", "--dist", "loadfile", "--max-worker-restart", "0", *argv]


if __name__ == "__main__":
    ensure(("test",), ["-m", "tests", *sys.argv[1:]])
    raise SystemExit(subprocess.call([sys.executable, "-m", "pytest", *parallel_args(sys.argv[1:])]))
