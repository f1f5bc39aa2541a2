"""Branching a reply that ran on a server: RemoteModel.branch continues from given token ids
with a forced token through LlamaDesk's serve (/v1/completions with a token-id prompt and the
forced_tokens extension) and gives the tokens a local branch gives, reusing the server's KV
cache; a chat reply's branch stops on its end of turn (stop_token_ids)."""
import httpx
import pytest

from core.checkpoints import load
from core.remote.client import RemoteError, RemoteModel
from core.engine.engine import Engine
from core.engine.events import Done
from core.prompt.prompting import render_chat
from core.engine.settings import SamplingParams
from core.remote.runner import RemoteRunner
from core.serving.run import RunningServer
from core.serving.state import ServerState
from core.worker.protocol import CompareRequest
from tests.helpers import ROOT, Collector

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
pytestmark = pytest.mark.timeout(180)


def done_of(events) -> Done:
    return [e for e in events if isinstance(e, Done)][0]


def branch_point(direct, prompt, i, stops=None):
    """The local greedy reply to ``prompt``, and the second most likely token at index i."""
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    toks = [e for e in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=24), inspect=5,
                                    stop_ids=stops) if hasattr(e, "top")]
    reply = [t.token_id for t in toks]
    alt = [tok for tok, _ in toks[i].top["raw"] if tok != reply[i]][0]
    return reply, alt


def local_branch(direct, prompt, reply, i, alt, stops=None) -> Done:
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    return done_of(eng.generate(prompt + reply[:i], SamplingParams(temperature=0, max_new_tokens=16), forced=[alt],
                                stop_ids=stops))


@pytest.mark.parametrize("lookup", [0, 2])
def test_a_completion_branches_on_the_server_as_it_does_locally(fixtures, lookup):
    path = fixtures / "stories260K.gguf"
    direct = load(path, device="cpu", dtype="float32")
    prompt = direct.tokenizer.encode("Once upon a time", bos=True)
    i = 6
    reply, alt = branch_point(direct, prompt, i)
    want = local_branch(direct, prompt, reply, i, alt)
    with RunningServer(ServerState(load(path, device="cpu", dtype="float32"))) as server:
        remote = RemoteModel(server.url)
        events = list(remote.stream(SamplingParams(temperature=0, max_new_tokens=24), prompt="Once upon a time",
                                    top_logprobs=5))
        first = done_of(events)
        assert first.tokens == reply
        # The server names the alternatives by id (an extension): the inspector's row is the id to force.
        alts = [k for k, _ in events[i].top["raw"] if k != reply[i]]
        assert alts[0] == alt and all(k >= 0 for k in alts)
        meta: dict = {}
        got = done_of(remote.branch(SamplingParams(temperature=0, max_new_tokens=16, lookup=lookup), prompt + reply[:i],
                                    [alt], top_logprobs=3, meta=meta))
    assert got.tokens[0] == alt and got.tokens == want.tokens
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)  # the forced token's too
    # The server kept the first reply's row: the branch's prefix came from its KV cache.
    assert meta["cached_tokens"] == got.stats.cached_tokens == len(prompt) + i - 1


def test_a_chat_reply_branches_and_ends_its_turn(fixtures):
    direct = load(DEMO, device="cpu", dtype="float32")
    msgs = [{"role": "user", "content": "Tell me a story about a dog named Max."}]
    stops = set(direct.stop_ids) | set(direct.chat_format.stop_ids())
    with RunningServer(ServerState(load(DEMO, device="cpu", dtype="float32"))) as server:
        remote = RemoteModel(server.url)
        meta: dict = {}
        first = done_of(remote.stream(SamplingParams(temperature=0, max_new_tokens=200), messages=msgs, meta=meta))
        assert first.stop_reason == "eos" and first.stop_token in direct.chat_format.stop_ids()
        prompt = meta["prompt_token_ids"]
        assert prompt == render_chat(direct.chat_format, msgs)
        i = 3
        reply, alt = branch_point(direct, prompt, i, stops)
        assert reply == first.tokens[:len(reply)]
        got = done_of(remote.branch(SamplingParams(temperature=0, max_new_tokens=300), prompt + first.tokens[:i], [alt],
                                    stop_ids=[first.stop_token]))
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    want = done_of(eng.generate(prompt + first.tokens[:i], SamplingParams(temperature=0, max_new_tokens=300),
                                forced=[alt], stop_ids=stops))
    assert got.tokens == want.tokens and got.tokens[0] == alt
    assert got.stop_reason == want.stop_reason == "eos"


def test_bad_branch_fields_are_400s_and_other_servers_are_refused(fixtures):
    path = fixtures / "stories260K.gguf"
    with RunningServer(ServerState(load(path, device="cpu", dtype="float32"))) as server:
        for body, param in (({"prompt": [1, 2], "forced_tokens": [512]}, "forced_tokens"),
                            ({"prompt": [1, 2], "forced_tokens": "5"}, "forced_tokens"),
                            ({"prompt": [1, 2], "forced_tokens": [1] * 65}, "forced_tokens"),
                            ({"prompt": [1, 2], "stop_token_ids": [-1]}, "stop_token_ids"),
                            ({"prompt": [1, 2], "reply_prefix": [1, "2"]}, "reply_prefix"),
                            ({"messages": [{"role": "user", "content": "Hi"}], "forced_tokens": [512]}, "forced_tokens")):
            path_ = "/chat/completions" if "messages" in body else "/completions"
            r = httpx.post(server.url + path_, json={**body, "max_tokens": 2}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        other = RemoteModel(server.url)
        other.card, other.model = {"id": "x", "owned_by": "vllm"}, "x"
        with pytest.raises(RemoteError) as e:
            list(other.branch(SamplingParams(temperature=0), [1, 2], [5]))
        assert e.value.kind == "unsupported"


def test_the_remote_runner_branches_a_chat_lane_from_the_apps_own_request(fixtures):
    """What the comparison window sends for a branch of a server lane (CompareRequest with
    the server's prompt_ids, reply_prefix, forced and the turn's stop_ids) runs through
    RemoteRunner as a local branch runs on the engine, for a greedy and a seeded lane."""
    direct = load(DEMO, device="cpu", dtype="float32")
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]
    stops = set(direct.stop_ids) | set(direct.chat_format.stop_ids())
    prompt = render_chat(direct.chat_format, msgs)
    i = 4
    reply, alt = branch_point(direct, prompt, i, stops)
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    lanes = [SamplingParams(temperature=0, max_new_tokens=40), SamplingParams(temperature=0.8, seed=9, max_new_tokens=40)]
    want = [e for e in eng.generate_lanes(prompt + reply[:i], lanes, forced=[alt], stop_ids=stops) if isinstance(e, Done)]
    want.sort(key=lambda d: d.lane)
    with RunningServer(ServerState(load(DEMO, device="cpu", dtype="float32"))) as server:
        remote = RemoteModel(server.url)
        remote.connect()
        col = Collector()
        eot = sorted(direct.chat_format.stop_ids())
        rid = RemoteRunner(col).compare(CompareRequest(messages=msgs, mode="chat", lanes=lanes, reply_prefix=reply[:i],
                                                       forced=[alt], prompt_ids=prompt, stop_ids=eot), remote)
        got = sorted((e for e in col.finished(rid, lanes=2) if isinstance(e, Done)), key=lambda d: d.lane)
    assert [d.tokens for d in got] == [d.tokens for d in want] and all(d.tokens[0] == alt for d in got)


def test_serve_takes_the_branch_as_the_apps_own_fields_too(fixtures):
    """reply_prefix (kept tokens after the rendered messages) with forced_tokens on the chat
    endpoint: the same branch without sending the prompt's ids, ending at the turn's end."""
    direct = load(DEMO, device="cpu", dtype="float32")
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]
    stops = set(direct.stop_ids) | set(direct.chat_format.stop_ids())
    prompt = render_chat(direct.chat_format, msgs)
    i = 4
    reply, alt = branch_point(direct, prompt, i, stops)
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    want = done_of(eng.generate(prompt + reply[:i], SamplingParams(temperature=0, max_new_tokens=40), forced=[alt],
                                stop_ids=stops))
    with RunningServer(ServerState(load(DEMO, device="cpu", dtype="float32"))) as server:
        remote = RemoteModel(server.url)
        got = done_of(remote.stream(SamplingParams(temperature=0, max_new_tokens=40), messages=msgs,
                                    extra={"reply_prefix": reply[:i], "forced_tokens": [alt]}))
    assert got.tokens == want.tokens and got.tokens[0] == alt and got.text == want.text
