"""Where one decode step's time goes, against the read-bandwidth floor (issue 24).

``python bench/bench_decode_profile.py FILE [--threads N] [--rows 1 4 8]`` loads a model
file as the app does (``dtype=auto``), prefills a short prompt and times decode steps of
1, 4 and 8 rows (comparison lanes), split by what runs: each kind of linear layer (by role,
tensor type, shape and planes), attention, and the rest of the forward (embedding, norms,
RoPE, KV cache, Python). Each part gets the bytes it reads per step, those bytes at the
measured read bandwidth (its floor) and, for packed layers, the int4 kernel's rate in
"kernel weights" per second (a two-plane layer counts twice: that is the kernel's work).

At one thread the clock is this thread's CPU time, which other jobs on a shared machine do
not inflate (the read bandwidth is measured the same way); at more threads it is wall time
and needs a quiet machine. Figures are each part's time in the fastest of ``--steps`` steps.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from core.model.kernels import ops as kernel_ops  # noqa: E402
from core.model.f16 import Float16Linear  # noqa: E402
from core.model.kernels.linear import KernelLinear  # noqa: E402
from core.model.quant import Int4Linear, Int8Linear  # noqa: E402
from core.model.transformer import Linear  # noqa: E402

REST = "rest of the forward (embedding, norms, RoPE, KV cache, Python)"
ATTENTION = "attention (scaled_dot_product_attention or the decode kernel)"
ROLES = {"wq": "q", "wk": "k", "wv": "v", "wo": "o", "w1": "gate", "w3": "up", "w2": "down"}


def clock_for(threads: int):
    """CPU time of this thread at one thread (robust to other load), else wall time."""
    return time.thread_time if threads == 1 else time.perf_counter


def layer_bytes(m: torch.nn.Module) -> int:
    """Bytes a linear layer reads per decode step (its packed or dense weight)."""
    if isinstance(m, Int4Linear):
        return m.packed.numel() * m.packed.element_size() + m.scale_zeros.numel() * m.scale_zeros.element_size()
    if isinstance(m, Int8Linear):
        return m.qweight.numel() + m.scales.numel() * m.scales.element_size()
    if isinstance(m, KernelLinear):
        return m.raw.numel()
    w = m.weight16 if isinstance(m, Float16Linear) else m.weight
    return w.numel() * w.element_size()


def shape_of(m: torch.nn.Module) -> tuple[int, int]:
    """[out, in] of a linear layer, packed or not."""
    return (m.out_features, m.in_features) if hasattr(m, "out_features") else tuple(m.weight.shape)


def part_name(model, name: str, m: torch.nn.Module) -> str:
    """'gate Q4_K 8192x2048', 'output Q6_K 128256x2048 x2 planes', 'q float32 64x64', ..."""
    role = "output" if m is model.output else ROLES.get(name.rsplit(".", 1)[-1], name)
    source = getattr(m, "source", None) or str(m.weight.dtype).replace("torch.", "")
    planes = getattr(m, "planes", 1)
    n, k = shape_of(m)
    return f"{role} {source} {n}x{k}" + (f" x{planes} planes" if planes > 1 else "")


def read_bandwidth(clock, mib: int = 512) -> float:
    """GB/s of the fastest of three sums over a buffer far larger than the caches."""
    buf = torch.ones(mib * (1 << 20) // 4)
    buf.sum()
    best = min(_timed(clock, buf.sum) for _ in range(3))
    return buf.numel() * 4 / best / 1e9


def _timed(clock, fn) -> float:
    t = clock()
    fn()
    return clock() - t


class StepProfile:
    """Forward hooks on the model's linear layers and a wrapper around attention that
    add each part's time per step (see the module docstring for the clock)."""

    def __init__(self, model, clock):
        self.model, self.clock = model, clock
        self.parts: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, int] = defaultdict(int)
        self.kernel_weights: dict[str, int] = defaultdict(int)
        self.handles, self.started = [], {}
        for name, m in model.named_modules():
            if isinstance(m, (Int4Linear, Int8Linear, Float16Linear, KernelLinear, Linear)):
                key = part_name(model, name, m)
                self.bytes[key] += layer_bytes(m)
                n, k = shape_of(m)
                self.kernel_weights[key] += n * k * getattr(m, "planes", 1)
                self.handles.append(m.register_forward_pre_hook(self._pre))
                self.handles.append(m.register_forward_hook(self._post(key)))

    def _pre(self, m, _inp):
        self.started[id(m)] = self.clock()

    def _post(self, key):
        def hook(m, _inp, _out):
            self.parts[key] += self.clock() - self.started[id(m)]
        return hook

    def run(self, step, steps: int) -> tuple[float, dict[str, float]]:
        """(time of the fastest step, its parts) over ``steps`` calls of ``step``."""
        sdpa = F.scaled_dot_product_attention

        def timed_sdpa(*a, **k):
            t = self.clock()
            out = sdpa(*a, **k)
            self.parts[ATTENTION] += self.clock() - t
            return out
        attn_decode = kernel_ops.attn_decode

        def timed_kernel(*a, **k):
            t = self.clock()
            out = attn_decode(*a, **k)
            self.parts[ATTENTION] += self.clock() - t
            return out
        F.scaled_dot_product_attention = timed_sdpa
        # an invariant step on a CPU with the kernels built attends through ld_attn_decode
        kernel_ops.attn_decode = timed_kernel
        try:
            step()  # warm
            best, parts = float("inf"), {}
            for _ in range(steps):
                self.parts.clear()
                took = _timed(self.clock, step)
                if took < best:
                    best, parts = took, dict(self.parts)
        finally:
            F.scaled_dot_product_attention = sdpa
            kernel_ops.attn_decode = attn_decode
        parts[REST] = best - sum(parts.values())
        return best, parts

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def profile(engine, rows: int, steps: int, threads: int) -> dict:
    """One decode step of ``rows`` rows (after a prefilled prompt), split into parts."""
    from core.engine.events import Done
    from core.engine.settings import SamplingParams

    clock = clock_for(threads)
    engine.cache.reset()
    prompt = list(range(100, 164))
    lanes = [SamplingParams(temperature=0.0, max_new_tokens=1, seed=i) for i in range(rows)]
    assert sum(isinstance(e, Done) for e in engine.generate_lanes(prompt, lanes)) == rows
    engine.model.batch_invariant(rows > 1)  # as the engine runs a lone reply and lanes
    x = torch.full((rows, 1), 5, dtype=torch.long)
    prof = StepProfile(engine.model, clock)
    try:
        with torch.inference_mode():
            best, parts = prof.run(lambda: engine.decode(x, len(prompt)), steps)
    finally:
        prof.close()
        engine.model.batch_invariant(True)
    return {"rows": rows, "step_s": best, "parts": parts, "bytes": dict(prof.bytes),
            "kernel_weights": dict(prof.kernel_weights)}


def table(result: dict, bandwidth: float) -> str:
    """A markdown table of one profile: parts by time, with bytes and floors."""
    step, parts = result["step_s"], result["parts"]
    lines = ["| part | ms | share | MB read | floor ms | kernel Gweights/s |", "|---|---|---|---|---|---|"]
    for key, s in sorted(parts.items(), key=lambda kv: -kv[1]):
        mb = result["bytes"].get(key, 0) / 1e6
        kw = result["kernel_weights"].get(key, 0) * result["rows"]
        lines.append(f"| {key} | {s * 1e3:.2f} | {s / step:.1%} | {mb:.0f} | "
                     f"{mb / bandwidth if mb else 0:.2f} | {kw / s / 1e9 if kw and s > 0 else 0:.1f} |")
    total_mb = sum(result["bytes"].values()) / 1e6
    lines.append(f"| **step, {result['rows']} row(s)** | **{step * 1e3:.1f}** | 100% | {total_mb:.0f} | "
                 f"{total_mb / bandwidth:.1f} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)
    from core.checkpoints import load
    from core.engine.engine import Engine

    torch.set_num_threads(args.threads)
    lm = load(args.file, device="cpu", dtype="auto")
    engine = Engine(lm.model, lm.tokenizer, stop_ids=(), threads=(args.threads, args.threads))
    bw = read_bandwidth(clock_for(args.threads))
    print(f"{args.file.name}: {args.threads} thread(s), {'CPU' if args.threads == 1 else 'wall'} time; "
          f"read bandwidth {bw:.1f} GB/s (the floor's rate); paths {lm.info.get('linear_paths')}\n")
    first = None
    for rows in args.rows:
        r = profile(engine, rows, args.steps, args.threads)
        first = first or r["step_s"]
        print(f"{rows} row(s): step {r['step_s'] * 1e3:.1f} ms ({r['step_s'] / first:.2f}x one row)\n")
        print(table(r, bw) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
