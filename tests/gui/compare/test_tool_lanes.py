"""Comparison lanes that differ in tools (issue 25 item 6): the line over a lane says where
its tool calls part from the baseline's; a lane's calls are kept in its record."""
from __future__ import annotations

from types import SimpleNamespace

import asyncio

from core.engine.settings import SamplingParams
from core.engine.events import Stats
from core.tools.spec import Tool, ToolCall
from core.worker.protocol import CompareRequest
from gui.compare.lane_column import LaneColumn
from gui.compare.lanes import calls_label
from gui.compare.models import ModelShelf
from gui.compare.runner import ComparisonRunner, LaneJob, running_line
from gui.widgets.token_run import LaneRun
from tests.gui.compare.common import history  # noqa: F401  (fixture)
from tests.gui.compare.test_runner import LOADED, Bridge, words
from tests.gui.ui_helpers import loop  # noqa: F401  (fixture)

COLORS = {"mark": "#c00", "muted": "#888"}


def lane(*calls, reason="tool_calls", choice="auto"):
    run = LaneRun()
    run.finish(SimpleNamespace(text="", stop_reason=reason if calls else "eos",
                               params=SamplingParams(tool_choice=choice), stats=Stats(), tool_calls=list(calls)))
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


def test_a_lane_with_tools_off_gets_a_prompt_without_them_and_its_line_says_so():
    note = Tool("note", "Write a note", {"type": "object", "properties": {"text": {"type": "string"}}})
    bridge = Bridge(words)
    jobs = [LaneJob(n, LOADED, SamplingParams(seed=n, tool_choice=c)) for n, c in
            ((1, "auto"), (2, "off"), (3, "none"))]
    base = CompareRequest(prompt="", mode="chat", messages=[{"role": "user", "content": "Note this"}], tools=[note])
    assert asyncio.run(ComparisonRunner(bridge, ModelShelf([LOADED])).run(base, jobs)) == []
    with_tools, without = bridge.requests
    assert [q.tool_choice for q in with_tools.lanes] == ["auto", "none"] and with_tools.tools == [note]
    assert [q.tool_choice for q in without.lanes] == ["off"] and without.tools == []
    assert running_line(jobs) == "Running 3 lanes…"  # one model, two prompts
    assert all(j.run.finished for j in jobs) and jobs[1].run.params["tool_choice"] == "off"
    paris = ToolCall("get_weather", {"city": "Paris"})
    said = calls_label(lane(choice="off"), lane(paris), COLORS)
    assert "Tools off</span>: this lane's prompt declares no tools · " in said
    assert said.endswith("where the baseline calls get_weather")
    assert "the baseline's prompt declares no tools" in calls_label(lane(), lane(choice="off"), COLORS)
    assert calls_label(lane(choice="off"), lane(choice="off"), COLORS) == ""


def test_a_lanes_tools_row_is_offered_with_tools_and_keeps_off(qtbot):
    col = LaneColumn(settings={"temperature": 0.0})
    qtbot.addWidget(col)
    col.show()
    assert not col.tools.isVisible() and col.settings()["tool_choice"] == "auto"
    col.tools.set_tools(["note", "get_weather"])
    assert col.tools.isVisible()
    assert [col.tools.choice.itemData(i) for i in range(col.tools.choice.count())] == [
        "auto", "none", "required", "note", "get_weather", "off"]
    with qtbot.waitSignal(col.settingsChanged):
        col.tools.choice.setCurrentIndex(col.tools.choice.findData("off"))
    assert col.settings()["tool_choice"] == "off" and not col.tools.held.isEnabled()
    SamplingParams.from_dict(col.settings()).validate()
    again = LaneColumn(settings={**col.settings(), "tool_choice": "gone_tool", "tool_constraint": False})
    qtbot.addWidget(again)
    assert again.settings()["tool_choice"] == "gone_tool" and again.settings()["tool_constraint"] is False
    assert "not offered" in again.tools.choice.currentText()


def test_a_saved_comparison_reopens_with_its_tools_and_lanes_tool_choices(qtbot, loop, history):  # noqa: F811
    from gui.compare.view import CompareView
    from tests.gui.compare.common import FakeBridge
    tool = {"type": "function", "function": {"name": "note", "description": "",
                                             "parameters": {"type": "object", "properties": {}}}}
    v = CompareView(bridge=FakeBridge(), history=history, prompt="Note this", tools=[tool],
                    lanes=[{"tool_choice": "auto"}, {"tool_choice": "off", "tool_constraint": False}])
    qtbot.addWidget(v)
    saved = history.save_comparison("notes", *v.comparison_data()).id
    again = CompareView(bridge=FakeBridge(), history=history)
    qtbot.addWidget(again)
    again.open_comparison(saved)
    assert again.prompt_row.prompt("auto")["tools"] == [tool]
    assert [c.settings()["tool_choice"] for c in again.columns] == ["auto", "off"]
    assert not again.columns[1].settings()["tool_constraint"]
    assert not again.columns[1].tools.isHidden() and "note" in [again.columns[0].tools.choice.itemData(i)
                                                                for i in range(again.columns[0].tools.choice.count())]
