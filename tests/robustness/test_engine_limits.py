"""Generation under hostile settings and broken numbers: clean errors or the setting's
limit, never garbage; cancel lands within a short prefill chunk (issue 12)."""
import threading

import pytest
import torch
import os

from core.engine import prefill as prefill_mod
from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done, Token
from core.errors import SettingsError
from core.engine.settings import SamplingParams
from core.cli.main import main
from core.tokenizer import load_tokenizer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def lm(seeds):
    return load(seeds["gguf"], device="cpu", dtype="float32")


def run(lm, prompt, **kw):
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    return list(eng.generate(prompt, SamplingParams(**kw)))


def test_tiny_temperatures_behave_as_greedy(lm):
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    greedy = [e.token_id for e in run(lm, prompt, temperature=0, max_new_tokens=10) if isinstance(e, Token)]
    for t in (1e-40, 1e-30, 1e-6):
        evs = run(lm, prompt, temperature=t, max_new_tokens=10, seed=3)
        assert [e.token_id for e in evs if isinstance(e, Token)] == greedy
        assert all(lp == lp for lp in evs[-1].logprobs)  # no NaN log-probs


@pytest.mark.parametrize("field,value", [("repetition_penalty", 1e-45), ("repetition_penalty", float("inf")),
                                         ("length_penalty", 1e308), ("length_penalty", float("nan")),
                                         ("temperature", float("nan")), ("top_p", float("nan"))])
def test_extreme_sampler_values_are_clean_errors(field, value):
    with pytest.raises(SettingsError, match=field.split("_")[0]):
        SamplingParams(**{field: value}).validate()


def test_cli_extreme_values_exit_2_with_one_line(seeds, capsys):
    for opt, v in (("--length-penalty", "1e308"), ("--repetition-penalty", "1e-45")):
        rc = main(["generate", str(seeds["gguf"]), "--prompt", "x", "--device", "cpu", opt, v])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "penalty" in err


def poison(lm, monkeypatch, call: int, rows, value: float) -> None:
    """The model's ``call``-th forward pass (1 = the prefill) returns ``value`` in one vocabulary
    column of ``rows`` (an index or slice of the batch)."""
    calls = [0]
    forward = lm.model.forward

    def broken(x, *a, **k):
        out = forward(x, *a, **k)
        calls[0] += 1
        if calls[0] == call:
            out = out.clone()
            out[rows, ..., 5] = value
        return out
    monkeypatch.setattr(lm.model, "forward", broken)


def test_non_finite_logits_stop_the_reply_with_error(lm, monkeypatch):
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    poison(lm, monkeypatch, 4, slice(None), float("nan"))  # the third decode step overflows
    evs = run(lm, prompt, temperature=0.7, max_new_tokens=20, seed=1)
    done = evs[-1]
    assert isinstance(done, Done) and done.stop_reason == "error"
    assert len(done.tokens) == 3 and all(lp == lp for lp in done.logprobs)


def test_non_finite_logits_in_one_lane_stop_only_that_lane(lm, monkeypatch):
    """The finite flag is read per row with the sampled ids: the healthy lane goes on."""
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    poison(lm, monkeypatch, 3, 1, float("inf"))  # the second decode step, lane 1 only
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set())
    lanes = [SamplingParams(temperature=0, max_new_tokens=6), SamplingParams(temperature=0.8, seed=2, max_new_tokens=6)]
    done = {e.lane: e for e in eng.generate_lanes(prompt, lanes) if isinstance(e, Done)}
    assert done[1].stop_reason == "error" and len(done[1].tokens) == 2
    assert done[0].stop_reason == "length" and len(done[0].tokens) == 6


RAW = b"caf\xe9 ok \xed\xa0\x80"


def check_replaced(tok):
    ids = tok.encode(os.fsdecode(RAW))  # what Python makes of invalid UTF-8 in argv
    assert ids == tok.encode(RAW.decode("utf-8", "replace"))
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")


def test_invalid_utf8_text_is_replaced_not_raised(seeds):
    check_replaced(load(seeds["gguf"], device="cpu").tokenizer)  # SentencePiece
    check_replaced(load_tokenizer(seeds["tokenizer.json"]))  # tokenizers


def test_invalid_utf8_text_with_meta_tokenizers(llama2_kind_tokenizer, llama3_kind_tokenizer):
    check_replaced(load_tokenizer(llama2_kind_tokenizer))  # Meta's files where present
    check_replaced(load_tokenizer(llama3_kind_tokenizer))  # tiktoken


def test_cli_invalid_utf8_prompt_warns_and_generates(seeds, capsys):
    rc = main(["generate", str(seeds["gguf"]), "--prompt", os.fsdecode(b"Once \xff upon"), "--device", "cpu",
               "--max-new-tokens", "3", "--seed", "1"])
    err = capsys.readouterr().err
    assert rc == 0 and "not valid UTF-8" in err


class FakeClock:
    """perf_counter that advances only when the model runs: 1 ms per prompt token."""
    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t


def test_prefill_chunks_follow_measured_speed(lm, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(prefill_mod, "time", clock)
    sizes = []
    forward = lm.model.forward

    def timed(x, *a, **k):
        if x.shape[1] > 1:
            sizes.append(x.shape[1])
        clock.t += 0.001 * x.shape[1]  # 1000 prompt tokens a second
        return forward(x, *a, **k)
    monkeypatch.setattr(lm.model, "forward", timed)
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids, prefill_chunk=512)
    prompt = lm.tokenizer.encode("the little dog ran to the park " * 60, bos=True)
    list(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=1)))
    target = int(1000 * prefill_mod.PREFILL_TARGET_S)  # tokens that run in the target time
    assert sizes[0] == 4 * prefill_mod.MIN_PREFILL_CHUNK  # first a small chunk, to measure
    assert set(sizes[1:-1]) == {target} and sizes[-1] <= target
    assert sum(sizes) == len(prompt)


def test_cancel_between_prefill_chunks_lands_with_the_chunk_running(lm):
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    cancel = threading.Event()
    calls = []
    forward = lm.model.forward

    def counting(x, *a, **k):
        calls.append(x.shape[1])
        if len(calls) == 2:
            cancel.set()
        return forward(x, *a, **k)
    lm.model.forward = counting
    try:
        prompt = lm.tokenizer.encode("word " * 400, bos=True)
        evs = list(eng.generate(prompt, SamplingParams(temperature=0), cancel=cancel))
    finally:
        lm.model.forward = forward
    assert evs[-1].stop_reason == "cancelled" and len(calls) == 2
