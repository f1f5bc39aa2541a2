"""Compiled decoding on the CPU: eager against ``--compile``, in one run.

Four engines over one small random Llama (Llama 2's 32k vocabulary by default): eager (the cache
grows), eager on the static cache (fixed shapes, whole-capacity attention), inductor with
dynamic shapes (what ``--compile`` does on the CPU) and inductor on the static cache (what
CUDA graphs capture on a GPU, here without graphs). Each compiled engine compiles once
before timing (its ``warmup_s`` is printed); then rounds interleave the four, and the
medians are reported as ratios to eager decode measured in the same rounds.

    python bench/bench_compile.py [--tokens 64] [--prompt 128] [--rounds 3] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import engine_run, fixture_tokenizer, random_model  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.model.args import ModelArgs  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402

PATHS = {"eager": dict(), "eager, static cache": dict(static=True),
         "inductor (--compile on CPU)": dict(compile=True), "inductor, static cache": dict(compile=True, static=True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokenizer", default="llama2-tokenizer.model", help="a fixture: its vocabulary sizes the model")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = fixture_tokenizer(a.tokenizer)
    args = ModelArgs(dim=a.dim, n_layers=a.layers, n_heads=8, n_kv_heads=2, vocab_size=tok.vocab_size,
                     hidden_dim=int(a.dim * 3.5) // 64 * 64, max_seq_len=2048, rope_theta=500000.0)
    model = random_model(args)
    g = torch.Generator().manual_seed(0)
    prompt = [int(t) for t in torch.randint(100, tok.vocab_size, (a.prompt,), generator=g)]
    greedy = [SamplingParams(temperature=0, max_new_tokens=a.tokens)]
    engines, tokens = {}, {}
    print(f"model: dim {a.dim}, {a.layers} layers, vocab {tok.vocab_size}; {a.prompt}-token prompt, "
          f"{a.tokens} greedy tokens, {a.threads} thread(s); load average {os.getloadavg()[0]:.1f}", flush=True)
    for name, kw in PATHS.items():
        eng = Engine(model, tok, stop_ids=set(), **kw)
        t0 = time.perf_counter()
        done = engine_run(eng, prompt, greedy)[0]  # compiles where it compiles
        print(f"  {name}: first run {time.perf_counter() - t0:.1f} s (warm-up {done.stats.warmup_s:.1f} s), "
              f"{eng.compile_status}", flush=True)
        engines[name], tokens[name] = eng, done.tokens
    rates: dict[str, list[float]] = {n: [] for n in PATHS}
    for _ in range(a.rounds):
        for name, eng in engines.items():
            eng.cache.reset()
            done = engine_run(eng, prompt, greedy)[0]
            rates[name].append(done.stats.decode_tok_s)
    base = statistics.median(rates["eager"])
    print(f"\n| decode path | tok/s (median of {a.rounds}) | vs eager | greedy tokens equal eager's |")
    print("|---|---|---|---|")
    for name, r in rates.items():
        m = statistics.median(r)
        print(f"| {name} | {m:.1f} | {m / base:.2f}x | {tokens[name] == tokens['eager']} |")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f} (shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
