"""serve holds replies to response_format (json_object / json_schema) and to the regex and
grammar extension fields, driven by the official ``openai`` client; a constraint that
cannot compile is a 400 naming its field."""
import json
import re

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from core.checkpoints import load  # noqa: E402
from core.remote.client import RemoteModel  # noqa: E402
from core.engine.constraint import Constraint  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done
from core.prompt.prompting import render_chat  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from tests.helpers import ROOT  # noqa: E402

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
PET = {"type": "object", "additionalProperties": False, "required": ["pet", "legs"],
       "properties": {"pet": {"enum": ["dog", "cat", "bird"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}}}
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def served():
    state = ServerState(load(DEMO, device="cpu", dtype="float32"), api_key="k")
    server = RunningServer(state)
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=60)
    direct = load(DEMO, device="cpu", dtype="float32")
    yield state, server, client, direct
    server.stop()


MESSAGES = [{"role": "user", "content": "Tell me about a dog named Max."}]


def test_json_schema_response_format_validates_and_equals_the_engine(served):
    state, server, client, direct = served
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}
    r = client.chat.completions.create(model=state.model_id, messages=MESSAGES, response_format=fmt,
                                       temperature=1.0, seed=5, max_tokens=30, n=4)
    texts = [c.message.content for c in r.choices]
    for c, text in zip(r.choices, texts):
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(text), PET)
    # The same lanes run directly on the engine (seed + i per choice) give the same texts.
    engine = Engine(direct.model, direct.tokenizer, stop_ids=direct.stop_ids)
    ids = render_chat(direct.chat_format, MESSAGES)
    stops = set(direct.stop_ids) | set(direct.chat_format.stop_ids())
    for i, text in enumerate(texts):
        p = SamplingParams(temperature=1.0, top_p=1.0, seed=5 + i, max_new_tokens=30,
                           constraint=Constraint("json_schema", json.dumps(PET)))
        d = [e for e in engine.generate(ids, p, strip_leading_space=True, stop_ids=stops) if isinstance(e, Done)][0]
        assert d.text == text


def test_json_object_streamed_and_regex_and_grammar_extension_fields(served):
    state, server, client, direct = served
    stream = client.chat.completions.create(model=state.model_id, messages=MESSAGES, stream=True, max_tokens=12,
                                            response_format={"type": "json_object"}, temperature=0)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text.startswith("{") and "\n" not in text
    r = client.completions.create(model=state.model_id, prompt="Once upon a time", max_tokens=20, temperature=1.0,
                                  seed=3, n=3, extra_body={"regex": "(Tim|Sue) had [1-9] (cats|dogs)"})
    assert all(re.fullmatch("(Tim|Sue) had [1-9] (cats|dogs)", c.text) for c in r.choices)
    gbnf = 'root ::= "The " ("sun" | "moon") " is " ("hot" | "cold") "."'
    r = client.chat.completions.create(model=state.model_id, messages=MESSAGES, max_tokens=20,
                                       extra_body={"grammar": gbnf})
    assert re.fullmatch(r"The (sun|moon) is (hot|cold)\.", r.choices[0].message.content)


@pytest.mark.parametrize("kw, param, words", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}),
     "response_format", "cannot be compiled"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format", "schema"),
    (dict(response_format={"type": "yaml"}), "response_format", "response_format"),
    (dict(extra_body={"regex": "[a-"}), "regex", "regular expression cannot be compiled"),
    (dict(extra_body={"grammar": "start: nowhere"}), "grammar", "grammar cannot be compiled"),
    (dict(extra_body={"regex": 5}), "regex", "must be a string"),
    (dict(extra_body={"regex": "a", "grammar": 'root ::= "a"'}), "grammar", "one constraint"),
])
def test_a_constraint_that_cannot_compile_is_400_naming_its_field(served, kw, param, words):
    state, server, client, direct = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=state.model_id, messages=MESSAGES, max_tokens=4, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert words in e.value.body["message"]


def test_client_sends_a_lanes_constraint_to_a_server(served):
    """generate/compare --server: RemoteModel asks for the lane's constraint in the request."""
    state, server, client, direct = served
    remote = RemoteModel(server.url, api_key="k")
    for c in (Constraint("json_schema", json.dumps(PET)), Constraint("regex", "[A-Z][a-z]{3,6}")):
        p = SamplingParams(temperature=1.0, seed=9, max_new_tokens=30, constraint=c)
        done = [e for e in remote.stream(p, messages=MESSAGES) if isinstance(e, Done)][0]
        if c.kind == "json_schema":
            jsonschema.validate(json.loads(done.text), PET)
        else:
            assert re.fullmatch("[A-Z][a-z]{3,6}", done.text)
