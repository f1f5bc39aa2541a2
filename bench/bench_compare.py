"""Comparison cost: wall time of N lanes against one lane, in one run.

Decode is memory-bound, so N lanes decoded in one batched forward per step should cost
little more than one. Measures 4 lanes vs 1 lane for 64 new tokens on a random ~100M
model and on the fixture story model.

    python bench/bench_compare.py [--threads N] [--tokens 64] [--lanes 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done
from core.model.transformer import Transformer  # noqa: E402
from core.model.args import ModelArgs
from core.engine.settings import SamplingParams  # noqa: E402


class _NoStopTokenizer:
    """Enough of a tokenizer for timing a random model: no stop ids, bytes of nothing."""
    stop_ids: set = set()
    add_dummy_prefix = False

    def token_bytes(self, i):
        return b"x"


def time_lanes(engine, prompt, n_lanes, tokens, repeats=3):
    lanes = [SamplingParams(temperature=1.0, top_p=0.95, seed=i, max_new_tokens=tokens) for i in range(n_lanes)]
    best = float("inf")
    for _ in range(repeats):
        engine.cache.reset()
        t0 = time.perf_counter()
        done = [e for e in engine.generate_lanes(prompt, lanes) if isinstance(e, Done)]
        best = min(best, time.perf_counter() - t0)
        assert all(len(d.tokens) == tokens for d in done) or any(d.stop_reason == "eos" for d in done)
    return best


@torch.inference_mode()
def decode_step_ms(model, batch, steps=30):
    from core.model.kv_cache import KVCache
    cache = KVCache.for_model(model, batch=batch, capacity=steps + 8)
    x = torch.randint(3, model.args.vocab_size, (batch, 1))
    for i in range(3):
        model(x, i, cache)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        for i in range(steps):
            model(x, 3 + i, cache)
        best = min(best, (time.perf_counter() - t0) / steps * 1000)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--lanes", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"{a.lanes} lanes vs 1 lane, {a.tokens} new tokens, {a.threads} threads")

    torch.manual_seed(0)
    args = ModelArgs(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, vocab_size=32000, hidden_dim=2048,
                     max_seq_len=2048)
    model = Transformer(args).eval().requires_grad_(False)
    eng = Engine(model, _NoStopTokenizer())
    prompt = torch.randint(3, 32000, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    time_lanes(eng, prompt, 1, 4, 1)  # warm-up
    one = time_lanes(eng, prompt, 1, a.tokens)
    many = time_lanes(eng, prompt, a.lanes, a.tokens)
    print(f"random {model.num_parameters() / 1e6:.0f}M: 1 lane {one:.2f} s, {a.lanes} lanes {many:.2f} s "
          f"-> {many / one:.2f}x the time for {a.lanes}x the text")
    # The same, forward passes only (no per-lane sampling): what batching itself costs.
    f1, fn = decode_step_ms(model, 1), decode_step_ms(model, a.lanes)
    print(f"random {model.num_parameters() / 1e6:.0f}M, one decode forward: batch 1 {f1:.1f} ms, "
          f"batch {a.lanes} {fn:.1f} ms -> {fn / f1:.2f}x")

    fixture = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures")) / "stories260K.gguf"
    if fixture.exists():
        from core.checkpoints import load
        lm = load(fixture, device="cpu", dtype="float32")
        eng = Engine(lm.model, lm.tokenizer, stop_ids=set())  # no early stops: equal work per lane
        prompt = lm.tokenizer.encode("Once upon a time", bos=True)
        time_lanes(eng, prompt, 1, 4, 1)
        # A run takes ~0.2 s here, so take the best of more runs to see past scheduler noise.
        one = time_lanes(eng, prompt, 1, a.tokens, repeats=9)
        many = time_lanes(eng, prompt, a.lanes, a.tokens, repeats=9)
        print(f"stories260K: 1 lane {one:.3f} s, {a.lanes} lanes {many:.3f} s -> {many / one:.2f}x")
    else:
        print(f"stories260K: skipped ({fixture} not found)")


if __name__ == "__main__":
    main()
