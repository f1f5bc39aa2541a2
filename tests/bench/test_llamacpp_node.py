"""The llama.cpp peer through node-llama-cpp reads the fixture model as llama.cpp does:
its greedy continuation is the one the fixtures' README records for llama.cpp."""
import pytest

from bench import llamacpp_node

pytestmark = pytest.mark.skipif(not llamacpp_node.available()[0], reason=llamacpp_node.available()[1])


def test_the_node_peer_continues_the_fixture_story_as_llama_cpp_does(fixtures):
    from core.checkpoints.gguf import load_gguf

    model = fixtures / "stories260K.gguf"
    r = llamacpp_node.measure(model, [1, 403, 407, 261, 378], decode=12, threads=1)
    text = load_gguf(model, device="cpu").tokenizer.decode(r["tokens"])
    assert text.startswith(", there was a little girl named Lily"), text
    assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["load_s"] > 0
    assert r["peak_rss_mb"] >= r["load_rss_mb"] > r["base_rss_mb"] > 0
