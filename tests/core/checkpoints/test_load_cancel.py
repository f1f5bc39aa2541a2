"""A load's cancel lands inside a tensor's packing, and the cancelled load leaves no cache."""
import pytest

from core.checkpoints import load, pack_cache
from core.model import pack_cpu
from tests.core.checkpoints.util import random_model, write_gguf


class Stop(BaseException):
    """What the worker's progress callback raises on cancel (a BaseException too)."""


@pytest.fixture
def model_file(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(pack_cache.ENV, "1")
    monkeypatch.setenv("LLAMADESK_KERNELS", "0")  # packing, the kernels' fallback, is what is cancelled
    m = random_model(4, dim=256, n_heads=4, n_kv_heads=2, hidden_dim=512, tie_word_embeddings=True)
    f = tmp_path / "model.gguf"
    write_gguf(f, m, qtypes={n: ("Q4_K" if "w2" not in n else "Q8_0") for n in m.state_dict()})
    return f


def test_cancel_is_checked_between_steps_of_one_tensor(model_file, monkeypatch):
    monkeypatch.setattr(pack_cpu, "STEP_WEIGHTS", 64 * 256)  # a 512x256 weight: 8 steps
    calls = []

    def progress(fraction, stage):
        if calls and calls[-1] == (fraction, stage):  # called again before the tensor is done
            raise Stop
        calls.append((fraction, stage))

    with pytest.raises(Stop):
        load(model_file, device="cpu", progress=progress)
    assert calls[-1][0] < 1.0  # stopped while tensors were still to load
    pack_cache.flush()
    assert pack_cache.list_caches() == []  # nothing half-packed is ever written

