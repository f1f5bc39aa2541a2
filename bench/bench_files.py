"""The files people download, opened and run by LlamaDesk and llama.cpp side by side.

A Llama-3.2-1B-shaped model (dim 2048, 16 layers, 8 KV heads, 128k vocabulary, tied
embeddings) written as F16, Q8_0 and Q4_K_M with llama.cpp's tensor-type mix (bench_fidelity's
writer). Every case runs in its own process, cases interleaved round by round:

- LlamaDesk, first open: no packed-layer cache (the cache it writes after loading is kept
  for the next case, outside the timings);
- LlamaDesk, second open: the cache the first open wrote;
- llama.cpp: llama-cpp-python, else node-llama-cpp's prebuilt build (bench/peers).

Columns: load, TTFT after open, prefill and decode tok/s (512-token prompt, 64 greedy
tokens), peak RSS and RSS growth, and LlamaDesk's cost of 4 and 8 sampled comparison lanes
against one. Both engines read the file from the page cache after the first round, so load
times are warm-cache times.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import bench_fidelity, bench_quant, llamacpp_node  # noqa: E402

TYPES = ("Q4_K_M", "Q8_0", "F16")
ENGINES = ("llamadesk first open", "llamadesk second open", "llama.cpp")
KEYS = ("load_s", "ttft_after_load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb", "load_rss_growth_mb",
        "run_rss_growth_mb")


def lane_costs(engine, vocab: int, tokens: int, counts=(1, 4, 8)) -> dict:
    """Wall time of ``tokens`` sampled tokens in N lanes over one lane's (short prompt)."""
    from core.engine.events import Done
    from core.engine.settings import SamplingParams

    prompt = bench_quant.prompt_ids(vocab, 16)
    took = {}
    for n in counts:
        lanes = [SamplingParams(temperature=1.0, top_p=0.95, seed=i, max_new_tokens=tokens) for i in range(n)]
        engine.cache.reset()
        t = time.perf_counter()
        done = [e for e in engine.generate_lanes(prompt, lanes) if isinstance(e, Done)]
        took[n] = time.perf_counter() - t
        assert len(done) == n
    return {f"lanes{n}_x": took[n] / took[1] for n in counts if n != 1}


def apply_threads() -> int:
    """Set this process's torch threads from LLAMADESK_THREADS (what ``run_case`` passes):
    the Engine sets no threads of its own, so without this a ``--threads 1`` child ran at
    torch's default (every core) while llama.cpp ran at 1."""
    import torch  # only the child needs it (the parent only starts processes)

    env = os.environ.get("LLAMADESK_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        torch.set_num_threads(int(env))
    return torch.get_num_threads()


def child(file: Path, prompt: int, decode: int, lanes: int) -> dict:
    """One LlamaDesk case (this process): bench_quant's measurements, then the lane costs."""
    apply_threads()
    from core.checkpoints import load, pack_cache
    from core.engine.engine import Engine

    r = bench_quant.measure(file, "auto", prompt, decode)
    if lanes:
        lm = load(file, device="cpu", dtype="auto")  # from the cache or pages just read: not timed
        r.update(lane_costs(Engine(lm.model, lm.tokenizer, stop_ids=()), lm.model.args.vocab_size, lanes))
    pack_cache.flush()  # the first open's cache is written before the process ends (not timed)
    return r


def run_case(file: Path, engine: str, cache_dir: Path, prompt: int, decode: int, threads: int, lanes: int) -> dict:
    if engine == "llama.cpp":
        return bench_quant.measure(file, bench_quant.PEER, prompt, decode, threads)
    env = {**os.environ, "LLAMADESK_DATA_DIR": str(cache_dir), "LLAMADESK_PACK_CACHE": "1",
           "LLAMADESK_THREADS": str(threads)}
    if engine == "llamadesk first open":  # the file's first open: no packed cache
        for p in cache_dir.glob("*"):
            if p.name != "kernels" and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.name != "kernels":
                p.unlink()
    if not (cache_dir / "kernels").is_dir():  # compiled once per machine, not per file: not timed
        subprocess.run([sys.executable, "-c", "from core.model.kernels import ops; ops.kernels()"], cwd=ROOT,
                       env=env, check=False, capture_output=True)
    cmd = [sys.executable, __file__, "--child", str(file), "--prompt", str(prompt), "--decode", str(decode),
           "--lanes", str(lanes if engine == "llamadesk second open" else 0)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr.strip()[-500:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(files: dict[str, Path], work: Path, rounds: int, prompt: int, decode: int, threads: int,
          lanes: int, engines=ENGINES) -> list[dict]:
    runs: dict[tuple[str, str], list[dict]] = {}
    errors: dict[tuple[str, str], str] = {}
    for rnd in range(rounds):
        for t, f in files.items():
            for e in engines:
                if (t, e) in errors:
                    continue
                try:
                    r = run_case(f, e, work / f"cache-{t}", prompt, decode, threads, lanes)
                except Exception as ex:  # a failing case is reported, not fatal
                    errors[(t, e)] = f"{type(ex).__name__}: {ex}"[-300:]
                    continue
                runs.setdefault((t, e), []).append({**r, "round": rnd})
                print(f"round {rnd} {t} {e}: load {r['load_s']:.2f} s, prefill {r['prefill_tok_s']:.0f} tok/s, "
                      f"decode {r['decode_tok_s']:.1f} tok/s, peak {r.get('peak_rss_mb') or 0:.0f} MB", file=sys.stderr)
    rows = []
    for t in files:
        peer = {r["round"]: r for r in runs.get((t, "llama.cpp"), [])}
        for e in engines:
            rs = runs.get((t, e))
            if not rs:
                rows.append({"type": t, "engine": e, "error": errors.get((t, e), "no run")})
                continue
            row = {"type": t, "engine": e, "runs": len(rs), "dtype": rs[0].get("dtype")}
            for k in KEYS + ("lanes4_x", "lanes8_x"):
                vals = [r[k] for r in rs if r.get(k) is not None]
                row[k] = statistics.median(vals) if vals else None
            for k in ("load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb"):  # same-round ratios
                same = [r[k] / peer[r["round"]][k] for r in rs if r["round"] in peer and r.get(k)]
                row[f"{k}_vs_peer"] = statistics.median(same) if same else None
            rows.append(row)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    def f(v, fmt="{:.2f}"):
        return "—" if v is None else fmt.format(v)

    out = [f"Llama-3.2-1B-shaped random model (dim 2048, {meta['layers']} layers, 8 KV heads, vocab 128256, tied "
           f"embeddings), written by bench_fidelity's writer with llama.cpp's Q4_K_M mix; prompt {meta['prompt']} "
           f"tokens, {meta['decode']} greedy tokens, {meta['threads']} thread(s) each; every case in its own process, "
           f"medians of {meta['rounds']} interleaved round(s) (× llama.cpp: median of same-round ratios); load average "
           f"at start {meta['load_before']}, at end {meta['load_after']}. llama.cpp: {meta['peer']}.", "",
           "| file | engine | load s | × llama.cpp | TTFT after open s | prefill tok/s | × llama.cpp | decode tok/s "
           "| × llama.cpp | peak RSS MB | × llama.cpp | RSS growth MB | 4 lanes × 1 | 8 lanes × 1 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['type']} | {r['engine']} | failed: {r['error']} |" + " |" * 12)
            continue
        out.append(f"| {r['type']} | {r['engine']} | {f(r['load_s'])} | {f(r['load_s_vs_peer'], '{:.2f}×')} | "
                   f"{f(r['ttft_after_load_s'])} | {f(r['prefill_tok_s'], '{:.0f}')} | "
                   f"{f(r['prefill_tok_s_vs_peer'], '{:.2f}×')} | {f(r['decode_tok_s'], '{:.1f}')} | "
                   f"{f(r['decode_tok_s_vs_peer'], '{:.2f}×')} | {f(r['peak_rss_mb'], '{:.0f}')} | "
                   f"{f(r['peak_rss_mb_vs_peer'], '{:.2f}×')} | {f(r['run_rss_growth_mb'], '{:.0f}')} | "
                   f"{f(r.get('lanes4_x'), '{:.2f}×')} | {f(r.get('lanes8_x'), '{:.2f}×')} |")
    out += ["", "Peak RSS is the whole process's (a Python process with torch starts near 300 MB, node with "
            "llama.cpp's library near 90 MB); RSS growth is what the load and the run added above that start."]
    return "\n".join(out)


def run(quick: bool = False, work: Path | None = None, rounds: int | None = None, threads: int = 2,
        layers: int | None = None, types: tuple[str, ...] = TYPES, **_) -> dict:
    args = bench_fidelity.model_args(quick, layers)
    meta = {"layers": args.n_layers, "prompt": 32 if quick else 512, "decode": 8 if quick else 64,
            "threads": threads, "rounds": rounds or (1 if quick else 2),
            "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    ok, why = bench_quant.peer_available()
    meta["peer"] = (("llama-cpp-python" if not bench_quant._llama_cpp_python() else
                     f"node-llama-cpp {llamacpp_node.version()} (prebuilt)") if ok else f"not measured: {why}")
    work = Path(work or (tempfile.mkdtemp(prefix="bench-files-") if quick else ROOT / "bench" / "work"))
    work.mkdir(parents=True, exist_ok=True)
    files = {t: bench_fidelity.write_file(work / f"files-l{args.n_layers}-{t}.gguf", args, t)
             for t in (("Q4_K_M",) if quick else types)}
    engines = ENGINES if ok else ENGINES[:2]
    rows = bench(files, work, meta["rounds"], meta["prompt"], meta["decode"], threads, 8 if quick else 32, engines)
    meta["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return {"title": "Downloaded-file shapes: open, prefill, decode, memory and lanes against llama.cpp",
            "markdown": markdown(rows, meta), "data": {"meta": meta, "rows": rows}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", type=Path)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--lanes", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None, help="default 16 (Llama 3.2 1B)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES), help="which files (default all)")
    a = ap.parse_args()
    if a.child:
        r = child(a.child, a.prompt, a.decode, a.lanes)
        r.pop("paths", None)
        print(json.dumps(r))
        return
    res = run(a.quick, a.work, a.rounds, a.threads, a.layers, tuple(a.types))
    print(res["markdown"])
    if a.json:
        a.json.write_text(json.dumps(res["data"], indent=1))


if __name__ == "__main__":
    main()
