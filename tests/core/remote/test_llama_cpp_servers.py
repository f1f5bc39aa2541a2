"""Comparison lanes on llama.cpp's real servers (issue 23, item 10): llama.cpp's own
``llama-server`` with several slots and with one, and llama-cpp-python's server with its
defaults (one request at a time, a newer request cutting the running one off). Both come
prebuilt from the ``bench`` extra (bench/llamacpp_server.py); without it these skip."""
from __future__ import annotations

import json

import httpx
import pytest

from bench import llamacpp_server
from core.cli.main import main
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.remote.client import RemoteModel
from core.remote.runner import ONE_AT_A_TIME, SERIAL, RemoteRunner
from core.worker.protocol import CompareRequest, Error
from tests.helpers import Collector

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(bool(llamacpp_server.why_not()), reason=llamacpp_server.why_not() or "-")]
PROMPT = "Once upon a time"
LANES = ["temperature=0", "temperature=1,seed=1", "temperature=0.7,top_k=5,seed=2"]


@pytest.fixture(scope="module")
def stories(fixtures):
    return fixtures / "stories260K.gguf"


@pytest.fixture(scope="module")
def llama_server(stories):
    with llamacpp_server.LlamaServer(stories, threads=1, ctx=256, slots=4) as srv:
        yield srv


@pytest.fixture(scope="module")
def one_slot(stories):
    with llamacpp_server.LlamaServer(stories, threads=1, ctx=256, slots=1) as srv:
        yield srv


@pytest.fixture(scope="module")
def llama_cpp_python(stories):
    try:
        llamacpp_server.import_llama_cpp()
    except ImportError as e:
        pytest.skip(str(e))
    with llamacpp_server.LlamaCppPythonServer(stories, threads=1, ctx=256) as srv:
        yield srv


def greedy(url: str, tokens: int) -> str:
    """The server's own greedy completion of PROMPT."""
    r = httpx.post(url + "/completions", json={"prompt": PROMPT, "max_tokens": tokens, "temperature": 0}, timeout=30)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def compare_cli(capsys, url: str, tokens: int) -> tuple[list[dict], str]:
    lanes = [a for spec in LANES for a in ("--lane", spec)]
    rc = main(["compare", "--server", url, "--prompt", PROMPT, "--max-new-tokens", str(tokens), "--json", *lanes])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)["lanes"], err


@pytest.mark.parametrize("server", ["llama_server", "one_slot"])
def test_compare_lanes_on_llama_server_match_its_own_greedy_reply(server, request, capsys):
    """Several slots decode the lanes together; one slot queues them (llama-server waits, it
    cuts nothing off): either way every lane finishes and the greedy one is the server's own."""
    srv = request.getfixturevalue(server)
    want = greedy(srv.url, 24)
    assert want.startswith(", there was a little girl")  # the fixture's llama.cpp text
    lanes, err = compare_cli(capsys, srv.url, 24)
    assert [lane["text"] for lane in lanes][0] == want
    assert all(lane["text"] for lane in lanes), lanes
    assert lanes[1]["text"] != want or lanes[2]["text"] != want  # the sampled lanes really sampled
    assert not any(lane["stats"].get("decode") == SERIAL for lane in lanes) and ONE_AT_A_TIME not in err


def test_llama_cpp_python_server_lanes_run_one_after_another_and_it_is_remembered(llama_cpp_python):
    """Its server ends the running reply when the next request comes (interrupt_requests on
    by default): the lanes cut off run again one after another, say so, and the server is
    remembered, so the next comparison on it never sends two at once."""
    want = greedy(llama_cpp_python.url, 48)
    remote = RemoteModel(llama_cpp_python.url)
    remote.connect()
    col = Collector()
    runner = RemoteRunner(col)
    lanes = [SamplingParams(temperature=0, max_new_tokens=48)] + \
        [SamplingParams(temperature=1.0, max_new_tokens=48, seed=i) for i in (1, 2)]
    for attempt in range(2):
        rid = runner.compare(CompareRequest(mode="completion", prompt=PROMPT, lanes=lanes), remote)
        evs = col.finished(rid, lanes=3)
        assert not [e for e in evs if isinstance(e, Error)], evs
        done = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
        assert len(done) == 3 and done[0].text == want and all(d.text for d in done)
        serial = [d.stats.decode == SERIAL for d in done]
        if attempt == 0:  # the lanes went together: the server cut all but one off
            assert sum(serial) >= 1 and remote.url in runner.one_at_a_time
        else:
            assert all(serial)


def test_cli_compare_on_llama_cpp_python_server_succeeds_naming_the_setting(llama_cpp_python, capsys):
    lanes, err = compare_cli(capsys, llama_cpp_python.url, 48)
    assert lanes[0]["text"] == greedy(llama_cpp_python.url, 48)
    assert all(lane["text"] for lane in lanes) and any(lane["stats"].get("decode") == SERIAL for lane in lanes)
    assert ONE_AT_A_TIME in err and "--interrupt_requests False" in err


def test_the_client_speaks_llama_cpps_own_dialect_to_the_real_server(llama_server):
    """Item 5's client side on the real thing: its model card says llama.cpp, the probe finds
    the repetition penalty under llama.cpp's name, and a penalised greedy reply is the one
    llama-server gives for its own repeat_penalty (not the plain greedy one)."""
    remote = RemoteModel(llama_server.url)
    remote.connect()
    assert remote.dialect == "llama.cpp" and remote.probe().repetition_penalty
    q = SamplingParams(temperature=0, repetition_penalty=1.5, max_new_tokens=32)
    got = [e for e in remote.stream(q, prompt=PROMPT, logprobs=False) if isinstance(e, Done)][0].text
    r = httpx.post(llama_server.url + "/completions", timeout=30,
                   json={"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "repeat_penalty": 1.5})
    assert got == r.json()["choices"][0]["text"] != greedy(llama_server.url, 32)
