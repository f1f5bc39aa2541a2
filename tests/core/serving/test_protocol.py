"""What the server refuses, and how: OpenAI's error objects with the status and the field
named (a wrong key, malformed JSON, an invalid setting, an unknown model, a prompt past
the context)."""
import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.core.serving.served import KEY, chat_ids  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_wrong_or_missing_key_is_401(stories):
    bad = openai.OpenAI(base_url=stories.url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=stories.model, prompt="Once", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    r = httpx.get(stories.url + "/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"


def test_malformed_json_is_400_with_an_error_object(stories):
    r = httpx.post(stories.url + "/chat/completions", content=b'{"messages": [', headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "not valid JSON" in err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("kw, param", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(extra_body={"top_k": "many"}), "top_k"),
    (dict(extra_body={"min_p": 1.0}), "min_p"),
    (dict(stop=[""]), "stop"),
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(logprobs=50), "logprobs"),
    (dict(logit_bias={"7": 101}), "logit_bias"),
    (dict(logit_bias={"9999": 1}), "logit_bias"),
    (dict(logit_bias={"the": 1}), "logit_bias"),
    (dict(prompt=["one", ["two"]]), "prompt"),  # a list of prompts is of one kind
])
def test_an_invalid_setting_is_400_naming_it(stories, kw, param):
    kw = {"prompt": "Once", "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        stories.client.completions.create(model=stories.model, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert param.split("_")[0] in e.value.body["message"]


def test_unknown_model_is_404(stories):
    with pytest.raises(openai.NotFoundError) as e:
        stories.client.completions.create(model="gpt-7", prompt="Once", max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and "gpt-7" in e.value.body["message"]


def test_a_chat_that_outgrows_the_context_is_400_naming_the_limit(demo):
    context = demo.state.engine.max_context  # 512
    # Nothing is dropped to make it fit: the client is told, with OpenAI's error code.
    long = [{"role": "user", "content": "Tell me a story about a dog. " * 5}] * 20
    assert len(chat_ids(demo, long)) > context
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.model, messages=long, max_tokens=8)
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "messages"
    assert f"{context} tokens" in body["message"] and str(len(chat_ids(demo, long))) in body["message"]
    # The messages fit, but not with the reply asked for.
    short = [{"role": "user", "content": "Tell me a story about a cat."}]
    n = len(chat_ids(demo, short))
    with pytest.raises(openai.BadRequestError) as e:
        demo.client.chat.completions.create(model=demo.model, messages=short, max_tokens=context - n + 1)
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "max_tokens"
    assert f"{context} tokens" in body["message"] and str(context + 1) in body["message"]
    # Exactly full is allowed, and so is no max_tokens at all (the rest of the context).
    r = demo.client.chat.completions.create(model=demo.model, messages=short, max_tokens=context - n, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert demo.client.chat.completions.create(model=demo.model, messages=short, temperature=0).choices[0].message.content
