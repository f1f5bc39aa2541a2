"""UI responsiveness while the worker generates: event-loop stalls and token latency.

A 10 ms QTimer runs on the UI thread (qasync loop, offscreen) while the worker streams
from a random ~35M-parameter Llama built in-process (so generation runs at full speed)
through the real Bridge. Printed for each torch thread count:

* stall: gaps between timer ticks beyond their 10 ms period — max and 99th percentile —
  while idle, while a model loads (Meta folder, memory-mapped), and while generating;
* token → UI: delay from a token's creation on the worker thread to its arrival in the
  UI coroutine that iterates ``bridge.generate`` (coalescing included);
* decode speed, and chunks delivered per second (at most one a frame).

Each thread count runs in its own process (torch's thread pool is process-wide).

    python bench/bench_responsiveness.py [--threads 1 2] [--seconds 6] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = dict(dim=384, n_layers=6, n_heads=6, n_kv_heads=2, vocab_size=32000, hidden_dim=1024,
             max_seq_len=4096)
TICK_MS = 10


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def child(threads: int, seconds: float) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import asyncio

    import qasync
    import torch
    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from core.chat_format import chat_format_for
    from core.checkpoints.common import LoadedModel
    from core.checkpoints.meta import save_meta
    from core.model import ModelArgs, Transformer
    from core.sampling import SamplingParams
    from core.tokenizer import load_tokenizer
    from core.worker import GenerateRequest, TokenDelta, Worker
    from gui.bridge import Bridge, Chunk, Done

    fixtures = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
    tok_file = fixtures / "llama2-tokenizer.model"
    torch.manual_seed(0)
    args = ModelArgs(**MODEL)
    model = Transformer(args).eval().requires_grad_(False)
    tok = load_tokenizer(tok_file)
    fmt = chat_format_for(tok)
    loaded = LoadedModel(model, tok, fmt, args, set(tok.stop_ids) - {tok.eos_id},  # never stop early
                         {"name": "random", "context_length": args.max_seq_len})
    tmp = tempfile.TemporaryDirectory()
    folder = save_meta(loaded, Path(tmp.name) / "random", tokenizer_file=tok_file)
    params = sum(p.numel() for p in model.parameters())

    app = QApplication.instance() or QApplication([])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    created: dict[tuple[int, int, int], float] = {}

    def factory(on_event):
        def stamped(ev):
            if isinstance(ev, TokenDelta):
                created[(ev.request_id, ev.lane, ev.index)] = time.perf_counter()
            on_event(ev)
        return Worker(stamped, torch_threads=threads)

    bridge = Bridge(worker_factory=factory)
    ticks: list[float] = []
    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start(TICK_MS)

    def gaps(t0: float, t1: float) -> list[float]:
        ts = [t for t in ticks if t0 <= t <= t1]
        return [(b - a) * 1000 for a, b in zip(ts, ts[1:])]

    async def scenario() -> dict:
        t0 = time.perf_counter()
        await asyncio.sleep(1.0)
        idle = gaps(t0, time.perf_counter())
        t0 = time.perf_counter()
        await bridge.load(folder)
        load_s = time.perf_counter() - t0
        load_gaps = gaps(t0, time.perf_counter())
        bridge.worker.adopt(loaded)  # the same model, with stop ids that never end early
        while bridge.model_info is None or bridge.model_info.get("name") != "random":
            await asyncio.sleep(0.01)
        req = GenerateRequest(mode="completion", prompt="Once upon a time",
                              params=SamplingParams(temperature=0.8, seed=1, max_new_tokens=100000))
        delays, chunks, tokens = [], 0, 0
        t_start = time.perf_counter()
        t_first = None
        done = None
        async for ev in bridge.generate(req):
            now = time.perf_counter()
            if isinstance(ev, Chunk):
                chunks += 1
                t_first = t_first or now
                for t in ev.tokens:
                    delays.append((now - created.pop((t.request_id, t.lane, t.index))) * 1000)
                tokens += len(ev.tokens)
                if now - t_start > seconds:
                    bridge.cancel()
            elif isinstance(ev, Done):
                done = ev
        t_end = time.perf_counter()
        gen = gaps(t_first or t_start, t_end)
        await bridge.shutdown()

        def summary(g):
            return {"max_ms": max(g, default=float("nan")), "p99_ms": percentile(g, 99),
                    "p50_ms": percentile(g, 50), "n": len(g)}
        return {
            "threads": threads, "params_M": params / 1e6, "cpus": os.cpu_count(),
            "idle": summary(idle), "load": {**summary(load_gaps), "seconds": load_s}, "generate": summary(gen),
            "token_to_ui_ms": {"p50": percentile(delays, 50), "p99": percentile(delays, 99),
                               "max": max(delays, default=float("nan"))},
            "decode_tok_s": done.stats["decode_tok_s"] if done else float("nan"),
            "tokens": tokens, "chunks_per_s": chunks / max(t_end - (t_first or t_start), 1e-9),
        }

    try:
        result = loop.run_until_complete(scenario())
    finally:
        timer.stop()
        loop.close()
        asyncio.set_event_loop(None)
        tmp.cleanup()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=6.0, help="generation time per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per thread count (interleaved)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.seconds)))
        return
    runs: dict[int, list[dict]] = {n: [] for n in a.threads}
    for _ in range(a.repeats):
        for n in a.threads:
            out = subprocess.run([sys.executable, __file__, "--child", str(n), "--seconds", str(a.seconds)],
                                 capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                sys.exit(f"child with {n} threads failed:\n{out.stderr[-3000:]}")
            runs[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if a.json:
        print(json.dumps(runs))
        return
    first = next(iter(runs.values()))[0]
    print(f"model: random Llama, {first['params_M']:.1f}M params, float32, CPU ({first['cpus']} cores); "
          f"QTimer every {TICK_MS} ms; {a.repeats} run(s) per setting, worst shown")
    print(f"{'threads':>7} | {'decode tok/s':>12} | {'gen gap max/p99 ms':>20} | {'load gap max/p99 ms':>21} | "
          f"{'idle max':>8} | {'token→UI p50/p99/max ms':>23} | {'chunks/s':>8}")
    for n, rs in runs.items():
        w = lambda k, f: max(r[k][f] for r in rs)  # noqa: E731 — worst of the repeats
        tok_s = statistics.median(r["decode_tok_s"] for r in rs)
        print(f"{n:>7} | {tok_s:>12.0f} | {w('generate', 'max_ms'):>9.1f} / {w('generate', 'p99_ms'):>7.1f} | "
              f"{w('load', 'max_ms'):>10.1f} / {w('load', 'p99_ms'):>7.1f} | {w('idle', 'max_ms'):>8.1f} | "
              f"{w('token_to_ui_ms', 'p50'):>6.1f} / {w('token_to_ui_ms', 'p99'):>5.1f} / "
              f"{w('token_to_ui_ms', 'max'):>6.1f} | {statistics.median(r['chunks_per_s'] for r in rs):>8.1f}")
    print("gap = time between ticks of a 10 ms timer (10 = no stall); goal: max gap ≤ 50 ms while generating")


if __name__ == "__main__":
    main()
