"""The tool vocabulary: declarations are checked as OpenAI checks them, results are bounded."""
from __future__ import annotations

import json

import pytest

from core.tools.spec import MAX_TOOLS, Tool, ToolCall, ToolError, ToolResult, tools_from_openai

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_an_openai_function_round_trips():
    tool = Tool.from_openai(WEATHER)
    assert tool.name == "get_weather" and tool.parameters["required"] == ["city"]
    assert tool.to_openai() == WEATHER


@pytest.mark.parametrize("bad, words", [
    ({"type": "function", "function": {"name": "has space"}}, "tool name"),
    ({"type": "function", "function": {"name": "x" * 65}}, "tool name"),
    ({"type": "code_interpreter"}, "only function tools"),
    ({"type": "function", "function": {"description": "no name"}}, "needs a function with a name"),
    ({"type": "function", "function": {"name": "f", "parameters": "string"}}, "JSON schema object"),
])
def test_a_bad_declaration_says_what_is_wrong(bad, words):
    with pytest.raises(ToolError, match=words):
        tools_from_openai([bad])


def test_names_are_unique_and_counted():
    with pytest.raises(ToolError, match="unique: get_weather"):
        tools_from_openai([WEATHER, WEATHER])
    many = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]
    with pytest.raises(ToolError, match=f"at most {MAX_TOOLS}"):
        tools_from_openai(many)


def test_a_long_result_is_cut_and_says_so():
    call = ToolCall("get_weather", {"city": "Paris"})
    assert json.loads(call.to_openai()["function"]["arguments"]) == {"city": "Paris"}
    assert call.id.startswith("call_") and call.id != ToolCall("get_weather").id
    result = ToolResult.bounded(call, "y" * 50_000, limit=1_000)
    assert result.truncated and result.content.startswith("y" * 1_000)
    assert "50,000 characters" in result.content and len(result.content) < 1_100
    assert not ToolResult.bounded(call, "short").truncated
