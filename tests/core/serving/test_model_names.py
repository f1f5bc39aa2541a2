"""A server's model names (issue 23, item 6): --model-name with aliases, and
--any-model-name answering whatever model a request names, as llama.cpp's server and LM
Studio do; real HTTP requests with the official ``openai`` client."""
import pytest

openai = pytest.importorskip("openai")

from tests.core.serving.served import Served  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def named(fixtures):
    s = Served(fixtures / "stories260K.gguf", model_id="tiny-stories", aliases=("stories", "gpt-4o-mini"),
               any_model=True)
    yield s
    s.server.stop()


def test_every_alias_is_listed_and_answered_and_replies_say_the_first_name(named):
    assert [m.id for m in named.client.models.list().data] == ["tiny-stories", "stories", "gpt-4o-mini"]
    assert named.client.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"
    for name in ("stories", "gpt-4o-mini", "whatever-the-client-was-written-for"):
        r = named.client.completions.create(model=name, prompt="Once upon a time", max_tokens=4, temperature=0)
        assert r.model == "tiny-stories" and r.choices[0].text.startswith(", there was")


def test_without_any_model_name_another_name_is_a_404_naming_the_served_one(stories):
    with pytest.raises(openai.NotFoundError) as e:
        stories.client.completions.create(model="gpt-4o-mini", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and "stories260K" in e.value.body["message"]
