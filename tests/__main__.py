"""``python3 -m tests [pytest options]``: the README's test command.

Sets up the project's ``.venv`` with the test extras on first use (tools/bootstrap.py),
then runs pytest in it with the given options.
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.bootstrap import ensure  # noqa: E402

ensure(("test",), ["-m", "tests", *sys.argv[1:]])
raise SystemExit(subprocess.call([sys.executable, "-m", "pytest", *sys.argv[1:]]))
