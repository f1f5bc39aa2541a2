"""The fields clients of vLLM and llama.cpp's server send (issue 23, items 5 and 6), as real
HTTP requests with the official ``openai`` client (``extra_body``) against the package's
servers; each reply is checked against the engine run directly or against the constraint."""
import json
import re

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from core.engine.engine import Joining  # noqa: E402
from core.engine.events import Done  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.prompt.prompting import render_chat  # noqa: E402
from tests.core.serving.served import chat_ids  # noqa: E402

pytestmark = pytest.mark.timeout(120)
PET = {"type": "object", "additionalProperties": False, "required": ["pet", "legs"],
       "properties": {"pet": {"enum": ["dog", "cat", "bird"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}}}
DOG = [{"role": "user", "content": "Tell me about a dog named Max."}]
ONCE = "Once upon a time"


def chat(s, **kw):
    return s.client.chat.completions.create(model=s.model, messages=kw.pop("messages", DOG), **kw)


def fails(s, path: str, body: dict) -> dict:
    """The error object of a request the server must refuse with 400."""
    with pytest.raises(openai.BadRequestError) as e:
        s.client.post(path, body={"model": s.model, **body}, cast_to=object)
    return e.value.body


@pytest.mark.parametrize("extra", [{"guided_choice": ["yes", "no (a.b)*"]},
                                   {"structured_outputs": {"choice": ["yes", "no (a.b)*"]}}])
def test_a_choice_field_gives_exactly_one_of_the_strings(demo, extra):
    r = chat(demo, temperature=1.5, seed=3, max_tokens=10, n=4, extra_body=extra)
    assert {c.message.content for c in r.choices} <= {"yes", "no (a.b)*"}  # metacharacters are literal


@pytest.mark.parametrize("extra", [{"guided_json": PET}, {"guided_json": json.dumps(PET)},
                                   {"structured_outputs": {"json": PET}},
                                   {"response_format": {"type": "json_object", "schema": PET}}])
def test_json_schema_fields_of_vllm_and_llama_cpp_hold_the_reply_to_the_schema(demo, extra):
    r = chat(demo, temperature=1.0, seed=5, max_tokens=30, n=2, extra_body=extra)
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), PET)


def test_guided_regex_and_grammar_hold_the_reply(demo):
    r = chat(demo, temperature=1.0, seed=2, max_tokens=8, extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", r.choices[0].message.content)
    r = chat(demo, temperature=1.0, seed=2, max_tokens=8, extra_body={"guided_grammar": 'root ::= "woof" | "meow"'})
    assert r.choices[0].message.content in ("woof", "meow")


def test_two_constraint_fields_or_a_bad_one_are_refused_naming_the_field(demo):
    err = fails(demo, "/chat/completions", {"messages": DOG, "guided_regex": "a+", "guided_choice": ["a"]})
    assert err["param"] == "guided_choice" and "one constraint" in err["message"]
    assert fails(demo, "/chat/completions", {"messages": DOG, "guided_choice": []})["param"] == "guided_choice"
    err = fails(demo, "/chat/completions", {"messages": DOG, "structured_outputs": {"regex": "a", "whitespace_pattern": " "}})
    assert err["param"] == "structured_outputs" and "whitespace_pattern" in err["message"]


@pytest.mark.parametrize("field, value", [("typical_p", 0.5), ("n_probs", 3), ("prompt_logprobs", 1), ("mirostat", 2),
                                          ("tfs_z", 0.9), ("use_beam_search", True), ("skip_special_tokens", False)])
def test_samplers_this_server_lacks_are_refused_naming_the_field(stories, field, value):
    err = fails(stories, "/completions", {"prompt": ONCE, "max_tokens": 2, field: value})
    assert err["param"] == field and field in err["message"]


def test_samplers_left_off_are_accepted(stories):
    off = {"typical_p": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "n_probs": 0, "repeat_last_n": 64,
           "skip_special_tokens": True}
    r = stories.client.completions.create(model=stories.model, prompt=ONCE, max_tokens=12, temperature=0, extra_body=off)
    assert r.choices[0].text.startswith(", there was a little girl named Lily.")
    err = fails(stories, "/completions", {"prompt": ONCE, "repeat_penalty": 1.3, "repeat_last_n": 64})
    assert err["param"] == "repeat_last_n"  # a window the penalty does not have, once the penalty is on


def test_llama_cpp_names_repeat_penalty_and_n_predict_work_as_this_servers(stories):
    ids = stories.direct.tokenizer.encode(ONCE, bos=True)
    want = stories.alone(ids, SamplingParams(temperature=0, repetition_penalty=1.5, max_new_tokens=20))
    r = stories.client.completions.create(model=stories.model, prompt=ONCE, temperature=0,
                                          extra_body={"repeat_penalty": 1.5, "n_predict": 20})
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 20
    err = fails(stories, "/completions", {"prompt": ONCE, "n_predict": 0})
    assert err["param"] == "n_predict" and "n_predict" in err["message"]
    err = fails(stories, "/completions", {"prompt": ONCE, "n_predict": 5, "max_tokens": 6})
    assert err["param"] == "n_predict"


def test_n_predict_minus_one_runs_past_openais_sixteen_tokens(stories):
    kw = dict(model=stories.model, prompt=ONCE, temperature=0)
    text = stories.client.completions.create(**kw, max_tokens=24).choices[0].text
    r = stories.client.completions.create(**kw, stop=[text[-6:]], extra_body={"n_predict": -1})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens > 16
    assert r.choices[0].text == text[:text.index(text[-6:])]


def eos_of(s) -> int:
    return min(s.direct.stop_ids)


def test_ignore_eos_runs_to_max_tokens_as_the_engine_does_without_stop_tokens(stories):
    eos = eos_of(stories)
    kw = dict(model=stories.model, prompt=ONCE, temperature=0, max_tokens=6, logit_bias={str(eos): 50})
    assert stories.client.completions.create(**kw).choices[0].text == ""  # it ends at once
    r = stories.client.completions.create(**kw, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    ids = stories.direct.tokenizer.encode(ONCE, bos=True)
    done = [e for e in stories.engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=6, logit_bias={eos: 50}),
                                               stop_ids=()) if isinstance(e, Done)][0]
    assert r.choices[0].model_extra["token_ids"] == done.tokens == [eos] * 6


def test_min_tokens_holds_back_the_end_of_text_until_then(stories):
    eos = eos_of(stories)
    r = stories.client.completions.create(model=stories.model, prompt=ONCE, temperature=0, max_tokens=20,
                                          logit_bias={str(eos): 50}, extra_body={"min_tokens": 4})
    # four tokens as if the end of text were banned, then the end of text it is pushed to
    ids = stories.direct.tokenizer.encode(ONCE, bos=True)
    want = stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=4, logit_bias={eos: float("-inf")}))
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "stop"
    # the engine's own loop with min_tokens on the lane gives the same tokens
    q = stories.engine.check_request(ids, [SamplingParams(temperature=0, max_new_tokens=20, logit_bias={eos: 50})])
    done = [e for e in stories.engine.serve(_admit_once(Joining(ids, q, None, False, 0, frozenset([eos]), (), min_tokens=4)),
                                            max_rows=1) if isinstance(e, Done)]
    assert done[0].tokens == want.tokens and done[0].stop_token == eos
    err = fails(stories, "/completions", {"prompt": ONCE, "max_tokens": 3, "min_tokens": 4})
    assert err["param"] == "min_tokens"
    err = fails(stories, "/completions", {"prompt": ONCE, "max_tokens": 8, "min_tokens": 4, "lookup": 2})
    assert err["param"] == "min_tokens"


def _admit_once(joining):
    sent = []

    def admit(free, next_lane):
        if sent:
            return []
        sent.append(1)
        return [joining]
    return admit


def test_min_tokens_passes_stop_strings_before_it(stories):
    kw = dict(model=stories.model, prompt=ONCE, temperature=0, max_tokens=40, stop=["Lily"])
    early = stories.client.completions.create(**kw)
    assert early.usage.completion_tokens <= 10
    r = stories.client.completions.create(**kw, extra_body={"min_tokens": 12})
    whole = stories.client.completions.create(model=stories.model, prompt=ONCE, temperature=0, max_tokens=40)
    assert r.usage.completion_tokens >= 12 and r.choices[0].text.startswith(early.choices[0].text + "Lily")
    assert whole.choices[0].text.startswith(r.choices[0].text)


def test_include_stop_str_in_output_keeps_the_stop_string_whole_and_streamed(stories):
    kw = dict(model=stories.model, prompt=ONCE, max_tokens=30, temperature=0, stop=["Lily", "zzz"],
              extra_body={"include_stop_str_in_output": True})
    r = stories.client.completions.create(**kw)
    assert r.choices[0].text == ", there was a little girl named Lily" and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in stories.client.completions.create(stream=True, **kw))
    assert streamed == r.choices[0].text


def test_continue_final_message_carries_the_assistants_text_on(demo):
    msgs = DOG + [{"role": "assistant", "content": "Max is a big"}]
    r = chat(demo, messages=msgs, temperature=0, max_tokens=12,
             extra_body={"continue_final_message": True, "add_generation_prompt": False})
    ids = render_chat(demo.direct.chat_format, DOG, continue_reply="Max is a big")
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == demo.alone(ids, SamplingParams(temperature=0, max_new_tokens=12)).text
    err = fails(demo, "/chat/completions", {"messages": DOG, "continue_final_message": True})
    assert err["param"] in ("continue_final_message", "messages")


def test_add_generation_prompt_false_leaves_the_assistant_header_out(demo):
    r = chat(demo, temperature=0, max_tokens=4, extra_body={"add_generation_prompt": False})
    assert r.usage.prompt_tokens == len(demo.direct.chat_format.encode_dialog(DOG, add_generation_prompt=False))
    assert r.usage.prompt_tokens < len(chat_ids(demo, DOG))


def test_a_list_of_prompts_is_batched_with_choices_indexed_as_openai_does(stories):
    prompts = [ONCE, "The cat", "Lily and Tom"]
    r = stories.client.completions.create(model=stories.model, prompt=prompts, max_tokens=6, n=2, temperature=1.0,
                                          seed=11, extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == list(range(6))
    for c in r.choices:  # prompt i, choice j is index i * n + j, drawn from seed + j as a lone request's
        i, j = divmod(c.index, 2)
        ids = stories.direct.tokenizer.encode(prompts[i], bos=True)
        want = stories.alone(ids, SamplingParams(temperature=1.0, top_p=1.0, seed=11 + j, max_new_tokens=6))
        assert c.text == want.text and c.model_extra["prompt_token_ids"] == ids
    lengths = [len(stories.direct.tokenizer.encode(p, bos=True)) for p in prompts]
    assert r.usage.prompt_tokens == sum(lengths) and r.usage.completion_tokens == 36
    streamed = {}
    for chunk in stories.client.completions.create(model=stories.model, prompt=prompts, max_tokens=6, n=2,
                                                   temperature=1.0, seed=11, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in r.choices}


def test_token_list_prompts_batch_too_and_too_many_prompts_are_refused(stories):
    ids = [stories.direct.tokenizer.encode(p, bos=True) for p in (ONCE, "The cat")]
    r = stories.client.completions.create(model=stories.model, prompt=ids, max_tokens=4, temperature=0)
    assert [c.text for c in r.choices] == [stories.alone(i, SamplingParams(temperature=0, max_new_tokens=4)).text
                                           for i in ids]
    err = fails(stories, "/completions", {"prompt": ["x"] * 65, "max_tokens": 1})
    assert err["param"] == "prompt" and "at most" in err["message"]
