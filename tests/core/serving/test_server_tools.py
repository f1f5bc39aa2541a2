"""serve's tool calling, driven by the official ``openai`` client: tools and tool_choice in,
tool_calls and finish_reason "tool_calls" out, streamed as OpenAI streams them; a
conversation's calls and tool results go back in; bad tool input is a 400 naming its field.
The demo model is not trained for tools: tool_choice required (or a name) and the call
constraint make its calls; its context is widened to hold the Llama 3.1 tool prompt."""
import json

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from core.checkpoints import load  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from core.serving.tools_api import CallStream  # noqa: E402
from tests.helpers import ROOT  # noqa: E402

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "required": ["city", "days"],
                   "properties": {"city": {"type": "string", "maxLength": 6},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def served():
    state = ServerState(load(DEMO, device="cpu", dtype="float32", max_seq_len=2048), api_key="k")
    server = RunningServer(state)
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=60)
    yield state, client
    server.stop()


def check_call(call, tool) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_required_call_whole(served):
    state, client = served
    r = client.chat.completions.create(model=state.model_id, messages=ASK, tools=[WEATHER, ADD],
                                       tool_choice="required", parallel_tool_calls=False, seed=3, max_tokens=80,
                                       temperature=1.0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    [call] = c.message.tool_calls
    check_call(call, WEATHER if call.function.name == "get_weather" else ADD)


def test_named_call_streams_name_then_argument_pieces(served):
    """The stream's deltas add up to the whole reply's call (same seed)."""
    state, client = served
    kw = dict(model=state.model_id, messages=ASK, tools=[WEATHER, ADD], seed=4, max_tokens=80,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    deltas, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        ch = chunk.choices[0]
        assert not ch.delta.content  # a call's text never streams as content
        deltas += ch.delta.tool_calls or []
        finish = ch.finish_reason or finish
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.name, first.function.arguments) == (0, "function", "get_weather", "")
    assert first.id.startswith("call_") and len(rest) > 2  # the arguments came in pieces
    assert all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    assert "".join(d.function.arguments for d in rest) == whole.function.arguments
    check_call(whole, WEATHER)
    assert finish == "tool_calls"


def test_a_conversation_with_calls_and_results(served):
    """The assistant's calls and the tool's result go back in; tool_choice none answers."""
    state, client = served
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    r = client.chat.completions.create(model=state.model_id, messages=msgs, tools=[WEATHER], tool_choice="none",
                                       seed=1, max_tokens=8)
    c = r.choices[0]
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length") and c.message.content
    assert r.usage.prompt_tokens > 600  # the tools, the call and the result were all in the prompt


def test_free_calls_stream_whole_at_the_end():
    """tool_constraint false: a call in another shape is held back and sent whole."""
    s = CallStream(True)
    text = '{"parameters": {"a": 1}, "name": "add"}'
    assert sum((s.push(ch) for ch in text), []) == []
    from core.tools.parse import parse_calls
    from core.tools.spec import Tool
    [d] = s.finish(parse_calls(text, [Tool("add")]))
    assert d["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    answer = CallStream(True)
    assert answer.push("Hi") == [{"content": "Hi"}] and answer.finish([]) == []
    looked = CallStream(True)
    assert looked.push('{"x": 1}') == [] and looked.finish([]) == [{"content": '{"x": 1}'}]


def test_a_hermes_templates_call_streams_as_a_call_not_as_text():
    """A model whose own template writes <tool_call> blocks: the block is no content."""
    from core.prompt.template_format import TemplateToolCalling
    from core.tools.spec import Tool
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    s = CallStream(True)
    assert sum((s.push(ch) for ch in text), []) == []
    [d] = s.finish(TemplateToolCalling((Tool("add"),)).parse(text))
    assert d["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    tagged = CallStream(True)  # text that only began like a call is an answer
    assert tagged.push("<to") == [] and tagged.push("day>") == [{"content": "<today>"}]


def test_unheld_calls_and_parallel_lists_stream(served):
    state, client = served
    s = CallStream(True)
    pieces = ['[{"name": "add", "param', 'eters": {"a": 1', '}}, {"name": "get_w', 'eather", "parameters": {}}]']
    out = sum((s.push(p) for p in pieces), [])
    calls = [d["tool_calls"][0] for d in out]
    assert [c.get("function", {}).get("name") for c in calls if "id" in c] == ["add", "get_weather"]
    assert "".join(c["function"]["arguments"] for c in calls if c["index"] == 0) == '{"a": 1}'
    assert "".join(c["function"]["arguments"] for c in calls if c["index"] == 1) == "{}"
    r = client.chat.completions.create(model=state.model_id, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       seed=2, max_tokens=30, extra_body={"tool_constraint": False})
    c = r.choices[0]  # unheld: the opening is forced, the rest is the model's
    assert c.finish_reason in ("length", "tool_calls", "stop")


@pytest.mark.parametrize("kw, param, words", [
    (dict(tools=[{"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}], tool_choice="required"),
     "tools", "tool bad"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", "nope"),
    (dict(tools=[{"type": "function", "function": {"name": "big", "parameters": {
        "type": "object", "description": "x" * 100_000}}}]), "tools", "over 64,000"),
    (dict(tool_choice="required"), "tool_choice", "needs tools"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools", "tool name"),
    (dict(tools=[WEATHER], response_format={"type": "json_object"}), "tool_choice", "does not combine"),
    (dict(tools=[WEATHER], parallel_tool_calls="yes"), "parallel_tool_calls", "true or false"),
    (dict(functions=[{"name": "f"}]), "functions", "send tools"),
])
def test_bad_tool_input_is_a_400_naming_it(served, kw, param, words):
    state, client = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=state.model_id, messages=ASK, max_tokens=4, **kw)
    err = e.value.body
    assert err["param"] == param and words in err["message"], err


def test_the_remote_backend_passes_tools_and_reads_calls_back(served):
    """A lane on a server: the tools go with the request, the streamed calls come back as
    ToolCalls (the ones a local lane gives), checked against the tools."""
    from core.engine.events import Done
    from core.engine.settings import SamplingParams
    from core.remote.client import RemoteModel
    from core.tools.spec import Tool
    state, client = served
    remote = RemoteModel(client.base_url.__str__().rstrip("/"), api_key="k")
    tools = [Tool.from_openai(WEATHER), Tool.from_openai(ADD)]
    evs = list(remote.stream(SamplingParams(seed=4, max_new_tokens=80, tool_choice="get_weather"), messages=ASK,
                             tools=tools))
    d = [e for e in evs if isinstance(e, Done)][0]
    assert d.stop_reason == "tool_calls" and len(d.tool_calls) == 1
    [call] = d.tool_calls
    assert call.name == "get_weather" and call.error == "" and call.id.startswith("call_")
    jsonschema.validate(call.arguments, WEATHER["function"]["parameters"])
    body = remote.body(SamplingParams(tool_choice="add"), messages=ASK, tools=tools, parallel_tool_calls=False)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["parallel_tool_calls"] is False and [t["function"]["name"] for t in body["tools"]] == ["get_weather", "add"]


def test_streamed_call_deltas_join_and_are_checked():
    from core.remote.tool_calls import CallDeltas
    from core.tools.spec import Tool
    got = CallDeltas([Tool.from_openai(WEATHER)])
    got.take([{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}])
    got.take([{"index": 0, "function": {"arguments": '{"city": '}}])
    got.take([{"index": 0, "function": {"arguments": '"Rome"}'}}, {"index": 1, "id": "call_b", "function": {
        "name": "nope", "arguments": "{bad"}}])
    first, second = got.done()
    assert (first.id, first.name, first.arguments) == ("call_a", "get_weather", {"city": "Rome"})
    assert "'days' is a required property" in first.error
    assert second.raw == "{bad" and "not valid JSON" in second.error


def test_langchain_bind_tools(served):
    """LangChain's tool binding against serve (langchain-openai is a test dependency)."""
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (pip install -e .[test])")
    state, client = served
    llm = lc.ChatOpenAI(base_url=str(client.base_url), api_key="k", model=state.model_id, max_tokens=80,
                        temperature=1.0, seed=4, max_retries=0)
    msg = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Paris?")
    [call] = msg.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER["function"]["parameters"])
