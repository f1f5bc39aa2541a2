"""Where a span of a reply came from: the attention it paid to each source passage.

For the tokens a reply span holds, the model attended over everything before them while
producing them. Computed after the fact with one pass over prompt + reply: causal attention
means a position's attention never depends on later tokens, so a fresh pass reproduces the
weights the model used while generating (exactly, up to float rounding). The pass runs in
chunks through a KV cache; after each layer, forward hooks on the layer's query and key
projections give the span's query rows, whose softmax(QK^T/sqrt(d)) is taken against the
layer's cached keys a few rows at a time: never T x T, never all layers at once.

The mass a key position receives is summed over layers and heads and averaged over the span's
query rows, so the whole prompt + reply so far gets ``layers * heads``; a passage's share is
its mass over that total, and what no passage got is the "no passage" share.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

from core.errors import SettingsError
from core.model.kv_cache import KVCache
from core.model.transformer import apply_rope

#: query rows whose softmax rows exist at once (memory: heads x QUERY_BLOCK x keys floats)
QUERY_BLOCK = 64
#: prompt + reply tokens per forward pass (the pass's hidden states stay this small)
PASS_CHUNK = 512


class AttributionCancelled(Exception):
    """The caller's cancel event was set; nothing was computed."""


@dataclass
class Attribution:
    """Shares of a span's attention: ``shares[i]`` is passage i's, ``none`` the rest's.

    ``mass`` is the per-key mass (summed over layers and heads, averaged over the span's
    query rows) for every position before the span's last token; ``layers * heads`` in all.
    """
    shares: list[float]
    none: float
    layers: int
    heads: int
    queries: int
    mass: list[float]


def _grab(store: dict, name: str):
    def hook(module, args, output):
        store[name] = output
    return hook


def attention_mass(model, ids: list[int], queries: tuple[int, int], *, cancel: threading.Event | None = None,
                   chunk: int = PASS_CHUNK, block: int = QUERY_BLOCK) -> torch.Tensor:
    """Attention mass [queries[1]] per key position, summed over layers and heads and averaged
    over query rows ``queries`` = [qa, qb) of ``ids`` (the rows whose outputs predicted the
    tokens at qa+1..qb). Only ids[:qb] run: later tokens cannot change these rows."""
    qa, qb = queries
    if not 0 <= qa < qb <= len(ids):
        raise SettingsError(f"query rows {qa}..{qb} are outside the {len(ids)} tokens")
    dev = model.tok_embeddings.weight.device
    args = model.args
    cache = KVCache.for_model(model, batch=1, capacity=qb)
    mass = torch.zeros(qb, dtype=torch.float64, device=dev)
    grabbed: dict = {}
    hooks = [layer.attention.wq.register_forward_hook(_grab(grabbed, "q")) for layer in model.layers]
    try:
        with torch.inference_mode():
            for start in range(0, qb, chunk):
                end = min(qb, start + chunk)
                h = model.tok_embeddings(torch.tensor([ids[start:end]], device=dev))
                rope, mask, pos = model.positions(h, start, cache)
                for i, layer in enumerate(model.layers):
                    if cancel is not None and cancel.is_set():
                        raise AttributionCancelled()
                    h = layer(h, rope, mask, cache, pos)
                    lo, hi = max(qa, start), min(qb, end)
                    if lo < hi:
                        q = grabbed.pop("q").view(1, end - start, args.n_heads, args.head_dim)
                        q = apply_rope(q, rope)[0, lo - start:hi - start].transpose(0, 1)  # [H, s, D]
                        _add_layer_mass(mass, q, cache.k[i][0, :, :hi], lo, block)
                    grabbed.clear()
    finally:
        for hk in hooks:
            hk.remove()
    return mass / (qb - qa)


def _add_layer_mass(mass: torch.Tensor, q: torch.Tensor, k: torch.Tensor, first: int, block: int) -> None:
    """Add one layer's softmax rows, summed over heads and rows, to ``mass``.

    q [H, s, D] are the rows at positions first..first+s-1; k [Hkv, L, D] the cached keys."""
    H, s, D = q.shape
    hkv, L = k.shape[0], k.shape[1]
    kf = k.float().unsqueeze(1)  # [Hkv, 1, L, D]: query heads share their K/V head (GQA)
    scale = 1.0 / math.sqrt(D)
    keys = torch.arange(L, device=k.device)
    for r0 in range(0, s, block):
        qs = q[:, r0:r0 + block].float().reshape(hkv, H // hkv, -1, D)  # [Hkv, rep, b, D]
        scores = (qs @ kf.transpose(-1, -2)) * scale  # [Hkv, rep, b, L]
        rows = torch.arange(first + r0, first + r0 + qs.shape[2], device=k.device)
        scores.masked_fill_(keys.view(1, -1) > rows.view(-1, 1), float("-inf"))
        mass[:L] += scores.softmax(-1).sum(dim=(0, 1, 2)).double()


def attribute(model, ids: list[int], span: tuple[int, int], passages: list[tuple[int, int]], *,
              cancel: threading.Event | None = None, chunk: int = PASS_CHUNK) -> Attribution:
    """Shares of the attention that produced tokens ids[span[0]:span[1]] paid to each passage
    (token ranges [a, b) of ids; overlaps are counted once, for the earlier passage)."""
    a, b = span
    if not 1 <= a < b <= len(ids):
        raise SettingsError(f"the span {a}..{b} is not inside the {len(ids)} tokens after the first")
    mass = attention_mass(model, ids, (a - 1, b - 1), cancel=cancel, chunk=chunk)
    total = model.args.n_layers * model.args.n_heads
    taken = torch.zeros(mass.shape[0], dtype=torch.bool, device=mass.device)
    shares = []
    for pa, pb in passages:
        pa, pb = max(0, pa), min(int(mass.shape[0]), pb)
        if pa >= pb:
            shares.append(0.0)
            continue
        free = ~taken[pa:pb]
        shares.append(float(mass[pa:pb][free].sum()) / total)
        taken[pa:pb] = True
    return Attribution(shares, max(0.0, 1.0 - sum(shares)), model.args.n_layers, model.args.n_heads,
                       b - a, mass.tolist())


__all__ = ["Attribution", "AttributionCancelled", "attention_mass", "attribute", "QUERY_BLOCK", "PASS_CHUNK"]
