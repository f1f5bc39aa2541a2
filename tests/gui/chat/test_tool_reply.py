"""A chat turn with tools, end to end through the conversation controller: the request
offers the chat's tools, a reply that ends with calls is stored with them, the card runs the
call, and the reply goes on with the result in OpenAI's shape (scripted bridge); and the
fixture model on the real worker, held to a call by tool_choice=required."""
from __future__ import annotations

from pathlib import Path

from core.engine.events import Done, Prefilled, Stats
from core.tools.spec import ToolCall
from gui.bridge import Bridge
from gui.chat.controller import ConversationController
from tests.gui.chat.test_controller import Models, finished, history  # noqa: F401 (fixture)
from tests.gui.chat.test_reply import Settings, chunk
from tests.gui.chat.test_tool_round import WEATHER, Provider, weather_answer
from tests.gui.ui_helpers import ScriptedBridge, bridge, loop, run, until  # noqa: F401 (fixtures)

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"
CALL_TEXT = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


async def calls_then_answers(request, stream):
    """The first reply calls get_weather; the one after its result answers."""
    yield Prefilled(30, 0, 0.01)
    if request.messages[-1]["role"] != "tool":
        yield chunk(CALL_TEXT)
        yield Done(0, "tool_calls", [7], CALL_TEXT, [-0.1], request.params.resolved(), Stats(generated_tokens=1),
                   tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="call_7")])
    else:
        yield chunk("It is sunny.")
        yield Done(0, "eos", [8], "It is sunny.", [-0.1], request.params.resolved(), Stats(generated_tokens=1))


def controller(history, script):
    models = Models()
    b = ScriptedBridge(script)
    c = ConversationController(bridge=b, history=history, models=models, settings=Settings())
    models.set_model({"name": "tiny", "context_length": 512})
    return c, b


def test_a_reply_calls_the_user_runs_it_and_the_reply_goes_on(loop, history):
    c, b = controller(history, calls_then_answers)
    weather = Provider("weather", [WEATHER], weather_answer)
    c.tools.set_providers({"mcp:weather": weather})
    c.tools.set_enabled("mcp:weather", True)
    cards = []
    c.tool_round.approvalNeeded.connect(cards.append)
    assert c.send("Weather in Paris?")
    run(loop, until(lambda: cards, 5, "the card"))
    assert [t.name for t in b.requests[0].tools] == ["get_weather"]  # the chat's tools were offered
    reply = c.conversation.path()[-1]
    assert reply.stop_reason == "tool_calls" and reply.tool_calls[0]["id"] == "call_7"
    assert reply.tool_calls[0]["source"] == "mcp:weather" and reply.meta["tools"] == ["get_weather"]
    assert c.busy and cards[0]["arguments"] == {"city": "Paris"}
    assert c.tool_round.decide("call_7", "run")
    run(loop, until(lambda: len(b.requests) == 2, 5, "the reply after the result"))
    run(loop, finished(c))
    assert [(m.role, m.text) for m in c.conversation.path()] == [
        ("user", "Weather in Paris?"), ("assistant", CALL_TEXT), ("tool", "sunny in Paris"), ("assistant", "It is sunny.")]
    sent = b.requests[1].messages
    assert sent[-2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_7", "name": "get_weather", "content": "sunny in Paris"}
    assert not c.busy


def test_a_reply_forced_to_call_answers_after_the_results(loop, history):
    """tool_choice=required holds the user's turn to a call; the reply after the results
    is offered "auto", or it would call again every round until the loop guard."""
    models = Models()
    b = ScriptedBridge(calls_then_answers)
    c = ConversationController(bridge=b, history=history, models=models,
                               settings=Settings(tool_choice="required"))
    models.set_model({"name": "tiny", "context_length": 512})
    c.tools.set_providers({"mcp:weather": Provider("weather", [WEATHER], weather_answer)})
    c.tools.set_enabled("mcp:weather", True)
    cards = []
    c.tool_round.approvalNeeded.connect(cards.append)
    assert c.send("Weather in Paris?")
    run(loop, until(lambda: cards, 5, "the card"))
    assert c.tool_round.decide(cards[0]["call_id"], "run")
    run(loop, until(lambda: len(b.requests) == 2, 5, "the reply after the result"))
    run(loop, finished(c))
    assert [r.params.tool_choice for r in b.requests] == ["required", "auto"]
    assert c.conversation.path()[-1].text == "It is sunny."


def test_stop_while_a_card_waits_answers_the_call_and_keeps_the_chat_usable(loop, history):
    c, b = controller(history, calls_then_answers)
    c.tools.set_providers({"mcp:weather": Provider("weather", [WEATHER], weather_answer)})
    c.tools.set_enabled("mcp:weather", True)
    busy = []
    c.busyChanged.connect(busy.append)
    c.send("Weather?")
    run(loop, until(lambda: c.tool_round.pending(), 5, "the card"))
    assert busy and busy[-1] is True
    c.stop()
    assert not c.busy and busy[-1] is False
    assert c.conversation.path()[-1].text.startswith("Not run") and len(b.requests) == 1


def test_the_demo_model_held_to_a_call_asks_then_goes_on(qapp, loop, history):
    """The real worker: tool_choice=required holds the demo model (Llama 3 chat format) to a
    valid call of the chat's tool; the card runs it and the next reply follows its result."""
    models = Models()
    real = Bridge(torch_threads=1)
    settings = Settings(max_new_tokens=160, tool_choice="required")
    c = ConversationController(bridge=real, history=history, models=models, settings=settings)
    models.set_model({"name": "demo", "context_length": 1024})
    c.tools.set_providers({"mcp:weather": Provider("weather", [WEATHER], weather_answer)})
    c.tools.set_enabled("mcp:weather", True)
    cards, refused = [], []
    c.tool_round.approvalNeeded.connect(cards.append)
    c.reply.refused.connect(lambda *a: refused.append(a))

    async def go():
        await real.load(DEMO, max_seq_len=1024)  # the Llama 3.1 tool preamble alone is ~450 tokens here
        assert c.send("Weather in Paris?")
        await until(lambda: cards or refused or (not c.busy and c.conversation.path()[-1].role == "assistant"),
                    60, "the call")
        assert cards, (refused, c.conversation.path()[-1:])
        settings.p = Settings(max_new_tokens=8, tool_choice="none").p
        assert c.tool_round.decide(cards[0]["call_id"], "run")
        await until(lambda: len(c.conversation.path()) == 4 and not c.busy, 60, "the reply after the result")
        await real.shutdown()
    run(loop, go(), 120)
    path = c.conversation.path()
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    assert path[1].tool_calls[0]["function"]["name"] == "get_weather" and path[1].stop_reason == "tool_calls"
    assert path[2].text.startswith("sunny in ")


def test_arguments_that_fail_the_tools_schema_are_answered_not_run(loop, history):
    from tests.gui.chat.test_tool_round import reply_with
    c, _ = controller(history, calls_then_answers)
    weather = Provider("weather", [WEATHER], weather_answer)
    c.tools.set_providers({"mcp:weather": weather})
    c.tools.set_enabled("mcp:weather", True)
    c.tool_round.on_reply(reply_with(c.conversation, ToolCall("get_weather", {"town": "Paris"})))
    run(loop, until(lambda: not c.tool_round.busy, 5, "the answer"))
    assert "'city' is a required property" in c.conversation.path()[2].text and weather.calls == []
