"""GGUF loading: the real stories260K model, and GGUF files written here from random models."""
import torch

from core.checkpoints import load
from core.kv_cache import KVCache

PROMPT = [1, 403, 407, 261, 378]  # BOS + "Once upon a time"


def greedy(model, prompt, n):
    """Greedy ids and their log-probs, decoding through a KV cache one token at a time."""
    cache = KVCache.for_model(model, capacity=len(prompt) + n)
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), 0, cache, last_only=True)[0, -1]
        toks, lps, pos = [], [], len(prompt)
        for _ in range(n):
            t = int(logits.argmax())
            toks.append(t)
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            logits = model(torch.tensor([[t]]), pos, cache)[0, -1]
            pos += 1
    return toks, torch.tensor(lps)


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
