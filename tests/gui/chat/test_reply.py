"""gui.chat.reply: one reply from request to saved message, against a scripted bridge and
against the real worker on the fixture model."""
from __future__ import annotations

import asyncio

import pytest

from core import checkpoints
from core.engine.engine import Engine
from core.engine.events import Done, Prefilled, Stats, Token
from core.engine.settings import SamplingParams
from core.history.store import History
from core.prompt.prompting import build_prompt
from core.worker.protocol import Error, GenerateRequest, Prompted
from gui.bridge import Bridge, Chunk
from gui.chat.conversation import ConversationModel
from gui.chat.reply import ReplyController
from tests.gui.ui_helpers import ScriptedBridge, loop, run, until  # noqa: F401


class Settings:
    """What the sampling panel gives a reply."""

    def __init__(self, **params):
        self.p = SamplingParams(**{"temperature": 0.0, "max_new_tokens": 12, **params})
        self.system = ""

    def params(self):
        return self.p

    def system_prompt(self):
        return self.system

    def chat_format(self):
        return "auto"


def chunk(text, start=0):
    return Chunk(0, text, [Token(0, start, 7, text, text, -0.5)])


async def hello(request, stream):
    yield Prompted(1, 2, 512)
    yield Prefilled(30, 0, 0.01)
    yield chunk("Hello")
    yield chunk(" world", 1)
    yield Done(0, "length", [7, 7], "Hello world", [-0.5, -0.5], request.params.resolved(),
               Stats(prompt_tokens=30, generated_tokens=2))


async def until_stopped(request, stream):
    yield Prefilled(10, 0, 0.01)
    yield chunk("Part")
    while not stream.cancelled:
        await asyncio.sleep(0.005)
    yield Done(0, "cancelled", [7], "Part", [-0.5], request.params.resolved(), Stats(generated_tokens=1))


async def fails(request, stream):
    yield Error(1, "no model is loaded: open a model first")


@pytest.fixture
def conv(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield ConversationModel(history=h)
    h.close()


def controller(conv, script, **params):
    bridge = ScriptedBridge(script)
    r = ReplyController(bridge=bridge, conversation=conv, settings=Settings(**params))
    seen = {k: [] for k in ("busy", "started", "streamed", "notice", "finished", "failed")}
    r.busyChanged.connect(seen["busy"].append)
    r.started.connect(seen["started"].append)
    r.streamed.connect(seen["streamed"].append)
    r.notice.connect(seen["notice"].append)
    r.finished.connect(seen["finished"].append)
    r.failed.connect(lambda title, msg: seen["failed"].append((title, msg)))
    return r, bridge, seen


def test_send_streams_and_saves_the_reply(qapp, loop, conv):
    r, bridge, seen = controller(conv, hello, seed=5)
    r.model_id = "scripted"

    async def go():
        assert r.send("Hi there")
        await until(lambda: seen["finished"], 5, "the saved reply")
    run(loop, go())
    req = bridge.requests[0]
    assert req.messages == [{"role": "user", "content": "Hi there"}] and req.params.seed == 5
    assert seen["busy"] == [True, False] and seen["streamed"] == ["Hello", " world"]
    assert seen["started"][0]["id"] is None and "2 oldest message(s)" in seen["notice"][0]
    view = seen["finished"][0]
    m = conv.message(view["id"])
    assert m.text == "Hello world" and m.stop_reason == "length" and m.seed == 5 and m.model_id == "scripted"
    assert m.meta["dropped_messages"] == 2 and m.stats["generated_tokens"] == 2
    assert [x.role for x in conv.path()] == ["user", "assistant"] and not r.busy and r.state is None


def test_stop_saves_what_streamed(qapp, loop, conv):
    r, bridge, seen = controller(conv, until_stopped)

    async def go():
        r.send("Tell me")
        await until(lambda: seen["streamed"], 5, "first text")
        r.stop()
        await until(lambda: seen["finished"], 5, "the saved reply")
    run(loop, go())
    assert bridge.streams[0].cancelled
    m = conv.message(seen["finished"][0]["id"])
    assert m.text == "Part" and m.stop_reason == "cancelled"


def test_an_error_before_any_text_saves_nothing(qapp, loop, conv):
    """A refused turn is not stored (not even the message, nor the chat it started): its
    text goes back to the editor and the reason is said once, with no dialog."""
    r, _, seen = controller(conv, fails)
    refused = []
    r.refused.connect(lambda *a: refused.append(a))

    async def go():
        r.send("Hi")
        await until(lambda: refused, 5, "the refusal")
    run(loop, go())
    assert refused == [("no model is loaded: open a model first", "Hi", None)] and seen["failed"] == []
    assert conv.conv_id is None and conv.conversations() == [] and seen["busy"] == [True, False]


def test_regenerate_continue_and_edit_resend(qapp, loop, conv):
    r, bridge, seen = controller(conv, hello)

    async def next_reply(start):
        n = len(seen["finished"])
        assert start()
        await until(lambda: len(seen["finished"]) > n, 5, "the reply")
        return conv.message(seen["finished"][-1]["id"])

    async def go():
        first = await next_reply(lambda: r.send("Hi"))
        again = await next_reply(lambda: r.regenerate())
        assert again.parent_id == first.parent_id and again.id != first.id  # a second version
        assert [s.id for s in conv.history.siblings(first.id)] == [first.id, again.id]
        cont = await next_reply(lambda: r.continue_reply())
        assert cont.id == again.id and cont.text == "Hello worldHello world"
        assert bridge.requests[-1].continue_reply == "Hello world"
        user = conv.path()[0]
        edited = await next_reply(lambda: r.send("Hello?", editing=user.id))
        new_user = conv.message(edited.parent_id)
        assert new_user.text == "Hello?" and new_user.id != user.id and new_user.parent_id == user.parent_id
    run(loop, go())


def test_one_reply_at_a_time(qapp, loop, conv):
    r, bridge, seen = controller(conv, until_stopped)

    async def go():
        assert r.send("One")
        assert not r.send("Two") and not r.regenerate() and not r.continue_reply()
        r.abandon()  # the window closes: what streamed is saved, the task ends
        await until(lambda: not r.busy, 5, "the task to end")
    run(loop, go())
    assert len(bridge.requests) == 1 and [m.role for m in conv.path()] == ["user", "assistant"]


def test_against_the_real_worker_on_the_fixture_model(qapp, loop, conv, fixtures):
    """A greedy reply through bridge + worker equals the engine's own greedy reply."""

    bridge = Bridge(torch_threads=1)
    r = ReplyController(bridge=bridge, conversation=conv, settings=Settings(max_new_tokens=16))
    done = []
    r.finished.connect(done.append)

    async def go():
        await bridge.load(fixtures / "stories260K.gguf")
        r.send("Once upon a time")
        await until(lambda: done, 30, "the reply")
        await bridge.shutdown()
    run(loop, go())
    m = conv.message(done[0]["id"])

    lm = checkpoints.load(fixtures / "stories260K.gguf")
    req = GenerateRequest(messages=[{"role": "user", "content": "Once upon a time"}], params=Settings().p)
    prompt = build_prompt(req, lm.chat_format, lm.stop_ids, lm.args.max_seq_len, 16)
    eng = Engine(lm.model, lm.tokenizer)
    ref = [e for e in eng.generate(prompt.ids, SamplingParams(temperature=0.0, max_new_tokens=16),
                                   strip_leading_space=prompt.strip_leading_space, stop_ids=prompt.stop_ids)][-1]
    assert m.text == ref.text and m.text and m.stop_reason == ref.stop_reason
    assert m.stats["generated_tokens"] == len(ref.tokens)
