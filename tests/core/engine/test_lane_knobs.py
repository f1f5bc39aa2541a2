"""Every lane knob the comparison window sweeps reaches the engine through ``compare --json``
and through ``serve``: temperature, top_p, top_k, min_p, repetition_penalty, seed,
max_new_tokens, lookup, draft, a constraint (JSON schema, regex, grammar), a logit bias by
text and by id, and a ban. Each knob runs in a local lane and in a lane on a real LlamaDesk
server (the same model file), which must give the same tokens, and each is checked to do
what it says against a plain greedy lane of the same run."""
import json
import re

import httpx
import jsonschema
import pytest

from core.cli.main import main
from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.serving.run import RunningServer
from core.serving.state import ServerState

pytestmark = pytest.mark.timeout(300)
PROMPT = "Once upon a time"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"enum": ["Lily", "Tom", "Ben"]}, "age": {"type": "integer", "minimum": 1, "maximum": 9}}}


@pytest.fixture(scope="module")
def model(fixtures):
    return fixtures / "stories260K.gguf"


@pytest.fixture(scope="module")
def servers(model):
    """Two servers of the same file: one plain, one with itself as its draft model."""
    plain = RunningServer(ServerState(load(model, device="cpu", dtype="float32")))
    drafting = RunningServer(ServerState(load(model, device="cpu", dtype="float32"), draft=str(model)))
    yield plain.url, drafting.url
    plain.stop()
    drafting.stop()


def compare(capsys, model, *lanes, max_new=24) -> list[dict]:
    capsys.readouterr()
    rc = main(["compare", str(model), "--prompt", PROMPT, "--max-new-tokens", str(max_new), "--json",
               *[a for lane in lanes for a in ("--lane", lane)]])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)["lanes"]


def local_and_remote(capsys, model, url, *specs, max_new=24) -> list[tuple[dict, dict]]:
    """Each spec as a local lane and as a lane on the server at ``url``: (local, remote) pairs
    (four pairs a comparison: it has at most 8 lanes)."""
    pairs = []
    for k in range(0, len(specs), 4):
        lanes = compare(capsys, model, *[x for sp in specs[k:k + 4] for x in (sp, f"{sp},server={url}")],
                        max_new=max_new)
        pairs += list(zip(lanes[::2], lanes[1::2]))
    for (local, remote), sp in zip(pairs, specs):
        assert remote["server"] == url and local["server"] is None
        assert remote["tokens"] == local["tokens"], sp
        assert remote["text"] == local["text"], sp
    return pairs


def test_sampler_knobs_reach_the_engine_locally_and_on_a_server(capsys, model, servers):
    url = servers[0]
    pairs = local_and_remote(
        capsys, model, url,
        "temperature=0",                                  # the reference
        "temperature=5,seed=3",                           # a near-uniform draw: not the greedy reply
        "temperature=5,seed=3,top_k=1",                   # top_k 1 keeps only the best token
        "temperature=5,seed=3,top_p=0.000001",            # so does a tiny top_p
        "temperature=5,seed=3,min_p=0.999",               # and a min_p near 1
        "temperature=0,repetition_penalty=3",             # seen tokens pushed down: another greedy reply
        "temperature=0,max_new_tokens=5",
        "temperature=0.9,seed=77")
    greedy = pairs[0][0]["tokens"]
    hot, top_k, top_p, min_p, penalty, short, seeded = (p[0] for p in pairs[1:])
    assert hot["tokens"] != greedy
    assert top_k["tokens"] == top_p["tokens"] == min_p["tokens"] == greedy
    assert penalty["tokens"] != greedy and len(short["tokens"]) == 5 and short["tokens"] == greedy[:5]
    for lane, want in ((top_k, ("top_k", 1)), (top_p, ("top_p", 0.000001)), (min_p, ("min_p", 0.999)),
                       (penalty, ("repetition_penalty", 3.0)), (short, ("max_new_tokens", 5)), (seeded, ("seed", 77))):
        assert lane["settings"][want[0]] == want[1]
    # A seeded lane is the engine's own draw with that seed.
    direct = load(model, device="cpu", dtype="float32")
    eng = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    d = [e for e in eng.generate(direct.tokenizer.encode(PROMPT, bos=True),
                                 SamplingParams(temperature=0.9, top_p=0.95, seed=77, max_new_tokens=24))
         if isinstance(e, Done)][0]
    assert seeded["tokens"] == d.tokens


def test_speculative_knobs_give_the_greedy_reply_locally_and_on_a_server(capsys, model, servers):
    plain_url, drafting_url = servers
    lanes = compare(capsys, model, "temperature=0", "temperature=0,lookup=2", f"temperature=0,lookup=2,server={plain_url}",
                    f"temperature=0,draft={model}", f"temperature=0,draft=stories260K,server={drafting_url}", max_new=40)
    assert all(ln["tokens"] == lanes[0]["tokens"] for ln in lanes)
    assert "speculative" not in lanes[0]["stats"]
    assert lanes[1]["stats"]["speculative"]["kind"] == "lookup" and lanes[3]["stats"]["speculative"]["kind"] == "draft"
    assert lanes[3]["stats"]["speculative"]["acceptance"] == 1.0
    assert lanes[2]["settings"]["lookup"] == 2 and lanes[4]["settings"]["draft"] == "stories260K"


def test_constraint_knobs_hold_the_output_locally_and_on_a_server(capsys, model, servers, tmp_path):
    url = servers[0]
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "g.gbnf").write_text('root ::= "The " ("dog" | "cat") " is " [a-z]+ "."')
    (tmp_path / "r.re").write_text("(yes|no), [a-z]{1,8}")  # a lane spec splits at commas
    pairs = local_and_remote(capsys, model, url, f"temperature=0,json_schema=@{tmp_path / 's.json'}",
                             f"temperature=0,regex=@{tmp_path / 'r.re'}", f"temperature=0,grammar=@{tmp_path / 'g.gbnf'}",
                             "temperature=1,seed=4,json_object=1", max_new=40)
    schema, regex, grammar, anything = (p[0] for p in pairs)
    jsonschema.validate(json.loads(schema["text"]), SCHEMA)
    assert re.fullmatch("(yes|no), [a-z]{1,8}", regex["text"]) and re.fullmatch("The (dog|cat) is [a-z]+[.]", grammar["text"])
    # any JSON object: a free one may run past max_new_tokens inside a string, never outside JSON
    assert isinstance(json.loads(anything["text"]), dict) if anything["stop_reason"] == "eos" else \
        anything["text"].startswith("{")
    assert schema["settings"]["constraint"]["kind"] == "json_schema"


def test_logit_bias_by_text_and_by_id_and_bans_locally_and_on_a_server(capsys, model, servers):
    url = servers[0]
    tok = load(model, device="cpu", dtype="float32").tokenizer
    greedy = compare(capsys, model, "temperature=0")[0]
    lily = tok.encode("Lily")[-1]
    assert lily in greedy["tokens"]  # ", there was a little girl named Lily."
    girl = tok.encode("girl")
    pairs = local_and_remote(capsys, model, url, "temperature=0,logit_bias=girl=-inf",  # ban by text
                             f"temperature=0,logit_bias_id={lily}=-inf",  # ban by id (the chat's "Ban and retry")
                             f"temperature=0,logit_bias_id={lily}=+100",  # favour by id
                             "temperature=0,logit_bias= dragon=+12")  # favour by text
    ban_text, ban_id, favour_id, favour_text = (p[0] for p in pairs)
    assert not set(girl) & set(ban_text["tokens"]) and ban_text["tokens"] != greedy["tokens"]
    assert lily not in ban_id["tokens"] and ban_id["settings"]["logit_bias"] == {str(lily): "-inf"}
    assert favour_id["tokens"][0] == lily and all(t == lily for t in favour_id["tokens"])
    assert "dragon" in favour_text["text"] and "dragon" not in greedy["text"]


def test_bad_lane_knobs_exit_2_with_one_line(capsys, model, servers):
    for lane, needle in (("temperature=0,logit_bias_id=x=-inf", "is not a token id"),
                         ("temperature=0,logit_bias_id=99999=1", "outside the vocabulary"),
                         ("temperature=0,logit_bias_id=5=300", "between -100 and 100"),
                         (f"temperature=0,draft=other,server={servers[0]}", "no draft model 'other'")):
        capsys.readouterr()
        rc = main(["compare", str(model), "--prompt", PROMPT, "--max-new-tokens", "4", "--lane", lane])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and needle in err, (lane, err)


def test_serve_takes_logit_bias_by_text_and_bans_by_id(servers, model):
    url = servers[0]
    tok = load(model, device="cpu", dtype="float32").tokenizer
    lily = tok.encode("Lily")[-1]
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "return_token_ids": True}
    plain = httpx.post(url + "/completions", json=body, timeout=60).json()["choices"][0]
    banned = httpx.post(url + "/completions", json={**body, "logit_bias": {str(lily): "-inf"}}, timeout=60).json()
    by_text = httpx.post(url + "/completions", json={**body, "logit_bias_text": ["Lily=-inf"]}, timeout=60).json()
    assert lily in plain["token_ids"]
    assert lily not in banned["choices"][0]["token_ids"]
    assert banned["choices"][0]["token_ids"] == by_text["choices"][0]["token_ids"]
    for extra, param in (({"logit_bias_text": ["no equals sign"]}, "logit_bias_text"),
                         ({"logit_bias_text": ["girl=+500"]}, "logit_bias_text"),
                         ({"logit_bias_text": 5}, "logit_bias_text"),
                         ({"logit_bias": {str(lily): "inf"}}, "logit_bias")):
        r = httpx.post(url + "/completions", json={**body, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)


def test_lanes_on_another_kind_of_server_refuse_what_only_serve_takes(capsys, model, servers, monkeypatch):
    """lookup, draft and a bias by text need LlamaDesk's serve: against any other server the
    comparison stops before a lane runs, and the client refuses to send them."""
    from core.remote.client import RemoteError, RemoteModel
    r = RemoteModel(servers[0])
    r.card, r.model = {"id": "other", "owned_by": "vllm"}, "other"
    for params in (SamplingParams(lookup=2), SamplingParams(draft="x"), SamplingParams(logit_bias_text=("a=1",))):
        with pytest.raises(RemoteError) as e:
            r.body(params)
        assert e.value.kind == "unsupported" and "not a LlamaDesk server" in str(e.value)
    assert r.body(SamplingParams(logit_bias={5: float("-inf")}))["logit_bias"] == {"5": "-inf"}  # ids are OpenAI's
    monkeypatch.setattr(RemoteModel, "is_llamadesk", property(lambda self: False))
    rc = main(["compare", str(model), "--prompt", PROMPT, "--max-new-tokens", "4", "--lane", "temperature=0",
               "--lane", f"temperature=0,lookup=2,server={servers[0]}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "lane 2: lookup runs on a local model or LlamaDesk's serve only" in err, err
