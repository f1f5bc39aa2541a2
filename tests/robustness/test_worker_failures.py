"""The worker under injected failures: it never dies, and a failed load never costs the
working model (issue 12)."""
import json

import pytest

from core import limits
from core.engine.events import Done
from core.worker.protocol import Error, Loaded, Unloaded
from tests.helpers import completion, is_token, loaded_ok
from core.checkpoints import common

pytestmark = pytest.mark.timeout(120)


def error_of(col, rid):
    evs = col.finished(rid)
    assert isinstance(evs[-1], Error), evs[-1]
    return evs[-1].message


def still_works(w, col):
    evs = col.finished(w.generate(completion(max_new=3)))
    assert isinstance(evs[-1], Done) and evs[-1].stop_reason in ("length", "eos")
    assert w.alive


def test_memory_errors_while_generating_leave_the_worker_alive(make_worker, seeds, monkeypatch):  # noqa: F811
    w, col = make_worker()
    loaded_ok(col, w.load(seeds["gguf"]))
    model = w._loaded.model
    forward = model.forward
    for exc in (MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                            "7516192768 bytes. Error code 12 (Cannot allocate memory)")):
        def failing(*a, exc=exc, **k):
            raise exc
        model.forward = failing
        msg = error_of(col, w.generate(completion(max_new=5)))
        assert msg.startswith("out of memory while generating")
        model.forward = forward
        still_works(w, col)


def test_memory_error_while_loading_keeps_the_working_model(make_worker, seeds, monkeypatch):  # noqa: F811
    w, col = make_worker()
    loaded_ok(col, w.load(seeds["gguf"]))

    def no_memory(*a, **k):
        raise MemoryError
    monkeypatch.setattr(common.Transformer, "__init__", no_memory)
    rid = w.load(seeds["hf"])
    assert "not enough memory to load this model" in error_of(col, rid)
    assert not any(isinstance(e, Unloaded) for e in col.of(rid))
    monkeypatch.undo()
    assert w.info is not None and w.info["format"] == "gguf"
    still_works(w, col)


def test_a_model_that_cannot_fit_is_refused_and_the_current_one_stays(make_worker, seeds, clone):  # noqa: F811
    w, col = make_worker()
    loaded_ok(col, w.load(seeds["gguf"]))
    big = clone(seeds["hf"])
    cfg = json.loads((big / "config.json").read_text())
    cfg.update(num_hidden_layers=1000, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
               num_key_value_heads=8, head_dim=128, vocab_size=128256)  # ~1 T parameters
    (big / "config.json").write_text(json.dumps(cfg))
    rid = w.load(big)
    msg = error_of(col, rid)
    assert "needs" in msg and "TiB of memory" in msg and "unloaded" not in msg
    assert not any(isinstance(e, Unloaded) for e in col.of(rid))
    still_works(w, col)


def test_the_old_model_is_released_only_when_both_would_not_fit(make_worker, seeds, monkeypatch):  # noqa: F811
    w, col = make_worker()
    loaded_ok(col, w.load(seeds["gguf"]))
    held = w._held_bytes()
    need = limits.model_bytes(w._loaded.args, 4, held=None)
    # Free memory for the new model alone, not for both: the old one goes first, then it loads.
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: need + held // 2 if w._loaded else need * 2)
    rid = w.load(seeds["meta"])
    evs = col.wait(lambda evs: [e for e in evs if e.request_id == rid and isinstance(e, (Loaded, Error))])
    assert isinstance(evs[-1], Loaded)
    kinds = [type(e).__name__ for e in col.of(rid)]
    assert kinds.index("Unloaded") < kinds.index("Loaded")
    still_works(w, col)


def test_a_request_whose_cache_cannot_fit_is_refused_with_its_size(make_worker, seeds, monkeypatch):  # noqa: F811
    w, col = make_worker()
    loaded_ok(col, w.load(seeds["gguf"]))
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: 1000)
    msg = error_of(col, w.generate(completion(max_new=2000)))
    assert "a request of" in msg and "needs" in msg
    monkeypatch.undo()
    still_works(w, col)


def test_listener_memory_errors_do_not_kill_the_worker(make_worker, seeds):  # noqa: F811
    def hook(ev):
        if is_token(ev):
            raise MemoryError
    w, col = make_worker(hook)
    loaded_ok(col, w.load(seeds["gguf"]))
    col.finished(w.generate(completion(max_new=3)))
    assert w.alive
