"""Item 6 of issue 25: the token inspector says, at a reply's first token, how likely the
model was to call a tool vs. answer, and at a tool's name which tools it weighed."""
from __future__ import annotations

import math
from types import SimpleNamespace

from core.history.tool_messages import stored_calls
from core.tools.spec import ToolCall
from gui.chat.chat_view import ChatView
from gui.chat.reply import cut_call
from gui.widgets.token_inspector import TokenInspector
from gui.widgets.tool_odds import call_odds, call_tokens, name_choices, opens_call, tool_note

CALL_TEXT = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TEXTS = ['{"', 'name', '": "', 'get', '_weather', '", "parameters": {"city": "Paris"}}']
FIRST = {"raw": [[1, 0.6], [2, 0.3], [3, 0.05]], "filtered": [[1, 1.0]], "pieces": {"1": '{"', "2": "The", "3": " {"}}
NAME = {"raw": [[10, 0.7], [11, 0.2], [12, 0.1]], "filtered": [[10, 1.0]],
        "pieces": {"10": "get", "11": "calc", "12": "hello"}}


def record(texts=TEXTS, tops=None):
    tops = tops or [FIRST, None, None, NAME, None, None]
    return {"tokens": list(range(100, 100 + len(texts))), "token_texts": texts, "pieces": texts,
            "logprobs": [math.log(0.6)] * len(texts), "top": tops, "inspect": 5}


def reply(**kw):
    calls = stored_calls([ToolCall("get_weather", {"city": "Paris"})], {"get_weather": "mcp:weather"})
    return {"id": 7, "role": "assistant", "text": CALL_TEXT, "stop_reason": "tool_calls", "tool_calls": calls,
            "tools_offered": ["get_weather", "calculator"], "tokens": record(), **kw}


def test_openers_and_the_split_of_the_recorded_mass():
    assert opens_call('{"') and opens_call(" [") and opens_call("<|python_tag|>") and not opens_call("The")
    assert opens_call("<tool_call>") and not opens_call("<b>")  # a Hermes / Qwen template's call
    cut = SimpleNamespace(stop_reason="length", text='<tool_call>\n{"name": "f', params=SimpleNamespace(tool_choice="auto"))
    assert cut_call(cut) and not cut_call(SimpleNamespace(stop_reason="length", text="Once",
                                                          params=SimpleNamespace(tool_choice="auto")))
    odds = call_odds(FIRST)
    assert math.isclose(odds["call"], 0.65) and math.isclose(odds["answer"], 0.3)
    assert math.isclose(odds["unlisted"], 0.05)


def test_the_name_token_is_found_even_when_it_holds_the_quote():
    assert call_tokens(CALL_TEXT, record()) == {"first": 0, "names": {3: ""}}
    texts = ['{"', 'name', '": ', '"get', '_weather', '", "parameters": {"city": "Paris"}}']
    spots = call_tokens(CALL_TEXT, record(texts))
    assert spots["names"] == {3: '"'}
    top = {"raw": [[1, 0.5], [2, 0.4]], "pieces": {"1": '"get', "2": '"calc'}}
    assert name_choices(top, ["get_weather", "calculator"], '"') == [("get_weather", 0.5), ("calculator", 0.4)]


def test_tool_note_at_the_first_token_and_at_the_name():
    r = reply()
    first = tool_note(r, 0, FIRST)
    assert "Call a tool: 65.0%" in first and "answer: 30.0%" in first and "called a tool" in first
    name = tool_note(r, 3, NAME)
    assert "get_weather 70.0%" in name and "calculator 20.0%" in name and "hello" not in name
    assert tool_note(r, 1, None) == ""
    assert tool_note({**r, "tools_offered": [], "tool_calls": []}, 0, FIRST) == ""  # no tools: nothing to say


def test_the_inspector_shows_it_for_a_reply_in_token_view(qtbot):
    inspector = TokenInspector()
    view = ChatView(inspector=inspector)
    qtbot.addWidget(view)
    qtbot.addWidget(inspector)
    view.set_messages([{"id": 6, "role": "user", "text": "Weather?"}, reply()])
    assert view.show_tokens(7)
    assert view.inspect_token(7, 0)
    assert "Call a tool: 65.0%" in inspector.tool_odds.text() and not inspector.tool_odds.isHidden()
    assert view.inspect_token(7, 3)
    assert "get_weather 70.0%" in inspector.tool_odds.text()
    inspector.resize(300, 420)
    inspector.grab().save("/tmp/toolgui-inspector.png")
    assert view.inspect_token(7, 1)
    assert inspector.tool_odds.isHidden()
