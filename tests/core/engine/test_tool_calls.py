"""Tool calls held to their schemas by the engine (the demo model is not trained for tools:
the constraint alone makes its calls valid; a logit bias on "{" steers it into calling)."""
import json
from pathlib import Path

import jsonschema
import pytest

from core.checkpoints import load
from core.engine.engine import Engine, lane_constraint
from core.engine.events import STOP_REASONS, Done
from core.engine.settings import SamplingParams
from core.engine.constraint import Constraint
from core.errors import SettingsError
from core.prompt.tool_format import ToolCalling
from core.tools.spec import Tool, ToolError

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"
WEATHER = Tool("get_weather", "Weather in a city", {
    "type": "object", "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}})
ADD = Tool("add", "Add two numbers", {"type": "object", "required": ["a", "b"],
                                      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})
TOOLS = ToolCalling((WEATHER, ADD), parallel=False, start_token="")
BRACE = 129  # the demo vocabulary's "{" (a byte token)


@pytest.fixture(scope="module")
def demo():
    lm = load(DEMO, device="cpu", dtype="float32")
    eng = Engine(lm.model, lm.tokenizer, stop_ids=sorted(lm.stop_ids))
    prompt = lm.chat_format.encode_dialog([{"role": "user", "content": "What is the weather in Paris?"}])
    return eng, prompt


def lanes(eng, prompt, params, tools=TOOLS) -> list[Done]:
    evs = eng.generate_lanes(prompt, params, tools=tools)
    return sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)


def valid(d: Done, tools=(WEATHER, ADD)) -> bool:
    by = {t.name: t for t in tools}
    if d.stop_reason != "tool_calls" or len(d.tool_calls) != 1 or d.tool_calls[0].error:
        return False
    c = d.tool_calls[0]
    jsonschema.validate(c.arguments, by[c.name].parameters)
    return json.loads(d.text) == {"name": c.name, "parameters": c.arguments}


def test_stop_reasons_name_tool_calls():
    assert "tool_calls" in STOP_REASONS


def test_required_calls_are_valid_over_8_seeds(demo):
    eng, prompt = demo
    done = lanes(eng, prompt, [SamplingParams(temperature=1.0, seed=s, max_new_tokens=80, tool_choice="required")
                               for s in range(8)])
    assert all(valid(d) for d in done), [(d.stop_reason, d.text) for d in done]
    assert len({d.text for d in done}) > 2


def test_a_named_choice_calls_that_tool(demo):
    eng, prompt = demo
    [d] = lanes(eng, prompt, [SamplingParams(seed=3, max_new_tokens=80, tool_choice="add")])
    assert valid(d) and d.tool_calls[0].name == "add"


def test_auto_answers_or_calls_and_none_never_calls(demo):
    eng, prompt = demo
    steer = {BRACE: 100.0}
    auto, free, none = lanes(eng, prompt, [
        SamplingParams(seed=1, max_new_tokens=80, logit_bias=steer),  # steered into a call: held to a schema
        SamplingParams(seed=1, max_new_tokens=8),  # not steered: the demo model tells a story
        SamplingParams(seed=1, max_new_tokens=8, logit_bias=steer, tool_choice="none")])
    assert valid(auto)
    assert free.tool_calls == [] and not free.text.startswith("{")
    assert none.tool_calls == [] and none.stop_reason != "tool_calls" and none.text.startswith("{")


def test_constrained_beside_free_lanes(demo):
    """A comparison: the same steered prompt with the call constraint on and off."""
    eng, prompt = demo
    on, off = lanes(eng, prompt, [SamplingParams(seed=2, max_new_tokens=n, tool_choice="required", tool_constraint=c)
                                  for c, n in ((True, 80), (False, 28))])
    assert valid(on)
    # Off: the opening is forced (required), the arguments are the model's own.
    assert off.text.startswith('{"name": "') and '"parameters": ' in off.text
    assert not valid(off) and off.text != on.text


def test_bad_tool_requests_fail_before_anything_streams(demo):
    eng, prompt = demo
    with pytest.raises(ToolError, match="not a declared tool"):
        eng.generate_lanes(prompt, [SamplingParams(tool_choice="nope")], tools=TOOLS)
    broken = ToolCalling((Tool("bad", "", {"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}),))
    with pytest.raises(ToolError, match="tool bad: its parameter schema cannot hold a call"):
        eng.generate_lanes(prompt, [SamplingParams(tool_choice="required")], tools=broken)
    with pytest.raises(SettingsError, match="beam search does not combine with tool calls"):
        eng.generate(prompt, SamplingParams(num_beams=2), tools=TOOLS)
    with pytest.raises(SettingsError, match="does not combine with tool calls"):
        eng.generate(prompt, SamplingParams(constraint=Constraint("json_object")), tools=TOOLS)
    with pytest.raises(SettingsError, match="tool_choice must be"):
        SamplingParams(tool_choice="two words").validate()


def test_lane_constraint_by_choice():
    q = SamplingParams()
    assert lane_constraint(q, None) is None
    assert lane_constraint(SamplingParams(tool_constraint=False), TOOLS) is None  # auto, free: not held at all
    fmt = Constraint("regex", "a+")
    assert lane_constraint(SamplingParams(constraint=fmt, tool_choice="none"), TOOLS) is fmt
    assert lane_constraint(q, TOOLS).kind == "grammar"
