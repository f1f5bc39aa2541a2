"""Comparison lanes that differ in tools (issue 25 item 6): the line over a lane says where
its tool calls part from the baseline's; a lane's calls are kept in its record."""
from __future__ import annotations

from types import SimpleNamespace

from core.engine.settings import SamplingParams
from core.engine.events import Stats
from core.tools.spec import ToolCall
from gui.compare.lanes import calls_label
from gui.widgets.token_run import LaneRun

COLORS = {"mark": "#c00", "muted": "#888"}


def lane(*calls, reason="tool_calls"):
    run = LaneRun()
    run.finish(SimpleNamespace(text="", stop_reason=reason if calls else "eos", params=SamplingParams(),
                               stats=Stats(), tool_calls=list(calls)))
    return run


def test_where_calls_differ():
    paris, rome = ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Rome"})
    calc = ToolCall("calculator", {"expression": "1+1"})
    assert calls_label(lane(), lane(), COLORS) == ""
    assert calls_label(lane(paris), lane(paris), COLORS) == "Same tool calls as the baseline: get_weather"
    assert "Calls get_weather</span> where the baseline answers" in calls_label(lane(paris), lane(), COLORS)
    assert "Answers</span> where the baseline calls get_weather" in calls_label(lane(), lane(paris), COLORS)
    assert "the baseline calls get_weather" in calls_label(lane(calc), lane(paris), COLORS)
    assert "other arguments: city" in calls_label(lane(rome), lane(paris), COLORS)
    assert calls_label(LaneRun(), lane(paris), COLORS) == ""  # still running: nothing said yet


def test_a_lanes_calls_survive_its_record():
    run = lane(ToolCall("get_weather", {"city": "Paris"}, id="call_1"))
    back = LaneRun.from_dict(run.to_dict({}))
    assert back.tool_calls == run.tool_calls and back.tool_calls[0]["function"]["name"] == "get_weather"


def test_a_comparison_from_a_chat_offers_its_tools_to_every_lane(qtbot):
    from gui.compare.controls import PromptRow
    from gui.compare.runner import base_request
    tool = {"type": "function", "function": {"name": "get_weather", "description": "",
                                             "parameters": {"type": "object", "properties": {}}}}
    row = PromptRow("Weather?", "chat", [], tools=[tool])
    qtbot.addWidget(row)
    prompt = row.prompt("auto")
    assert prompt["tools"] == [tool]
    assert [t.name for t in base_request(prompt, 0).tools] == ["get_weather"]
    row.mode_combo.setCurrentIndex(row.mode_combo.findData("completion"))
    assert "tools" not in row.prompt("auto") and base_request(row.prompt("auto"), 0).tools == []
