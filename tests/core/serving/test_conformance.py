"""Where the server used to differ from what OpenAI, vLLM and llama.cpp clients expect:
stop_reason, 503's Retry-After, /health and /metrics, logit_bias that bans everything,
tools (refused, naming the field), llama.cpp's paths without /v1 and n_predict."""
import httpx
import pytest

openai = pytest.importorskip("openai")

from core.checkpoints import load  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402
from tests.core.serving.served import KEY  # noqa: E402

pytestmark = pytest.mark.timeout(120)
AUTH = {"Authorization": f"Bearer {KEY}"}


def root(url: str) -> str:
    return url[: -len("/v1")]


def test_stop_reason_names_a_requested_stop_token_id(stories):
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    plain = stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=8))
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                          extra_body={"stop_token_ids": [plain.tokens[3]]})
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == plain.tokens[3]
    assert r.usage.completion_tokens == 3 and c.text == stories.direct.tokenizer.decode(plain.tokens[:3])


def test_a_full_queue_is_503_with_retry_after(fixtures):
    state = ServerState(load(fixtures / "stories260K.gguf", device="cpu", dtype="float32"), max_queue=0)
    with RunningServer(state) as srv:
        r = httpx.post(srv.url + "/completions", json={"prompt": "Once", "max_tokens": 1})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"


def test_health_answers_without_a_key_at_both_paths(stories):
    for path in ("/health", "/v1/health"):
        r = httpx.get(root(stories.url) + path)
        assert r.status_code == 200 and r.json() == {"status": "ok"}


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_metrics_count_requests_tokens_and_latencies(stories):
    before = httpx.get(root(stories.url) + "/metrics").text
    r = stories.client.completions.create(model=stories.model, prompt="Once upon a time", max_tokens=6, temperature=0)
    with pytest.raises(openai.BadRequestError):
        stories.client.completions.create(model=stories.model, prompt="Once", max_tokens=1, temperature=-1)
    m = httpx.get(root(stories.url) + "/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = m.text
    ok, bad = 'llamadesk_requests_total{endpoint="completions",status="200"}', \
        'llamadesk_requests_total{endpoint="completions",status="400"}'
    assert metric(after, ok) - metric(before, ok) >= 1 and metric(after, bad) - metric(before, bad) >= 1
    assert metric(after, "llamadesk_generation_tokens_total") - metric(before, "llamadesk_generation_tokens_total") \
        >= r.usage.completion_tokens == 6
    ttft = "llamadesk_time_to_first_token_seconds_count"
    per_token = "llamadesk_time_per_output_token_seconds_count"
    assert metric(after, ttft) - metric(before, ttft) >= 1 and metric(after, per_token) - metric(before, per_token) >= 5
    assert "# TYPE llamadesk_queue_depth gauge" in after and "llamadesk_batch_size " in after
    assert 'llamadesk_time_to_first_token_seconds_bucket{le="+Inf"}' in after


def test_a_logit_bias_that_bans_every_token_is_400(stories):
    every = {str(i): "-inf" for i in range(512)}
    r = httpx.post(stories.url + "/completions", headers=AUTH,
                   json={"prompt": "Once", "max_tokens": 2, "logit_bias": every})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias" and "bans all 512" in r.text
    del every["7"]  # one token left: that one is the reply
    r = httpx.post(stories.url + "/completions", headers=AUTH,
                   json={"prompt": "Once", "max_tokens": 2, "logit_bias": every, "return_token_ids": True})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [7, 7]


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("extra, param, needle", [
    ({"tools": [TOOL, {"type": "web_search"}]}, "tools", "only function tools"),
    ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "weather"}}}, "tool_choice", "needs tools"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "parallel_tool_calls"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": 5}}]}]},
     "messages", "messages[1].tool_calls[0]"),
    ({"messages": [{"role": "tool", "content": "sunny"}]}, "messages", "messages[0]: a tool message needs"),
    ({"messages": [{"role": "function", "name": "f", "content": "sunny"}]}, "messages", "send a 'tool' message"),
])
def test_bad_tools_and_tool_messages_are_400_naming_the_field(demo, extra, param, needle):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    r = httpx.post(demo.url + "/chat/completions", headers=AUTH, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_llama_cpp_paths_without_v1_and_n_predict(stories):
    base = root(stories.url)
    assert httpx.get(base + "/models", headers=AUTH).json()["data"][0]["id"] == "stories260K"
    r = httpx.post(base + "/completions", headers=AUTH, json={"prompt": "Once upon a time", "n_predict": 24,
                                                                "temperature": 0})
    c = r.json()["choices"][0]
    assert r.status_code == 200 and c["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 24
    ids = stories.direct.tokenizer.encode("Once upon a time", bos=True)
    assert c["text"] == stories.alone(ids, SamplingParams(temperature=0, max_new_tokens=24)).text
    chat = httpx.post(base + "/chat/completions", headers=AUTH,
                      json={"messages": [{"role": "user", "content": "Once"}], "max_tokens": 3})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    bad = httpx.post(base + "/completions", headers=AUTH, json={"prompt": "Once", "n_predict": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_predict"
