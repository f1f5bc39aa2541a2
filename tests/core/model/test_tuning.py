"""CPU dtype and threads chosen by a probe, cached per machine, reported by load()."""
import json
import os

import pytest
import torch

from core.model import tuning
from core.checkpoints import common, load
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


def test_auto_load_uses_the_cached_choice_and_says_why(fresh, fixtures, monkeypatch):
    monkeypatch.setattr(common, "SMALL_FLOAT32_BYTES", 0)  # stories260K is small: let the probe decide
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


def quiet_probe(prefill_gain: float, decode_gain: float, load: float = 0.05, cores: int = 4):
    return tuning.CpuChoice("float32", cores, 1, 1.0, 1.0, "fp", "2026-12-01 00:00 UTC", prefill_gain,
                            decode_gain, cores, tuning.PROBE_VERSION, load)


def test_thread_plan_follows_physical_cores_unless_a_quiet_probe_saw_them_slower(monkeypatch):
    monkeypatch.setattr(tuning, "physical_cores", lambda: 4)
    p = tuning.thread_plan(8, choice=quiet_probe(3.1, 1.6))
    assert (p.prefill, p.decode) == (4, 4) and "physical core" in p.reason and "3.10x" in p.reason
    p = tuning.thread_plan(8, choice=quiet_probe(3.1, 0.7))  # decode measured clearly slower
    assert (p.prefill, p.decode) == (4, 1) and "0.70x" in p.reason
    p = tuning.thread_plan(8, choice=quiet_probe(3.1, 0.92))  # within noise: the hardware wins
    assert (p.prefill, p.decode) == (4, 4)
    p = tuning.thread_plan(2, choice=quiet_probe(3.1, 1.6))  # the app leaves a core to its UI
    assert (p.prefill, p.decode) == (2, 2) and "at most 2" in p.reason
    p = tuning.thread_plan(2, override=3, choice=quiet_probe(3.1, 0.7))  # the user's setting wins
    assert (p.prefill, p.decode) == (3, 3) and "set by the user" in p.reason
    assert tuning.plan_for(torch.device("meta"), 2) is None  # threads are a CPU matter


def test_a_probe_taken_under_load_does_not_pin_a_quiet_run_to_one_thread(fresh, monkeypatch):
    # What happened: first start while the machine was busy measured 2 threads slower than 1.
    monkeypatch.setattr(tuning, "physical_cores", lambda: 2)
    busy = quiet_probe(0.6, 0.5, load=2.5, cores=2)
    (fresh / tuning.CACHE_NAME).write_text(json.dumps(busy.__dict__ | {"fingerprint": tuning.fingerprint()}))
    p = tuning.thread_plan(2, choice=busy)
    assert (p.prefill, p.decode) == (2, 2) and "under load 2.50" in p.reason
    # The next start on a quiet machine measures again and keeps the quiet result.
    monkeypatch.setattr(tuning, "load_per_core", lambda: 0.02)
    monkeypatch.setattr(tuning, "probe", lambda: quiet_probe(1.9, 1.4, cores=2))
    fresh_choice = tuning.cpu_choice()
    assert fresh_choice.load == 0.05 and fresh_choice.decode_thread_speedup == 1.4
    assert json.loads((fresh / tuning.CACHE_NAME).read_text())["load"] == 0.05
    # Still busy at the next start: keep the cache (no probe under load), and the hardware rule.
    (fresh / tuning.CACHE_NAME).write_text(json.dumps(busy.__dict__ | {"fingerprint": tuning.fingerprint()}))
    monkeypatch.setattr(tuning, "_CHOICE", None)
    monkeypatch.setattr(tuning, "load_per_core", lambda: 1.5)
    monkeypatch.setattr(tuning, "probe", lambda: pytest.fail("probed again under load"))
    assert tuning.cpu_choice().load == 2.5


def test_physical_cores_counts_each_core_once():
    n = tuning.physical_cores()
    assert 1 <= n <= (os.cpu_count() or 1)


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
    c = tuning.CpuChoice("float32", 2, 1, 1.0, 1.0, tuning.fingerprint(), "2026-12-01 00:00 UTC", 1.9, 0.6,
                         2, tuning.PROBE_VERSION, 0.05)
    monkeypatch.setattr(tuning, "physical_cores", lambda: 2)
    (fresh / tuning.CACHE_NAME).write_text(json.dumps(c.__dict__))
    monkeypatch.delenv("LLAMADESK_THREADS", raising=False)
    assert main(["info", str(fixtures / "stories260K.gguf"), "--device", "cpu", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "prefill 2 / decode 1 threads" in out and "0.60x" in out
    monkeypatch.setenv("LLAMADESK_THREADS", "1")
    assert main(["info", str(fixtures / "stories260K.gguf"), "--device", "cpu", "--dtype", "float32"]) == 0
    assert "1 threads: set by the user" in capsys.readouterr().out
