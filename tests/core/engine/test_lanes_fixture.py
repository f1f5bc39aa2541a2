"""Comparison lanes on the real story model (float32): the properties users rely on."""
import pytest

from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done, Token
from core.engine.settings import SamplingParams


@pytest.fixture(scope="module")
def story(fixtures):
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    return lm, Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)


def single(engine, prompt, params):
    return [e for e in engine.generate(prompt, params) if isinstance(e, Done)][0]


def lanes(engine, prompt, params):
    evs = list(engine.generate_lanes(prompt, params))
    return sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane), evs


def test_greedy_lanes_equal_each_other_and_single_generate(story):
    lm, eng = story
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    one = single(eng, prompt, SamplingParams(temperature=0, max_new_tokens=40))
    assert one.text.startswith(", there was a little girl named Lily")
    done, _ = lanes(eng, prompt, [SamplingParams(temperature=0, max_new_tokens=40)] * 4)
    assert all(d.text == one.text and d.tokens == one.tokens for d in done)


def test_seeds_in_lanes_match_single_runs(story):
    lm, eng = story
    prompt = lm.tokenizer.encode("The cat", bos=True)
    settings = [SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_new_tokens=48),
                SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_new_tokens=48),
                SamplingParams(temperature=1.0, top_p=0.9, seed=8, max_new_tokens=48),
                SamplingParams(temperature=0.6, min_p=0.1, top_k=40, seed=9, max_new_tokens=48)]
    done, _ = lanes(eng, prompt, settings)
    assert done[0].text == done[1].text and done[0].tokens == done[1].tokens
    assert done[0].tokens != done[2].tokens
    for p, d in zip(settings, done):
        assert single(eng, prompt, p).text == d.text


def test_lanes_stop_independently_and_others_continue(story):
    lm, eng = story
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    greedy = single(eng, prompt, SamplingParams(temperature=0, max_new_tokens=40)).text
    done, evs = lanes(eng, prompt, [SamplingParams(temperature=0, max_new_tokens=40),
                                    SamplingParams(temperature=0, max_new_tokens=5),
                                    SamplingParams(temperature=0, max_new_tokens=40, stop=("Lily",))])
    assert done[0].stop_reason == "length" and done[0].text == greedy
    assert done[1].stop_reason == "length" and len(done[1].tokens) == 5
    assert done[2].stop_reason == "stop" and done[2].text == greedy[: greedy.find("Lily")]
    streamed = "".join(e.text for e in evs if isinstance(e, Token) and e.lane == 2)
    assert streamed == done[2].text  # the stop string never reached the screen
    last_short = max(i for i, e in enumerate(evs) if isinstance(e, Token) and e.lane == 1)
    assert sum(isinstance(e, Token) and e.lane == 0 for e in evs[last_short:]) >= 30


def test_a_branch_from_any_lane_reuses_that_lanes_row_of_the_kv_cache(story):
    """After a comparison, a branch from the second lane (not the one in row 0) finds its
    tokens in the cache: the engine takes the free row holding the longest start of the new
    prompt, so only the last kept position runs; the forced token comes at the chosen
    position and the rest equals an uncached engine's continuation."""
    lm, _ = story
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    settings = [SamplingParams(temperature=0, max_new_tokens=20), SamplingParams(temperature=0, max_new_tokens=20,
                                                                                  logit_bias={int(t): float("-inf") for t in lm.tokenizer.encode("girl")})]
    done, _ = lanes(eng, prompt, settings)
    a, b = done
    assert a.tokens[:5] == b.tokens[:5] and a.tokens != b.tokens and len(b.tokens) == 20
    k = next(i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y) + 2  # past where they part
    alt = a.tokens[0]  # any token other than b's at k
    assert alt != b.tokens[k]
    branch = [e for e in eng.generate(prompt + b.tokens[:k], settings[1], forced=[alt]) if isinstance(e, Done)][0]
    assert branch.stats.cached_tokens == len(prompt) + k - 1  # row 0 held lane a's reply: b's row was taken
    assert branch.tokens[0] == alt
    fresh = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    ref = [e for e in fresh.generate(prompt + b.tokens[:k], settings[1], forced=[alt]) if isinstance(e, Done)][0]
    assert ref.stats.cached_tokens == 0 and ref.tokens == branch.tokens
