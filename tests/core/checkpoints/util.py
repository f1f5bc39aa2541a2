"""Shared helpers for checkpoint tests: greedy decoding both ways, tiny tokenizers."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from core.kv_cache import KVCache

LETTERS = "abcdefghijklmnopqrstuvwxyz "


def _cache_kw() -> str:
    import inspect

    from transformers import LlamaForCausalLM
    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


_CACHE_KW = _cache_kw()


def greedy(model, prompt, n):
    """Our greedy ids and log-probs, decoding through a KV cache one token at a time."""
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


def hf_greedy(hf, prompt, n):
    """transformers' greedy ids and log-probs (its own KV cache, no generate() processors)."""
    toks, lps, past = [], [], None
    step = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            # transformers 5.24 renamed past_key_values to cache (the old name still works, warns)
            out = hf(step, use_cache=True, **({} if past is None else {_CACHE_KW: past}))
            past = out.get("cache", None) or out.get("past_key_values", None)
            logits = out.logits[0, -1].float()
            t = int(logits.argmax())
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            toks.append(t)
            step = torch.tensor([[t]])
    return toks, torch.tensor(lps)


def write_tiny_tokenizer(folder: Path, extra_special: tuple[str, ...] = ()) -> int:
    """A 30-token character-level tokenizer.json (<unk>, <s>, </s>, a-z, space); returns its size."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in LETTERS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", *extra_special)])
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size(with_added_tokens=True)


def write_json(file: Path, data) -> None:
    file.write_text(json.dumps(data, indent=2))
