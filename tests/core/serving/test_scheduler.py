"""The scheduler under load: continuous batching (concurrent requests each equal to their
request alone), a full queue, clients that leave, a failure inside the engine."""
import queue
import threading
from dataclasses import replace

import httpx
import pytest

openai = pytest.importorskip("openai")

from core.checkpoints import load  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done  # noqa: E402
from core.prompt.prompting import render_chat  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.model.kv_cache import KVCache  # noqa: E402
from core.serving.scheduler import Job, Scheduler  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from tests.core.serving.served import DEMO, Served  # noqa: E402

pytestmark = pytest.mark.timeout(120)


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


def test_a_client_that_gives_up_on_a_whole_reply_frees_its_generation(fixtures):
    # bfloat16: off the C forward (float32 only), whose 2040 tokens take ~1.4 s here, too
    # close to the client's 0.5 s for "cancelled before the end" to hold on a faster machine
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="bfloat16")
    finished: queue.Queue = queue.Queue()
    # No stop token: the reply runs to the end of the context unless cancelled.
    with RunningServer(ServerState(replace(lm, stop_ids=set()), on_done=finished.put)) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/completions", json={"prompt": "Once upon a time", "max_tokens": 2040}, timeout=0.5)
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


def test_a_chats_end_of_turn_stops_that_request_only(fixtures):
    """Stop ids are per request: a chat stops on its format's end of turn, a completion
    batched beside it runs on past the same token (never an engine-wide setting)."""
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
    assert c.message.content == as_chat.text and c.finish_reason == "stop" and c.model_extra["stop_reason"] is None
    assert c.model_extra["stop_token_id"] in eot  # vLLM's stop_reason is null at the end of turn; the id is here
    k = out["completion"].choices[0]
    assert k.model_extra["token_ids"] == as_completion.tokens and k.text == as_completion.text


def test_a_seeded_reply_is_the_same_alone_and_batched_beside_others(fixtures):
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


# -- jobs of any kind share the batch (no HTTP) ------------------------------------------

LOOKUP_STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                "Once upon a time, there was a little girl named Lily.")


def test_plain_and_drafting_jobs_decode_in_one_batch(fixtures):
    """A plain job and one drafting by prompt lookup, waiting together, are admitted
    together: the same forwards carry both rows (before, the drafting job waited for the
    plain batch to end), and each reply is its greedy reply alone."""
    stories = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    tok = stories.tokenizer
    eng = Engine(stories.model, tok, stop_ids=())
    prompts = [tok.encode("Lily and Ben went to the park", bos=True), tok.encode(LOOKUP_STORY, bos=True)]
    specs = [{}, dict(lookup=2)]
    alone = [[e for e in eng.generate(p, SamplingParams(temperature=0, max_new_tokens=30, **s))
              if isinstance(e, Done)][0].tokens for p, s in zip(prompts, specs)]
    rows, real = [], stories.model.forward

    def counting(x, pos=0, cache=None, *a, **kw):
        if isinstance(cache, KVCache):
            rows.append(x.shape[0])
        return real(x, pos, cache, *a, **kw)

    finished = threading.Semaphore(0)
    sched = Scheduler(eng, on_done=lambda job: finished.release())
    jobs = [Job(p, [SamplingParams(temperature=0, max_new_tokens=30, **s)]) for p, s in zip(prompts, specs)]
    for job in jobs:
        sched.submit(job)
    stories.model.forward = counting
    try:
        sched.start()
        assert finished.acquire(timeout=120) and finished.acquire(timeout=120)
    finally:
        sched.stop()
        del stories.model.forward
    assert [job.done[0].tokens for job in jobs] == alone
    assert jobs[1].done[0].stats.speculative["drafted"] > 0
    assert rows.count(2) >= 10  # both rows ran in the same forwards


class RecordingLoop:
    """Stands in for the request's event loop: records each wake-up and runs it."""

    def __init__(self):
        self.wakeups = 0

    def is_closed(self) -> bool:
        return False

    def call_soon_threadsafe(self, fn, *args):
        self.wakeups += 1
        fn(*args)


class Inbox(list):
    put_nowait = list.append


def test_one_decode_step_wakes_the_event_loop_once_for_every_stream(fixtures):
    """Four streams decoding together: their events reach the loop in one wake-up per
    decode step (before: one call_soon_threadsafe per event, 8 per stream here), each
    stream's events complete and in order."""
    stories = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    eng = Engine(stories.model, stories.tokenizer, stop_ids=())
    loop, finished = RecordingLoop(), threading.Semaphore(0)
    sched = Scheduler(eng, on_done=lambda job: finished.release())
    prompts = ("Once upon a time", "Lily went", "The sun", "Tom and")
    jobs = [Job(stories.tokenizer.encode(p, bos=True), [SamplingParams(temperature=0, max_new_tokens=6)],
                loop=loop, events=Inbox()) for p in prompts]
    for job in jobs:
        sched.submit(job)
    try:
        sched.start()
        for _ in jobs:
            assert finished.acquire(timeout=60)
    finally:
        sched.stop()
    for job in jobs:
        kinds = [type(item[1]).__name__ if item is not None else None for item in job.events]
        assert kinds == ["Token"] * 6 + ["Done", None]
        assert [item[1].token_id for item in job.events[:6]] == job.done[0].tokens
    events = sum(len(job.events) for job in jobs)
    # 6 steps, the last, and one per joiner of the burst (its first token goes out right
    # after its own prefill, before the next prompt's): not 32
    assert events == 32 and loop.wakeups <= 8 + len(jobs)
