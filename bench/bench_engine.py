"""Prefill and decode speed of LlamaDesk's engine against transformers, in one run.

Both run the same random ~100M-parameter Llama in float32 on this machine's CPU, so the
printed ratios compare implementations, not machines. Also compares the seed's
token-by-token prefill with one batched prefill for a 512-token prompt.

    python bench/bench_engine.py [--threads N] [--decode-tokens 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.kv_cache import KVCache  # noqa: E402
from tests.helpers import meta_from_hf  # noqa: E402

CONFIG = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
              num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


@torch.inference_mode()
def ours_prefill(model, ids):
    cache = KVCache.for_model(model, capacity=ids.shape[1] + 1)
    return model(ids, 0, cache, last_only=True)


@torch.inference_mode()
def ours_decode(model, ids, n):
    cache = KVCache.for_model(model, capacity=ids.shape[1] + n)
    logits = model(ids, 0, cache, last_only=True)[:, -1]
    pos = ids.shape[1]
    for _ in range(n):
        tok = logits.argmax(-1, keepdim=True)
        logits = model(tok, pos, cache)[:, -1]
        pos += 1


@torch.inference_mode()
def seed_prefill(model, ids):
    """The seed's method: every prompt token is its own forward pass."""
    cache = KVCache.for_model(model, capacity=ids.shape[1] + 1)
    for i in range(ids.shape[1]):
        model(ids[:, i:i + 1], i, cache)


@torch.inference_mode()
def hf_prefill(hf, ids):
    return hf(ids, use_cache=True, logits_to_keep=1)


@torch.inference_mode()
def hf_decode(hf, ids, n):
    from transformers import DynamicCache
    cache = DynamicCache()
    out = hf(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    for _ in range(n):
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        out = hf(tok, past_key_values=out.past_key_values, use_cache=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    ours = meta_from_hf(hf)
    n_params = sum(p.numel() for p in ours.parameters())
    ids = torch.randint(0, CONFIG["vocab_size"], (1, a.prompt_tokens), generator=torch.Generator().manual_seed(1))
    short = ids[:, :16]
    print(f"model: {n_params / 1e6:.0f}M params, float32, {a.threads} threads, torch {torch.__version__}")

    # Warm up both (first calls allocate and pick kernels).
    ours_prefill(ours, short), hf_prefill(hf, short)

    rows = []
    o_pf, _ = best(lambda: ours_prefill(ours, ids), a.repeats)
    h_pf, _ = best(lambda: hf_prefill(hf, ids), a.repeats)
    rows.append(("prefill tok/s", a.prompt_tokens / o_pf, a.prompt_tokens / h_pf))
    o_dec, _ = best(lambda: ours_decode(ours, short, a.decode_tokens), a.repeats)
    h_dec, _ = best(lambda: hf_decode(hf, short, a.decode_tokens), a.repeats)
    o_pf_s, _ = best(lambda: ours_prefill(ours, short), a.repeats)
    h_pf_s, _ = best(lambda: hf_prefill(hf, short), a.repeats)
    rows.append(("decode tok/s", a.decode_tokens / (o_dec - o_pf_s), a.decode_tokens / (h_dec - h_pf_s)))
    print(f"{'':16}{'LlamaDesk':>12}{'transformers':>14}{'ratio':>8}")
    for name, o, h in rows:
        print(f"{name:16}{o:12.1f}{h:14.1f}{o / h:8.2f}x")

    # The CPU default dtype is chosen from this: float32 vs bfloat16 for our engine.
    bf = meta_from_hf(hf).to(torch.bfloat16)
    b_pf, _ = best(lambda: ours_prefill(bf, ids), a.repeats)
    b_dec, _ = best(lambda: ours_decode(bf, short, a.decode_tokens), a.repeats)
    b_pf_s, _ = best(lambda: ours_prefill(bf, short), a.repeats)
    print(f"bfloat16 / float32 on this CPU: prefill {(a.prompt_tokens / b_pf) / rows[0][1]:.2f}x, "
          f"decode {(a.decode_tokens / (b_dec - b_pf_s)) / rows[1][1]:.2f}x")

    seed_s, _ = best(lambda: seed_prefill(ours, ids), 1)
    print(f"prefill of {a.prompt_tokens} tokens: token-by-token (seed) {seed_s:.2f} s, batched {o_pf:.3f} s "
          f"-> batched is {seed_s / o_pf:.1f}x faster")


if __name__ == "__main__":
    main()
