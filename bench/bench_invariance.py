"""The cost of batch-invariant decoding (docs/SERVING.md): decode tok/s of one forward
step over 1, 4 and 16 rows with the model's batch-invariant step (rows padded to one GEMM
path, attention per row) and with the fast paths (matrix-vector for one row, W @ x.T for a
few, masked attention over the longest row), interleaved in one run on the same weights.
Rows sit at different positions, as requests of a serve batch do.

    python bench/bench_invariance.py [--quick] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.model.args import ModelArgs  # noqa: E402
from core.model.kv_cache import KVCache  # noqa: E402
from core.model.transformer import Transformer  # noqa: E402

ROWS = (1, 4, 16)
PROMPT = 64


def models(quick: bool) -> dict[str, Transformer]:
    out = {}
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    if demo.exists() and not quick:
        from core.checkpoints import load  # start-up time: only when the demo model is there
        out["demo (float32)"] = load(demo, device="cpu", dtype="float32").model
    torch.manual_seed(0)
    dim, layers = (256, 1) if quick else (2048, 8)
    args = ModelArgs(dim=dim, n_layers=layers, n_heads=dim // 64, n_kv_heads=dim // 256, vocab_size=32000,
                     hidden_dim=dim * 11 // 4, max_seq_len=1024)
    out[f"random {dim}-dim, {layers} layers (float32)"] = Transformer(args).eval().requires_grad_(False)
    return out


def step_s(model: Transformer, rows: int, steps: int) -> float:
    """Seconds per decode step over ``rows`` rows at staggered positions."""
    cache = KVCache.for_model(model, batch=rows, capacity=PROMPT + steps + rows)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model(torch.randint(3, model.args.vocab_size, (rows, PROMPT), generator=g), 0, cache)
        pos = torch.arange(rows) % 4 + PROMPT - 4
        x = torch.randint(3, model.args.vocab_size, (rows, 1), generator=g)
        model(x, pos, cache)  # warm-up
        t0 = time.perf_counter()
        for i in range(steps):
            model(x, pos + i, cache, last_only=True)
        return (time.perf_counter() - t0) / steps


def run(quick: bool = False, threads: int | None = None) -> dict:
    steps, repeats = (2, 1) if quick else (24, 3)
    data: dict = {"threads": torch.get_num_threads(), "models": {}}
    lines = [f"Decode tok/s of one forward step (all rows), median of {repeats} interleaved runs of "
             f"{steps} steps, {data['threads']} torch threads.", "",
             "| model | rows | fast paths tok/s | invariant tok/s | invariant / fast |", "|---|---|---|---|---|"]
    for name, model in models(quick).items():
        res = {}
        for rows in ROWS:
            t = {True: [], False: []}
            for _ in range(repeats):
                for inv in (False, True):  # interleaved: drift on a shared machine hits both
                    model.batch_invariant(inv)
                    t[inv].append(step_s(model, rows, steps))
            model.batch_invariant(True)
            fast, inv = rows / statistics.median(t[False]), rows / statistics.median(t[True])
            res[rows] = {"fast_tok_s": fast, "invariant_tok_s": inv}
            lines.append(f"| {name} | {rows} | {fast:.1f} | {inv:.1f} | {inv / fast:.2f} |")
        data["models"][name] = res
    return {"title": "Batch-invariant decode: its cost", "markdown": "\n".join(lines), "data": data}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(run(quick=a.quick)["markdown"])


if __name__ == "__main__":
    main()
