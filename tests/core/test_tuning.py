"""CPU dtype and threads chosen by a probe, cached per machine, reported by load()."""
import json
import os

import pytest
import torch

from core import tuning
from core.checkpoints import load


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.delenv(tuning.DTYPE_ENV, raising=False)
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_CHOICE", None)
    return tmp_path


def test_probe_measures_both_dtypes_and_applies_its_rule():
    c = tuning.probe(k=256, n=2048, rows=16, repeats=1)
    assert c.bf16_decode_speedup > 0 and c.bf16_prefill_speedup > 0
    faster = c.bf16_decode_speedup >= 1.05 and c.bf16_prefill_speedup >= 0.8
    assert c.dtype == ("bfloat16" if faster else "float32")
    cores = max(1, (os.cpu_count() or 1) - 1)
    assert {c.prefill_threads, c.decode_threads} <= {1, cores}
    assert c.fingerprint == tuning.fingerprint() and "probe of this CPU" in c.reason


def test_probe_runs_once_per_machine_and_again_on_another(fresh, monkeypatch):
    calls = []
    real = tuning.probe

    def counted():
        calls.append(1)
        return real(k=256, n=1024, rows=8, repeats=1)
    monkeypatch.setattr(tuning, "probe", counted)
    first = tuning.cpu_choice()
    saved = json.loads((fresh / tuning.CACHE_NAME).read_text())
    assert saved["fingerprint"] == tuning.fingerprint() and saved["dtype"] == first.dtype
    monkeypatch.setattr(tuning, "_CHOICE", None)  # a new process reads the file
    assert tuning.cpu_choice() == first and len(calls) == 1
    monkeypatch.setattr(tuning, "_CHOICE", None)
    monkeypatch.setattr(tuning, "fingerprint", lambda: "another-machine")
    tuning.cpu_choice()
    assert len(calls) == 2


def test_auto_load_uses_the_cached_choice_and_says_why(fresh, fixtures):
    c = tuning.CpuChoice("bfloat16", 1, 1, 1.3, 2.9, tuning.fingerprint(), "2026-12-01 00:00 UTC")
    (fresh / tuning.CACHE_NAME).write_text(json.dumps(c.__dict__))
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="auto")
    assert lm.model.tok_embeddings.weight.dtype == torch.bfloat16
    assert lm.info["dtype"] == "bfloat16" and "1.30x" in lm.info["dtype_reason"]
    # An explicit dtype is an override: no reason needed, the probe's pick is ignored.
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    assert lm.model.tok_embeddings.weight.dtype == torch.float32 and "dtype_reason" not in lm.info


def test_env_override_skips_the_probe(fresh, monkeypatch):
    monkeypatch.setenv(tuning.DTYPE_ENV, "float32")
    monkeypatch.setattr(tuning, "probe", lambda: pytest.fail("probed despite the override"))
    c = tuning.cpu_choice()
    assert c.dtype == "float32" and "LLAMADESK_CPU_DTYPE" in c.reason
