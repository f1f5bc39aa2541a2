"""serve speculates: ``serve --lookup N`` / ``--draft MODEL`` and the per-request ``lookup`` /
``draft`` fields, through the real HTTP server and the official ``openai`` client. Greedy
token ids equal plain decoding (the same server with speculation off, and the engine run
directly); each reply says how its drafting went; bad values are 400s naming the field; a
draft model of another vocabulary stops ``serve`` with exit 2 and one line."""
import json
import threading

import httpx
import pytest

openai = pytest.importorskip("openai")

from core.cli.main import main  # noqa: E402
from core.checkpoints import load  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done
from core.prompt.prompting import render_chat, strips_reply_space  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from tests.helpers import ROOT  # noqa: E402

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
# The story comes back to its opening: prompt lookup has something to draft from.
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
         "One day, she saw a big tree. Once upon a time, there was a little girl named Lily.")
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def served(fixtures):
    """stories260K served with itself as the draft model (so drafts are always right) and
    the same model run directly on its own engine."""
    path = fixtures / "stories260K.gguf"
    state = ServerState(load(path, device="cpu", dtype="float32"), api_key="k", draft=str(path))
    server = RunningServer(state)
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=60)
    direct = load(path, device="cpu", dtype="float32")
    yield state, server, client, direct
    server.stop()


def engine_reply(direct, prompt_ids, max_new, stops=None, strip=False) -> Done:
    """Plain greedy decoding on an engine of its own."""
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    return [e for e in eng.generate(prompt_ids, SamplingParams(temperature=0, max_new_tokens=max_new), stop_ids=stops,
                                    strip_leading_space=strip) if isinstance(e, Done)][0]


def test_greedy_completions_with_lookup_or_the_draft_model_equal_plain_decoding(served):
    state, server, client, direct = served
    assert client.models.list().data[0].model_extra["llamadesk"]["speculative"] == {"lookup": 0, "draft": "stories260K"}
    kw = dict(model=state.model_id, prompt=STORY, max_tokens=60, temperature=0)
    replies = {name: client.completions.create(**kw, extra_body={"return_token_ids": True, **extra})
               for name, extra in (("plain", {"draft": False}), ("default", {}), ("lookup", {"lookup": 2}),
                                   ("named", {"draft": "stories260K"}))}
    want = engine_reply(direct, direct.tokenizer.encode(STORY, bos=True), 60).tokens
    for name, r in replies.items():
        assert r.choices[0].model_extra["token_ids"] == want, name
    plain = replies["plain"]
    assert "speculative" not in plain.usage.model_extra and "speculative" not in plain.choices[0].model_extra
    for name in ("default", "named"):  # the server's draft model is every request's default
        sp = replies[name].usage.model_extra["speculative"]
        assert sp["kind"] == "draft" and sp["draft"] == "stories260K" and sp["drafted"] > 0
        assert sp["accepted"] == sp["drafted"] and sp["acceptance_rate"] == 1.0  # it drafts for itself
        assert replies[name].choices[0].model_extra["speculative"]["accepted"] == sp["accepted"]
    sp = replies["lookup"].usage.model_extra["speculative"]
    assert sp["kind"] == "lookup" and sp["lookup"] == 2 and sp["draft"] is None
    assert 0 < sp["accepted"] <= sp["drafted"] and sp["acceptance_rate"] == sp["accepted"] / sp["drafted"]
    assert sp["forwards"] < 60  # accepted drafts saved verification forwards


def test_streamed_chat_with_n_lanes_drafts_and_reports_in_the_last_chunks(served):
    state, server, client, direct = served
    msgs = [{"role": "user", "content": STORY}]
    kw = dict(model=state.model_id, messages=msgs, max_tokens=40, temperature=0, n=2)
    whole = client.chat.completions.create(**kw, extra_body={"draft": False})
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"lookup": 3}))
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
        assert text == whole.choices[i].message.content
        last = [c for c in chunks if c.choices and c.choices[0].index == i and c.choices[0].finish_reason][-1]
        sp = last.choices[0].model_extra["speculative"]
        assert sp["kind"] == "lookup" and sp["lookup"] == 3 and sp["accepted"] <= sp["drafted"]
    usage = chunks[-1].usage.model_extra["speculative"]
    per = [c.choices[0].model_extra["speculative"] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert usage["drafted"] == sum(s["drafted"] for s in per) and usage["accepted"] == sum(s["accepted"] for s in per)
    ids = render_chat(direct.chat_format, msgs)
    stops = set(direct.stop_ids) | set(direct.chat_format.stop_ids())
    assert engine_reply(direct, ids, 40, stops, strip=strips_reply_space(direct.tokenizer, direct.chat_format)).text == whole.choices[0].message.content


def test_plain_and_speculative_requests_arriving_together_are_all_answered_right(served):
    """Plain requests and speculative ones share the continuous batch: eight streams
    of both kinds at once each get the engine's own greedy reply."""
    state, server, client, direct = served
    want = engine_reply(direct, direct.tokenizer.encode(STORY, bos=True), 30).text
    results: dict[int, str] = {}

    def ask(i: int):
        extra = [{"draft": False}, {"lookup": 2}, {}, {"lookup": 1}][i % 4]
        stream = client.completions.create(model=state.model_id, prompt=STORY, max_tokens=30, temperature=0,
                                           stream=True, extra_body=extra)
        results[i] = "".join(c.choices[0].text for c in stream if c.choices)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(8))
    assert all(text == want for text in results.values()), (want, results)


@pytest.mark.parametrize("extra,param,needle", [
    ({"lookup": 9}, "lookup", "from 0 (off) to 8"),
    ({"lookup": -1}, "lookup", "from 0 (off) to 8"),
    ({"lookup": "2"}, "lookup", "whole number"),
    ({"lookup": True}, "lookup", "whole number"),
    ({"lookup": 2.5}, "lookup", "whole number"),
    ({"draft": "other-model"}, "draft", "no draft model 'other-model'"),
    ({"draft": 3}, "draft", "true, false or"),
    ({"draft": ["stories260K"]}, "draft", "true, false or"),
    ({"lookup": 2, "draft": True}, "draft", "not both"),
])
def test_bad_speculative_fields_are_400s_naming_the_field(served, extra, param, needle):
    state, server, client, direct = served
    for path, body in (("/completions", {"prompt": "Once"}), ("/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        r = httpx.post(server.url + path, json={**body, "max_tokens": 4, **extra}, headers={"Authorization": "Bearer k"},
                       timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and needle in err["message"] and err["type"] == "invalid_request_error"


def test_a_server_without_a_draft_model_refuses_draft_and_defaults_to_its_lookup(fixtures):
    path = fixtures / "stories260K.gguf"
    state = ServerState(load(path, device="cpu", dtype="float32"), lookup=2)
    with RunningServer(state) as server:
        r = httpx.post(server.url + "/completions", json={"prompt": "Once", "max_tokens": 4, "draft": True}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "draft"
        assert "no draft model" in r.json()["error"]["message"]
        body = {"prompt": STORY, "max_tokens": 30, "temperature": 0, "return_token_ids": True}
        default = httpx.post(server.url + "/completions", json=body, timeout=60).json()
        off = httpx.post(server.url + "/completions", json={**body, "lookup": 0}, timeout=60).json()
    assert default["usage"]["speculative"]["lookup"] == 2 and "speculative" not in off["usage"]
    assert default["choices"][0]["token_ids"] == off["choices"][0]["token_ids"]


@pytest.mark.parametrize("argv,needle", [
    (["--draft", "{demo}"], "another vocabulary"),
    (["--draft", "/nonexistent/draft.gguf"], "no such file"),
    (["--draft", "{bad}"], "draft.gguf"),
    (["--lookup", "9"], "--lookup must be"),
    (["--lookup", "2", "--draft", "{model}"], "not both"),
])
def test_serve_with_a_bad_draft_model_or_lookup_exits_2_with_one_line(capsys, fixtures, tmp_path, argv, needle):
    model = fixtures / "stories260K.gguf"
    bad = tmp_path / "draft.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)  # a GGUF header and nothing behind it
    argv = [a.format(model=model, demo=DEMO, bad=bad) for a in argv]
    rc = main(["serve", str(model), "--port", "0", *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err


def test_stats_of_the_final_chunk_are_json_numbers(served):
    """The last streamed choice chunk carries the stats as plain JSON (read without the client)."""
    state, server, client, direct = served
    body = {"prompt": STORY, "max_tokens": 12, "temperature": 0, "stream": True, "lookup": 2}
    with httpx.stream("POST", server.url + "/completions", json=body, headers={"Authorization": "Bearer k"},
                      timeout=60) as r:
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    last = [d for d in data if d["choices"] and d["choices"][0]["finish_reason"]][-1]["choices"][0]["speculative"]
    assert {"drafted", "accepted", "acceptance_rate"} <= set(last)
    assert all(isinstance(last[k], (int, float)) for k in ("drafted", "accepted", "acceptance_rate"))
