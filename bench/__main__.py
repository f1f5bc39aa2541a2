"""One benchmark entry point: ``python -m bench [--quick] [--out DIR] [--threads N]``.

Writes ``PERFORMANCE.md`` and ``performance.json`` (default: docs/). Every figure comes
from this run on this machine, through the real :class:`core.engine.Engine` path
(filters, log-probs, stream decoding, stop handling); peers run in the same process,
interleaved, at the same thread count, and each decode figure is also given as a share of
the machine's read bandwidth measured here. ``--quick`` uses tiny models so the suite
can run it in seconds (its numbers mean nothing; it checks the plumbing).

Each section is ``run(quick, threads) -> {"title", "markdown", "data"}``; sections from
other modules (``bench.bench_quant``) are included when present.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_engine import engine_section  # noqa: E402
from bench.common import GB, LLAMA3_VOCAB, Engine, engine_run, llama_args, machine, median_of, random_model, weight_bytes  # noqa: E402,E501
from core.sampling import SamplingParams, choose_tokens, draw, filter_rows  # noqa: E402

# --------------------------------------------------------------------------- sampler

def sampler(quick: bool, threads: int) -> dict:
    V = 4096 if quick else LLAMA3_VOCAB
    reps = 2 if quick else 15
    g = torch.Generator().manual_seed(0)
    rows = {}
    data = {"vocab": V}
    for shape, std in (("peaked (logit std 4)", 4.0), ("flat (logit std 0.5)", 0.5)):
        for lanes in (1, 8):
            lg = torch.randn(lanes, V, generator=g) * std
            qs = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) for i in range(lanes)]
            gens = [q.generator() for q in qs]
            fast = median_of(lambda: choose_tokens(lg, qs, [None] * lanes, gens), reps)

            def ref():
                f = filter_rows(lg, qs, [None] * lanes)
                return [draw(f[i].softmax(-1), gens[i]) for i in range(lanes)]
            slow = median_of(ref, max(2, reps // 3))
            rows[(shape, lanes)] = (fast, slow)
            data[f"{shape.split()[0]}_{lanes}_lanes_ms_per_lane"] = {"fast": fast * 1e3 / lanes,
                                                                       "reference": slow * 1e3 / lanes}
    md = [f"Top-p 0.9, temperature 0.8, vocabulary {V:,}; per lane per token, median of {reps}. "
          "The reference is the full stable sort (kept in the tests as the definition).", "",
          "| logits | lanes | fast sampler | reference sort | speed-up |", "|---|---|---|---|---|"]
    for (shape, lanes), (fast, slow) in rows.items():
        md.append(f"| {shape} | {lanes} | {fast * 1e3 / lanes:.3f} ms | {slow * 1e3 / lanes:.2f} ms | "
                  f"{slow / fast:.1f}x |")
    md.append("")
    md.append("Flat rows need most of the vocabulary to reach p, so they take the fallback "
              "(a 4096-candidate pass, then the sort); trained models' distributions are peaked.")
    return {"title": "Sampler (goal: <= 1 ms per lane per token at 128k vocabulary)",
            "markdown": "\n".join(md), "data": data}


# --------------------------------------------------------------------------- llama.cpp and load

def gguf_section(quick: bool, threads: int, bandwidth: float, work: Path) -> dict:
    """Load each GGUF file with LlamaDesk (time, then time to first token) and, when
    llama_cpp is importable, run llama.cpp on the same file at the same thread count."""
    from core.checkpoints import load
    from tests.core.checkpoints.util import sp_vocab, write_gguf
    vocab = sp_vocab(52)
    a = llama_args(quick, len(vocab[0]))
    if not quick:  # the model B shape, with a small vocabulary (the GGUF writer's)
        from core.model import ModelArgs
        a = ModelArgs(dim=2048, n_layers=4, n_heads=32, n_kv_heads=8, vocab_size=len(vocab[0]),
                      hidden_dim=5632, max_seq_len=2048)
    model = random_model(a)
    kinds = ("F32",) if quick else ("F16", "Q8_0", "Q4_0")
    try:
        import llama_cpp  # noqa: F401  (the peer; imported to see that it is there)
        peer, why = True, ""
    except ImportError as e:
        peer, why = False, f"llama_cpp is not importable here ({e}); install the `bench` extra"
    n_new = 8 if quick else 64
    prompt = [1] + [259 + (i * 7) % 52 for i in range(15 if quick else 127)]
    data = {}
    for kind in kinds:
        path = work / f"bench-{kind.lower()}.gguf"
        write_gguf(path, model, qtype=kind, vocab=vocab)
        size = path.stat().st_size
        t0 = time.perf_counter()
        lm = load(path, device="cpu")
        load_s = time.perf_counter() - t0
        eng = Engine(lm.model, lm.tokenizer, stop_ids=set())
        first = engine_run(eng, prompt, [SamplingParams(temperature=0, max_new_tokens=n_new)])[0]
        eng.cache.reset()
        again = engine_run(eng, prompt, [SamplingParams(temperature=0, max_new_tokens=n_new)])[0]
        wb = weight_bytes(lm.model) if kind == "F32" else size
        entry = {"file_mb": size / 1e6, "load_s": load_s, "first_ttft_s": first.stats.ttft_s,
                 "ttft_s": again.stats.ttft_s, "decode_tok_s": again.stats.decode_tok_s,
                 "dtype": str(next(lm.model.parameters()).dtype)}
        if peer:
            try:
                entry["llama_cpp_tok_s"] = llama_cpp_decode(path, prompt, n_new, threads)
            except Exception as e:  # a peer failing is reported, not fatal
                entry["llama_cpp_error"] = f"{type(e).__name__}: {e}"
        entry["floor_share"] = entry["decode_tok_s"] * wb / (bandwidth * GB)
        data[kind] = entry
        del lm, eng
    md = [f"Random Llama (dim {a.dim}, {a.n_layers} layers, heads {a.n_heads}/{a.n_kv_heads}, FFN {a.hidden_dim}) "
          f"written with `gguf`; {len(prompt)}-token prompt, {n_new} greedy tokens; {threads} thread(s) for both.",
          "", "| file | size | load | TTFT right after load | TTFT warm | LlamaDesk decode | share of floor | "
          "llama.cpp decode | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for kind, e in data.items():
        lc = e.get("llama_cpp_tok_s")
        lc_s = f"{lc:.1f}" if lc else ("error: " + e["llama_cpp_error"][:60] if "llama_cpp_error" in e else "not measured")
        ratio = f"{e['decode_tok_s'] / lc:.2f}x" if lc else "-"
        md.append(f"| {kind} | {e['file_mb']:.0f} MB | {e['load_s']:.2f} s | {e['first_ttft_s'] * 1e3:.0f} ms | "
                  f"{e['ttft_s'] * 1e3:.0f} ms | {e['decode_tok_s']:.1f} tok/s | {e['floor_share']:.0%} | {lc_s} | {ratio} |")
    if not peer:
        md += ["", f"llama.cpp was **not measured** in this run: {why}."]
    return {"title": "GGUF files: load, time to first token, and llama.cpp on the same files",
            "markdown": "\n".join(md), "data": {"llama_cpp": peer, "why_not": why, **data}}


def llama_cpp_decode(path: Path, prompt: list[int], n: int, threads: int) -> float:
    """llama.cpp's decode tok/s on the same prompt ids, greedy, from one timed generation."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=len(prompt) + n + 8,
                verbose=False)
    stamps = []
    for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == n:
            break
    llm.close() if hasattr(llm, "close") else None
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


# --------------------------------------------------------------------------- GPU note and assembly

def gpu_section(quick: bool, threads: int) -> dict:
    if torch.cuda.is_available():
        md = ("A CUDA device is present: run `python bench/gpu.py` (one script, < 8 minutes) for the "
              "GPU table; this CPU run does not measure it.")
    else:
        md = ("**Unmeasured**: no CUDA device on this machine. `python bench/gpu.py` measures decode "
              "tok/s of an 8B-shaped random model in bfloat16/int8/int4 against the GPU's measured "
              "memory bandwidth, prefill tok/s, 4-lane cost and transformers on the same GPU.")
    return {"title": "GPU", "markdown": md, "data": {"measured": False}}


EXTRA = ("bench.bench_quant", "bench.bench_serve")


def extra_sections(quick: bool, skip: list[str]) -> list[dict]:
    """Other modules' sections; one that fails is reported, not allowed to lose the run."""
    out = []
    for name in EXTRA:
        if name.rsplit(".", 1)[-1] in skip:
            out.append({"title": f"{name} (skipped)", "markdown": f"Skipped in this run (`--skip {name.rsplit('.', 1)[-1]}`).",
                        "data": {"skipped": True}})
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        try:
            out.append(mod.run(quick))
        except Exception as e:
            out.append({"title": f"{name} (failed)", "markdown": f"`{name}.run` failed: {type(e).__name__}: {e}",
                        "data": {"error": f"{type(e).__name__}: {e}"}})
    return out


BEGIN, END = "<!-- python -m bench: begin (generated) -->", "<!-- python -m bench: end -->"


def write_report(path: Path, block: str) -> None:
    """Put the generated block into PERFORMANCE.md, replacing the previous one and keeping
    everything else (other benchmarks' hand-written sections)."""
    old = path.read_text() if path.exists() else "# Performance\n"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny models: checks the plumbing in seconds")
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for PERFORMANCE.md and JSON")
    ap.add_argument("--threads", type=int, default=1, help="torch (and llama.cpp) threads (default 1)")
    ap.add_argument("--skip", action="append", default=[], metavar="MODULE",
                    help="leave out another module's section (e.g. bench_quant)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    sections = []
    mach = machine(a.quick, a.threads)
    sections.append(mach)
    bw = mach["data"]["read_bandwidth_gb_s"]
    sections.append(sampler(a.quick, a.threads))
    sections.append(engine_section(a.quick, a.threads, bw))  # bench/bench_engine.py
    with tempfile.TemporaryDirectory() as work:
        sections.append(gguf_section(a.quick, a.threads, bw, Path(work)))
    sections += extra_sections(a.quick, a.skip)
    sections.append(gpu_section(a.quick, a.threads))
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    md = [BEGIN, f"## `python -m bench`{' --quick (plumbing only, numbers meaningless)' if a.quick else ''}", "",
          f"Written by `python -m bench{' --quick' if a.quick else ''}` on {stamp} "
          f"in {time.perf_counter() - t0:.0f} s. Re-run it to refresh; every number in this part is from that one run.", ""]
    for s in sections:
        md += [f"### {s['title']}", "", s["markdown"], ""]
    md.append(END)
    write_report(a.out / "PERFORMANCE.md", "\n".join(md))
    (a.out / "performance.json").write_text(json.dumps(
        {"quick": a.quick, "written": stamp, "sections": [{"title": s["title"], "data": s["data"]} for s in sections]},
        indent=2, default=str))
    print(f"wrote {a.out / 'PERFORMANCE.md'} and performance.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
