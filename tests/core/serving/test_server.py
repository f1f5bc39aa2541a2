"""The OpenAI-compatible server on loopback, driven by the official ``openai`` client.

Every reply is checked against the engine run directly (a separate Engine on a separate
copy of the model), or against the model's own forward pass for log-probabilities.
"""
import math
import queue
import threading

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from core.checkpoints import load  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done
from core.prompt.prompting import render_chat  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from tests.helpers import ROOT  # noqa: E402

KEY = "test-key-123"
DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
pytestmark = pytest.mark.timeout(120)


class Served:
    """A running server, a client for it, the engine run directly, and finished jobs."""

    def __init__(self, path, **kw):
        self.finished: queue.Queue = queue.Queue()
        self.state = ServerState(load(path, device="cpu", dtype="float32"), api_key=KEY,
                                 on_done=self.finished.put, **kw)
        self.server = RunningServer(self.state)
        self.url = self.server.url
        self.client = openai.OpenAI(base_url=self.url, api_key=KEY, max_retries=0, timeout=60)
        self.direct = load(path, device="cpu", dtype="float32")
        self.engine = Engine(self.direct.model, self.direct.tokenizer, stop_ids=self.direct.stop_ids)

    @property
    def model(self) -> str:
        return self.state.model_id

    def alone(self, prompt_ids, params, strip=False) -> Done:
        return [e for e in self.engine.generate(prompt_ids, params, strip_leading_space=strip) if isinstance(e, Done)][0]


@pytest.fixture(scope="module")
def stories(fixtures):
    s = Served(fixtures / "stories260K.gguf")
    yield s
    s.server.stop()


@pytest.fixture(scope="module")
def demo():
    s = Served(DEMO)
    yield s
    s.server.stop()


def chat_ids(s: Served, messages):
    return render_chat(s.direct.chat_format, messages)


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
    assert r.usage.completion_tokens == len(done.tokens) + 1  # the end-of-turn token counts
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
    assert r.usage.completion_tokens == sum(len(d.tokens) + (d.stop_token is not None) for d in done)


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
    # Greedy: the chosen token is the most likely one, so it heads its alternatives.
    for t in content:
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)
        assert math.exp(t.top_logprobs[1].logprob) <= math.exp(t.logprob)


def test_a_client_that_disconnects_mid_stream_frees_its_generation(stories):
    while not stories.finished.empty():
        stories.finished.get_nowait()
    stream = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=1500,
                                               temperature=1.0, seed=1, stream=True)
    got = []
    for chunk in stream:
        got.append(chunk.choices[0].text)
        if len(got) == 3:
            break
    stream.close()
    job = stories.finished.get(timeout=60)  # the scheduler reports the job finished
    d = job.done[0]
    assert d.stop_reason == "cancelled" and len(d.tokens) < 1500
    assert stories.state.scheduler.active_lanes == 0
    # The server still answers.
    assert stories.client.completions.create(model=stories.model, prompt="Once", max_tokens=2).usage.completion_tokens


def test_wrong_or_missing_key_is_401(stories):
    bad = openai.OpenAI(base_url=stories.url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=stories.model, prompt="Once", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    r = httpx.get(stories.url + "/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"


def test_malformed_json_is_400_with_an_error_object(stories):
    r = httpx.post(stories.url + "/chat/completions", content=b'{"messages": [', headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "not valid JSON" in err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("kw, param", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(extra_body={"top_k": "many"}), "top_k"),
    (dict(extra_body={"min_p": 1.0}), "min_p"),
    (dict(stop=[""]), "stop"),
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(logprobs=50), "logprobs"),
    (dict(logit_bias={"7": 101}), "logit_bias"),
    (dict(logit_bias={"9999": 1}), "logit_bias"),
    (dict(logit_bias={"the": 1}), "logit_bias"),
    (dict(prompt=["one", "two"]), "prompt"),
])
def test_an_invalid_setting_is_400_naming_it(stories, kw, param):
    kw = {"prompt": "Once", "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        stories.client.completions.create(model=stories.model, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert param.split("_")[0] in e.value.body["message"]


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


def test_unknown_model_is_404(stories):
    with pytest.raises(openai.NotFoundError) as e:
        stories.client.completions.create(model="gpt-7", prompt="Once", max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and "gpt-7" in e.value.body["message"]


def test_a_full_queue_is_503(fixtures):
    s = Served(fixtures / "stories260K.gguf", max_batch=1, max_queue=1)
    try:
        kw = dict(model=s.model, prompt="Once upon a time", max_tokens=1500, temperature=1.0, seed=2, stream=True)
        running = s.client.completions.create(**kw)
        next(iter(running))  # it holds the only row
        waiting = s.client.completions.create(**kw)  # queued behind it
        with pytest.raises(openai.InternalServerError) as e:
            s.client.completions.create(**kw)
        assert e.value.status_code == 503 and e.value.body["code"] == "queue_full"
        running.close()
        waiting.close()
    finally:
        s.server.stop()


def test_16_concurrent_streams_are_batched_and_each_equals_its_request_alone(stories):
    tok = stories.direct.tokenizer
    prompts = [f"{w} upon a time" for w in ("Once", "Twice", "Long", "One day", "The sun", "A cat", "Lily", "Tom",
                                             "The dog", "In a park", "Mom", "A big", "The bird", "Sue", "A boy", "Ben")]
    barrier = threading.Barrier(len(prompts))
    out: dict[int, str] = {}
    finish: dict[int, str] = {}
    peak = []

    def client(i):
        barrier.wait()
        text = []
        for chunk in stories.client.completions.create(model=stories.model, prompt=prompts[i], max_tokens=24,
                                                       temperature=0, stream=True):
            text.append(chunk.choices[0].text)
            peak.append(stories.state.scheduler.active_lanes)
            finish[i] = chunk.choices[0].finish_reason or finish.get(i)
        out[i] = "".join(text)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert sorted(out) == list(range(16))
    for i, p in enumerate(prompts):
        alone = stories.alone(tok.encode(p, bos=True), SamplingParams(temperature=0, max_new_tokens=24))
        assert out[i] == alone.text, p
        assert finish[i] == {"eos": "stop", "length": "length"}[alone.stop_reason]
    assert max(peak) > 1  # decoded together, not one after another


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


def test_a_client_that_gives_up_on_a_whole_reply_frees_its_generation(fixtures):
    from dataclasses import replace
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    finished: queue.Queue = queue.Queue()
    # No stop token: the reply runs to the end of the context unless cancelled.
    with RunningServer(ServerState(replace(lm, stop_ids=set()), on_done=finished.put)) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/completions", json={"prompt": "Once upon a time", "max_tokens": 5000}, timeout=0.5)
        job = finished.get(timeout=60)
        assert job.done[0].stop_reason == "cancelled" and len(job.done[0].tokens) < 2000
        assert srv.state.scheduler.active_lanes == 0


def test_a_failure_inside_the_engine_fails_its_request_and_the_server_goes_on(stories, monkeypatch):
    model = stories.state.engine.model
    real = model.forward
    calls = []

    def broken(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated out of memory")
        return real(*a, **kw)

    monkeypatch.setattr(model, "forward", broken)  # the prefill runs, the first decode step fails
    with pytest.raises(openai.InternalServerError) as e:
        stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert e.value.status_code == 500 and "simulated out of memory" in e.value.body["message"]
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.choices[0].text.startswith(", there was a little girl")


def test_a_chat_that_outgrows_the_context_is_400_naming_the_limit(demo):
    context = demo.state.engine.max_context  # 512
    # Nothing is dropped to make it fit: the client is told, with OpenAI's error code.
    long = [{"role": "user", "content": "Tell me a story about a dog. " * 5}] * 20
    assert len(chat_ids(demo, long)) > context
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.model, messages=long, max_tokens=8)
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "messages"
    assert f"{context} tokens" in body["message"] and str(len(chat_ids(demo, long))) in body["message"]
    # The messages fit, but not with the reply asked for.
    short = [{"role": "user", "content": "Tell me a story about a cat."}]
    n = len(chat_ids(demo, short))
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.model, messages=short, max_tokens=context - n + 1)
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "max_tokens"
    assert f"{context} tokens" in body["message"] and str(context + 1) in body["message"]
    # Exactly full is allowed, and so is no max_tokens at all (the rest of the context).
    r = demo.client.chat.completions.create(model=demo.model, messages=short, max_tokens=context - n, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert demo.client.chat.completions.create(model=demo.model, messages=short, temperature=0).choices[0].message.content


def test_a_chats_end_of_turn_stops_that_request_only(fixtures):
    """Stop ids are per request: a chat stops on its format's end of turn, a completion
    batched beside it runs on past the same token (never an engine-wide setting)."""
    from dataclasses import replace
    lm = load(DEMO, device="cpu", dtype="float32")
    eot = lm.chat_format.stop_ids() - {2}
    assert eot  # the demo's chat format ends a turn with its own token
    lm = replace(lm, stop_ids={2})  # the model's stop tokens no longer include the end of turn
    direct = Engine(lm.model, lm.tokenizer, stop_ids={2})
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]  # ends its turn after 94 tokens
    ids = render_chat(lm.chat_format, msgs)
    as_chat = [e for e in direct.generate(ids, SamplingParams(temperature=0, max_new_tokens=120), strip_leading_space=True,
                                          stop_ids={2} | eot) if isinstance(e, Done)][0]
    as_completion = [e for e in direct.generate(ids, SamplingParams(temperature=0, max_new_tokens=120), stop_ids={2})
                     if isinstance(e, Done)][0]
    assert as_chat.stop_token in eot and set(as_completion.tokens) & eot  # the reference runs past it
    with RunningServer(ServerState(lm)) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        barrier = threading.Barrier(2)
        out = {}

        def chat():
            barrier.wait()
            out["chat"] = client.chat.completions.create(model=srv.state.model_id, messages=msgs, temperature=0,
                                                         max_tokens=120, extra_body={"return_token_ids": True})

        def completion():
            barrier.wait()
            out["completion"] = client.completions.create(model=srv.state.model_id, prompt=ids, temperature=0,
                                                          max_tokens=120, extra_body={"return_token_ids": True})

        threads = [threading.Thread(target=f) for f in (chat, completion)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(100)
    c = out["chat"].choices[0]
    assert c.message.content == as_chat.text and c.finish_reason == "stop" and c.model_extra["stop_reason"] in eot
    k = out["completion"].choices[0]
    assert k.model_extra["token_ids"] == as_completion.tokens and k.text == as_completion.text


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


def test_a_seeded_reply_is_the_same_alone_and_batched_beside_others(fixtures):
    from dataclasses import replace
    lm = replace(load(fixtures / "stories260K.gguf", device="cpu", dtype="float32"), stop_ids=set())
    direct = Engine(lm.model, lm.tokenizer, stop_ids=set())
    kw = dict(prompt="Once upon a time", max_tokens=30, temperature=1.0, top_p=0.9, seed=4321)
    ids = lm.tokenizer.encode("Once upon a time", bos=True)
    ref = [e for e in direct.generate(ids, SamplingParams(temperature=1.0, top_p=0.9, seed=4321, max_new_tokens=30))
           if isinstance(e, Done)][0]
    with RunningServer(ServerState(lm)) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        model = srv.state.model_id
        alone = client.completions.create(model=model, **kw).choices[0].text
        # Three other streams (no stop token: they run to max_tokens) decode while it runs.
        others = [client.completions.create(model=model, prompt=p, max_tokens=1500, temperature=1.0, seed=i,
                                            stream=True) for i, p in enumerate(("Lily", "Tom went", "The sun"))]
        its = [iter(o) for o in others]
        for it in its:
            next(it)  # each has started decoding
        batched = client.completions.create(model=model, **kw).choices[0].text
        for it in its:
            assert next(it).choices[0].finish_reason is None  # still running after it: they overlapped
        for o in others:
            o.close()
    assert alone == batched == ref.text


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
