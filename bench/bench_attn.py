"""The decode-attention kernel (csrc/attn.c, ``ops.attn_decode``) on serve's shapes: one call
for every row of a decode step, against one ``scaled_dot_product_attention`` per row (the
path without a compiler) and, with ``--base REV``, against the kernel as commit REV wrote it
(built from that commit's csrc/ into a temporary folder), interleaved in one process.

Times are CPU seconds of the calling thread (``time.thread_time``: the shared machine's other
jobs do not count), one torch/OpenMP thread unless ``--threads``; each figure is the median
over rounds of the mean of a batch of calls.

    python bench/bench_attn.py [--base REV] [--rounds N] [--threads N] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.model.kernels import build, ops  # noqa: E402

#: (rows, keys per row, query heads, kv heads, head dim): stories260K's layers at serve's
#: context lengths, then a Llama-shaped layer at 16 rows and at one long row
CASES = [(16, 40, 8, 4, 8), (16, 150, 8, 4, 8), (16, 300, 8, 4, 8), (16, 1000, 8, 4, 8),
         (16, 1000, 32, 8, 64), (1, 2000, 32, 8, 64)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def base_library(rev: str, folder: Path):
    """The kernels as commit ``rev`` wrote them, built into ``folder``."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "core/model/kernels/csrc"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(folder / "src", filter="data")
    saved = build.CSRC
    build.CSRC = folder / "src" / "core" / "model" / "kernels" / "csrc"
    try:
        built = build.build(folder / "lib")
    finally:
        build.CSRC = saved
    if built.path is None:
        raise SystemExit(f"the base kernels do not build: {built.reason}")
    return ops.typed(build.load(built.path))


def inputs(rows, keys, h, hkv, d, dtype):
    g = torch.Generator().manual_seed(0)
    cap = keys + 16  # a cache's spare positions: k and v are strided views, as the model passes them
    k = torch.randn(rows, hkv, cap, d, generator=g).to(dtype)[:, :, :keys]
    v = torch.randn(rows, hkv, cap, d, generator=g).to(dtype)[:, :, :keys]
    q = torch.randn(rows, h, 1, d, generator=g).to(dtype)
    return q, k, v, [keys] * rows


def sdpa_rows(q, k, v, lengths):
    """The step without the kernel: one SDPA per row over its own keys (core/model/transformer.py)."""
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return torch.cat([F.scaled_dot_product_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], **gqa)
                      for b, n in enumerate(lengths)])


def cpu_seconds(fn, budget: float) -> float:
    """Mean CPU seconds of one fn() call over a batch sized to take about ``budget`` seconds."""
    fn()
    t0 = time.thread_time()
    fn()
    one = max(time.thread_time() - t0, 1e-6)
    n = max(1, min(2000, int(budget / one)))
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n


def run(base: str | None, rounds: int, threads: int, quick: bool) -> list[dict]:
    torch.set_num_threads(threads)
    lib = ops.kernels()
    if lib is None:
        raise SystemExit(f"no kernels: {build.reason()}")
    with tempfile.TemporaryDirectory(prefix="bench-attn-") as tmp:
        paths = {"after": lib}
        if base:
            paths["base"] = base_library(base, Path(tmp))
        out = []
        for case in CASES[:2] if quick else CASES:
            for name, dtype in DTYPES.items():
                q, k, v, lengths = inputs(*case, dtype)
                fns = {label: (lambda lb=lb: ops.attn_decode(q, k, v, lengths, lb)) for label, lb in paths.items()}
                fns["sdpa per row"] = lambda: sdpa_rows(q, k, v, lengths)
                got = {label: [] for label in fns}
                for _ in range(rounds):
                    for label, fn in fns.items():
                        got[label].append(cpu_seconds(fn, 0.02 if quick else 0.15))
                row = {"case": case, "dtype": name, **{label: statistics.median(t) for label, t in got.items()}}
                out.append(row)
                print(markdown_row(row, list(fns)), flush=True)
        return out


def markdown_row(row: dict, labels: list[str]) -> str:
    rows, keys, h, hkv, d = row["case"]
    cells = [f"{row[label] * 1e6:.0f}" for label in labels]
    ratio = [f"{row[label] / row['after']:.2f}x" for label in labels if label != "after"]
    return f"| {rows} x {keys} | {h}/{hkv} of {d} | {row['dtype']} | " + " | ".join(cells + ratio) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a commit whose csrc/ to build and compare with (e.g. main)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="two shapes, short batches (plumbing only)")
    a = ap.parse_args()
    labels = ["after", *(["base"] if a.base else []), "sdpa per row"]
    print(f"µs a call (CPU time, {a.threads} thread(s), median of {a.rounds} interleaved rounds); "
          "the ratios are each against after")
    print("| rows x keys | heads/kv heads of d | cache | " + " | ".join(labels)
          + " | " + " | ".join(f"{x} / after" for x in labels[1:]) + " |")
    print("|---" * (3 + 2 * len(labels) - 1) + "|")
    run(a.base, a.rounds, a.threads, a.quick)


if __name__ == "__main__":
    main()
