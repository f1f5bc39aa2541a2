"""The generation loop: events, stop rules, cancel, prefix reuse, batches and lanes."""
import threading

import pytest
import torch

from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done, Prefilled, Token
from core.errors import SettingsError
from core.engine.settings import SamplingParams
from core.model.kv_cache import rounded_capacity


@pytest.fixture(scope="module")
def lm(tiny_meta_dir):
    return load(tiny_meta_dir, device="cpu", dtype="float32")


@pytest.fixture
def engine(lm):
    return Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)


def run(engine, prompt, **kw):
    evs = list(engine.generate(prompt, SamplingParams(**kw)))
    return evs, evs[-1]


def reference_greedy(model, prompt, n):
    """Greedy by full forward passes, no cache: the slow obviously-right way."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_events_in_order_and_text_is_sum_of_deltas(engine, lm):
    prompt = lm.tokenizer.encode("Hello world", bos=True)
    evs, done = run(engine, prompt, temperature=0, max_new_tokens=12)
    assert isinstance(evs[0], Prefilled) and evs[0].prompt_tokens == len(prompt)
    toks = [e for e in evs if isinstance(e, Token)]
    assert isinstance(done, Done) and done.stop_reason == "length"
    assert [t.token_id for t in toks] == done.tokens and len(done.tokens) == 12
    assert "".join(t.text for t in toks) == done.text == lm.tokenizer.decode(prompt + done.tokens)[len("Hello world"):]
    assert done.stats.generated_tokens == 12 and done.stats.prompt_tokens == len(prompt)


def test_greedy_equals_uncached_reference_and_logprobs_are_raw(engine, lm):
    prompt = lm.tokenizer.encode("The quick brown fox", bos=True)
    _, done = run(engine, prompt, temperature=0, max_new_tokens=10)
    assert done.tokens == reference_greedy(lm.model, prompt, 10)
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt + done.tokens]))[0, len(prompt) - 1:-1]
    expect = torch.log_softmax(logits, -1).gather(-1, torch.tensor(done.tokens).view(-1, 1)).view(-1)
    torch.testing.assert_close(torch.tensor(done.logprobs), expect, atol=1e-4, rtol=0)


def test_logprobs_are_under_raw_distribution_even_with_temperature(engine, lm):
    prompt = lm.tokenizer.encode("Once", bos=True)
    _, done = run(engine, prompt, temperature=1.7, top_k=5, seed=3, max_new_tokens=5)
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt + done.tokens]))[0, len(prompt) - 1:-1]
    expect = torch.log_softmax(logits, -1).gather(-1, torch.tensor(done.tokens).view(-1, 1)).view(-1)
    torch.testing.assert_close(torch.tensor(done.logprobs), expect, atol=1e-4, rtol=0)


def test_same_seed_same_output_different_seed_differs(engine, lm):
    prompt = lm.tokenizer.encode("Hi", bos=True)
    a = run(engine, prompt, temperature=1.0, seed=11, max_new_tokens=16)[1].tokens
    b = run(engine, prompt, temperature=1.0, seed=11, max_new_tokens=16)[1].tokens
    c = run(engine, prompt, temperature=1.0, seed=12, max_new_tokens=16)[1].tokens
    assert a == b and a != c


def test_stop_token_ends_with_eos(lm):
    prompt = lm.tokenizer.encode("Hello", bos=True)
    first = reference_greedy(lm.model, prompt, 8)
    # Declare a later greedy token a stop token (the first one from the third on that did not
    # come before, whichever tokenizer built the prompt): generation must end right before it.
    k = next(i for i in range(2, len(first)) if first[i] not in first[:i])
    eng = Engine(lm.model, lm.tokenizer, stop_ids={first[k]})
    _, done = run(eng, prompt, temperature=0, max_new_tokens=20)
    assert done.stop_reason == "eos" and done.stop_token == first[k]
    assert done.tokens == first[:k]


def test_stop_string_truncates_and_is_never_streamed(engine, lm):
    prompt = lm.tokenizer.encode("Hello", bos=True)
    full = run(engine, prompt, temperature=0, max_new_tokens=20)[1].text
    stop = full[5:8]
    assert stop and stop in full
    evs, done = run(engine, prompt, temperature=0, max_new_tokens=20, stop=(stop,))
    assert done.stop_reason == "stop"
    assert done.text == full[: full.find(stop)]
    assert "".join(e.text for e in evs if isinstance(e, Token)) == done.text


def test_context_limit_stops_with_context(lm):
    eng = Engine(lm.model, lm.tokenizer, max_context=20, stop_ids=lm.stop_ids)
    prompt = lm.tokenizer.encode("Hello world", bos=True)
    _, done = run(eng, prompt, temperature=0, max_new_tokens=100)
    assert done.stop_reason == "context"
    assert len(prompt) + len(done.tokens) <= 21
    with pytest.raises(SettingsError, match="context"):
        list(eng.generate(list(range(3, 30)), SamplingParams()))


def test_cancel_lands_within_one_decode_step(engine, lm):
    cancel = threading.Event()
    prompt = lm.tokenizer.encode("Hello", bos=True)
    n = 0
    done = None
    for ev in engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=200), cancel=cancel):
        if isinstance(ev, Token):
            n += 1
            if n == 5:
                cancel.set()
        if isinstance(ev, Done):
            done = ev
    assert done.stop_reason == "cancelled"
    assert len(done.tokens) == 5
    # The engine works again afterwards, and its cache reuse gives the right answer.
    _, again = run(engine, prompt, temperature=0, max_new_tokens=6)
    assert again.tokens == reference_greedy(lm.model, prompt, 6)


def test_cancel_between_prefill_chunks(lm):
    eng = Engine(lm.model, lm.tokenizer, prefill_chunk=8, stop_ids=lm.stop_ids)
    prompt = lm.tokenizer.encode("word " * 100, bos=True)
    cancel = threading.Event()
    calls = []
    orig = lm.model.forward

    def counting(*a, **k):
        calls.append(a[0].shape[1])
        if len(calls) == 3:
            cancel.set()
        return orig(*a, **k)

    lm.model.forward = counting
    try:
        evs = list(eng.generate(prompt, SamplingParams(temperature=0), cancel=cancel))
    finally:
        del lm.model.forward
    assert evs[-1].stop_reason == "cancelled" and evs[-1].tokens == []
    assert len(calls) == 3 and all(c == 8 for c in calls)


def test_chat_turn_reuses_cached_prefix_and_matches_fresh_engine(lm):
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    turn1 = lm.tokenizer.encode("A long shared conversation prefix", bos=True)
    _, d1 = run(eng, turn1, temperature=0, max_new_tokens=8)
    turn2 = turn1 + d1.tokens + lm.tokenizer.encode(" and then")
    evs, d2 = run(eng, turn2, temperature=0, max_new_tokens=8)
    assert evs[0].cached_tokens >= len(turn1) + len(d1.tokens) - 1
    fresh = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    assert run(fresh, turn2, temperature=0, max_new_tokens=8)[1].tokens == d2.tokens
    # A prompt that diverges early reuses only the common part.
    evs3, d3 = run(eng, turn1[:3] + [500, 600], temperature=0, max_new_tokens=4)
    assert evs3[0].cached_tokens == 3
    assert d3.tokens == reference_greedy(lm.model, turn1[:3] + [500, 600], 4)


def test_batch_of_different_lengths_matches_each_alone(engine, lm):
    texts = ["Hi", "The weather today is rather", "Numbers: 1 2 3"]
    prompts = [lm.tokenizer.encode(t, bos=True) for t in texts]
    done = sorted((e for e in engine.generate_batch(prompts, SamplingParams(temperature=0, max_new_tokens=8))
                   if isinstance(e, Done)), key=lambda d: d.lane)
    for p, d in zip(prompts, done):
        assert d.tokens == reference_greedy(lm.model, p, 8)


def test_beam_search_runs_and_returns_a_scored_hypothesis(engine, lm):
    prompt = lm.tokenizer.encode("Hello", bos=True)
    evs, done = run(engine, prompt, temperature=0, num_beams=3, max_new_tokens=6)
    greedy = run(engine, prompt, temperature=0, max_new_tokens=6)[1]
    assert done.stop_reason in ("length", "eos") and 0 < len(done.tokens) <= 6
    # Beam search maximises the joint log-probability, so it is never worse than greedy.
    assert sum(done.logprobs) >= sum(greedy.logprobs) - 1e-4


@pytest.fixture(scope="module")
def hf_twin():
    """transformers' LlamaForCausalLM holding the same weights as ``lm``: the reference."""
    from tests.helpers import TINY_META, tiny_hf
    return tiny_hf(**TINY_META)


def hf_beam(hf, prompt, **kw):
    """transformers' beam search: its best continuation and that sequence's score."""
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=False, pad_token_id=0, bos_token_id=1, num_return_sequences=1,
                          return_dict_in_generate=True, output_scores=True, **kw)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), generation_config=gc)
    return out.sequences[0, len(prompt):].tolist(), float(out.sequences_scores[0])


def hf_logprobs(hf, prompt, tokens):
    """Each token's log-prob by one full forward pass of the reference, no cache."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens).view(-1, 1)).view(-1)


@pytest.mark.parametrize("num_beams", [2, 3, 4])
def test_beam_search_equals_transformers_generate(engine, lm, hf_twin, num_beams):
    # No stop token: every hypothesis has the same length, so length-penalty conventions agree.
    prompt = lm.tokenizer.encode("Hello world", bos=True)
    evs = list(engine.generate(prompt, SamplingParams(temperature=0, num_beams=num_beams, max_new_tokens=8),
                               stop_ids=()))
    done = evs[-1]
    ref, ref_score = hf_beam(hf_twin, prompt, num_beams=num_beams, max_new_tokens=8, eos_token_id=None,
                             length_penalty=1.0, early_stopping=True)
    assert done.tokens == ref and done.stop_reason == "length"
    # The reported log-probs are the reference's, recomputed by a full forward pass.
    lps = hf_logprobs(hf_twin, prompt, done.tokens)
    torch.testing.assert_close(torch.tensor(done.logprobs), lps, atol=1e-4, rtol=0)
    assert float(lps.sum()) / len(ref) == pytest.approx(ref_score, abs=1e-4)


def test_beam_search_with_a_stop_token_equals_transformers_generate(engine, lm, hf_twin):
    """A hypothesis that ends early competes with running ones; length_penalty 0 scores both by
    their summed log-prob, the one convention transformers and we share."""
    prompt = lm.tokenizer.encode("Hello world", bos=True)
    free = hf_beam(hf_twin, prompt, num_beams=3, max_new_tokens=8, eos_token_id=None)[0]
    stop = free[2]  # a token the best free-running beam meets: stopping there must compete
    params = SamplingParams(temperature=0, num_beams=3, max_new_tokens=8, length_penalty=0.0)
    done = list(engine.generate(prompt, params, stop_ids=(stop,)))[-1]
    ref, ref_score = hf_beam(hf_twin, prompt, num_beams=3, max_new_tokens=8, eos_token_id=stop,
                             length_penalty=0.0, early_stopping="never")
    assert done.stop_reason == "eos" and done.stop_token == stop
    ours = done.tokens + [stop]
    assert ours == ref
    assert float(hf_logprobs(hf_twin, prompt, ours).sum()) == pytest.approx(ref_score, abs=1e-4)


@pytest.mark.parametrize("num_beams,stop_at", [(2, None), (4, None), (3, 2)])
def test_every_beam_returned_equals_transformers_return_sequences(engine, lm, hf_twin, num_beams, stop_at):
    """Done.beams are the hypotheses transformers returns with num_return_sequences=num_beams:
    the same token sequences (a stopped one ends with its stop token), in the same order, with
    the same scores; with a stop token, length_penalty 0 (the convention both share)."""
    from transformers import GenerationConfig
    prompt = lm.tokenizer.encode("Hello world", bos=True)
    stop = None if stop_at is None else hf_beam(hf_twin, prompt, num_beams=3, max_new_tokens=8, eos_token_id=None)[0][stop_at]
    penalty, early = (1.0, True) if stop is None else (0.0, "never")
    params = SamplingParams(temperature=0, num_beams=num_beams, max_new_tokens=6, length_penalty=penalty)
    done = list(engine.generate(prompt, params, stop_ids=() if stop is None else (stop,)))[-1]
    gc = GenerationConfig(do_sample=False, pad_token_id=0, bos_token_id=1, num_beams=num_beams,
                          num_return_sequences=num_beams, max_new_tokens=6, eos_token_id=stop, length_penalty=penalty,
                          early_stopping=early, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        out = hf_twin.generate(torch.tensor([prompt]), generation_config=gc)
    ref = [row[len(prompt):].tolist() for row in out.sequences]
    ref = [r[:r.index(stop) + 1] if stop in r else r for r in ref]  # rows are padded with the stop token
    ours = [b.tokens + ([b.stop_token] if b.stop_token is not None else []) for b in done.beams]
    assert ours == ref and len(set(map(tuple, ref))) == num_beams
    assert stop is None or any(b.stop_reason == "eos" for b in done.beams)
    assert [b.score for b in done.beams] == pytest.approx([float(x) for x in out.sequences_scores], abs=1e-4)
    best = done.beams[0]
    assert (best.tokens, best.text, best.logprobs) == (done.tokens, done.text, done.logprobs)
    for b in done.beams:  # each beam's text is its tokens decoded, its log-probs the model's
        assert b.text == lm.tokenizer.decode(prompt + b.tokens)[len("Hello world"):]
        assert b.stop_reason == ("eos" if b.stop_token is not None else "length")
        torch.testing.assert_close(torch.tensor(b.logprobs), hf_logprobs(hf_twin, prompt, b.tokens), atol=1e-4, rtol=0)


def test_a_beam_lane_of_a_comparison_is_that_beam_search_beside_sampled_lanes(engine, lm):
    prompt = lm.tokenizer.encode("Hello world", bos=True)
    lanes = [SamplingParams(temperature=0, max_new_tokens=5), SamplingParams(temperature=0, num_beams=3, max_new_tokens=5),
             SamplingParams(temperature=0, max_new_tokens=4)]
    evs = list(engine.generate_lanes(prompt, lanes))
    dones = {e.lane: e for e in evs if isinstance(e, Done)}
    alone = run(engine, prompt, temperature=0, num_beams=3, max_new_tokens=5)[1]
    assert [b.tokens for b in dones[1].beams] == [b.tokens for b in alone.beams] and len(alone.beams) == 3
    assert dones[1].tokens == alone.tokens and dones[1].params.num_beams == 3
    assert dones[0].tokens == reference_greedy(lm.model, prompt, 5) and dones[2].tokens == dones[0].tokens[:4]
    assert not dones[0].beams and not dones[2].beams
    for k in (0, 1, 2):
        assert "".join(e.text for e in evs if isinstance(e, Token) and e.lane == k) == dones[k].text
    assert sorted(k for e in evs if isinstance(e, Prefilled) for k in e.lanes) == [0, 1, 2]
    with pytest.raises(SettingsError, match="beam"):
        engine.generate_lanes(prompt, lanes, forced=[5])


def test_invalid_prompt_tokens_are_rejected(engine):
    with pytest.raises(SettingsError, match="vocabulary"):
        list(engine.generate([1, 10**6], SamplingParams()))
    with pytest.raises(SettingsError, match="empty"):
        list(engine.generate([], SamplingParams()))


# -- lanes (comparison) -------------------------------------------------------------------

def lanes_done(engine, prompt, lanes):
    evs = list(engine.generate_lanes(prompt, lanes))
    assert sum(isinstance(e, Prefilled) for e in evs) == 1  # one shared prefill
    return sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane), evs


def test_greedy_lanes_equal_each_other_and_single_run(engine, lm):
    prompt = lm.tokenizer.encode("Once upon", bos=True)
    single = run(engine, prompt, temperature=0, max_new_tokens=10)[1].tokens
    done, _ = lanes_done(engine, prompt, [SamplingParams(temperature=0, max_new_tokens=10)] * 3)
    assert all(d.tokens == single for d in done)


def test_seeded_lanes_match_single_runs_and_stop_independently(engine, lm):
    prompt = lm.tokenizer.encode("Once upon", bos=True)
    lanes = [SamplingParams(temperature=1.0, seed=1, max_new_tokens=12),
             SamplingParams(temperature=1.0, seed=1, max_new_tokens=12),
             SamplingParams(temperature=1.0, seed=2, max_new_tokens=4),
             SamplingParams(temperature=0.7, top_k=20, seed=3, max_new_tokens=9)]
    done, evs = lanes_done(engine, prompt, lanes)
    assert done[0].tokens == done[1].tokens
    assert done[2].tokens != done[0].tokens[:4]  # another seed, another draw
    assert [len(d.tokens) for d in done] == [12, 12, 4, 9]
    for lane, d in zip(lanes, done):  # each lane alone: a comparison of one lane (batch-invariant)
        assert d.tokens == lanes_done(engine, prompt, [lane])[0][0].tokens
    # Lane 2 finished early; the others kept streaming afterwards.
    last_lane2 = max(i for i, e in enumerate(evs) if isinstance(e, Token) and e.lane == 2)
    assert any(isinstance(e, Token) and e.lane == 0 for e in evs[last_lane2 + 1:])


def test_lane_with_stop_string_stops_alone(engine, lm):
    prompt = lm.tokenizer.encode("Once upon", bos=True)
    full = run(engine, prompt, temperature=0, max_new_tokens=16)[1].text
    stop = full[4:7]
    done, _ = lanes_done(engine, prompt, [SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,)),
                                          SamplingParams(temperature=0, max_new_tokens=16)])
    assert done[0].stop_reason == "stop" and done[0].text == full[: full.find(stop)]
    assert done[1].stop_reason == "length" and done[1].text == full


def test_inspector_alternatives_match_direct_softmax(engine, lm):
    prompt = lm.tokenizer.encode("Hello", bos=True)
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9, seed=5, max_new_tokens=3)
    evs = list(engine.generate(prompt, params, inspect=5))
    toks = [e for e in evs if isinstance(e, Token)]
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt + [t.token_id for t in toks]]))[0, len(prompt) - 1:-1]
    for t, lg in zip(toks, logits):
        raw = lg.softmax(-1)
        top = torch.topk(raw, 5)
        assert [i for i, _ in t.top["raw"]] == top.indices.tolist()
        # Every alternative is named, so a UI without a tokenizer can show it.
        for i in top.indices.tolist():
            assert t.top["pieces"][i] == lm.tokenizer.token_bytes(i).decode("utf-8", "replace")
        torch.testing.assert_close(torch.tensor([p for _, p in t.top["raw"]]), top.values, atol=1e-5, rtol=0)
        scaled = lg / 0.8
        k4 = torch.topk(scaled, 4)
        probs = k4.values.softmax(-1)
        keep = (probs.cumsum(-1) - probs) < 0.9
        expect = probs[keep] / probs[keep].sum()
        assert [i for i, _ in t.top["filtered"]] == k4.indices[keep].tolist()
        torch.testing.assert_close(torch.tensor([p for _, p in t.top["filtered"]]), expect, atol=1e-5, rtol=0)


# -- serve: requests joining a running batch ------------------------------------------------

def test_requests_join_a_running_batch_and_each_matches_its_run_alone(engine, lm):
    from core.engine.engine import Joining
    texts = ["Hi", "The weather today is rather", "Numbers: 1 2 3", "Once"]
    prompts = [lm.tokenizer.encode(t, bos=True) for t in texts]
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    arrivals = {0: [Joining(prompts[0], [greedy])], 3: [Joining(prompts[1], [greedy]), Joining(prompts[2], [greedy])],
                5: [Joining(prompts[3], [greedy] * 2)]}
    calls, starts = [], {}

    def admit(free, next_lane):
        step = len(calls)
        calls.append((free, next_lane))
        new = arrivals.get(step, [])
        for j in new:
            starts[next_lane] = j
            next_lane += len(j.lanes)
        return new

    evs = list(engine.serve(admit, max_rows=8))
    done = {e.lane: e for e in evs if isinstance(e, Done)}
    assert sorted(done) == list(range(5))
    by_lane = {0: prompts[0], 1: prompts[1], 2: prompts[2], 3: prompts[3], 4: prompts[3]}
    for lane, p in by_lane.items():
        assert done[lane].tokens == reference_greedy(lm.model, p, 8), lane
    # Later requests joined while the first was still decoding: it was not served alone first.
    prefilled = [i for i, e in enumerate(evs) if isinstance(e, Prefilled)]
    first_done = next(i for i, e in enumerate(evs) if isinstance(e, Done))
    assert len(prefilled) == 4 and prefilled[2] < first_done
    assert [e.lanes for e in evs if isinstance(e, Prefilled)] == [(0,), (1,), (2,), (3, 4)]
    assert calls[3] == (7, 1)  # 8 rows, one busy


def test_cancelling_one_request_of_a_batch_stops_only_it_within_a_step(engine, lm):
    from core.engine.engine import Joining
    stop_a = threading.Event()
    long = SamplingParams(temperature=0, max_new_tokens=30)
    a = Joining(lm.tokenizer.encode("Hello", bos=True), [long], cancel=stop_a)
    b = Joining(lm.tokenizer.encode("Once upon", bos=True), [long])
    pending = [[a, b]]
    seen = 0
    for ev in engine.serve(lambda free, nxt: pending.pop() if pending else [], max_rows=4):
        if isinstance(ev, Token) and ev.lane == 0:
            seen += 1
            if seen == 3:
                stop_a.set()
        if isinstance(ev, Done):
            if ev.lane == 0:
                assert ev.stop_reason == "cancelled" and len(ev.tokens) == 3
            else:
                assert ev.stop_reason == "length" and len(ev.tokens) == 30
                assert ev.tokens == reference_greedy(lm.model, b.prompt, 30)


def test_kv_cache_grows_with_the_reply_not_with_max_new_tokens(lm):
    """A huge max_new_tokens and context cost nothing until tokens exist (issue 12)."""
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids, max_context=10**7)
    prompt = lm.tokenizer.encode("Hello", bos=True)
    evs = []
    for ev in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=10**6)):
        evs.append(ev)
        if isinstance(ev, Token) and ev.index == 299:
            break  # 300 tokens in: the cache must have grown past its first allocation
    assert eng.cache.capacity < 2048
    grown = eng.cache.capacity
    assert grown >= len(prompt) + 299
    # The same request with the static option is bounded by max_context, not 10**6 tokens.
    small = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids, max_context=64, preallocate=True)
    _, done = run(small, prompt, temperature=0, max_new_tokens=10**6)
    assert done.stop_reason == "context" and small.cache.capacity == 256


def test_grown_cache_gives_the_same_tokens_as_a_preallocated_one(lm):
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    step = rounded_capacity(1)  # the cache grows in steps of this many positions
    new = step + 24 - len(prompt)  # the reply outgrows the first step: one growth mid-reply
    grow = Engine(lm.model, lm.tokenizer, stop_ids=set(), max_context=700)
    static = Engine(lm.model, lm.tokenizer, stop_ids=set(), max_context=700, preallocate=True)
    a = run(grow, prompt, temperature=0.9, top_p=0.9, seed=4, max_new_tokens=new)[1]
    b = run(static, prompt, temperature=0.9, top_p=0.9, seed=4, max_new_tokens=new)[1]
    assert static.cache.capacity >= step + 24 and grow.cache.capacity > step and len(a.tokens) == new
    assert a.tokens == b.tokens and a.logprobs == b.logprobs


def test_compiled_decode_gives_the_same_tokens(lm):
    """torch.compile captures the decode step (dynamo with the eager backend here: the
    inductor backend takes minutes to compile on a small CPU) and changes nothing."""
    import torch._dynamo
    torch._dynamo.reset()
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    q = SamplingParams(temperature=0.9, top_p=0.9, seed=2, max_new_tokens=20)
    eager = run(Engine(lm.model, lm.tokenizer, stop_ids=set()), prompt, **q.to_dict())[1]
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), compile="eager")
    done = run(eng, prompt, **q.to_dict())[1]
    assert eng.compile_status == "compiled (eager)"
    assert done.tokens == eager.tokens
    torch.testing.assert_close(torch.tensor(done.logprobs), torch.tensor(eager.logprobs), atol=1e-5, rtol=0)


def test_compile_failure_falls_back_to_eager(lm, monkeypatch):
    def broken(*a, **k):
        def fn(*a, **k):
            raise RuntimeError("no C++ compiler here")
        return fn
    monkeypatch.setattr(torch, "compile", broken)
    prompt = lm.tokenizer.encode("Hello", bos=True)
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), compile=True)
    done = run(eng, prompt, temperature=0, max_new_tokens=6)[1]
    assert done.tokens == reference_greedy(lm.model, prompt, 6)
    assert eng.compile_status.startswith("eager: compiling failed") and "C++" in eng.compile_status


def test_a_decode_step_reads_the_device_once(engine, lm, monkeypatch):
    """Deliverable 5: no per-token host synchronisation beyond reading the token. Every
    way a tensor's value reaches Python (tolist, item, bool, int, float) is counted
    between consecutive Token events; a sampled lane and a greedy lane share each step."""
    reads = [0]
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, **k):
            reads[0] += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    lanes = [SamplingParams(temperature=0, max_new_tokens=8),
             SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=4, max_new_tokens=8)]
    per_step, seen = [], 0
    for ev in engine.generate_lanes(prompt, lanes):
        if isinstance(ev, Token) and ev.lane == 0:
            if seen:
                per_step.append(reads[0])
            seen += 1
            reads[0] = 0
    assert seen == 8 and per_step == [1] * 7


def test_branch_forces_the_chosen_token_and_reuses_the_prefix_from_the_cache(lm):
    """A branch at token i: the reply's first i tokens end the prompt and come from the KV
    cache (one position is run, for its logits), the chosen alternative is token i, and
    what follows is what greedy decoding after that prefix gives (no cache)."""
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    _, first = run(eng, prompt, temperature=0, max_new_tokens=10)
    i = 4
    alt = next(t for t in range(5, 500) if t != first.tokens[i] and t not in lm.stop_ids)
    positions = []
    real_forward = lm.model.forward

    def counting(x, *a, **kw):
        positions.append(x.shape[1])
        return real_forward(x, *a, **kw)
    lm.model.forward = counting
    try:
        evs = list(eng.generate(prompt + first.tokens[:i], SamplingParams(temperature=0, max_new_tokens=6),
                                forced=[alt], inspect=3))
    finally:
        del lm.model.forward
    pre, done = evs[0], evs[-1]
    assert isinstance(pre, Prefilled) and pre.cached_tokens == len(prompt) + i - 1
    assert done.stats.cached_tokens == pre.cached_tokens
    assert positions[0] == 1  # the prefill ran one position: the prefix was not recomputed
    assert done.tokens[0] == alt
    assert done.tokens[1:] == reference_greedy(lm.model, prompt + first.tokens[:i] + [alt], 5)
    tok0 = next(e for e in evs if isinstance(e, Token))
    raw = torch.log_softmax(lm.model(torch.tensor([prompt + first.tokens[:i]]))[0, -1].float(), -1)
    assert tok0.token_id == alt and tok0.logprob == pytest.approx(float(raw[alt]), abs=1e-4)
    assert tok0.top is not None and tok0.top["raw"][0][0] == first.tokens[i]  # alternatives as before


def test_forced_tokens_are_checked(engine, lm):
    prompt = lm.tokenizer.encode("Hi", bos=True)
    with pytest.raises(SettingsError, match="outside the vocabulary"):
        list(engine.generate(prompt, SamplingParams(temperature=0), forced=[10**7]))
    with pytest.raises(SettingsError, match="beam"):
        list(engine.generate(prompt, SamplingParams(temperature=0, num_beams=2), forced=[5]))


def test_logit_bias_by_text_uses_the_models_tokenizer(engine, lm):
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    _, plain = run(engine, prompt, temperature=0, max_new_tokens=12)
    word = lm.tokenizer.decode(plain.tokens[2:3]).strip() or "the"
    ids = lm.tokenizer.encode(word)
    _, by_text = run(engine, prompt, temperature=0, max_new_tokens=12, logit_bias_text=(f"{word}=-inf",))
    _, by_ids = run(engine, prompt, temperature=0, max_new_tokens=12, logit_bias={t: float("-inf") for t in ids})
    assert by_text.params.logit_bias == {t: float("-inf") for t in ids}
    assert by_text.tokens == by_ids.tokens and not set(ids) & set(by_text.tokens)
    with pytest.raises(SettingsError, match="beam search"):
        SamplingParams(num_beams=2, logit_bias_text=("a=1",)).validate()
