"""Tool use in the transcript: the approval card, a reply's calls, a result folded and cut,
and the chat column driving a round through the conversation controller."""
from __future__ import annotations

from PySide6.QtCore import Qt

from core.history.tool_messages import stored_calls
from core.tools.spec import MAX_RESULT_CHARS, ToolCall, ToolResult
from gui.chat.chat_view import ChatView
from gui.chat.column import ChatColumn
from gui.chat.tool_views import SHOWN_CHARS, CallsReplyWidget, ToolCard, ToolResultWidget
from tests.gui.chat.test_controller import finished, history, make  # noqa: F401 (fixture)
from tests.gui.chat.test_tool_round import WEATHER, Provider, weather_answer
from tests.gui.ui_helpers import loop, run, until  # noqa: F401 (fixtures)

CALL = ToolCall("get_weather", {"city": "Paris", "days": 2}, id="call_1")


def card(**kw):
    return {"call_id": "call_1", "name": "get_weather", "source": "mcp:weather", "description": "The weather",
            "arguments": {"city": "Paris", "days": 2}, "raw": "", "reply_id": 2, **kw}


def transcript(long_text: str):
    res = ToolResult.bounded(CALL, long_text)
    return [
        {"id": 1, "role": "user", "text": "Weather in Paris?"},
        {"id": 2, "role": "assistant", "text": "Let me look.", "stop_reason": "tool_calls",
         "tool_calls": stored_calls([CALL], {"get_weather": "mcp:weather"})},
        {"id": 3, "role": "tool", "text": res.content,
         "tool_result": {"call_id": "call_1", "name": "get_weather", "source": "mcp:weather",
                         "truncated": res.truncated, "is_error": False}},
    ]


def test_a_reply_lists_its_calls_and_a_result_is_folded_until_opened(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(640, 560)
    view.set_messages(transcript("line one\n" + "x" * (MAX_RESULT_CHARS + 500)))
    view.show()
    reply, result = view.widgets[1], view.widgets[2]
    assert isinstance(reply, CallsReplyWidget) and isinstance(result, ToolResultWidget)
    assert "get_weather" in reply.calls_label.text() and "MCP server weather" in reply.calls_label.text()
    assert result.role_label.text() == "Result · get_weather"
    assert not result.body.isVisible() and "line one" in result.toggle.text()
    foot = result.footer.text()
    assert f"cut: the model got the first {MAX_RESULT_CHARS:,}" in foot and f"first {SHOWN_CHARS:,} of" in foot
    assert result.buttons["regenerate"].isHidden() and not result.buttons["copy"].isHidden()
    qtbot.mouseClick(result.toggle, Qt.LeftButton)
    assert result.body.isVisible() and "line one" in result.body.toPlainText()
    assert len(result.body.toPlainText()) < SHOWN_CHARS + 100  # the transcript shows at most this much
    view.add_card(card())
    view.grab().save("/tmp/toolgui-result.png")


def test_the_card_runs_edits_and_denies(qtbot):
    w = ToolCard(card())
    qtbot.addWidget(w)
    got = []
    w.decided.connect(lambda *a: got.append(a))
    assert '"city": "Paris"' in w.arguments.toPlainText() and w.arguments.isReadOnly()
    w.always.setChecked(True)
    qtbot.mouseClick(w.run_button, Qt.LeftButton)
    assert got == [("call_1", "run", None, True)]
    qtbot.mouseClick(w.edit_button, Qt.LeftButton)
    assert not w.arguments.isReadOnly()
    w.arguments.setPlainText('{"city": ')
    qtbot.mouseClick(w.run_button, Qt.LeftButton)
    assert len(got) == 1 and "not valid JSON" in w.status.text()
    w.arguments.setPlainText('{"city": "Rome"}')
    qtbot.mouseClick(w.run_button, Qt.LeftButton)
    assert got[-1] == ("call_1", "run", {"city": "Rome"}, True)
    qtbot.mouseClick(w.deny_button, Qt.LeftButton)
    assert got[-1] == ("call_1", "deny", None, False)
    w.set_running()
    assert not w.run_button.isEnabled() and "Running get_weather" in w.status.text()


def test_the_column_shows_the_card_runs_the_call_and_the_reply_goes_on(qtbot, loop, history):
    c, bridge, _, _ = make(history)
    col = ChatColumn()
    qtbot.addWidget(col)
    col.attach(c)
    col.resize(760, 640)
    col.show()
    weather = Provider("weather", [WEATHER], weather_answer)
    c.tools.set_providers({"mcp:weather": weather})
    c.tools.set_enabled("mcp:weather", True)
    c.send("Weather in Paris?")
    run(loop, finished(c))
    m = history.add_message(c.conversation.conv_id, role="assistant", text="", parent_id=c.conversation.leaf_id(),
                            stop_reason="tool_calls", tool_calls=stored_calls([CALL], {"get_weather": "mcp:weather"}))
    col.show_transcript()
    c.tool_round.on_reply(c.conversation.view_message(m))
    assert c.busy and list(col.chat.cards) == ["call_1"]
    col.show_transcript()  # the branch shown anew keeps the waiting card
    assert list(col.chat.cards) == ["call_1"]
    assert not c.regenerate(m.id) and len(bridge.requests) == 1  # nothing else starts while a card waits
    col.chat.cards["call_1"].grab().save("/tmp/toolgui-card.png")
    qtbot.mouseClick(col.chat.cards["call_1"].run_button, Qt.LeftButton)
    run(loop, until(lambda: len(bridge.requests) == 2 and not c.busy, 5, "the reply after the result"))
    assert col.chat.cards == {}
    assert [m.role for m in c.conversation.path()][-3:] == ["assistant", "tool", "assistant"]
    sent = bridge.requests[-1].messages
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny in Paris"}
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    roles = [type(w).__name__ for w in col.chat.widgets]
    assert roles[-2:] == ["ToolResultWidget", "MessageWidget"]
    col.grab().save("/tmp/toolgui-column.png")
