"""The client speaks a vLLM or llama.cpp server's own field names (issue 23, item 5): one
real serve process behind middleware that answers as that server would (its model card,
and the fields the other server's names would be ignored under), so each reply is checked
against the engine run directly."""
import json
import re

import pytest

from core.checkpoints import load
from core.engine.constraint import Constraint
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.remote.client import RemoteError, RemoteModel
from core.serving.run import RunningServer
from core.serving.state import ServerState
from tests.helpers import read_body, replaying

pytestmark = pytest.mark.timeout(120)
# what each server would silently drop: the other dialects' names
IGNORED = {"llamacpp": ("repetition_penalty", "regex", "structured_outputs"), "vllm": ("repeat_penalty", "regex", "grammar")}


def persona(app, who: dict, seen: list):
    """ASGI middleware: the model list says owned_by who["owned_by"]; request bodies are
    recorded, and the fields that server would ignore are dropped before serve sees them."""
    from starlette.responses import JSONResponse  # noqa: the test's own ASGI helper

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["path"].endswith("/models"):
            card = {"id": "m", "object": "model", "owned_by": who["owned_by"]}
            return await JSONResponse({"object": "list", "data": [card]})(scope, receive, send)
        body = json.loads(await read_body(receive))
        seen.append(dict(body))
        for key in IGNORED[who["owned_by"]]:
            body.pop(key, None)
        body.pop("model", None)
        return await app(scope, replaying(json.dumps(body).encode(), receive), send)
    return wrapped


@pytest.fixture(scope="module")
def server(fixtures):
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    who, seen = {"owned_by": "llamacpp"}, []
    with RunningServer(ServerState(lm), wrap=lambda app: persona(app, who, seen)) as srv:
        yield srv, who, seen, Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids), lm.tokenizer


def text_of(events) -> str:
    return [e for e in events if isinstance(e, Done)][0].text


def test_llama_cpp_gets_repeat_penalty_and_is_told_it_has_no_regex(server):
    srv, who, seen, engine, tok = server
    who["owned_by"] = "llamacpp"
    remote = RemoteModel(srv.url)
    remote.connect()
    assert remote.dialect == "llama.cpp"
    q = SamplingParams(temperature=0, repetition_penalty=1.5, max_new_tokens=16)
    got = text_of(remote.stream(q, prompt="Once upon a time", logprobs=False))
    assert got == text_of(engine.generate(tok.encode("Once upon a time", bos=True), q))
    assert seen[-1]["repeat_penalty"] == 1.5 and "repetition_penalty" not in seen[-1]
    with pytest.raises(RemoteError) as e:
        remote.body(SamplingParams(constraint=Constraint("regex", "[a-z]+")), prompt="x")
    assert e.value.kind == "unsupported" and "regular-expression" in str(e.value)


def test_llama_cpp_probe_finds_the_penalty_under_its_own_name(server):
    srv, who, seen, engine, tok = server
    who["owned_by"] = "llamacpp"
    assert RemoteModel(srv.url).probe().repetition_penalty


def test_vllm_gets_a_regex_as_structured_outputs(server):
    srv, who, seen, engine, tok = server
    who["owned_by"] = "vllm"
    remote = RemoteModel(srv.url)
    remote.connect()
    assert remote.dialect == "vllm"
    q = SamplingParams(temperature=1.0, seed=4, max_new_tokens=12, constraint=Constraint("regex", "[0-9]{2}-[a-z]{3}"))
    got = text_of(remote.stream(q, prompt="Once upon a time", logprobs=False))
    assert re.fullmatch("[0-9]{2}-[a-z]{3}", got)
    assert seen[-1]["structured_outputs"] == {"regex": "[0-9]{2}-[a-z]{3}"} and "regex" not in seen[-1]
    assert seen[-1]["return_token_ids"] is True
