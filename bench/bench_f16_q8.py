"""The F16 and Q8_0 kernels (core/model/kernels/csrc/q8_f16.c) against the torch paths they
replace, one weight at a time: milliseconds per product by row count, interleaved rounds,
medians.

- F16: ``ld_mm_f16`` against PyTorch's float16 matrix-vector kernel (``W @ x.T`` on float16
  x, what decode ran: rows beyond one cost one product each) and, for prefill, oneDNN's
  float32 GEMM on the weight widened to float32 (the widening shown apart: a layered prefill
  pays it once per layer per prompt).
- Q8_0: ``ld_mm_q8_0`` on the file's blocks against the two-plane int4 layer
  (``pack.pack_gguf``: torch's int4 kernel run twice) and, for prefill, the dense bfloat16
  GEMM on the weight dequantized once.

``python bench/bench_f16_q8.py [--threads 2] [--rows 1 4 8 16 64] [--shapes 8192x2048 ...]``
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def cases(n: int, k: int, rows: int):
    """{name: callable} for one weight shape and row count."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    from core.model import pack
    from core.model.f16 import dense_linear
    from core.model.kernels import ops

    g = torch.Generator().manual_seed(0)
    w16 = (torch.randn(n, k, generator=g) * 0.02).half()
    raw = torch.from_numpy(quantize(w16.float().numpy(), Q.Q8_0).reshape(-1).view(np.uint8).copy())
    x = torch.randn(rows, k, generator=g)
    xh = x.half()
    wf, int4 = w16.float(), pack.pack_gguf(raw, "Q8_0", n, k, torch.device("cpu"))
    wb, xb = int4.dequantize(torch.bfloat16), x.bfloat16()
    out = {"F16 kernel": lambda: ops.mm("F16", w16.view(torch.uint8), n, k, x),
           "F16 torch widen": lambda: w16.float(),
           "F16 oneDNN fp32 (widened)": lambda: dense_linear(x, wf),
           "Q8_0 kernel": lambda: ops.mm("Q8_0", raw, n, k, x),
           "Q8_0 bf16 GEMM (dequantized)": lambda: F.linear(xb, wb)}
    if rows < 16:
        out["F16 torch f16 gemv per row"] = lambda: [w16 @ r.t() for r in xh.split(1)]
        out["Q8_0 torch int4 two planes"] = lambda: int4(x)
    return out


def run(shapes, rows_list, threads: int, rounds: int) -> list[dict]:
    import torch
    torch.set_num_threads(threads)
    res: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for (n, k) in shapes:
            for rows in rows_list:
                for name, fn in cases(n, k, rows).items():
                    res.setdefault((n, k, rows, name), []).append(timed(fn, 3 if rows >= 64 else 8))
    return [{"shape": f"{n}x{k}", "rows": r, "case": name, "ms": statistics.median(v)}
            for (n, k, r, name), v in res.items()]


def markdown(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["case"] for r in rows))
    keys = list(dict.fromkeys((r["shape"], r["rows"]) for r in rows))
    got = {(r["shape"], r["rows"], r["case"]): r["ms"] for r in rows}
    out = ["| weight | rows | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for shape, n in keys:
        cells = [f"{got[(shape, n, c)]:.2f}" if (shape, n, c) in got else "—" for c in names]
        out.append(f"| {shape} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 64])
    ap.add_argument("--shapes", nargs="+", default=["8192x2048", "2048x8192"])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes]
    print(markdown(run(shapes, a.rows, a.threads, a.rounds)))


if __name__ == "__main__":
    main()
