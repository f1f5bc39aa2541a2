"""GGUF files through LlamaDesk's real Engine and through llama.cpp, side by side.

For each file type (F16, Q8_0, Q4_0, Q4_K) of one random Llama, every engine runs the same
prompt ids and greedy decode on the same file at the same thread count:

- ``llamadesk``: LlamaDesk with ``dtype=auto`` (quantized linears stay packed,
  :mod:`core.model.quant`; a float file gets the probed compute dtype);
- ``llamadesk-f32``: LlamaDesk with ``dtype=float32`` (every tensor dequantized at load,
  the path before packing; ``--engines`` to include it, python -m bench leaves it out);
- ``llama.cpp``: llama-cpp-python (the ``bench`` extra) when it imports.

Each case runs in its own process, so load time and peak resident memory (VmHWM) are its
own; cases are interleaved across repeats and medians reported. Per case: load time,
time to first token of the first request right after load (prompt of ``--prompt``
tokens: this absorbs any lazy page-in), then on a fresh cache the prefill rate of the same
prompt and the decode rate of ``--decode`` greedy tokens. The read bandwidth is measured
in the parent between rounds (the best round is the floor's denominator).

    python bench/bench_quant.py [--layers 8] [--dim 2048] [--prompt 512] [--decode 64]
                                [--repeats 3] [--threads 1] [--work DIR]
    python -m bench   (imports run() from here)
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
from bench import llamacpp_node, llamacpp_server  # noqa: E402

TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K")
#: engine name -> the child's --dtype (``llama.cpp`` runs llama-cpp-python instead)
PATHS = {"llamadesk": "auto", "llamadesk-f32": "float32", "llama.cpp": "llama.cpp"}
#: what ``python -m bench`` runs (the float32 path is the slow pre-packing baseline)
MAIN_ENGINES = ("llamadesk", "llama.cpp")
PEER = "llama.cpp"
LLAMA_CPP_NOTE = ("llama.cpp runs with `use_extra_bufts=False` (weights in its plain CPU buffers): with its "
                  "default extra buffer types, llama-cpp-python 0.3.36 built here segfaults on the first "
                  "multi-token batch of every quantized file (in the AMX buffer type this CPU advertises; "
                  "llama.cpp issue #20824), and forcing the CPU_REPACK type instead crashes on Q8_0.")


def peer_available() -> tuple[bool, str]:
    """Whether llama.cpp can run here (llama-cpp-python, else node-llama-cpp's prebuilt
    build: bench/llamacpp_node.py), and why not."""
    why = _llama_cpp_python()
    if not why:
        return True, ""
    ok, why_node = llamacpp_node.available()
    return (True, "") if ok else (False, f"{why}; or {why_node}")


def _llama_cpp_python() -> str:
    """'' when llama-cpp-python imports here, else why not."""
    try:
        llamacpp_server.import_llama_cpp()
    except ImportError as e:
        return str(e)
    if os.environ.get("LLAMA_CPP_LIB_PATH") == str(llamacpp_server.lib_dir()):  # the prebuilt library
        return llamacpp_server.cpu_gap()  # the quantized files here would stop it (SIGILL)
    return ""


def model_args(dim: int, layers: int, vocab: int):
    from core.model.args import ModelArgs

    heads = max(dim // 128, 2)
    return ModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=max(heads // 4, 1), vocab_size=vocab,
                     hidden_dim=(dim * 11 // 4) // 256 * 256 or 256, max_seq_len=2048)


def write_files(work: Path, dim: int, layers: int, vocab: int, types=TYPES) -> dict[str, Path]:
    """One random model written as a GGUF per type (reused when already in ``work``)."""
    import gguf
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    from core.checkpoints.gguf import gguf_name
    from core.checkpoints.gguf_write import add_llama_params
    from core.model.transformer import Transformer
    from tests.core.checkpoints.util import _random_k_blocks, sp_vocab

    work.mkdir(parents=True, exist_ok=True)
    files = {t: work / f"random-d{dim}-l{layers}-v{vocab}-{t}.gguf" for t in types}
    todo = [t for t, f in files.items() if not f.exists()]
    if not todo:
        return files
    torch.manual_seed(0)
    model = Transformer(model_args(dim, layers, vocab)).eval()
    tokens, scores, ttypes = sp_vocab()
    # one piece per embedding row, so every id the random model emits decodes
    extra = range(len(tokens), vocab)
    tokens, scores, ttypes = (tokens + [f"\u2581w{i}" for i in extra], scores + [-float(i) for i in extra],
                              ttypes + [1] * len(extra))
    for t in todo:
        w = gguf.GGUFWriter(str(files[t]) + ".tmp", "llama")
        add_llama_params(w, model.args, f"bench-quant random {t}", t)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(ttypes)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        kind = Q[t]
        for name, p in model.state_dict().items():
            x = p.detach().numpy()
            if x.ndim != 2:
                w.add_tensor(gguf_name(name), x)
            elif kind == Q.F16:
                w.add_tensor(gguf_name(name), x.astype(np.float16))
            else:  # gguf has no Q4_K quantizer: valid blocks with random values and sane scales
                data = _random_k_blocks(x.shape, kind) if kind == Q.Q4_K else quantize(x, kind)
                w.add_tensor(gguf_name(name), data, raw_shape=data.shape, raw_dtype=kind)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(str(files[t]) + ".tmp", files[t])
    return files


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _rss_growth(before_kb: int | None, load_kb: int | None) -> dict:
    """Resident memory the load added, and what it had grown by after the runs (both MB;
    read the same way in both engines' processes, after their imports)."""
    now = _status_kb("VmRSS")
    if before_kb is None or load_kb is None or now is None:
        return {"load_rss_growth_mb": None, "run_rss_growth_mb": None}
    return {"load_rss_growth_mb": (load_kb - before_kb) / 1024, "run_rss_growth_mb": (now - before_kb) / 1024}


def prompt_ids(vocab: int, n: int) -> list[int]:
    """The same prompt for every engine: BOS then n-1 random ids past the specials."""
    import torch

    return [1] + torch.randint(3, vocab, (n - 1,), generator=torch.Generator().manual_seed(1)).tolist()


def measure(file: Path, dtype: str, prompt: int, decode: int, threads: int = 1) -> dict:
    """Load ``file`` and time it through the Engine (or llama.cpp); timings and memory."""
    if dtype == PEER:
        if not _llama_cpp_python():
            return measure_llama_cpp(file, prompt, decode, threads)
        return measure_llama_cpp_node(file, prompt, decode, threads)
    from core.checkpoints import load
    from core.checkpoints.gguf_write import gguf_tensor_bytes
    from core.engine.engine import Engine
    from core.engine.events import Done
    from core.engine.settings import SamplingParams

    rss_before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    lm = load(file, device="cpu", dtype=dtype)
    load_s = time.perf_counter() - t0
    rss_load = _status_kb("VmRSS")
    engine = Engine(lm.model, lm.tokenizer, stop_ids=())
    ids = prompt_ids(lm.tokenizer.vocab_size, prompt)
    first = next(ev for ev in engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=1))
                 if isinstance(ev, Done))
    engine.cache.reset()  # the timed request prefills the whole prompt again
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=decode, seed=0)
    done = next(ev for ev in engine.generate(ids, params) if isinstance(ev, Done))
    assert done.stats.cached_tokens == 0
    return {"load_s": load_s, "ttft_after_load_s": first.stats.ttft_s, "prefill_tok_s": done.stats.prefill_tok_s,
            "decode_tok_s": done.stats.decode_tok_s, "tokens": done.tokens,
            "rss_after_load_mb": rss_load / 1024 if rss_load else None,
            **_rss_growth(rss_before, rss_load),
            "peak_rss_mb": (_status_kb("VmHWM") or 0) / 1024 or None,
            "tensor_mb": gguf_tensor_bytes(file) / 2 ** 20, "paths": lm.info.get("linear_paths"),
            "dtype": lm.info.get("dtype")}


def measure_llama_cpp(file: Path, prompt: int, decode: int, threads: int) -> dict:
    """The same measurements through llama-cpp-python's low-level eval/sample loop (greedy),
    with llama.cpp's own defaults for everything else (mmap, batch 512) except
    ``use_extra_bufts``: see :data:`LLAMA_CPP_NOTE`."""
    llamacpp_server.import_llama_cpp()  # binds the prebuilt library first
    import llama_cpp.llama as lc
    from llama_cpp import Llama

    from core.checkpoints.gguf_write import gguf_tensor_bytes

    default = lc.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    lc.llama_cpp.llama_model_default_params = params  # Llama() reads its model params from here
    rss_before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    llm = Llama(model_path=str(file), n_threads=threads, n_threads_batch=threads, n_ctx=prompt + decode + 16,
                n_batch=512, verbose=False)
    load_s = time.perf_counter() - t0
    rss_load = _status_kb("VmRSS")
    ids = prompt_ids(llm.n_vocab(), prompt)

    def greedy() -> int:
        return int(llm.sample(top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0))

    t = time.perf_counter()
    llm.eval(ids)
    greedy()
    ttft = time.perf_counter() - t
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    tok = greedy()
    prefill_s = time.perf_counter() - t
    tokens = [tok]
    t = time.perf_counter()
    for _ in range(decode - 1):  # as the Engine's stats: the first token is the prefill's
        llm.eval([tok])
        tok = greedy()
        tokens.append(tok)
    decode_s = time.perf_counter() - t
    out = {"load_s": load_s, "ttft_after_load_s": ttft, "prefill_tok_s": prompt / prefill_s,
           "decode_tok_s": (decode - 1) / decode_s, "tokens": tokens,
           "rss_after_load_mb": rss_load / 1024 if rss_load else None,
           **_rss_growth(rss_before, rss_load),
           "peak_rss_mb": (_status_kb("VmHWM") or 0) / 1024 or None,
           "tensor_mb": gguf_tensor_bytes(file) / 2 ** 20, "paths": None, "dtype": "llama.cpp"}
    llm.close() if hasattr(llm, "close") else None
    return out


def measure_llama_cpp_node(file: Path, prompt: int, decode: int, threads: int) -> dict:
    """llama.cpp through node-llama-cpp's prebuilt binaries (its own defaults: mmap, batch
    512, its extra buffer types), in a node process of its own."""
    from core.checkpoints.gguf_header import header_args, read_header
    from core.checkpoints.gguf_write import gguf_tensor_bytes

    meta, tensors = read_header(file)
    ids = prompt_ids(header_args(meta, tensors, str(file)).vocab_size, prompt)
    r = llamacpp_node.measure(file, ids, decode, threads)
    return {**{k: r[k] for k in ("load_s", "ttft_after_load_s", "prefill_tok_s", "decode_tok_s", "tokens",
                                 "rss_after_load_mb", "load_rss_growth_mb", "run_rss_growth_mb", "peak_rss_mb")},
            "tensor_mb": gguf_tensor_bytes(file) / 2 ** 20, "paths": None, "dtype": r["engine"]}


def _child(file: Path, dtype: str, prompt: int, decode: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", str(file), "--dtype", dtype, "--prompt", str(prompt),
           "--decode", str(decode), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode:
        raise RuntimeError(f"case {file.name} {dtype} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


KEYS = ("load_s", "ttft_after_load_s", "prefill_tok_s", "decode_tok_s", "rss_after_load_mb", "peak_rss_mb",
        "tensor_mb", "load_rss_growth_mb", "run_rss_growth_mb")


def bench(files: dict[str, Path], prompt: int, decode: int, repeats: int, threads: int, paths: dict[str, str],
          in_process: bool = False, bandwidth=None) -> tuple[list[dict], list[float]]:
    """Every (file, engine) case once per round, rounds repeated; medians per case.
    ``bandwidth``: called once per round, its GB/s kept (the floor's denominator)."""
    runs: dict[tuple[str, str], list[dict]] = {}
    errors: dict[tuple[str, str], str] = {}
    bws = []
    for rnd in range(repeats):  # interleaved: every case once per round
        if bandwidth is not None:
            bws.append(bandwidth())
        for t, f in files.items():
            for path, dtype in paths.items():
                if (t, path) in errors:
                    continue
                try:
                    if in_process:  # one process holds every case: its RSS says nothing per case
                        r = {**measure(f, dtype, prompt, decode, threads), "rss_after_load_mb": None,
                             "peak_rss_mb": None, "load_rss_growth_mb": None, "run_rss_growth_mb": None}
                    else:
                        r = _child(f, dtype, prompt, decode, threads)
                except Exception as e:  # a failing case (the peer on a type) is reported, not fatal
                    errors[(t, path)] = f"{type(e).__name__}: {e}"[-300:]
                    continue
                runs.setdefault((t, path), []).append({**r, "round": rnd})
    rows = []
    for t in files:
        for path in paths:
            rs = runs.get((t, path))
            if not rs:
                rows.append({"type": t, "path": path, "error": errors.get((t, path), "no run")})
                continue
            med = {k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None for k in KEYS}
            rows.append({"type": t, "path": path, **med, "paths": rs[0]["paths"], "dtype": rs[0]["dtype"],
                         "runs": len(rs), "tokens": rs[0]["tokens"],
                         "rounds": [{k: r[k] for k in ("round", "prefill_tok_s", "decode_tok_s")} for r in rs]})
    by = {(r["type"], r["path"]): r for r in rows}
    for r in rows:  # against the peer: the median of the ratios of runs in the same round (same load)
        peer = {p["round"]: p for p in by.get((r["type"], PEER), {}).get("rounds", [])}
        for k in ("prefill_tok_s", "decode_tok_s"):
            same = [x[k] / peer[x["round"]][k] for x in r.get("rounds", []) if x["round"] in peer]
            r[f"{k}_vs_peer"] = statistics.median(same) if same else None
    for r in rows:  # how long each engine's greedy reply agrees with the others' on the same file
        for other in ("llamadesk-f32", PEER):
            o = by.get((r["type"], other))
            if o is not None and o is not r and "tokens" in o and "tokens" in r:
                a, b = r["tokens"], o["tokens"]
                r[f"greedy_prefix_vs_{other}"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return rows, bws


def markdown(rows: list[dict], meta: dict, bw: float | None) -> str:
    def f(v, fmt="{:.1f}"):
        return "—" if v is None else fmt.format(v)

    out = [f"Random Llama dim {meta['dim']}, {meta['layers']} layers, vocab {meta['vocab']}, written with `gguf`; "
           f"prompt {meta['prompt']} tokens, {meta['decode']} greedy tokens; {meta['threads']} thread(s) for every "
           f"engine; {'one process (quick)' if meta['quick'] else 'each case in its own process'}, medians of {meta['repeats']} interleaved round(s) on a shared "
           "machine (× llama.cpp: the median of the ratios of runs in the same round). LlamaDesk runs through "
           "`Engine.generate` (filters, log-probs, stream decoding); llama.cpp through llama-cpp-python's "
           "eval/sample loop.", "",
           "| file | engine | compute | decode tok/s | × llama.cpp | share of floor | prefill tok/s | × llama.cpp | "
           "TTFT after load | load s | peak RSS MB | peak RSS / tensor bytes | ΔRSS load / tensor bytes | "
           "ΔRSS after run / tensor bytes | greedy prefix = llama.cpp |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["type"], r["path"]): r for r in rows}
    for r in rows:
        if "error" in r:
            out.append(f"| {r['type']} | {r['path']} | failed: {r['error'][:120]} |" + " |" * 12)
            continue
        peer = by.get((r["type"], PEER))
        peer = peer if peer is not None and "error" not in peer else None
        ratio = lambda k: r.get(f"{k}_vs_peer") if peer else None  # noqa: E731
        per_tensor = lambda k: r[k] / r["tensor_mb"] if r.get(k) is not None else None  # noqa: E731
        floor = bw * 1e9 / (r["floor_bytes"]) if bw and r.get("floor_bytes") else None
        share = r["decode_tok_s"] / floor if floor else None
        agree = r.get(f"greedy_prefix_vs_{PEER}")
        out.append(f"| {r['type']} | {r['path']} | {r['dtype']} | {f(r['decode_tok_s'])} | "
                   f"{f(ratio('decode_tok_s'), '{:.2f}×')} | {f(share, '{:.0%}')} | {f(r['prefill_tok_s'])} | "
                   f"{f(ratio('prefill_tok_s'), '{:.2f}×')} | {f(r['ttft_after_load_s'], '{:.2f} s')} | "
                   f"{f(r['load_s'], '{:.2f}')} | {f(r['peak_rss_mb'], '{:.0f}')} | "
                   f"{f(r['peak_rss_mb'] / r['tensor_mb'] if r['peak_rss_mb'] else None, '{:.2f}')} | "
                   f"{f(per_tensor('load_rss_growth_mb'), '{:.2f}')} | {f(per_tensor('run_rss_growth_mb'), '{:.2f}')} | "
                   f"{'—' if agree is None else f'{agree}/' + str(len(r['tokens']))} |")
    if any(r["path"] == PEER for r in rows):
        out += ["", LLAMA_CPP_NOTE]
    if bw:
        out += ["", f"Share of floor: decode tok/s × the file's tensor bytes read per token (all but the token "
                f"embedding) ÷ the best read bandwidth measured between rounds ({bw:.1f} GB/s). ΔRSS: resident "
                "memory (VmRSS) after load, and after the timed runs, minus before load, in the same process after "
                "its imports, ÷ the file's tensor bytes (llama.cpp maps the file and reads pages as its first "
                "evaluation touches them, so its after-load figure leaves out what it has not read yet). Greedy prefix: "
                "how many of the greedy tokens equal llama.cpp's on the same file (random weights make near-ties "
                "common, so a short prefix is rounding, not a bug)."]
    return "\n".join(out)


def dense_crossover(n: int = 5632, k: int = 2048, rows: int = 64, repeats: int = 5) -> list[dict]:
    """Where core.model.quant.DENSE_ROWS comes from: per packed kind, the int4 kernel's time per
    row, dequantize-to-bfloat16's time once and the dense bf16 matmul's time per row (at
    ``rows`` rows) on an [n, k] weight; dense wins from dequantize / (kernel - dense) rows."""
    import torch

    from core.model import pack, quant
    from core.model.tuning import median_seconds
    from tests.core.model.test_quant import as_raw, gguf_blocks

    def best(fn):
        return median_seconds(fn, repeats)
    out = []
    for kind in ("Q4_0", "Q8_0", "Q4_K"):
        layer = pack.pack_gguf(as_raw(gguf_blocks(kind, n=n, k=k)), kind, n, k, torch.device("cpu"))
        x = torch.randn(rows, k).bfloat16()
        xx = x.repeat(1, layer.planes)
        kernel = best(lambda: quant._int4_mm(xx, layer.packed, layer.scale_zeros)) / rows
        deq = best(lambda: layer.dequantize(torch.bfloat16))
        w = layer.dequantize(torch.bfloat16)
        dense = best(lambda: torch.nn.functional.linear(x, w)) / rows
        out.append({"kind": kind, "kernel_ms_per_row": 1e3 * kernel, "dequantize_ms": 1e3 * deq,
                    "dense_ms_per_row": 1e3 * dense, "crossover_rows": deq / max(kernel - dense, 1e-9)})
    return out


def crossover_markdown(rows: list[dict], n: int = 5632, k: int = 2048) -> str:
    from core.model.quant import DENSE_ROWS
    out = [f"Packed kernel against dequantize + dense bfloat16 on a {n}x{k} weight, one thread (core.model.quant."
           f"DENSE_ROWS = {DENSE_ROWS}):", "",
           "| kind | int4 kernel ms/row | dequantize to bf16 ms | dense bf16 ms/row (64 rows) | dense wins from |",
           "|---|---|---|---|---|"]
    out += [f"| {r['kind']} | {r['kernel_ms_per_row']:.3f} | {r['dequantize_ms']:.1f} | {r['dense_ms_per_row']:.3f} | "
            f"{r['crossover_rows']:.0f} rows |" for r in rows]
    return "\n".join(out)


def floor_bytes(file: Path) -> int:
    """Bytes of ``file``'s tensors a decode step reads: all but the token embedding (gathered)."""
    from gguf import GGUFReader

    return int(sum(t.n_bytes for t in GGUFReader(str(file)).tensors if t.name != "token_embd.weight"))


def run(quick: bool = False, bandwidth: float | None = None, **kw) -> dict:
    """Measure and return {"title", "markdown", "data"} (for ``python -m bench``).

    quick: a tiny model, in this process (no RSS figures), a few seconds.
    bandwidth: GB/s measured by the caller (kept as one more sample of the floor).
    """
    if quick:
        meta = dict(dim=256, layers=2, vocab=512, prompt=32, decode=8, repeats=1, threads=1, quick=True)
    else:
        meta = dict(dim=2048, layers=8, vocab=32000, prompt=512, decode=64, repeats=3, threads=1, quick=False)
    meta.update({k: v for k, v in kw.items() if k in meta and v is not None})
    work = kw.get("work") or (Path(tempfile.mkdtemp(prefix="bench-quant-")) if quick else ROOT / "bench" / "work")
    work = Path(work)
    types = ("Q8_0", "Q4_0") if quick else TYPES
    files = write_files(work, meta["dim"], meta["layers"], meta["vocab"], types)
    peer, why = peer_available()
    paths = {k: v for k, v in PATHS.items() if peer or k != PEER}
    engines = kw.get("engines") or (tuple(PATHS) if quick else MAIN_ENGINES)
    paths = {k: v for k, v in paths.items() if k in engines}
    from bench.common import read_bandwidth
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(meta["threads"])  # in-process (quick) cases and the bandwidth; children set their own
    try:
        rows, bws = bench(files, meta["prompt"], meta["decode"], meta["repeats"], meta["threads"], paths,
                          in_process=quick, bandwidth=lambda: read_bandwidth(quick))
    finally:
        torch.set_num_threads(before)
    bw = max(bws + ([bandwidth] if bandwidth else []))
    for r in rows:
        r["floor_bytes"] = floor_bytes(files[r["type"]])
        if "decode_tok_s" in r:
            r["floor_share"] = r["decode_tok_s"] * r["floor_bytes"] / (bw * 1e9)
    md = markdown(rows, meta, bw)
    cross = None
    if not quick:
        before_cross = torch.get_num_threads()
        torch.set_num_threads(meta["threads"])
        try:
            cross = dense_crossover()
        finally:
            torch.set_num_threads(before_cross)
        md += "\n\n" + crossover_markdown(cross)
    if not peer:
        md += f"\n\nllama.cpp was **not measured** in this run: {why}."
    for r in rows:
        r.pop("tokens", None)
    return {"title": "GGUF files: LlamaDesk against llama.cpp on the same files",
            "markdown": md, "data": {"meta": meta, "llama_cpp": peer, "why_not": why, "bandwidth_gb_s": bws,
                                     "floor_bandwidth_gb_s": bw, "rows": rows,
                                     "dense_crossover": cross}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", type=Path)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--dim", type=int, default=None, help="default 2048 (quick: smaller)")
    ap.add_argument("--layers", type=int, default=None, help="default 8 (quick: smaller)")
    ap.add_argument("--vocab", type=int, default=None, help="default 32000 (quick: smaller)")
    ap.add_argument("--prompt", type=int, default=None, help="default 512 (quick: smaller)")
    ap.add_argument("--decode", type=int, default=None, help="default 64 (quick: smaller)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (quick: smaller)")
    ap.add_argument("--threads", type=int, default=None, help="default 1")
    ap.add_argument("--engines", nargs="+", choices=list(PATHS), default=None,
                    help=f"default: {' '.join(MAIN_ENGINES)} (quick: all); llama.cpp only where it imports")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the data here")
    ap.add_argument("--crossover", action="store_true", help="only measure where DENSE_ROWS comes from")
    a = ap.parse_args()
    if a.crossover:
        import torch
        torch.set_num_threads(a.threads or 1)
        print(crossover_markdown(dense_crossover()))
        return
    if a.child:
        import torch
        torch.set_num_threads(a.threads or 1)
        print(json.dumps(measure(a.child, a.dtype, a.prompt or 512, a.decode or 64, a.threads or 1)))
        return
    res = run(a.quick, dim=a.dim, layers=a.layers, vocab=a.vocab, prompt=a.prompt, decode=a.decode,
              repeats=a.repeats, threads=a.threads, work=a.work, engines=a.engines)
    print(f"## {res['title']}\n\n{res['markdown']}")
    if a.json:
        a.json.write_text(json.dumps(res["data"], indent=1))


if __name__ == "__main__":
    main()
