"""Seed models for the robustness tests: one tiny model as GGUF, Meta and HF (tools/badseeds.py)."""
import shutil

import pytest


@pytest.fixture(scope="session")
def seeds(tmp_path_factory, fixtures):
    from tools.badseeds import make_seeds
    return make_seeds(tmp_path_factory.mktemp("seeds"))


@pytest.fixture
def clone(tmp_path):
    """clone(seed_folder) -> a private copy the test may break."""
    n = [0]

    def make(src):
        n[0] += 1
        dst = tmp_path / f"{src.name}-{n[0]}"
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)
        return dst
    return make
