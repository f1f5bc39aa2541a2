"""gui.chat.tool_round and chat_tools: a reply's tool calls from approval to the reply that
goes on, with fake providers (the real MCP path is covered in tests/core/tools and by one
GUI test through an SDK server); no window."""
from __future__ import annotations

import threading
import time

import pytest

from core.history.store import History
from core.history.tool_messages import stored_calls
from core.tools.spec import Tool, ToolCall, ToolResult
from gui.chat.chat_tools import ChatTools, switch_key
from gui.chat.conversation import ConversationModel
from gui.chat.tool_round import ToolRound
from tests.gui.ui_helpers import loop, run, until  # noqa: F401 (fixtures)

WEATHER = Tool("get_weather", "The weather in a city",
               {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "mcp:weather")
SLOW = Tool("slow", "Never answers until cancelled", source="mcp:weather")
CALC = Tool("calculator", "Arithmetic", {"type": "object", "properties": {"expression": {"type": "string"}}},
            "builtin")


class Provider:
    """A ToolProvider that answers from a function, on whatever thread calls it."""

    def __init__(self, name, tools, answer):
        self.name, self._tools, self.answer = name, tools, answer
        self.calls: list[ToolCall] = []
        self.threads: list[str] = []

    def tools(self):
        return list(self._tools)

    def call(self, call, *, cancel, timeout):
        self.calls.append(call)
        self.threads.append(threading.current_thread().name)
        return self.answer(call, cancel, timeout)


def weather_answer(call, cancel, timeout):
    if call.name == "slow":
        cancel.wait(timeout)
        return ToolResult.bounded(call, "cancelled", is_error=True)
    return ToolResult.bounded(call, f"sunny in {call.arguments.get('city')}")


@pytest.fixture
def setup(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    conv = ConversationModel(history=h)
    tools = ChatTools(conversation=conv)
    weather = Provider("weather", [WEATHER, SLOW], weather_answer)
    calc = Provider("builtin", [CALC], lambda call, cancel, timeout: ToolResult.bounded(call, "4"))
    tools.set_providers({"mcp:weather": weather, "builtin": calc})
    rnd = ToolRound(conversation=conv, tools=tools, prefs=tools)
    seen = {k: [] for k in ("approvalNeeded", "callRunning", "callSettled", "resultAdded", "notice", "continueWith",
                            "busyChanged")}
    for k, v in seen.items():
        getattr(rnd, k).connect(v.append)
    yield conv, tools, rnd, weather, seen
    h.close()


def reply_with(conv, *calls, parent=None, text="Who?"):
    """A stored user turn (unless ``parent``) and a reply that made ``calls``."""
    if parent is None:
        parent = conv.add_user(text).id
    m = conv.history.add_message(conv.conv_id, role="assistant", text="", parent_id=parent, stop_reason="tool_calls",
                                 tool_calls=stored_calls(list(calls), {"get_weather": "mcp:weather"}))
    return conv.view_message(m)


def roles(conv):
    return [(m.role, m.text) for m in conv.path()]


def test_a_fresh_chat_offers_nothing_until_its_switches_are_on_and_keeps_them(setup):
    conv, tools, *_ = setup
    assert tools.tools() == []
    tools.set_enabled("mcp:weather", True)
    tools.set_enabled(switch_key(CALC), True)
    assert {t.name for t in tools.tools()} == {"get_weather", "slow", "calculator"}
    conv.add_user("hi")  # stores the chat: it keeps the switches it was typed with
    assert tools.enabled(conv.conv_id) == {"mcp:weather", "builtin:calculator"}
    assert conv.history.conversation(conv.conv_id).meta["tools"]["enabled"] == ["mcp:weather", "builtin:calculator"]
    tools.set_enabled("mcp:weather", False)
    assert [t.name for t in tools.tools()] == ["calculator"]
    other = conv.history.create_conversation("old chat").id
    assert tools.enabled(other) == set()  # another chat has its own (none)


def test_a_call_asks_runs_off_the_ui_thread_is_stored_and_the_reply_goes_on(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    call = ToolCall("get_weather", {"city": "Paris"})
    rnd.on_reply(reply_with(conv, call))
    (card,) = seen["approvalNeeded"]
    assert card["name"] == "get_weather" and card["source"] == "mcp:weather" and card["arguments"] == {"city": "Paris"}
    assert weather.calls == [] and rnd.busy  # nothing runs before the user says so
    assert rnd.decide(call.id, "run")
    run(loop, until(lambda: seen["continueWith"], 5, "the result"))
    assert weather.threads and weather.threads[0] != threading.main_thread().name
    assert roles(conv)[-1] == ("tool", "sunny in Paris")
    tool_msg = conv.path()[-1]
    assert tool_msg.tool_result["call_id"] == call.id and tool_msg.tool_result["source"] == "mcp:weather"
    assert seen["continueWith"] == [tool_msg.id] and seen["resultAdded"][0]["id"] == tool_msg.id
    assert not rnd.busy and seen["busyChanged"] == [True, False]


def test_edited_arguments_run_and_always_allow_is_remembered_per_chat_and_tool(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    first = ToolCall("get_weather", {"city": "Paris"})
    rnd.on_reply(reply_with(conv, first))
    assert rnd.decide(first.id, "run", arguments={"city": "Rome"}, always=True)
    run(loop, until(lambda: seen["continueWith"], 5, "the result"))
    assert weather.calls[0].arguments == {"city": "Rome"} and roles(conv)[-1] == ("tool", "sunny in Rome")
    assert tools.always(conv.conv_id) == {"get_weather"}
    second = ToolCall("get_weather", {"city": "Oslo"})
    rnd.on_reply(reply_with(conv, second, parent=conv.leaf_id()))
    run(loop, until(lambda: len(seen["continueWith"]) == 2, 5, "the second result"))
    assert len(seen["approvalNeeded"]) == 1  # allowed: it ran without a card
    rnd.ask_every_time = True  # the global switch: every call asks again
    third = ToolCall("get_weather", {"city": "Nice"})
    rnd.on_reply(reply_with(conv, third, parent=conv.leaf_id()))
    assert len(seen["approvalNeeded"]) == 2


def test_deny_answers_the_call_as_declined_and_goes_on(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    a, b = ToolCall("get_weather", {"city": "A"}), ToolCall("get_weather", {"city": "B"})
    rnd.on_reply(reply_with(conv, a, b))
    assert rnd.decide(a.id, "deny")
    assert [c["call_id"] for c in seen["approvalNeeded"]] == [a.id, b.id]  # the next call asks in turn
    assert not rnd.decide(a.id, "run")  # an answered card is not answered twice
    assert rnd.decide(b.id, "run")
    run(loop, until(lambda: seen["continueWith"], 5, "the result"))
    assert [r for r, _ in roles(conv)[-2:]] == ["tool", "tool"]
    denied = conv.path()[-2]
    assert denied.tool_result["is_error"] and "declined" in denied.text
    assert [c.arguments for c in weather.calls] == [{"city": "B"}]


def test_stop_cancels_a_running_call_answers_the_rest_and_does_not_go_on(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    tools.allow_always(None, "slow")
    slow, later = ToolCall("slow", {}), ToolCall("get_weather", {"city": "X"})
    rnd.on_reply(reply_with(conv, slow, later))
    run(loop, until(lambda: weather.calls, 5, "the call to start"))
    assert rnd.running
    t0 = time.monotonic()
    rnd.stop()
    run(loop, until(lambda: not rnd.busy, 5, "the stop"))
    assert time.monotonic() - t0 < 2
    path = conv.path()
    assert [m.role for m in path[-2:]] == ["tool", "tool"]
    assert "stopped" in path[-2].text and path[-1].text.startswith("Not run")
    assert seen["continueWith"] == [] and "stopped" in seen["notice"][-1]


def test_a_provider_that_never_answers_times_out_and_the_ui_stays_free(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    stuck = threading.Event()
    weather.answer = lambda call, cancel, timeout: stuck.wait(30) and None  # ignores its timeout
    rnd.timeout = 0.2
    import gui.chat.tool_round as tr
    old, tr.GRACE_S = tr.GRACE_S, 0.1
    try:
        call = ToolCall("get_weather", {"city": "P"})
        rnd.on_reply(reply_with(conv, call))
        rnd.decide(call.id, "run")
        run(loop, until(lambda: seen["continueWith"], 5, "the timeout"))
    finally:
        tr.GRACE_S = old
        stuck.set()
    assert "did not answer within 0.2 s" in conv.path()[-1].text and conv.path()[-1].tool_result["is_error"]


@pytest.mark.parametrize("answer,expect", [
    (lambda call, cancel, timeout: ToolResult(call.id, call.name, "x" * 10_000_000), "cut"),
    (lambda call, cancel, timeout: (_ for _ in ()).throw(RuntimeError("server exited")), "server exited"),
])
def test_a_huge_result_is_cut_and_a_crash_is_said(loop, setup, answer, expect):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    tools.allow_always(None, "get_weather")
    weather.answer = answer
    conv.add_user("q")
    rnd.on_reply(reply_with(conv, ToolCall("get_weather", {"city": "P"}), parent=conv.leaf_id()))
    run(loop, until(lambda: seen["continueWith"], 5, "the result"))
    m = conv.path()[-1]
    assert expect in m.text and len(m.text) < 40_000
    assert m.tool_result["truncated"] == (expect == "cut")


def test_a_tool_removed_meanwhile_or_never_offered_is_answered_without_running(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    call, unknown = ToolCall("get_weather", {"city": "P"}), ToolCall("launch_rockets", {})
    rnd.on_reply(reply_with(conv, unknown, call))
    tools.set_providers({})  # the server was removed while the card waited
    assert rnd.decide(call.id, "run")
    run(loop, until(lambda: seen["continueWith"], 5, "the results"))
    texts = [m.text for m in conv.path()[-2:]]
    assert "no tool named launch_rockets" in texts[0] and "removed" in texts[1]
    assert weather.calls == [] and len(seen["approvalNeeded"]) == 1


def test_arguments_that_fail_the_schema_are_answered_with_why(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    rnd.check = lambda tool, args: "'city' is a required property" if "city" not in args else ""
    bad = ToolCall("get_weather", {"town": "P"})
    rnd.on_reply(reply_with(conv, bad))
    run(loop, until(lambda: seen["continueWith"], 5, "the result"))
    assert "'city' is a required property" in conv.path()[-1].text and weather.calls == []
    good = ToolCall("get_weather", {"city": "P"})
    rnd.on_reply(reply_with(conv, good, parent=conv.leaf_id()))
    assert not rnd.decide(good.id, "run", arguments={"nope": 1}) and "required" in rnd.problem
    assert rnd.decide(good.id, "run", arguments={"city": "Q"})
    run(loop, until(lambda: len(seen["continueWith"]) == 2, 5, "the edited call"))
    assert [c.arguments for c in weather.calls] == [{"city": "Q"}]


def test_the_loop_guard_stops_after_max_rounds_and_says_so(loop, setup):
    conv, tools, rnd, weather, seen = setup
    tools.set_enabled("mcp:weather", True)
    tools.allow_always(None, "get_weather")
    rnd.max_rounds = 2
    parent = None
    for i in range(3):
        rnd.on_reply(reply_with(conv, ToolCall("get_weather", {"city": str(i)}), parent=parent))
        run(loop, until(lambda: not rnd.busy, 5, "the round"))
        parent = conv.leaf_id()
    assert len(seen["continueWith"]) == 2 and len(weather.calls) == 2
    assert "2 rounds" in seen["notice"][-1] and conv.path()[-1].text.startswith("Not run")


def test_refresh_lists_the_providers_off_the_ui_thread(loop, setup):
    conv, tools, rnd, weather, seen = setup
    where = []

    class Listing(Provider):
        def tools(self):
            where.append(threading.current_thread().name)
            return [WEATHER]

    slow = Listing("weather", [], weather_answer)
    tools.set_providers({"mcp:weather": slow}, listed={"mcp:weather": []})
    tools.set_enabled("mcp:weather", True)
    assert tools.tools() == [] and where == []  # nothing listed on the UI thread
    run(loop, tools.refresh())
    assert [t.name for t in tools.tools()] == ["get_weather"]
    assert where and where[0] != threading.main_thread().name
