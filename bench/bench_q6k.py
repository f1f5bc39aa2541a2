"""Q6_K held compactly: two ways to multiply without a float copy, against the float paths.

One [5632, 2048] weight (an FFN projection of a 2048-wide Llama) quantized to Q6_K, then
multiplied by one row (decode) and by 128 rows (a prefill chunk) four ways:

- ``int4x2 requantized`` (what the loader does, :mod:`core.model.quant`): two 4-bit planes with
  a scale per 32 weights; rounds one sub-block of each pair (see core.model.quant);
- ``per-matmul dequantize``: only the file's blocks are held; every call decodes them
  (exactly, gguf's arithmetic) into bfloat16 in row chunks and multiplies each chunk;
- ``float32`` / ``bfloat16`` dense: the dequantized copy the loader held before.

    python bench/bench_q6k.py [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import median_of  # noqa: E402
from core.model import pack  # noqa: E402

N, K = 5632, 2048
CHUNK = 512  # rows of the weight decoded at a time by the per-matmul path


def per_matmul_dequantize(raw: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T with W [n, k] decoded from Q6_K blocks CHUNK rows at a time (no full copy held)."""
    n, k = raw.shape[0], x.shape[-1]
    xb = x.to(torch.bfloat16)
    out = []
    for i in range(0, n, CHUNK):
        g = pack.decode_blocks(raw[i:i + CHUNK], "Q6_K", min(CHUNK, n - i), k)
        w = (g.q.view(-1, k // 16, 16).to(torch.bfloat16) * g.scale.to(torch.bfloat16).unsqueeze(-1)).view(-1, k)
        out.append(F.linear(xb, w))
    return torch.cat(out, -1).float()


def run(quick: bool = False, threads: int = 1) -> dict:
    from tests.core.checkpoints.util import q6_k_blocks

    n, k = (512, 512) if quick else (N, K)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=g) * 0.02
    blocks = q6_k_blocks(w.numpy())
    raw = torch.from_numpy(blocks.copy()).view(n, -1)
    packed = pack.pack_gguf(raw.reshape(-1), "Q6_K", n, k, torch.device("cpu"))
    exact = pack.decode_blocks(raw, "Q6_K", n, k)
    w32 = (exact.q.view(n, -1, 16).float() * exact.scale.unsqueeze(-1)).view(n, k)
    w16 = w32.bfloat16()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = {}
    reps = 2 if quick else 7
    try:
        for m in (1, 128):
            x = torch.randn(m, k, generator=g)
            with torch.inference_mode():
                cases = {"int4x2 requantized": (lambda: packed(x), sum(b.numel() * b.element_size() for b in packed.buffers())),
                         "per-matmul dequantize": (lambda: per_matmul_dequantize(raw, x), raw.numel()),
                         "float32 dense": (lambda: F.linear(x, w32), w32.numel() * 4),
                         "bfloat16 dense": (lambda: F.linear(x.bfloat16(), w16).float(), w16.numel() * 2)}
                times = {name: [] for name in cases}
                for _ in range(3):  # interleaved rounds
                    for name, (fn, _) in cases.items():
                        times[name].append(median_of(fn, reps))
                err = {name: ((fn() - x @ w32.t()).norm() / (x @ w32.t()).norm()).item() for name, (fn, _) in cases.items()}
            for name, (fn, held) in cases.items():
                rows.setdefault(name, {"held_mb": held / 2 ** 20})[f"{m}_rows_ms"] = sorted(times[name])[1] * 1e3
                rows[name][f"{m}_rows_rel_error"] = err[name]
    finally:
        torch.set_num_threads(before)
    file_mb = raw.numel() / 2 ** 20
    base = rows["float32 dense"]
    md = [f"One [{n}, {k}] weight in Q6_K ({file_mb:.1f} MB of blocks), {threads} thread(s); median of {reps} "
          "calls, middle of 3 interleaved rounds; error = relative Frobenius error of the product against "
          "the exact dequantized weight in float32.", "",
          "| path | held MB | 1 row ms | × float32 | 128 rows ms | × float32 | error (1 row) |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        md.append(f"| {name} | {r['held_mb']:.1f} | {r['1_rows_ms']:.2f} | {base['1_rows_ms'] / r['1_rows_ms']:.2f}× | "
                  f"{r['128_rows_ms']:.1f} | {base['128_rows_ms'] / r['128_rows_ms']:.2f}× | {r['1_rows_rel_error']:.1e} |")
    return {"title": "Q6_K: requantized planes vs per-matmul dequantization", "markdown": "\n".join(md),
            "data": {"shape": [n, k], "file_mb": file_mb, "threads": threads, "rows": rows}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    res = run(a.quick, a.threads)
    print(f"## {res['title']}\n\n{res['markdown']}")
