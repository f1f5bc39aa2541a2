"""core/serving/protocol.py without a server: each request field parsed, or refused with a
400 (or 404) naming it."""
import pytest

from core.serving.protocol import (APIError, chat_logprobs, check_context, constraint_from_request, parse_body,
                                   sampling_from_request, sampling_fields, speculation_from_request, stream_options,
                                   token_ids)


def refused(fn, *args, **kw) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args, **kw)
    return e.value


def test_the_body_must_be_a_json_object_naming_this_model():
    assert parse_body(b'{"model": "m", "n": 2}', "m") == {"model": "m", "n": 2}
    assert parse_body(b'{}', "m") == {}
    assert refused(parse_body, b'{"messages": [', "m").status == 400
    assert "JSON object" in str(refused(parse_body, b'[1, 2]', "m"))
    other = refused(parse_body, b'{"model": "other"}', "m")
    assert (other.status, other.param, other.code) == (404, "model", "model_not_found")


def test_sampling_fields_take_openai_and_vllm_spellings():
    fields, key = sampling_fields({"top_k": -1, "stop": "\n", "max_completion_tokens": 7, "max_tokens": 99}, 16)
    assert fields["top_k"] == 0 and fields["stop"] == ("\n",) and fields["max_new_tokens"] == 7
    assert key == "max_completion_tokens"
    fields, key = sampling_fields({}, 16)
    assert key == "max_tokens" and fields["max_new_tokens"] == 16 and fields["temperature"] == 1.0
    for body, param in (({"temperature": "hot"}, "temperature"), ({"top_k": 1.5}, "top_k"),
                        ({"seed": True}, "seed"), ({"stop": [1]}, "stop"), ({"top_p": float("nan")}, "top_p")):
        assert refused(sampling_fields, body, 16).param == param


def test_n_choices_draw_from_consecutive_seeds_and_bad_ranges_name_the_field():
    lanes = sampling_from_request({"n": 3, "seed": 10, "temperature": 0.5}, default_max_tokens=4)
    assert [q.seed for q in lanes] == [10, 11, 12] and all(q.temperature == 0.5 for q in lanes)
    assert refused(sampling_from_request, {"n": 0}, default_max_tokens=4).param == "n"
    e = refused(sampling_from_request, {"max_tokens": 0}, default_max_tokens=4)
    assert e.param == "max_tokens" and "max_tokens" in str(e)
    assert refused(sampling_from_request, {"presence_penalty": 0.5}, default_max_tokens=4).param == "presence_penalty"
    assert sampling_from_request({"presence_penalty": 0}, default_max_tokens=4)  # the no-op value is taken


def test_speculation_fields_over_the_servers_defaults():
    assert speculation_from_request({}, lookup=3) == (3, "")
    assert speculation_from_request({}, draft="small") == (0, "small")
    assert speculation_from_request({"lookup": 2}, draft="small") == (2, "")  # one kind on turns the other off
    assert speculation_from_request({"draft": True}, lookup=3, draft="small") == (0, "small")
    assert speculation_from_request({"draft": False}, draft="small") == (0, "")
    assert refused(speculation_from_request, {"draft": True}).param == "draft"  # no draft model here
    assert refused(speculation_from_request, {"draft": "other"}, draft="small").param == "draft"
    assert refused(speculation_from_request, {"lookup": 2, "draft": True}, draft="small").param == "draft"
    assert refused(speculation_from_request, {"lookup": 99}).param == "lookup"


def test_token_id_lists_hold_whole_numbers_of_the_vocabulary():
    assert token_ids({}, "forced_tokens", 10, most=4) == []
    assert token_ids({"forced_tokens": [1, 9]}, "forced_tokens", 10, most=4) == [1, 9]
    for bad in ([10], [True], [-1], [1, 2, 3, 4, 5], "1"):
        assert refused(token_ids, {"forced_tokens": bad}, "forced_tokens", 10, most=4).param == "forced_tokens"


def test_the_context_limit_names_what_to_shorten():
    check_context(10, 5, 16, what="the prompt")
    e = refused(check_context, 20, None, 16, what="the messages")
    assert (e.param, e.code) == ("messages", "context_length_exceeded") and "16 tokens" in str(e)
    e = refused(check_context, 10, 10, 16, what="the prompt")
    assert e.param == "max_tokens" and "come to 20" in str(e)


def test_one_constraint_at_most_and_logprob_fields_agree():
    assert constraint_from_request({}) == (None, None)
    assert constraint_from_request({"response_format": {"type": "text"}}) == (None, None)
    assert constraint_from_request({"regex": "[ab]+"})[1] == "regex"
    assert refused(constraint_from_request, {"regex": "a", "grammar": "root ::= \"a\""}).param == "grammar"
    assert refused(constraint_from_request, {"response_format": {"type": "xml"}}).param == "response_format"
    assert chat_logprobs({}) is None and chat_logprobs({"logprobs": True}) == 0
    assert chat_logprobs({"logprobs": True, "top_logprobs": 3}) == 3
    assert refused(chat_logprobs, {"top_logprobs": 3}).param == "top_logprobs"
    assert refused(chat_logprobs, {"logprobs": True, "top_logprobs": 21}).param == "top_logprobs"


def test_stream_options():
    assert stream_options({}) == (False, False)
    assert stream_options({"stream": True, "stream_options": {"include_usage": True}}) == (True, True)
    assert refused(stream_options, {"stream": "yes"}).param == "stream"
    assert stream_options({"stream_options": None}) == (False, False)
    assert refused(stream_options, {"stream_options": 3}).param == "stream_options"
