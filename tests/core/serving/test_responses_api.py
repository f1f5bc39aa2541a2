"""OpenAI's Responses API (POST /v1/responses, issue 23 item 6) driven by the official
``openai`` client, whole and streamed; each reply equals the chat path's for the same
messages (which the chat tests check against the engine run directly)."""
import json

import pytest

openai = pytest.importorskip("openai")

from tests.core.serving.served import chat_ids  # noqa: E402

pytestmark = pytest.mark.timeout(120)
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about a dog named Max."}]


def chat_text(s, max_tokens: int) -> tuple[str, str]:
    r = s.client.chat.completions.create(model=s.model, messages=MSGS, temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_a_response_is_the_chat_reply_with_instructions_and_max_output_tokens(demo):
    r = demo.client.responses.create(model=demo.model, instructions="Be brief.", input="Tell me about a dog named Max.",
                                     temperature=0, max_output_tokens=12)
    text, finish = chat_text(demo, 12)
    assert r.output_text == text and finish == "length"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.object == "response" and r.id.startswith("resp_") and r.output[0].role == "assistant"
    assert r.usage.input_tokens == len(chat_ids(demo, MSGS)) and r.usage.output_tokens == 12
    assert r.instructions == "Be brief." and r.max_output_tokens == 12


def test_input_as_a_message_list_with_text_parts(demo):
    r = demo.client.responses.create(model=demo.model, temperature=0, max_output_tokens=8, input=[
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me about a dog named Max."}]}])
    assert r.output_text == chat_text(demo, 8)[0]


def test_a_streamed_response_sends_the_events_in_order_and_the_same_text(demo):
    events = list(demo.client.responses.create(model=demo.model, instructions="Be brief.", stream=True, temperature=0,
                                               input="Tell me about a dog named Max.", max_output_tokens=12))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == chat_text(demo, 12)[0] == events[-4].text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.usage.output_tokens == 12 and events[-1].response.output_text == "".join(deltas)


def test_a_response_that_ends_its_turn_is_completed_and_text_format_holds_it(demo):
    schema = {"type": "object", "required": ["name"], "additionalProperties": False,
              "properties": {"name": {"enum": ["Max", "Rex"]}}}
    r = demo.client.responses.create(model=demo.model, input="Name the dog.", temperature=0, max_output_tokens=30,
                                     text={"format": {"type": "json_schema", "name": "dog", "schema": schema}})
    assert r.status == "completed" and json.loads(r.output_text)["name"] in ("Max", "Rex")


@pytest.mark.parametrize("extra, field", [({"previous_response_id": "resp_1"}, "previous_response_id"),
                                          ({"tools": [{"type": "web_search"}]}, "tools"),
                                          ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
                                          ({"input": 5}, "input")])
def test_what_it_cannot_serve_is_a_400_naming_the_field(demo, extra, field):
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.post("/responses", body={"model": demo.model, "input": "hi", **extra}, cast_to=object)
    assert e.value.body["param"] == field
