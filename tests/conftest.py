import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

ROOT = Path(__file__).resolve().parent.parent


def fixtures_dir() -> Path:
    return Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    """The shared fixtures folder; skipped when missing, a failure in CI."""
    d = fixtures_dir()
    if not (d / "stories260K.gguf").exists():
        msg = f"fixtures folder not found: {d} (set LLAMADESK_FIXTURES)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return d
