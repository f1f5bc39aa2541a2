"""Streams written straight through ASGI's send (core/serving/sse.py): the wire format and
headers clients and proxies rely on, keep-alive pings, a client that leaves, one write per
decode step, and token chunks encoded from a template byte for byte as json.dumps."""
import asyncio
import json

import httpx
import pytest

pytest.importorskip("openai")

from core.engine.events import Token  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.serving.app import build_app  # noqa: E402
from core.serving.responses import Reply  # noqa: E402
from core.serving.scheduler import Job  # noqa: E402
from core.serving.sse import EventStream  # noqa: E402
from tests.core.serving.served import KEY  # noqa: E402

pytestmark = pytest.mark.timeout(60)
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def test_a_stream_has_sse_headers_and_frames_ending_in_done(stories):
    body = {"model": stories.model, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", stories.url + "/completions", json=body, headers=AUTH, timeout=30) as r:
        raw = b"".join(r.iter_raw())
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-store" and r.headers["x-accel-buffering"] == "no"
    frames = raw.decode().split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    chunks = [json.loads(f[len("data: "):]) for f in frames[:-2]]
    assert all(f.startswith("data: ") for f in frames[:-1])
    text = "".join(c["choices"][0]["text"] for c in chunks)
    whole = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=6,
                                              temperature=0)
    assert text == whole.choices[0].text and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_one_write_per_decode_step_for_all_of_a_requests_choices(stories):
    """n=4: a step's four tokens reach the socket in one send, not four."""
    body = json.dumps({"model": stories.model, "prompt": "Once upon a time", "max_tokens": 8, "n": 4,
                       "temperature": 1.0, "seed": 3, "stream": True, "logit_bias": {"2": -100}}).encode()
    sent = _asgi_post(build_app(stories.state), "/v1/completions", body)  # the fixture's scheduler runs it
    assert sent[0]["status"] == 200
    bodies = [m["body"].decode() for m in sent[1:] if m.get("body")]
    frames = [f for b in bodies for f in b.split("\n\n") if f]
    assert all(b.endswith("\n\n") for b in bodies)  # whole frames in every write
    tokens = [f for f in frames if f != "data: [DONE]" and json.loads(f[6:])["choices"][0]["finish_reason"] is None]
    assert len(tokens) == 32
    assert len(bodies) <= 8 + 2  # one per step (the last steps' ends and [DONE] may come apart)
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def _asgi_post(app, path: str, body: bytes) -> list[dict]:
    """POST ``body`` to ``app`` over fake ASGI channels (a client that stays): the messages sent."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
             "scheme": "http", "query_string": b"", "http_version": "1.1",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"authorization", f"Bearer {KEY}".encode()), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "app": app}
    sent, given = [], []

    async def receive():
        if not given:
            given.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        sent.append(message)
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return sent


def _run_stream(frames, disconnect_after: int | None = None, ping: float = 0.01):
    """Run an EventStream over fake ASGI channels: (messages sent, whether the frames'
    generator was closed)."""
    sent, closed = [], []
    left = asyncio.Event()

    async def receive():
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if disconnect_after is not None and sum(1 for m in sent if m.get("body")) >= disconnect_after:
            left.set()

    async def main():
        async def gen():
            try:
                async for f in frames(sent):
                    yield f
            finally:
                closed.append(True)
        await asyncio.wait_for(EventStream(gen(), ping=ping)(None, receive, send), 10)
    asyncio.run(main())
    return sent, bool(closed)


def test_pings_keep_an_idle_stream_alive_and_stop_at_its_end():
    async def frames(sent):
        yield b"data: 1\n\n"
        while sum(1 for m in sent if m.get("body") == b": ping\n\n") < 2:  # the stream idles until pinged twice
            await asyncio.sleep(0.005)
        yield b"data: 2\n\n"
    sent, closed = _run_stream(frames)
    bodies = [m["body"] for m in sent[1:]]
    assert sent[0]["headers"][0] == (b"content-type", b"text/event-stream; charset=utf-8")
    assert bodies[0] == b"data: 1\n\n" and bodies[1:3] == [b": ping\n\n"] * 2 and b"data: 2\n\n" in bodies
    assert bodies[-1] == b"" and sent[-1]["more_body"] is False and closed


def test_a_client_that_leaves_closes_the_streams_generator_at_once():
    async def frames(sent):
        yield b"data: 1\n\n"
        await asyncio.Event().wait()  # no more tokens for a while: the disconnect must end it anyway
        yield b"data: never\n\n"
    sent, closed = _run_stream(frames, disconnect_after=1, ping=60)
    assert closed and b"data: never\n\n" not in [m.get("body") for m in sent]


@pytest.mark.parametrize("chat", [False, True])
def test_token_chunks_from_a_template_equal_json_dumps_of_them(stories, chat):
    job = Job([1, 2, 3], [SamplingParams(seed=1), SamplingParams(seed=2)])
    job.done = [None, None]
    reply = Reply(stories.state, {}, chat, job, None)
    for choice in (0, 1):
        for text in ("plain", ' "quoted" \\ back', "\u00fcn\u00ef\u2028code \U0001f389", "\n\t\x00", "x" * 3):
            tok = Token(lane=choice, index=1, token_id=5, text=text, piece=text, logprob=-0.5)
            assert reply.token_texts(choice, tok, False) == [json.dumps(c) for c in reply.token_chunks(choice, tok, False)]
    assert reply.token_texts(0, Token(lane=0, index=2, token_id=5, text="", piece="", logprob=-0.5), False) == []


def test_a_responses_stream_writes_its_opening_and_closing_events_together(demo):
    body = json.dumps({"model": demo.model, "input": "Tell me about a dog named Max.", "max_output_tokens": 4,
                       "temperature": 0, "stream": True}).encode()
    sent = _asgi_post(build_app(demo.state), "/v1/responses", body)
    bodies = [m["body"].decode() for m in sent[1:] if m.get("body")]
    kinds = [[line[7:] for line in b.split("\n") if line.startswith("event: ")] for b in bodies]
    assert kinds[0] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"]
    assert kinds[-1][-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                              "response.incomplete"]
    # between them, deltas only: one a step, or a few where the loop wakes after several steps
    assert all(set(k) == {"response.output_text.delta"} for k in kinds[1:-1]) and len(kinds) <= 4 + 2


def test_a_responses_client_that_leaves_cancels_its_generation(demo):
    while not demo.finished.empty():
        demo.finished.get_nowait()
    body = {"model": demo.model, "input": "Tell me a long story.", "max_output_tokens": 480, "temperature": 1.0,
            "stream": True}
    with httpx.stream("POST", demo.url + "/responses", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        deltas = 0
        for line in r.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas == 2:
                break
    job = demo.finished.get(timeout=30)
    assert job.done[0].stop_reason == "cancelled" and len(job.done[0].tokens) < 480
