"""serve refuses, with a 400 and the figure, a request whose KV cache the machine cannot
hold, and goes on serving (issue 22, item 25)."""
import pytest

from core import limits
from tests.core.engine.test_request_memory import FREE, cache_bytes, huge_context_copy

openai = pytest.importorskip("openai")
from tests.core.serving.served import Served  # noqa: E402  (needs openai)


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    folder, params = huge_context_copy(tmp_path_factory.mktemp("huge") / "demo-10M")
    s = Served(folder)
    yield s, params
    s.server.stop()


def test_a_request_the_memory_cannot_hold_is_400_with_the_figure(huge, monkeypatch):
    s, params = huge
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: FREE)
    prompt = len(s.direct.tokenizer.encode("Once", bos=True))
    with pytest.raises(openai.BadRequestError) as e:
        s.client.completions.create(model=s.model, prompt="Once", max_tokens=9_000_000)
    body = e.value.body
    assert body["param"] == "max_tokens" and f"a request of {prompt + 9_000_000} tokens" in body["message"]
    assert f"needs {limits.human(cache_bytes(params, prompt + 9_000_000))} of memory" in body["message"]
    # A chat with no max_tokens may run to the end of the 10^7-token context: refused too.
    with pytest.raises(openai.BadRequestError) as e:
        s.client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "Hi"}])
    assert "a request of 10000000 tokens" in e.value.body["message"]
    # What fits is served beside it.
    r = s.client.completions.create(model=s.model, prompt="Once", max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 4
