"""How much a quantized (or any non-float32) load of a model changes it.

Perplexity on a fixed held-out text and greedy agreement over 256 tokens, both against
the same checkpoint loaded in float32. ``python -m core info MODEL --dtype int4 --quality``.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from core.checkpoints import load
from core.model.kv_cache import KVCache

#: Written for this check (not from any training set): plain English prose a small story
#: model should find ordinary.
HELD_OUT = (
    "Once upon a time, in a small town by the sea, there lived a girl named Mia. Every morning she "
    "walked to the harbour with her dog, Sam, to watch the fishing boats come home. One day a boat "
    "came back with a torn sail. The old fisherman looked sad, because he could not go out to sea "
    "without it. Mia had an idea. She ran home and asked her mother for the big blue blanket from "
    "her bed. Together they sewed it onto the sail. The next morning the boat went out again, and "
    "everyone in the town could see the blue patch from far away. The fisherman gave Mia the "
    "biggest fish he caught, and that night her family had a happy dinner. Mia smiled and said "
    "that helping is the best way to make a friend."
)
PROMPT = "Once upon a time"


@torch.no_grad()
def perplexity(model, ids: list[int]) -> float:
    """exp(mean next-token cross-entropy) of ``ids`` under ``model`` (one forward pass)."""
    x = torch.tensor([ids])
    logits = model(x[:, :-1])
    nll = torch.nn.functional.cross_entropy(logits[0].float(), x[0, 1:])
    return math.exp(float(nll))


@torch.no_grad()
def greedy_ids(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after ``prompt``, through a KV cache."""
    cache = KVCache.for_model(model, capacity=len(prompt) + n)
    logits = model(torch.tensor([prompt]), 0, cache, last_only=True)[0, -1]
    out, pos = [], len(prompt)
    for _ in range(n):
        t = int(logits.argmax())
        out.append(t)
        logits = model(torch.tensor([[t]]), pos, cache)[0, -1]
        pos += 1
    return out


@torch.no_grad()
def compare(model, reference, tokenizer, *, n: int = 256) -> dict[str, Any]:
    """Quality of ``model`` against ``reference`` (same tokenizer), as a JSON-able dict.

    ``greedy_prefix``: tokens the two free-running greedy decodes share before they first
    differ; ``greedy_agreement``: share of positions where ``model``'s argmax equals the
    reference's along the reference's own greedy continuation (teacher-forced).
    """
    limit = reference.args.max_seq_len
    text_ids = tokenizer.encode(HELD_OUT, bos=True)[:limit]
    prompt = tokenizer.encode(PROMPT, bos=True)
    n = max(1, min(n, limit - len(prompt)))
    ref_ids = greedy_ids(reference, prompt, n)
    got_ids = greedy_ids(model, prompt, n)
    prefix = next((i for i, (a, b) in enumerate(zip(ref_ids, got_ids)) if a != b), n)
    seq = torch.tensor([prompt + ref_ids[:-1]])
    want = reference(seq)[0, len(prompt) - 1:].argmax(-1)
    got = model(seq)[0, len(prompt) - 1:].argmax(-1)
    ppl_ref, ppl = perplexity(reference, text_ids), perplexity(model, text_ids)
    return {
        "held_out_tokens": len(text_ids),
        "perplexity": round(ppl, 4),
        "perplexity_float32": round(ppl_ref, 4),
        "perplexity_ratio": round(ppl / ppl_ref, 4),
        "greedy_tokens": n,
        "greedy_agreement": round(float((want == got).float().mean()), 4),
        "greedy_prefix": prefix,
    }


def quality_report(path, *, dtype: str = "auto", device: str = "cpu", n: int = 256) -> dict[str, Any]:
    """Load ``path`` with ``dtype`` and in float32, and :func:`compare` them."""
    loaded = load(path, device=device, dtype=dtype)
    reference = load(path, device=device, dtype="float32")
    out = compare(loaded.model, reference.model, loaded.tokenizer, n=n)
    out["dtype"] = dtype
    return out
