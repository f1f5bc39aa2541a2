"""GGUF loading: the real stories260K model, and GGUF files written here from random models."""
import torch

from core.checkpoints import load
from tests.core.checkpoints.util import PROMPT
from tests.helpers import greedy


def test_stories260k_continues_like_llama_cpp(fixtures):
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    assert lm.tokenizer.encode("Once upon a time", bos=True) == PROMPT
    assert (lm.args.dim, lm.args.n_layers, lm.args.n_heads, lm.args.n_kv_heads) == (64, 5, 8, 4)
    assert lm.args.norm_eps == 1e-5 and lm.args.rope_theta == 10000.0
    ids, _ = greedy(lm.model, PROMPT, 16)
    text = lm.tokenizer.decode(ids)
    assert text.startswith(", there was a little girl named Lily. She loved to play"), text
    assert lm.info["format"] == "gguf"
    assert lm.info["tensor_types"] == ["F32"] and lm.info["dequantized"] is False
    assert lm.info["chat_format"] == "raw" and lm.info["chat_template_source"] is None
    assert lm.tokenizer.eos_id in lm.stop_ids


# --------------------------------------------------------------------------- written here

import dataclasses  # noqa: E402

import gguf  # noqa: E402

import pytest  # noqa: E402

from tests.core.checkpoints.util import (LLAMA3_TEMPLATE, hf_greedy, random_model, reference_model,  # noqa: E402
                                         write_gguf, write_llama3_gguf)
from core.errors import CheckpointError  # noqa: E402
from core.model.args import ModelArgs  # noqa: E402
from tests.helpers import meta_from_hf, tiny_hf  # noqa: E402
from core.checkpoints.gguf import scaling_from_rope_freqs
from core.model.transformer import rope_frequencies

IDS = torch.randint(0, 280, (2, 40), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0"])
def test_types_match_forward_on_dequantized_weights(tmp_path, qtype):
    m = random_model(1)
    f = tmp_path / f"m-{qtype}.gguf"
    held = write_gguf(f, m, qtype=qtype)
    lm = load(f, device="cpu", dtype="float32")
    ref = reference_model(m.args, held)
    with torch.no_grad():
        torch.testing.assert_close(lm.model(IDS), ref(IDS), atol=1e-4, rtol=0)
        # and the file really is a lossy copy for the block types (the test is not vacuous)
        if qtype in ("Q8_0", "Q4_0"):
            assert (lm.model(IDS) - m(IDS)).abs().max() > 1e-3
    assert lm.info["tensor_types"] == sorted({"F32", qtype})
    assert lm.info["dequantized"] is (qtype.startswith("Q"))
    assert lm.tokenizer.kind == "sentencepiece" and lm.tokenizer.vocab_size == 279


def test_k_quants_and_bfloat16_compute(tmp_path):
    m = random_model(2, dim=256, n_heads=4, n_kv_heads=2, hidden_dim=256, n_layers=1)
    qtypes = {n: ("Q6_K" if "feed_forward" in n or n == "output.weight" else "Q4_K")
              for n in m.state_dict()}
    f = tmp_path / "k.gguf"
    held = write_gguf(f, m, qtypes=qtypes)
    lm = load(f, device="cpu", dtype="float32")
    ref = reference_model(m.args, held)
    with torch.no_grad():
        torch.testing.assert_close(lm.model(IDS), ref(IDS), atol=1e-4, rtol=0)
    assert lm.info["tensor_types"] == ["F32", "Q4_K", "Q6_K"] and lm.info["dequantized"] is True
    lb = load(f, device="cpu", dtype="bfloat16")
    assert lb.model.tok_embeddings.weight.dtype == torch.bfloat16
    torch.testing.assert_close(lb.model.layers[0].attention.wq.weight.float(),
                               held["layers.0.attention.wq.weight"], atol=0.02, rtol=0.01)


def test_tied_embeddings_and_head_dim(tmp_path):
    m = random_model(3, tie_word_embeddings=True, head_dim=32)
    f = tmp_path / "tied.gguf"
    held = write_gguf(f, m)
    lm = load(f, device="cpu", dtype="float32")
    assert lm.args.tie_word_embeddings and lm.args.head_dim == 32
    with torch.no_grad():
        torch.testing.assert_close(lm.model(IDS), reference_model(m.args, held)(IDS), atol=1e-5, rtol=0)


def test_rope_freqs_tensor_becomes_llama3_scaling(tmp_path):
    """Llama 3.1 GGUFs carry rope_freqs; non-default constants must survive the round trip."""
    consts = {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
              "original_max_position_embeddings": 32}
    # head_dim 64: three frequencies fall in the blended band, which fixes the constants
    hf = tiny_hf(4, vocab_size=288, hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                 rope_theta=500000.0, max_position_embeddings=1024,
                 rope_scaling={"rope_type": "llama3", **consts})
    ours = meta_from_hf(hf)
    plain = dataclasses.replace(ours.args, rope_scaling=None)
    factors = (rope_frequencies(plain).double() / rope_frequencies(ours.args).double()).numpy()
    unscaled = reference_model(plain, ours.state_dict())
    f = tmp_path / "l31.gguf"
    write_gguf(f, unscaled, rope_freqs=factors,
               extra={"llama.rope.scaling.original_context_length": (32, gguf.GGUFValueType.UINT32)})
    lm = load(f, device="cpu", dtype="float32")
    for k, v in consts.items():
        assert lm.args.rope_scaling[k] == pytest.approx(v, rel=1e-3), k
    prompt = [1] + [3 + (i * 11) % 270 for i in range(80)]
    ref_ids, ref_lp = hf_greedy(hf, prompt, 12)
    got_ids, got_lp = greedy(lm.model, prompt, 12)
    assert got_ids == ref_ids
    torch.testing.assert_close(got_lp, ref_lp, atol=1e-4, rtol=0)


def test_gpt2_vocab_and_llama3_chat_template(tmp_path):
    f = tmp_path / "l3.gguf"
    bos, eos, eot = write_llama3_gguf(f)
    lm = load(f, device="cpu", dtype="float32")
    assert lm.tokenizer.encode("hello world", bos=True)[:2] == [bos, 259]
    assert lm.tokenizer.decode(lm.tokenizer.encode("hello world")) == "hello world"
    assert lm.chat_format.name == "llama3"
    assert {eos, eot} <= lm.stop_ids
    assert lm.info["chat_template_source"] == "gguf" and lm.chat_template == LLAMA3_TEMPLATE


def test_a_gpt2_vocab_is_read_only_under_llama3s_split(tmp_path):
    """tokenizer.ggml.pre names the text splitting llama.cpp uses. Ours rebuilds Llama 3's
    only, so a file naming another is refused in one line instead of giving other ids than
    llama.cpp gives, without a word."""
    for pre in ("llama-bpe", "llama3", "llama-v3"):
        write_llama3_gguf(f := tmp_path / f"{pre}.gguf", pre=pre)
        assert load(f, device="cpu", dtype="float32").tokenizer.encode("hello world")[:2] == [259, 260]  # hello, " w"
    for pre in ("qwen2", "default"):
        write_llama3_gguf(f := tmp_path / f"{pre}.gguf", pre=pre)
        with pytest.raises(CheckpointError) as e:
            load(f, device="cpu", dtype="float32")
        assert f"'{pre}'" in str(e.value) and "llama-bpe" in str(e.value) and "\n" not in str(e.value)


def test_rope_freqs_with_few_blended_entries(tmp_path):
    """head_dim 16 leaves one blended frequency: constants are not unique, frequencies are."""
    for consts in ({"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                    "original_max_position_embeddings": 32},
                   {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}):
        args = ModelArgs(dim=64, n_heads=4, vocab_size=8, rope_theta=500000.0, rope_scaling=consts)
        plain = dataclasses.replace(args, rope_scaling=None)
        factors = (rope_frequencies(plain).double() / rope_frequencies(args).double()).float().numpy()
        got = scaling_from_rope_freqs(factors, plain, None, "x.gguf")
        torch.testing.assert_close(rope_frequencies(dataclasses.replace(args, rope_scaling=got)),
                                   rope_frequencies(args), rtol=1e-4, atol=0)
