"""The worker carries a request's tools to the prompt and the engine: a reply that calls
ends with stop reason "tool_calls" and its calls; a comparison's lanes differ in how calls
are held; a tool_choice naming no tool is one Error line, the worker going on."""
import jsonschema

from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.tools.spec import Tool
from core.worker.protocol import CompareRequest, Error, GenerateRequest
from tests.helpers import ROOT, loaded_ok

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
NOTE = Tool("note", "Write a note", {"type": "object", "required": ["text"],
                                     "properties": {"text": {"type": "string", "maxLength": 6}}})
ASK = [{"role": "user", "content": "Take a note."}]


def test_a_reply_calls_and_a_comparison_holds_one_lane(make_worker):
    w, col = make_worker()
    loaded_ok(col, w.load(DEMO, max_seq_len=1024))
    evs = col.finished(w.generate(GenerateRequest(messages=ASK, tools=[NOTE], params=SamplingParams(
        seed=2, max_new_tokens=60, tool_choice="required"))))
    done = evs[-1]
    assert isinstance(done, Done) and done.stop_reason == "tool_calls", (done.stop_reason, done.text)
    [call] = done.tool_calls
    assert call.name == "note" and not call.error
    jsonschema.validate(call.arguments, NOTE.parameters)
    assert evs[0].dropped_messages == 0 and evs[1].prompt_tokens > 200  # the tool was declared in the prompt
    lanes = [SamplingParams(seed=2, max_new_tokens=n, tool_choice="note", tool_constraint=held)
             for held, n in ((True, 60), (False, 24))]
    evs = col.finished(w.compare(CompareRequest(messages=ASK, tools=[NOTE], lanes=lanes)), lanes=2)
    on, off = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
    assert on.stop_reason == "tool_calls" and on.tool_calls[0].name == "note"
    assert off.text.startswith('{"name": "note", "parameters": ') and off.params.tool_constraint is False
    bad = col.finished(w.generate(GenerateRequest(messages=ASK, tools=[NOTE], params=SamplingParams(tool_choice="nope"))))
    assert isinstance(bad[-1], Error) and "not a declared tool" in bad[-1].message
    # a lane with tools off runs on a prompt that declares none (what the comparison sends it)
    lane = SamplingParams(seed=2, max_new_tokens=4, tool_choice="off")
    evs = col.finished(w.compare(CompareRequest(messages=ASK, tools=[], lanes=[lane])))
    done = evs[-1]
    assert isinstance(done, Done) and done.params.tool_choice == "off" and done.stop_reason != "tool_calls"
    assert evs[1].prompt_tokens < 40  # only the question: no tool preamble
    bad = col.finished(w.compare(CompareRequest(messages=ASK, tools=[NOTE], lanes=[lane])))
    assert isinstance(bad[-1], Error) and "off leaves the tools out of the prompt" in bad[-1].message
