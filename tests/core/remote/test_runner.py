"""Remote requests as worker events (core/remote.py) against the real server, in process.

The served model is the fixture the local tests load, so a greedy remote reply must be the
fixture's known text; the events must be the worker's own vocabulary.
"""
import pytest

from core.checkpoints import load
from core.remote.client import RemoteError, RemoteModel
from core.engine.events import Done, Token
from core.remote.runner import RemoteRunner, describe_error
from core.engine.settings import SamplingParams
from core.serving.run import RunningServer
from core.serving.state import ServerState
from core.worker.protocol import CompareRequest, Error, GenerateRequest, Prompted
from core.engine.events import Reply
from tests.helpers import Collector, free_port, is_token

pytestmark = pytest.mark.timeout(180)
KNOWN = ", there was a little girl named Lily. She loved to play"  # the fixture's greedy text


@pytest.fixture(scope="module")
def served(fixtures):
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    with RunningServer(ServerState(lm, api_key="k")) as srv:
        remote = RemoteModel(srv.url, api_key="k")
        remote.connect()
        yield srv, remote


def completion(n=8, temperature=0.0, **kw):
    return GenerateRequest(mode="completion", prompt="Once upon a time",
                           params=SamplingParams(temperature=temperature, max_new_tokens=n, seed=3), **kw)


def test_a_remote_reply_is_the_workers_event_vocabulary_with_negative_ids(served):
    srv, remote = served
    col = Collector()
    runner = RemoteRunner(col)
    rid = runner.generate(completion(inspect=3), remote)
    evs = col.finished(rid)
    assert rid < 0 and all(e.request_id == rid for e in col.events)
    assert isinstance(evs[0], Prompted) and evs[0].context_length == srv.state.engine.max_context
    toks, done = [e for e in evs if isinstance(e, Token)], evs[-1]
    assert isinstance(done, Done) and done.stop_reason == "length" and len(toks) == 8
    assert done.text == KNOWN[:len(done.text)] and "".join(t.text for t in toks) == done.text
    assert done.stats.generated_tokens == 8 and done.stats.ttft_s > 0
    # The inspector's shape: the chosen token is keyed by its own id (greedy: the top one),
    # the other alternatives by the ids LlamaDesk's serve names them by (what a branch at one
    # forces); no filtered list is made up.
    for t in toks:
        keys = [k for k, _ in t.top["raw"]]
        assert keys[0] == t.token_id and t.top["pieces"][t.token_id] == t.piece
        assert all(k >= 0 for k in keys) and len(set(keys)) == 3 and t.top["filtered"] == []
        assert all(srv.state.engine.piece(k) == t.top["pieces"][k] for k in keys)
    assert runner.active == 0


def test_cancel_ends_the_reply_at_once_keeping_its_text_and_frees_the_server(served):
    srv, remote = served
    col = Collector()
    runner = RemoteRunner(col)
    rid = runner.generate(GenerateRequest(messages=[{"role": "user", "content": "Tell me a story."}],
                                          params=SamplingParams(temperature=1.0, max_new_tokens=400, seed=1)), remote)
    col.wait(lambda evs: sum(is_token(e, rid) for e in evs) >= 3)
    runner.cancel(rid)
    done = col.finished(rid)[-1]
    streamed = "".join(e.event.text for e in col.events if is_token(e, rid))
    assert done.stop_reason == "cancelled" and done.text.startswith(streamed[:len(done.text)]) and done.text
    assert len(done.tokens) < 400
    # The server saw the connection close and dropped the generation.
    col.wait(lambda evs: srv.state.scheduler.active_lanes == 0 and runner.active == 0)
    n = len(col.of(rid))
    runner.cancel(rid)  # a late cancel reaches nothing
    assert len(col.of(rid)) == n


def test_lanes_run_as_parallel_requests_with_one_done_each(served):
    _, remote = served
    col = Collector()
    runner = RemoteRunner(col)
    lanes = [SamplingParams(temperature=0, max_new_tokens=6), SamplingParams(temperature=1.0, seed=5, max_new_tokens=6)]
    rid = runner.compare(CompareRequest(mode="completion", prompt="Once upon a time", lanes=lanes), remote)
    evs = col.finished(rid, lanes=2)
    dones = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
    assert [d.lane for d in dones] == [0, 1] and dones[0].text == KNOWN[:len(dones[0].text)]
    for d in dones:
        assert "".join(e.text for e in evs if isinstance(e, Token) and e.lane == d.lane) == d.text
    assert dones[1].params.seed == 5


@pytest.mark.parametrize("url_key, kind", [("wrong", "auth"), ("refused", "connection")])
def test_a_failing_server_is_an_error_event_naming_its_kind(served, url_key, kind):
    _, remote = served
    if url_key == "wrong":
        bad = RemoteModel(remote.url, api_key="nope")
        bad.card = remote.card
    else:
        bad = RemoteModel(f"http://127.0.0.1:{free_port()}")
        bad.card = {"id": "stories260K"}
    col = Collector()
    rid = RemoteRunner(col).generate(completion(), bad)
    err = col.finished(rid)[-1]
    assert isinstance(err, Error) and err.kind == kind and not err.cancelled
    assert ("401" in err.message) if kind == "auth" else ("cannot connect" in err.message)


def test_continuing_a_reply_is_refused_not_silently_restarted(served):
    _, remote = served
    col = Collector()
    rid = RemoteRunner(col).generate(GenerateRequest(messages=[{"role": "user", "content": "Hi"}],
                                                     continue_reply="Once", params=SamplingParams()), remote)
    err = col.finished(rid)[-1]
    assert isinstance(err, Error) and err.kind == "unsupported" and "carry on" in err.message
    assert not any(isinstance(e, Reply) for e in col.events)


def test_error_descriptions_say_what_happened_and_what_to_do():
    dns = describe_error("connection", "cannot connect to http://nohost.invalid/v1: [Errno -2] Name or service not known")
    assert dns.startswith("Could not find the server") and "nohost.invalid" in dns
    assert describe_error("auth", "x answered 401").startswith("The server refused the API key (401)")
    assert describe_error("rate_limit", "x answered 429").startswith("The server is rate-limiting")
    slow = describe_error("timeout", "http://h:1/v1 stopped answering for 60 s")
    assert slow.startswith("http://h:1/v1 stopped answering for 60 s. ") and "retry" in slow
    cut = describe_error("cut", "the connection to x was cut mid-reply (peer closed connection)")
    assert cut.startswith("The connection to x was cut mid-reply (peer closed connection). The reply above is incomplete")
    assert describe_error("bad_request", "top_p must be ≤ 1") == "top_p must be ≤ 1"


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://h/v1", "http://[::1", "http://127.0.0.1:99999", "http://", " "])
def test_a_server_address_that_is_no_url_is_refused_in_words(url):
    with pytest.raises(RemoteError) as e:
        RemoteModel(url)
    assert e.value.kind == "bad_request" and "URL" in str(e.value)
