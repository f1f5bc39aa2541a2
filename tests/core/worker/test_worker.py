"""The worker thread: events in order, cancel, errors, shutdown; no Qt."""
from __future__ import annotations

import threading

import pytest
import torch

from core import checkpoints
from core.prompt.chat_format import chat_format_for
from core.engine.engine import Engine
from core.engine.events import Done, Prefilled, Token
from core.errors import SettingsError
from core.prompt.prompting import fit_dialog, reply_reserve
from core.engine.settings import SamplingParams
from core.worker.protocol import (CompareRequest, Counted, Error, GenerateRequest, LoadProgress, Loaded, Prompted,
                                  Unloaded)
from core.worker.worker import Worker, default_torch_threads, load_failure, resolve_torch_threads
from core.engine.events import Reply
from tests.helpers import PROMPT, ROOT, Collector, completion, inner, is_token, loaded_ok
from core import limits
from core.tokenizer.fingerprint import tokenizer_fingerprint
from core.worker.protocol import Held

@pytest.fixture
def gguf(fixtures):
    return fixtures / "stories260K.gguf"


def direct_text(path, prompt_ids_fn, params, **gen_kw) -> tuple[str, list[int]]:
    """What the engine produces without the worker."""
    lm = checkpoints.load(path)
    eng = Engine(lm.model, lm.tokenizer, max_context=lm.args.max_seq_len, stop_ids=lm.stop_ids)
    done = [e for e in eng.generate(prompt_ids_fn(lm), params, **gen_kw) if type(e).__name__ == "Done"][0]
    return done.text, done.tokens


# --------------------------------------------------------------------------- happy path

def test_load_generate_events_in_order_and_match_engine(make_worker, gguf):
    w, col = make_worker()
    lid = w.load(gguf)
    gid = w.generate(completion())
    evs = col.finished(gid)
    kinds = [type(e) for e in col.events]
    # LoadProgress…, Loaded, Prompted, Reply(Prefilled), Reply(Token)…, Reply(Done)
    first_loaded = kinds.index(Loaded)
    # the worker was given 1 thread: both phases use it, and the model's facts say so
    assert col.events[first_loaded].info["threads"] == "1 threads: set by the user"
    assert kinds[0] is LoadProgress and all(k is LoadProgress for k in kinds[:first_loaded])
    assert [e.request_id for e in col.events[: first_loaded + 1]] == [lid] * (first_loaded + 1)
    assert all(type(e) is Reply for e in col.events[first_loaded + 2:])
    assert [type(e) for e in evs[:2]] == [Prompted, Prefilled] and type(evs[-1]) is Done
    assert all(isinstance(e, Token) for e in evs[2:-1])
    deltas = evs[2:-1]
    done = evs[-1]
    assert [d.index for d in deltas] == list(range(len(deltas)))
    assert "".join(d.text for d in deltas) == done.text
    assert done.stop_reason in ("length", "eos") and done.params.seed == 7
    assert done.stats.generated_tokens == len(done.tokens) and done.stats.prompt_tokens == 5
    info = col.events[first_loaded].info
    assert info["name"] == "stories260K" and info["context_length"] > 0 and w.info == info
    prompted, prefilled = evs[0], evs[1]
    assert prefilled.prompt_tokens == 5 and prompted.dropped_messages == 0
    assert prompted.context_length == info["context_length"]

    text, tokens = direct_text(gguf, lambda lm: lm.tokenizer.encode(PROMPT, bos=True),
                               SamplingParams(temperature=0.8, max_new_tokens=30, seed=7))
    assert done.text == text and done.tokens == tokens


def test_greedy_completion_is_the_known_continuation(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf)
    done = col.finished(w.generate(completion(max_new=12, temperature=0)))[-1]
    assert done.text.startswith(", there was a little girl named Lily")


def test_chat_mode_matches_engine_and_reuses_the_cache(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf)
    msgs = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
    params = SamplingParams(temperature=0.7, max_new_tokens=20, seed=3)
    evs = col.finished(w.generate(GenerateRequest(messages=msgs, params=params, chat_format="llama2")))
    done = evs[-1]
    fmt_ids = lambda lm: chat_format_for(lm.tokenizer, override="llama2").encode_dialog(msgs)  # noqa: E731
    text, _ = direct_text(gguf, fmt_ids, params, strip_leading_space=True)
    assert done.text == text and not done.text.startswith(" ")
    # The next turn extends the same prompt: only its new tokens are prefilled.
    msgs2 = msgs + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "More."}]
    started = col.finished(w.generate(GenerateRequest(messages=msgs2, params=params, chat_format="llama2")))[1]
    assert isinstance(started, Prefilled) and started.cached_tokens > evs[1].prompt_tokens // 2


def test_count_is_the_prompt_a_reply_would_prefill(make_worker, gguf):
    """Worker.count builds the prompt a reply would (chat format, oldest turns left out) and
    says its length, without generating: equal to the engine's own prefill count."""
    w, col = make_worker()
    rid = w.count(GenerateRequest(messages=[{"role": "user", "content": "hi"}]))
    assert "no model is loaded" in col.finished(rid)[-1].message
    w.load(gguf)
    msgs = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"},
            {"role": "assistant", "content": "there was a cat."}, {"role": "user", "content": "More."}]
    request = GenerateRequest(messages=msgs, params=SamplingParams(max_new_tokens=4, seed=1), chat_format="llama2")
    rid = w.count(request)
    counted = col.wait(lambda evs: [e for e in evs if e.request_id == rid and isinstance(e, Counted)])[0]
    prefilled = col.finished(w.generate(request))[1]
    assert counted.tokens == prefilled.prompt_tokens > 10
    assert counted.context_length == w.info["context_length"]
    assert not [e for e in col.of(rid) if not isinstance(e, Counted)]  # nothing generated


def test_compare_runs_one_done_per_lane(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf)
    lanes = [SamplingParams(temperature=0, max_new_tokens=8), SamplingParams(temperature=1.0, seed=1, max_new_tokens=12)]
    evs = col.finished(w.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes, inspect=3)), lanes=2)
    dones = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
    assert [d.lane for d in dones] == [0, 1]
    for d in dones:
        assert "".join(t.text for t in evs if isinstance(t, Token) and t.lane == d.lane) == d.text
    tops = [t.top for t in evs if isinstance(t, Token)]
    assert tops and all(t and len(t["raw"]) <= 3 for t in tops)


def test_beam_search_comes_back_with_every_beam_as_the_engine_gives_them(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf)
    params = SamplingParams(temperature=0, num_beams=3, max_new_tokens=8, seed=1)
    done = col.finished(w.generate(GenerateRequest(mode="completion", prompt=PROMPT, params=params)))[-1]
    lm = checkpoints.load(gguf)
    eng = Engine(lm.model, lm.tokenizer, max_context=lm.args.max_seq_len, stop_ids=lm.stop_ids)
    direct = list(eng.generate(lm.tokenizer.encode(PROMPT, bos=True), params))[-1]
    def same(a, b):  # the same hypotheses; numbers to float rounding (another thread count)
        return ([(x.tokens, x.text, x.stop_reason) for x in a] == [(x.tokens, x.text, x.stop_reason) for x in b]
                and [x.score for x in a] == pytest.approx([x.score for x in b], abs=1e-4))
    assert len(done.beams) == 3 and same(done.beams, direct.beams)
    # a comparison's beam lane comes back with its beams too, beside a sampled lane
    lanes = [SamplingParams(temperature=0, max_new_tokens=8), params]
    evs = col.finished(w.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes)), lanes=2)
    dones = {e.lane: e for e in evs if isinstance(e, Done)}
    assert same(dones[1].beams, direct.beams) and not dones[0].beams


def test_continue_reply_carries_on_after_the_partial_reply(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf)
    msgs = [{"role": "user", "content": "Once upon a time"}]
    first = col.finished(w.generate(GenerateRequest(messages=msgs, params=SamplingParams(temperature=0, max_new_tokens=6),
                                                    chat_format="llama2")))
    cont = col.finished(w.generate(GenerateRequest(messages=msgs, params=SamplingParams(temperature=0, max_new_tokens=6),
                                                   chat_format="llama2", continue_reply=first[-1].text)))
    assert cont[1].prompt_tokens > first[1].prompt_tokens
    assert cont[-1].stop_reason in ("length", "eos")


# --------------------------------------------------------------------------- cancel

def test_cancel_during_decode_stops_within_one_step(make_worker, gguf):
    holder = {}

    def hook(ev):
        if is_token(ev, holder.get("rid"), 4):
            holder["w"].cancel(ev.request_id)  # on the worker thread, right after token 4 was made
    w, col = make_worker(hook)
    holder["w"] = w
    w.load(gguf)
    holder["rid"] = rid = w.generate(completion(max_new=1000))
    done = col.finished(rid)[-1]
    assert done.stop_reason == "cancelled" and len(done.tokens) == 5
    again = col.finished(w.generate(completion(max_new=10)))[-1]
    assert again.stop_reason in ("length", "eos") and len(again.tokens) > 0


def test_cancel_during_long_prefill_stops_between_chunks(make_worker, gguf):
    lm = checkpoints.load(gguf)
    calls = []
    holder = {}
    forward = lm.model.forward

    def counting_forward(x, *a, **kw):
        if x.shape[1] > 1:  # a prefill chunk
            calls.append(x.shape[1])
            if len(calls) == 3 and holder.get("cancel"):
                holder["w"].cancel(holder["rid"])
        return forward(x, *a, **kw)
    lm.model.forward = counting_forward
    w, col = make_worker(prefill_chunk=8)
    holder["w"] = w
    w.adopt(lm)
    long_prompt = " ".join(["the little dog ran to the park and played"] * 30)
    holder["cancel"] = True
    holder["rid"] = w.generate(completion(prompt=long_prompt, max_new=5))
    evs = col.finished(holder["rid"])
    assert isinstance(evs[1], Prefilled) and evs[1].prompt_tokens > 100
    assert evs[-1].stop_reason == "cancelled" and evs[-1].tokens == []
    assert len(calls) == 3  # the chunk running when cancel came finished; no further chunk ran
    holder["cancel"] = False
    params = SamplingParams(temperature=0.8, max_new_tokens=10, seed=5)
    evs = col.finished(w.generate(GenerateRequest(mode="completion", prompt=long_prompt, params=params)))
    assert evs[1].cached_tokens == 24  # the three chunks that ran are reused
    lm.model.forward = forward
    text, _ = direct_text(gguf, lambda m: m.tokenizer.encode(long_prompt, bos=True), params)
    assert evs[-1].text == text


def test_cancel_all_reaches_queued_requests_but_not_later_ones(make_worker, gguf):
    w, col = make_worker()
    loaded_ok(col, w.load(gguf))
    a = w.generate(completion(max_new=1000))
    b = w.generate(completion(max_new=1000))
    w.cancel_all()
    c = w.generate(completion(max_new=5))
    assert col.finished(a)[-1].stop_reason == "cancelled"
    assert col.finished(b)[-1].stop_reason == "cancelled"
    assert col.finished(c)[-1].stop_reason in ("length", "eos")


def test_cancel_names_one_request_and_leaves_the_others(make_worker, gguf):
    holder = {}

    def hook(ev):  # on the worker thread: while a runs, cancel the queued b only
        if is_token(ev, holder.get("a"), 2):
            holder["w"].cancel(holder["b"])
    w, col = make_worker(hook)
    holder["w"] = w
    loaded_ok(col, w.load(gguf))
    holder["b"] = None
    holder["a"] = a = w.generate(completion(max_new=12, temperature=0))
    holder["b"] = b = w.generate(completion(max_new=12, temperature=0))
    c = w.generate(completion(max_new=12, temperature=0))
    done_a, done_b, done_c = (col.finished(r)[-1] for r in (a, b, c))
    assert done_b.stop_reason == "cancelled" and done_b.tokens == []
    assert done_a.stop_reason in ("length", "eos") and done_c.stop_reason in ("length", "eos")
    assert done_a.text == done_c.text and len(done_a.tokens) == 12
    w.cancel(a)  # a finished request: nothing to cancel, and nothing else is touched
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")


# --------------------------------------------------------------------------- errors

def _error(col, rid) -> str:
    evs = col.wait(lambda evs: [e for e in evs if e.request_id == rid and isinstance(e, (Error, Loaded))])
    err = evs[-1]
    assert isinstance(err, Error), err
    assert "\n" not in err.message and "Traceback" not in err.message and len(err.message) < 400
    return err.message


def test_bad_path_and_broken_file_are_readable_errors(make_worker, gguf, tmp_path):
    w, col = make_worker()
    assert "no model is loaded" in _error(col, w.generate(completion()))
    assert "no such file" in _error(col, w.load(tmp_path / "nope.gguf"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(gguf.read_bytes()[:5000])
    msg = _error(col, w.load(broken))
    assert "broken.gguf" in msg or "truncated" in msg.lower() or "tensor" in msg.lower(), msg
    assert w.alive and w.info is None
    loaded_ok(col, w.load(gguf))
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")


def test_failed_load_leaves_a_clear_state(make_worker, gguf, tmp_path):
    w, col = make_worker()
    loaded_ok(col, w.load(gguf))
    # Not a model at all: the current model stays.
    _error(col, w.load(tmp_path / "missing"))
    assert w.info is not None
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")
    assert "device" in _error(col, w.load(gguf, device="tpu"))
    assert w.info is not None
    # A model file that breaks midway: refused before the working model is released.
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(gguf.read_bytes()[:5000])
    rid = w.load(broken)
    msg = _error(col, rid)
    assert "unloaded" not in msg
    assert not any(isinstance(e, Unloaded) for e in col.of(rid)) and w.info is not None
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")


def test_bad_settings_are_errors_and_the_worker_goes_on(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf)
    bad = GenerateRequest(mode="completion", prompt="x", params=SamplingParams(temperature=-1))
    assert "temperature" in _error(col, w.generate(bad))
    assert "chat format" in _error(col, w.generate(GenerateRequest(messages=[{"role": "user", "content": "hi"}],
                                                                   chat_format="nonsense")))
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")


def test_listener_exceptions_do_not_kill_the_worker(make_worker, gguf):
    def hook(ev):
        if is_token(ev):
            raise RuntimeError("listener bug")
    w, col = make_worker(hook)
    w.load(gguf)
    assert col.finished(w.generate(completion(max_new=3)))  # Collector.__call__ raised before recording deltas
    assert w.alive


# --------------------------------------------------------------------------- load / shutdown races

def test_load_while_generating_cancels_the_generation_first(make_worker, gguf):
    holder = {}

    def hook(ev):
        if is_token(ev, holder.get("gen"), 3):
            holder["load"] = holder["w"].load(gguf)
    w, col = make_worker(hook)
    holder["w"] = w
    loaded_ok(col, w.load(gguf))
    holder["gen"] = w.generate(completion(max_new=1000))
    done = col.finished(holder["gen"])[-1]
    assert done.stop_reason == "cancelled" and len(done.tokens) == 4
    lid = col.wait(lambda evs: holder.get("load"))
    evs = col.wait(lambda evs: [e for e in evs if e.request_id == lid and isinstance(e, (Loaded, Error))])
    assert isinstance(evs[-1], Loaded)
    kinds = [type(e) for e in col.of(lid)]
    # Both fit: the new model is built beside the old, which is released just before it is installed.
    assert kinds[-1] is Loaded and Unloaded in kinds[:-1]
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")


def test_shutdown_while_generating_returns_quickly(gguf):
    col = Collector()
    w = Worker(col, torch_threads=1)
    w.start()
    w.load(gguf)
    rid = w.generate(completion(max_new=100000))
    col.wait(lambda evs: any(is_token(e) for e in evs))
    w.stop()
    # The thread ends because the reply was cancelled mid-decode (not by running out of work):
    # the generous bound only keeps a broken cancel from hanging the suite.
    assert w.join(30) and not w.alive
    assert col.of(rid)[-1].stop_reason == "cancelled"
    assert isinstance(inner(col.events[-1]), Done)
    # After shutdown, commands are answered with an error, not silence.
    assert "shut down" in _error(col, w.generate(completion()))


def test_shutdown_while_loading_returns_quickly(gguf):
    seen, release = threading.Event(), threading.Event()

    def hook(ev):
        if isinstance(ev, LoadProgress) and not seen.is_set():
            seen.set()
            release.wait(5)  # hold the load at its first progress report
    col = Collector(hook)
    w = Worker(col, torch_threads=1)
    w.start()
    rid = w.load(gguf)
    assert seen.wait(20)
    threading.Timer(0.05, release.set).start()
    w.stop()
    assert w.join(30) and not w.alive
    last = col.of(rid)[-1]
    assert isinstance(last, Error) and last.cancelled and "cancelled" in last.message


def test_shutdown_without_start_and_twice(gguf):
    w = Worker(lambda ev: None)
    w.shutdown(1)
    w.shutdown(1)
    assert not w.alive


# --------------------------------------------------------------------------- fitting the context

@pytest.fixture
def llama2_format(gguf):
    tok = checkpoints.load(gguf).tokenizer
    return chat_format_for(tok, override="llama2")


def _dialog(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You tell short stories."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Tell me story number {i} about a cat and a dog."})
        msgs.append({"role": "assistant", "content": f"Story {i}: the cat and the dog played in the park all day."})
    msgs.append({"role": "user", "content": "One more, please."})
    return msgs


def test_fit_dialog_drops_oldest_pairs_and_keeps_the_system_prompt(llama2_format):
    msgs = _dialog(6)
    full = llama2_format.encode_dialog(msgs)
    ids, dropped = fit_dialog(llama2_format, msgs, len(full))
    assert (ids, dropped) == (full, 0)
    budget = len(full) - 10
    ids, dropped = fit_dialog(llama2_format, msgs, budget)
    assert len(ids) <= budget and dropped == 2  # one user+assistant pair
    kept = [msgs[0]] + msgs[1 + dropped:]
    assert ids == llama2_format.encode_dialog(kept)
    # Minimal: keeping one more pair would not fit.
    assert len(llama2_format.encode_dialog([msgs[0]] + msgs[1 + dropped - 2:])) > budget
    only_last = llama2_format.encode_dialog([msgs[0], msgs[-1]])
    ids, dropped = fit_dialog(llama2_format, msgs, len(only_last))
    assert ids == only_last and dropped == len(msgs) - 2
    with pytest.raises(SettingsError, match="last message"):
        fit_dialog(llama2_format, msgs, len(only_last) - 1)


def test_fit_dialog_never_starts_on_an_orphan_reply(llama2_format):
    msgs = [{"role": "user", "content": "a " * 30}, {"role": "assistant", "content": "b " * 30},
            {"role": "user", "content": "c"}]
    ids, dropped = fit_dialog(llama2_format, msgs, len(llama2_format.encode_dialog(msgs)) - 1)
    assert dropped == 2 and ids == llama2_format.encode_dialog(msgs[2:])


def test_worker_reports_dropped_turns_and_too_long_messages(make_worker, gguf):
    w, col = make_worker()
    w.load(gguf, max_seq_len=160)
    params = SamplingParams(temperature=0, max_new_tokens=20)
    prompted, started = col.finished(w.generate(GenerateRequest(messages=_dialog(8), params=params,
                                                                chat_format="llama2")))[:2]
    assert isinstance(prompted, Prompted) and prompted.dropped_messages >= 2 and prompted.dropped_messages % 2 == 0
    assert started.prompt_tokens <= 160 - reply_reserve(160, 20)
    huge = [{"role": "user", "content": "dog " * 400}]
    msg = _error(col, w.generate(GenerateRequest(messages=huge, params=params)))
    assert "last message" in msg and "tokens" in msg
    assert "context" in _error(col, w.generate(completion(prompt="dog " * 400)))


def test_reply_reserve_never_eats_the_whole_context():
    assert reply_reserve(4096, 256) == 256
    assert reply_reserve(4096, 100000) == 2048
    assert reply_reserve(2, 5) == 1


def test_thread_count_resolution(monkeypatch):
    monkeypatch.delenv("LLAMADESK_THREADS", raising=False)
    assert default_torch_threads(2) == 1 and default_torch_threads(1) == 1 and default_torch_threads(8) == 7
    assert resolve_torch_threads(3) == 3
    monkeypatch.setenv("LLAMADESK_THREADS", "2")
    assert resolve_torch_threads() == 2 and resolve_torch_threads(1) == 1
    monkeypatch.setenv("LLAMADESK_THREADS", "lots")
    assert resolve_torch_threads() == default_torch_threads()
    with pytest.raises(SettingsError):
        resolve_torch_threads(0)


def test_dropping_a_model_calls_the_given_garbage_collector(make_worker, gguf):
    calls = threading.Event()
    w, col = make_worker(collect_garbage=calls.set)
    loaded_ok(col, w.load(gguf))
    assert not calls.is_set()
    w.unload()
    assert calls.wait(20)


# --------------------------------------------------------------------------- a second checkpoint

DEMO = __import__("tests.helpers", fromlist=["ROOT"]).ROOT / "assets" / "models" / "llamadesk-demo"


def held_or_error(col, rid):
    return col.wait(lambda evs: [e for e in evs if e.request_id == rid and isinstance(e, (Held, Error))])[-1]


def test_a_second_checkpoint_is_held_beside_the_model_and_runs_its_lanes(make_worker, gguf):
    w, col = make_worker()
    main = loaded_ok(col, w.load(gguf)).info
    held = held_or_error(col, w.hold(DEMO))
    assert isinstance(held, Held), held
    info = held.info
    assert info["name"] == "llamadesk-demo" and info["key"] == str(DEMO.resolve())
    demo = checkpoints.load(DEMO)
    assert info["tokenizer"] == tokenizer_fingerprint(demo.tokenizer, demo.args.vocab_size) != main["tokenizer"]
    lanes = [SamplingParams(temperature=0, max_new_tokens=16), SamplingParams(temperature=0.9, seed=3, max_new_tokens=16)]
    on_demo = col.finished(w.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes, model=info["key"])), 2)
    on_main = col.finished(w.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes)), 2)
    for evs, path in ((on_demo, DEMO), (on_main, gguf)):
        dones = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
        for d, p in zip(dones, lanes):
            assert (d.text, d.tokens) == direct_text(path, lambda lm: lm.tokenizer.encode(PROMPT, bos=True), p)
    assert [d.text for d in on_main if isinstance(d, Done) and d.lane == 0][0].startswith(", there was a little girl")
    # Held again: the same model at once, not a second copy.
    first = w._held[info["key"]][0]
    assert isinstance(held_or_error(col, w.hold(DEMO)), Held) and w._held[info["key"]][0] is first
    # Released: a lane that still names it gets a clear error, the main model goes on.
    w.release(info["key"])
    evs = col.finished(w.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes[:1], model=info["key"])))
    assert isinstance(evs[-1], Error) and "not loaded any more" in evs[-1].message
    assert any(isinstance(e, Done) for e in col.finished(w.generate(completion(max_new=3))))


def test_a_checkpoint_that_does_not_fit_beside_the_model_is_refused_and_the_model_stays(make_worker, gguf,
                                                                                         monkeypatch):
    w, col = make_worker()
    loaded_ok(col, w.load(gguf))
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: 1000)
    err = held_or_error(col, w.hold(DEMO))
    assert isinstance(err, Error) and "llamadesk-demo beside the loaded model needs" in err.message
    assert "available" in err.message and not err.cancelled
    assert not any(isinstance(e, Unloaded) for e in col.events) and w._held == {}
    monkeypatch.undo()
    assert any(isinstance(e, Done) for e in col.finished(w.generate(completion(max_new=3))))
    # Not a model at all: a readable error too.
    err = held_or_error(col, w.hold(gguf.parent / "README.md"))
    assert isinstance(err, Error) and "\n" not in err.message


def test_lanes_draft_with_lookup_or_a_draft_model_the_worker_loads(make_worker, gguf):
    """Speculative lanes give plain greedy output; the worker loads a lane's draft model on
    first use, and a draft model of another vocabulary is a readable error."""
    w, col = make_worker()
    w.load(gguf)
    lanes = [SamplingParams(temperature=0, max_new_tokens=24, **spec)
             for spec in (dict(), dict(lookup=2), dict(draft=str(gguf)))]
    evs = col.finished(w.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes)), lanes=3)
    dones = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
    assert dones[0].tokens == dones[1].tokens == dones[2].tokens and len(dones[0].tokens) == 24
    assert dones[0].stats.speculative is None
    assert dones[1].stats.speculative["kind"] == "lookup"
    assert dones[2].stats.speculative["kind"] == "draft" and dones[2].stats.speculative["acceptance"] == 1.0
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    bad = GenerateRequest(mode="completion", prompt="x", params=SamplingParams(draft=str(demo)))
    assert "another vocabulary" in _error(col, w.generate(bad))
    assert col.finished(w.generate(completion(max_new=3)))[-1].stop_reason in ("length", "eos")


def test_compiled_load_says_its_decode_path_before_and_after_the_first_reply(make_worker, gguf, monkeypatch):
    """load(compile=True) reaches the engine; info()["decode"] says what will run, then what
    ran: here torch.compile fails (as without a C++ compiler) and the reply, decoded
    eagerly instead, is the one an uncompiled load gives."""
    w, col = make_worker()
    loaded_ok(col, w.load(gguf))
    assert w.info["decode"] == "eager: compile is off"
    plain = col.finished(w.generate(completion(temperature=0)))[-1]

    def no_compiler(fn, **kw):
        def compiled(*a, **k):
            raise RuntimeError("no C++ compiler here")
        return compiled
    monkeypatch.setattr(torch, "compile", no_compiler)
    loaded_ok(col, w.load(gguf, compile=True))
    assert w.info["decode"] == "compiles at the first decode step (inductor)"
    done = col.finished(w.generate(completion(temperature=0)))[-1]
    assert done.tokens == plain.tokens and done.stop_reason == plain.stop_reason
    assert w.info["decode"].startswith("eager: compiling failed (RuntimeError: no C++ compiler")
    assert done.stats.decode == w.info["decode"] and plain.stats.decode == ""


@pytest.mark.parametrize("exc, words", [
    (MemoryError(), "not enough memory"),
    (FileNotFoundError(2, "No such file or directory", "/m/consolidated.00.pth"), "could not read the model's files (/m/consolidated.00.pth)"),
    (ValueError("could not broadcast input array from shape (3,) into shape (2,)"), "damaged or in a form"),
])
def test_unexpected_loader_exceptions_in_the_users_words(exc, words):
    msg = load_failure(exc)
    assert words in msg and "broadcast" not in msg
