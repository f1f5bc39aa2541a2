"""A reply's text as calls: answers stay answers, calls the model got wrong say what is wrong."""
import json

from core.tools.parse import check_arguments, looks_like_call, parse_calls
from core.tools.spec import Tool

W = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                             "required": ["city"]})
TOOLS = [W, Tool("add", "", {"type": "object", "properties": {"a": {"type": "number"}}})]


def test_one_call():
    [c] = parse_calls('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', TOOLS)
    assert (c.name, c.arguments, c.error, c.raw) == ("get_weather", {"city": "Paris", "days": 2}, "", "")
    assert json.loads(c.to_openai()["function"]["arguments"]) == {"city": "Paris", "days": 2}


def test_answers_are_not_calls():
    for text in ["Hello", "", '{"answer": 42}', "{ not json and names nothing", "[1, 2]"]:
        assert parse_calls(text, TOOLS) == [], text
    assert looks_like_call('  <|python_tag|>{"name"') and not looks_like_call("Sure: {")


def test_parallel_list_and_semicolons_and_arguments_key():
    lst = parse_calls('[{"name": "add", "parameters": {"a": 1}}, {"name": "get_weather", "parameters": {"city": "x"}}]', TOOLS)
    semi = parse_calls('{"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "arguments": "{\\"city\\": \\"x\\"}"}',
                       TOOLS)
    for calls in (lst, semi):
        assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 1}, ""),
                                                                  ("get_weather", {"city": "x"}, "")]
    assert len({c.id for c in lst}) == 2 and all(c.id.startswith("call_") for c in lst)


def test_wrong_calls_carry_one_line_errors():
    [unknown] = parse_calls('{"name": "nope", "parameters": {}}', TOOLS)
    assert "no tool named 'nope'" in unknown.error and "get_weather" in unknown.error
    [missing] = parse_calls('{"name": "get_weather", "parameters": {"days": "two"}}', TOOLS)
    assert missing.error.startswith("get_weather: the arguments do not fit its schema")
    [broken] = parse_calls('{"name": "get_weather", "parameters": {"city": "Par', TOOLS)
    assert broken.name == "get_weather" and broken.error.startswith("the call is not valid JSON")
    assert broken.raw.endswith('"Par') and broken.to_openai()["function"]["arguments"] == broken.raw
    [notobj] = parse_calls('{"name": "add", "parameters": [1]}', TOOLS)
    assert "must be a JSON object" in notobj.error
    for c in (unknown, missing, broken, notobj):
        assert "\n" not in c.error


def test_a_schema_that_cannot_be_checked_says_so():
    bad = Tool("r", "", {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}})
    assert "cannot be checked" in check_arguments(bad, {"x": 1})
    assert check_arguments(W, {"city": "x"}) == ""
