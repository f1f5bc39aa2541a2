"""CPU dtype and threads chosen by a probe, cached per machine, reported by load()."""
import json
import os

import pytest
import torch

from core.model import tuning
from core.checkpoints import load
from core.cli.main import main
from core.engine.engine import Engine
from core.engine.settings import SamplingParams


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
    cores = max(1, os.cpu_count() or 1)
    assert {c.prefill_threads, c.decode_threads} <= {1, cores} and c.max_threads == cores
    assert c.prefill_thread_speedup > 0 and c.decode_thread_speedup > 0
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
    c = tuning.CpuChoice("bfloat16", 1, 1, 1.3, 2.9, tuning.fingerprint(), "2026-12-01 00:00 UTC",
                         version=tuning.PROBE_VERSION)
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


def test_a_cache_from_an_older_probe_is_measured_again(fresh, monkeypatch):
    old = tuning.CpuChoice("bfloat16", 1, 1, 1.3, 2.9, tuning.fingerprint(), "2026-12-01 00:00 UTC")
    (fresh / tuning.CACHE_NAME).write_text(json.dumps(old.__dict__))  # version 1: no thread timings
    monkeypatch.setattr(tuning, "probe", lambda: tuning.CpuChoice(
        "float32", 2, 1, 1.0, 1.0, tuning.fingerprint(), "now", 1.8, 0.9, 2, tuning.PROBE_VERSION))
    assert tuning.cpu_choice().decode_thread_speedup == 0.9


def test_thread_plan_takes_the_probes_pick_per_phase_within_the_budget():
    c = tuning.CpuChoice("float32", 4, 1, 1.0, 1.0, "fp", "2026-12-01 00:00 UTC", 3.1, 0.7, 4, tuning.PROBE_VERSION)
    p = tuning.thread_plan(8, choice=c)
    assert (p.prefill, p.decode) == (4, 1)
    assert "prefill 4 / decode 1" in p.reason and "3.10x" in p.reason and "0.70x" in p.reason
    p = tuning.thread_plan(2, choice=c)  # the app leaves a core to its UI
    assert (p.prefill, p.decode) == (2, 1) and "at most 2" in p.reason
    p = tuning.thread_plan(2, override=3, choice=c)  # the user's setting wins
    assert (p.prefill, p.decode) == (3, 3) and "set by the user" in p.reason
    assert tuning.plan_for(torch.device("meta"), 2) is None  # threads are a CPU matter


def test_engine_runs_prefill_and_decode_at_their_thread_counts(fixtures):
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    seen = []
    forward = lm.model.forward

    def spy(x, *a, **k):
        seen.append(("prefill" if x.shape[1] > 1 else "decode", torch.get_num_threads()))
        return forward(x, *a, **k)
    lm.model.forward = spy
    before = torch.get_num_threads()
    try:
        eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), threads=(2, 1))
        list(eng.generate(lm.tokenizer.encode("Once upon a time", bos=True), SamplingParams(temperature=0, max_new_tokens=4)))
    finally:
        torch.set_num_threads(before)
    assert {n for phase, n in seen if phase == "prefill"} == {2}
    assert {n for phase, n in seen if phase == "decode"} == {1} and len(seen) == 4


def test_cli_info_says_which_threads_and_why(fresh, fixtures, monkeypatch, capsys):
    c = tuning.CpuChoice("float32", 2, 1, 1.0, 1.0, tuning.fingerprint(), "2026-12-01 00:00 UTC", 1.9, 0.8,
                         2, tuning.PROBE_VERSION)
    (fresh / tuning.CACHE_NAME).write_text(json.dumps(c.__dict__))
    monkeypatch.delenv("LLAMADESK_THREADS", raising=False)
    assert main(["info", str(fixtures / "stories260K.gguf"), "--device", "cpu", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "decode 1 threads" in out and "0.80x" in out
    monkeypatch.setenv("LLAMADESK_THREADS", "1")
    assert main(["info", str(fixtures / "stories260K.gguf"), "--device", "cpu", "--dtype", "float32"]) == 0
    assert "1 threads: set by the user" in capsys.readouterr().out
