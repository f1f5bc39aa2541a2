"""generate --builtin/--mcp: the reply's calls to those tools run and the reply goes on with
their results (scripted replies, the real calculator); bad use is exit 2 and one line."""
import argparse

import pytest

from core.cli.tool_rounds import offered, run_rounds
from core.engine.events import Done, Stats
from core.engine.settings import SamplingParams
from core.errors import SettingsError
from core.tools.box import ToolBox
from core.tools.builtin import BuiltinTools
from core.tools.spec import Tool, ToolCall
from tests.core.cli.helpers import run_cli
from tests.helpers import ROOT


def args(**kw):
    return argparse.Namespace(**{"json": True, "system": None, "prompt": "What is 2^10?", "max_tool_rounds": 8,
                                 **kw})


def done(reason, calls=(), text=""):
    return Done(0, reason, [1], text, [-0.1], SamplingParams(), Stats(), tool_calls=list(calls))


@pytest.fixture
def box():
    b = ToolBox([BuiltinTools(["calculator"])])
    yield b
    b.close()


def test_a_call_runs_and_the_reply_goes_on_with_its_result(box):
    sent = []

    def again(msgs, p):
        sent.append((list(msgs), p))
        yield done("eos", text="It is 1024.")
    first = iter([done("tool_calls", [ToolCall("calculator", {"expression": "2^10"}, id="call_1")])])
    params = SamplingParams(tool_choice="required")
    last, ran = run_rounds(first, again, params, box, args())
    assert last.text == "It is 1024." and len(sent) == 1
    msgs, p = sent[0]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "1024"}
    assert p.tool_choice == "auto"  # forced for the user's turn only
    assert ran == [{"call": msgs[1]["tool_calls"][0], "source": "builtin", "result": "1024", "is_error": False,
                    "truncated": False}]


def test_rounds_stop_at_the_limit_and_a_client_tool_ends_the_reply(box, capsys):
    calls = []

    def again(msgs, p):
        calls.append(1)
        yield done("tool_calls", [ToolCall("calculator", {"expression": "1+1"})])
    first = iter([done("tool_calls", [ToolCall("calculator", {"expression": "1+1"})])])
    last, ran = run_rounds(first, again, SamplingParams(), box, args(json=False, max_tool_rounds=2))
    assert len(calls) == 2 and len(ran) == 2 and last.stop_reason == "tool_calls"
    assert "stopped after 2 tool rounds" in capsys.readouterr().err
    client = iter([done("tool_calls", [ToolCall("get_weather", {"city": "Rome"})])])
    last, ran = run_rounds(client, again, SamplingParams(), box, args())
    assert ran == [] and last.tool_calls[0].name == "get_weather"  # the caller runs its own function


def test_a_name_both_sides_offer_is_refused(box):
    with pytest.raises(SettingsError, match="both offer calculator"):
        offered([Tool("calculator")], box)
    assert [t.name for t in offered([Tool("get_weather")], box)] == ["get_weather", "calculator"]


def test_builtin_without_chat_is_exit_2_and_one_line(capsys):
    rc, out, err = run_cli(capsys, "generate", str(ROOT / "assets" / "models" / "llamadesk-demo"),
                           "--prompt", "x", "--builtin", "calculator")
    assert rc == 2 and "need --chat" in err and len(err.strip().splitlines()) == 1, err
