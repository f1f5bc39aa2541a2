"""The OpenAI-compatible server's endpoints on loopback, driven by the official ``openai``
client: every reply is checked against the engine run directly (a separate Engine on a
separate copy of the model), or against the model's own forward pass for log-probabilities."""
import math
import threading

import pytest
import torch

openai = pytest.importorskip("openai")

from core.checkpoints import load  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from tests.core.serving.served import chat_ids  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_models_lists_the_served_model_with_its_tokenizer(stories):
    models = stories.client.models.list().data
    assert [m.id for m in models] == ["stories260K"]
    assert models[0].model_extra["llamadesk"]["vocab_size"] == 512


def test_completion_is_the_fixture_text_and_matches_the_engine(stories):
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=12,
                                          temperature=0)
    # The fixture's known greedy continuation (llama.cpp and llama2.c agree).
    assert r.choices[0].text.startswith(", there was a little girl named Lily.")
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    assert r.choices[0].text == stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=12)).text
    assert r.choices[0].finish_reason == "length" and r.object == "text_completion"
    assert r.usage.prompt_tokens == len(ids) == 5 and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == 17 and r.system_fingerprint and r.model == "stories260K"


def test_chat_reply_ends_its_turn_and_matches_the_engine(demo):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story about a dog named Max."}]
    r = demo.client.chat.completions.create(model=demo.model, messages=msgs, temperature=0, max_tokens=200)
    done = demo.alone(chat_ids(demo, msgs), SamplingParams(temperature=0, max_new_tokens=200), strip=True)
    assert done.stop_reason == "eos"  # the demo model ends its turn on its own
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content == done.text and "Max" in done.text
    assert c.finish_reason == "stop" and r.object == "chat.completion"
    assert r.usage.completion_tokens == len(done.tokens)  # the tokens reported: the end of turn is not one
    assert r.usage.prompt_tokens == len(chat_ids(demo, msgs))


def test_streaming_chat_sends_the_same_text_in_deltas_and_usage_last(demo):
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]
    whole = demo.client.chat.completions.create(model=demo.model, messages=msgs, temperature=0, max_tokens=40)
    chunks = list(demo.client.chat.completions.create(model=demo.model, messages=msgs, temperature=0, max_tokens=40,
                                                      stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 5  # streamed, not one lump
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"


def test_stop_strings_cut_the_text_whole_and_streamed(stories):
    kw = dict(model=stories.model, prompt="Once upon a time", max_tokens=30, temperature=0, stop=["Lily", "zzz"])
    r = stories.client.completions.create(**kw)
    assert r.choices[0].text == ", there was a little girl named "
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == "Lily"
    streamed = "".join(c.choices[0].text for c in stories.client.completions.create(stream=True, **kw))
    assert streamed == r.choices[0].text  # no held-back piece of "Lily" leaks out


def test_seed_reproduces_a_sampled_reply_and_another_seed_differs(stories):
    kw = dict(model=stories.model, prompt="Once upon a time", max_tokens=30, temperature=1.0, top_p=0.95)
    a = stories.client.completions.create(seed=1234, **kw).choices[0].text
    b = stories.client.completions.create(seed=1234, **kw).choices[0].text
    c = stories.client.completions.create(seed=99, **kw).choices[0].text
    assert a == b and a != c
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    assert a == stories.alone(ids, SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_new_tokens=30)).text


def test_n_3_equals_three_comparison_lanes_over_one_prompt(stories):
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=20,
                                          temperature=0.9, top_p=0.9, seed=7, n=3,
                                          extra_body={"top_k": 40, "min_p": 0.02, "repetition_penalty": 1.1})
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    lanes = [SamplingParams(temperature=0.9, top_p=0.9, top_k=40, min_p=0.02, repetition_penalty=1.1,
                            seed=7 + i, max_new_tokens=20) for i in range(3)]
    done = sorted((e for e in stories.engine.generate_lanes(ids, lanes) if isinstance(e, Done)), key=lambda d: d.lane)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [d.text for d in done]
    assert len({c.text for c in r.choices}) > 1  # three different samples, not one copied
    assert r.usage.completion_tokens == sum(len(d.tokens) for d in done)


def test_logprobs_are_the_raw_distribution_of_the_model(stories):
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=6,
                                          temperature=0.7, seed=3, logprobs=3,
                                          extra_body={"top_k": 3, "return_token_ids": True})
    c = r.choices[0]
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    toks = c.model_extra["token_ids"]
    done = stories.alone(ids, SamplingParams(temperature=0.7, top_p=1.0, top_k=3, seed=3, max_new_tokens=6))
    assert toks == done.tokens
    # The reference: one full forward pass, log-softmax of the raw logits (not the top-k-filtered ones).
    with torch.no_grad():
        logits = stories.direct.model(torch.tensor([ids + toks]))[0, len(ids) - 1:-1]
    ref = torch.log_softmax(logits, -1)
    got = torch.tensor(c.logprobs.token_logprobs)
    torch.testing.assert_close(got, ref.gather(-1, torch.tensor(toks).view(-1, 1)).view(-1), atol=1e-4, rtol=0)
    torch.testing.assert_close(got, torch.tensor(done.logprobs), atol=1e-5, rtol=0)
    for step, alts in enumerate(c.logprobs.top_logprobs):
        top = torch.topk(ref[step], 3)
        expect = [stories.direct.tokenizer.token_bytes(int(i)).decode("utf-8", "replace") for i in top.indices]
        assert list(alts) == expect
        assert list(alts.values()) == pytest.approx(top.values.tolist(), abs=1e-4)
    assert "".join(c.logprobs.tokens) == c.text


def test_chat_logprobs_carry_top_alternatives(demo):
    msgs = [{"role": "user", "content": "Tell me a story about a dog."}]
    r = demo.client.chat.completions.create(model=demo.model, messages=msgs, temperature=0, max_tokens=5,
                                            logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 2 for t in content)
    # the tokens spell the content: the first one's leading space is dropped from both
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert bytes(content[0].bytes).decode() == content[0].token
    # Greedy: the chosen token is the most likely one, so it heads its alternatives.
    for t in content:
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)
        assert math.exp(t.top_logprobs[1].logprob) <= math.exp(t.logprob)


def test_logit_bias_in_the_openai_shape_favours_and_bans_tokens(stories):
    """{"token id": bias}: the reply equals the engine's with the same bias, and -100 on each
    greedy token in turn keeps it out of the reply."""
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    plain = stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=8))
    banned = {str(plain.tokens[0]): -100, str(plain.tokens[2]): -100}
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=8,
                                          temperature=0, logit_bias=banned)
    want = stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=8,
                                             logit_bias={plain.tokens[0]: -100, plain.tokens[2]: -100}))
    assert r.choices[0].text == want.text != plain.text
    assert plain.tokens[0] not in want.tokens and plain.tokens[2] not in want.tokens
    favour = {str(plain.tokens[1]): 100}
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=3,
                                          temperature=0, logit_bias=favour)
    want = stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=3, logit_bias={plain.tokens[1]: 100}))
    assert want.tokens == [plain.tokens[1]] * 3 and r.choices[0].text == want.text


def test_streamed_n_2_choices_interleave_and_each_equals_the_whole_reply(stories):
    kw = dict(model=stories.model, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=21, n=2)
    whole = stories.client.completions.create(**kw)
    parts = {0: [], 1: []}
    finish = {}
    for chunk in stories.client.completions.create(stream=True, **kw):
        c = chunk.choices[0]
        parts[c.index].append(c.text)
        if c.finish_reason:
            finish[c.index] = c.finish_reason
    assert ["".join(parts[i]) for i in (0, 1)] == [c.text for c in whole.choices]
    assert finish == {c.index: c.finish_reason for c in whole.choices}


def test_a_model_is_described_by_name_and_an_unknown_name_is_404(stories):
    assert stories.client.models.retrieve("stories260K").id == "stories260K"
    with pytest.raises(openai.NotFoundError):
        stories.client.models.retrieve("nope")


def test_n_with_stop_strings_equals_lanes_that_stop_on_them(stories):
    kw = dict(model=stories.model, prompt="Once upon a time", max_tokens=40, temperature=1.0, seed=5, n=3,
              stop=[".", "!"])
    r = stories.client.completions.create(**kw)
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    lanes = [SamplingParams(temperature=1.0, top_p=1.0, seed=5 + i, max_new_tokens=40, stop=(".", "!")) for i in range(3)]
    done = sorted((e for e in stories.engine.generate_lanes(ids, lanes) if isinstance(e, Done)), key=lambda d: d.lane)
    assert [c.text for c in r.choices] == [d.text for d in done]
    assert [c.finish_reason for c in r.choices] == [{"stop": "stop", "eos": "stop", "length": "length"}[d.stop_reason]
                                                    for d in done]
    assert sum(d.stop_reason == "stop" for d in done) >= 2 and not any("." in c.text or "!" in c.text for c in r.choices)
    streamed = {0: [], 1: [], 2: []}
    for chunk in stories.client.completions.create(stream=True, **kw):
        streamed[chunk.choices[0].index].append(chunk.choices[0].text)
    assert ["".join(streamed[i]) for i in range(3)] == [c.text for c in r.choices]


def test_serve_compile_decodes_through_torch_compile_with_the_same_tokens(fixtures):
    """``serve --compile`` reaches the engine: a greedy request decodes through
    torch.compile (dynamo's eager backend standing in for inductor, which takes minutes
    here) and gives the uncompiled engine's tokens."""
    torch._dynamo.reset()
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    prompt = "Once upon a time"
    plain = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    want = [e for e in plain.generate(lm.tokenizer.encode(prompt, bos=True), SamplingParams(temperature=0, max_new_tokens=12))
            if isinstance(e, Done)][0].tokens
    with RunningServer(ServerState(lm, compile="eager")) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
        r = client.completions.create(model=srv.state.model_id, prompt=prompt, temperature=0, max_tokens=12,
                                      extra_body={"return_token_ids": True})
        assert srv.state.engine.compile_status == "compiled (eager)"
    assert r.choices[0].model_extra["token_ids"] == want and len(want) == 12


def test_the_kernels_are_loaded_before_the_server_says_it_listens(fixtures, monkeypatch):
    """Not on the first request's decode step: compiling them (after an update, or in a
    fresh data folder) takes seconds the first client would wait."""
    from core.serving import app as app_module
    calls = []
    monkeypatch.setattr(app_module.kernel_ops, "kernels", lambda tick=None: calls.append(threading.current_thread().name))
    state = ServerState(load(fixtures / "stories260K.gguf", device="cpu", dtype="float32"))
    with RunningServer(state):
        assert calls and calls[0] != "llamadesk-serve"  # before it listened, off the scheduler's thread
