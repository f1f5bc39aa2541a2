"""The OpenAI-compatible client: capability probing and the errors a user sees.

Probing runs against the real server, and against the same server behind middleware
that makes it behave like a server lacking features (refusing ``seed``, silently
dropping ``top_k``, ``repetition_penalty`` and ``n``), which the probe must tell apart.
"""
import json
import os
import signal

import pytest

from core.checkpoints import load
from core.remote.client import RemoteError, RemoteModel
from core.engine.events import Done, Token
from core.engine.settings import SamplingParams
from core.serving.run import RunningServer
from core.serving.state import ServerState
from tests.helpers import ServeProcess, lacking

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def lm(fixtures):
    return load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


def test_probe_finds_everything_on_serve(lm):
    with RunningServer(ServerState(lm)) as srv:
        caps = RemoteModel(srv.url).probe()
    assert all(getattr(caps, f) for f in caps.FIELDS), caps.why
    assert caps.why == {}


def test_probe_tells_refused_from_ignored_fields(lm):
    with RunningServer(ServerState(lm), wrap=lacking) as srv:
        caps = RemoteModel(srv.url).probe()
    assert not caps.seed and "refused seed" in caps.why["seed"]
    for name in ("top_k", "repetition_penalty", "n"):
        assert not getattr(caps, name) and "ignores" in caps.why[name], name
    assert caps.streaming and caps.logprobs and caps.top_logprobs and caps.min_p


def test_remote_reply_streams_as_engine_events(lm):
    with RunningServer(ServerState(lm)) as srv:
        remote = RemoteModel(srv.url)
        evs = list(remote.stream(SamplingParams(temperature=0, max_new_tokens=8), prompt="Once upon a time",
                                 top_logprobs=3))
    toks, done = [e for e in evs if isinstance(e, Token)], evs[-1]
    assert isinstance(done, Done) and done.stop_reason == "length" and len(toks) == 8
    assert "".join(t.text for t in toks) == done.text == ", there was a little girl named Lily"[:len(done.text)]
    assert [t.token_id for t in toks] == done.tokens and all(t.token_id >= 0 for t in toks)
    # The inspector's shape: alternatives with probabilities and their names; greedy picks the top one.
    for t in toks:
        (first, p), *_ = t.top["raw"]
        assert t.top["pieces"][first] == t.piece and abs(p - 2.718281828 ** t.logprob) < 1e-4


def test_wrong_key_and_unreachable_server_are_typed_errors(lm):
    with RunningServer(ServerState(lm, api_key="k")) as srv:
        with pytest.raises(RemoteError) as e:
            RemoteModel(srv.url, api_key="nope").connect()
        assert e.value.kind == "auth" and e.value.status == 401
        assert RemoteModel(srv.url, api_key="k").connect()["id"] == "stories260K"
    with pytest.raises(RemoteError) as e:  # stopped: nothing listens there any more
        RemoteModel(srv.url).connect()
    assert e.value.kind == "connection"


def test_a_server_killed_mid_stream_is_a_cut_with_the_partial_reply_kept(fixtures):
    # ServeProcess: a `serve` process of its own (forked, no second interpreter start-up)
    with ServeProcess(fixtures / "stories260K.gguf") as s:
        got = []
        with pytest.raises(RemoteError) as e:
            for ev in RemoteModel(s.url).stream(SamplingParams(temperature=1.0, seed=3, max_new_tokens=1500),
                                                prompt="Once upon a time"):
                got.append(ev.text)
                if len(got) == 3:
                    os.kill(s.proc.pid, signal.SIGKILL)
        assert e.value.kind == "cut" and "mid-reply" in str(e.value)
        assert len(got) >= 3 and "".join(got)  # what arrived before the cut is the consumer's to keep


def test_credentials_in_a_server_url_are_never_printed(lm, capsys):
    from core.cli.main import main
    with RunningServer(ServerState(lm)) as srv:
        plain = srv.url
        secret = plain.replace("http://", "http://ann:hunter2@")
        assert RemoteModel(secret).shown == plain
        capsys.readouterr()
        assert main(["generate", "--server", secret, "--prompt", "Once", "--max-new-tokens", "3", "--json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["server"] == plain and "hunter2" not in out + err
        assert main(["compare", "--server", secret, "--prompt", "Once", "--max-new-tokens", "2", "--json",
                     "--lane", "temperature=0", "--lane", "temperature=1,seed=1"]) == 0
        out, err = capsys.readouterr()
        assert [lane["server"] for lane in json.loads(out)["lanes"]] == [plain, plain] and "hunter2" not in out + err
        assert main(["generate", "--server", secret, "--model", "nope", "--prompt", "Once"]) == 2
        err = capsys.readouterr().err
        assert plain in err and "hunter2" not in err
    assert main(["generate", "--server", secret, "--prompt", "Once"]) == 2  # stopped: cannot connect
    err = capsys.readouterr().err
    assert "cannot connect" in err and "hunter2" not in err and "ann:" not in err
    assert main(["generate", "--server", "http://ann:hunter2@[::1", "--prompt", "Once"]) == 2
    assert "hunter2" not in capsys.readouterr().err
