"""The seed's API shape: LLaMA.build + batched text_completion / chat_completion."""
import pytest

from core.errors import SettingsError
from core.llama import LLaMA


@pytest.fixture(scope="module")
def story(fixtures):
    return LLaMA.build(fixtures / "stories260K.gguf", max_seq_len=256, max_batch_size=4, device="cpu",
                       dtype="float32")


def test_text_completion_batch_matches_each_prompt_alone(story):
    prompts = ["Once upon a time", "The dog", "Lily and Ben went to the park. They"]
    tokens, texts = story.text_completion(prompts, temperature=0, max_gen_len=20)
    assert texts[0].startswith(", there was a little girl named Lily")
    for p, toks, text in zip(prompts, tokens, texts):
        alone_t, alone = story.text_completion([p], temperature=0, max_gen_len=20)
        assert alone_t[0] == toks and alone[0] == text
        assert len(toks) <= 20


def test_sampled_completion_is_reproducible_with_a_seed(story):
    a = story.text_completion(["Once upon a time"], temperature=0.9, top_p=0.9, max_gen_len=30, seed=5)
    b = story.text_completion(["Once upon a time"], temperature=0.9, top_p=0.9, max_gen_len=30, seed=5)
    assert a == b


def test_batch_size_is_enforced(story):
    with pytest.raises(SettingsError, match="max_batch_size"):
        story.text_completion(["a"] * 5)


def test_max_seq_len_caps_the_context(story):
    assert story.engine.max_context == 256
