"""Quantized GGUF files through the real Engine: packed layers against today's dequantized path.

For each file type (Q8_0, Q4_0, Q4_K, F16) of one random Llama, runs the same prompt and
greedy decode through :class:`core.engine.Engine`, loaded two ways in the same run:
``dtype=auto`` (quantized linears stay packed, :mod:`core.quant`) and ``dtype=float32``
(every tensor dequantized to float32 at load, the path before packing). Each case runs
in its own process, so load time and peak resident memory (VmHWM) are its own; cases are
interleaved across repeats and medians reported. F16 has no packed path: both rows are
float32 and show the noise between two identical runs.

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

TYPES = ("Q8_0", "Q4_0", "Q4_K", "F16")
PATHS = {"packed": "auto", "dequantized": "float32"}


def model_args(dim: int, layers: int, vocab: int):
    from core.model import ModelArgs

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
    from core.model import Transformer
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


def measure(file: Path, dtype: str, prompt: int, decode: int) -> dict:
    """Load ``file`` and run one greedy request through the Engine; timings and memory."""
    import torch

    from core.checkpoints import load
    from core.checkpoints.gguf_write import gguf_tensor_bytes
    from core.engine import Done, Engine
    from core.sampling import SamplingParams

    t0 = time.perf_counter()
    lm = load(file, device="cpu", dtype=dtype)
    load_s = time.perf_counter() - t0
    rss_load = _status_kb("VmRSS")
    engine = Engine(lm.model, lm.tokenizer, stop_ids=())
    ids = torch.randint(3, lm.tokenizer.vocab_size, (prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=decode, seed=0)
    done = next(ev for ev in engine.generate([1] + ids, params) if isinstance(ev, Done))
    return {"load_s": load_s, "prefill_tok_s": done.stats.prefill_tok_s, "decode_tok_s": done.stats.decode_tok_s,
            "ttft_s": done.stats.ttft_s, "tokens": done.tokens,
            "rss_after_load_mb": rss_load / 1024 if rss_load else None,
            "peak_rss_mb": (_status_kb("VmHWM") or 0) / 1024 or None,
            "tensor_mb": gguf_tensor_bytes(file) / 2 ** 20, "paths": lm.info.get("linear_paths")}


def _child(file: Path, dtype: str, prompt: int, decode: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", str(file), "--dtype", dtype, "--prompt", str(prompt),
           "--decode", str(decode), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode:
        raise RuntimeError(f"case {file.name} {dtype} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(files: dict[str, Path], prompt: int, decode: int, repeats: int, threads: int,
          in_process: bool = False) -> list[dict]:
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(repeats):  # interleaved: every case once per round
        for t, f in files.items():
            for path, dtype in PATHS.items():
                if in_process:  # one process holds every case: its RSS says nothing per case
                    r = {**measure(f, dtype, prompt, decode), "rss_after_load_mb": None, "peak_rss_mb": None}
                else:
                    r = _child(f, dtype, prompt, decode, threads)
                runs.setdefault((t, path), []).append(r)
    rows = []
    for (t, path), rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None
               for k in ("load_s", "prefill_tok_s", "decode_tok_s", "ttft_s", "rss_after_load_mb", "peak_rss_mb",
                         "tensor_mb")}
        rows.append({"type": t, "path": path, **med, "paths": rs[0]["paths"], "runs": len(rs),
                     "same_tokens_as_dequantized": None})
    by = {(r["type"], r["path"]): r for r in rows}
    for t in files:
        a, b = runs[(t, "packed")][0]["tokens"], runs[(t, "dequantized")][0]["tokens"]
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        by[(t, "packed")]["greedy_prefix_vs_dequantized"] = n
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    def f(v, fmt="{:.1f}"):
        return "—" if v is None else fmt.format(v)

    out = [f"Random Llama dim {meta['dim']}, {meta['layers']} layers, vocab {meta['vocab']}; prompt "
           f"{meta['prompt']} tokens, {meta['decode']} greedy tokens through Engine; {meta['threads']} thread(s); "
           f"medians of {meta['repeats']} interleaved run(s) on a shared machine.", "",
           "| file | path | decode tok/s | × dequantized | prefill tok/s | × dequantized | load s | "
           "RSS after load MB | peak RSS MB | tensor MB | RSS / tensor bytes |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["type"], r["path"]): r for r in rows}
    for r in rows:
        base = by[(r["type"], "dequantized")]
        ratio = lambda k: (r[k] / base[k]) if r[k] and base[k] else None  # noqa: E731
        rss = r["rss_after_load_mb"]
        out.append(f"| {r['type']} | {r['path']} | {f(r['decode_tok_s'])} | {f(ratio('decode_tok_s'), '{:.2f}×')} | "
                   f"{f(r['prefill_tok_s'])} | {f(ratio('prefill_tok_s'), '{:.2f}×')} | {f(r['load_s'], '{:.2f}')} | "
                   f"{f(rss, '{:.0f}')} | {f(r['peak_rss_mb'], '{:.0f}')} | {f(r['tensor_mb'], '{:.0f}')} | "
                   f"{f(rss / r['tensor_mb'] if rss else None, '{:.2f}')} |")
    return "\n".join(out)


def run(quick: bool = False, **kw) -> dict:
    """Measure and return {"title", "markdown", "data"} (for ``python -m bench``).

    quick: a tiny model, in this process (no RSS figures), a few seconds.
    """
    if quick:
        meta = dict(dim=256, layers=2, vocab=512, prompt=32, decode=8, repeats=1, threads=1)
    else:
        meta = dict(dim=2048, layers=8, vocab=32000, prompt=512, decode=64, repeats=3, threads=1)
    meta.update({k: v for k, v in kw.items() if k in meta and v is not None})
    work = kw.get("work") or (Path(tempfile.mkdtemp(prefix="bench-quant-")) if quick else ROOT / "bench" / "work")
    work = Path(work)
    types = ("Q8_0", "Q4_0") if quick else TYPES
    files = write_files(work, meta["dim"], meta["layers"], meta["vocab"], types)
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(meta["threads"])  # in-process (quick) cases; children set their own
    try:
        rows = bench(files, meta["prompt"], meta["decode"], meta["repeats"], meta["threads"], in_process=quick)
    finally:
        torch.set_num_threads(before)
    return {"title": "Quantized GGUF: packed layers vs dequantized float32", "markdown": markdown(rows, meta),
            "data": {"meta": meta, "rows": rows}}


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
    ap.add_argument("--threads", type=int, default=None, help="default 1 (quick: smaller)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the data here")
    a = ap.parse_args()
    if a.child:
        import torch
        torch.set_num_threads(a.threads or 1)
        print(json.dumps(measure(a.child, a.dtype, a.prompt or 512, a.decode or 64)))
        return
    res = run(a.quick, dim=a.dim, layers=a.layers, vocab=a.vocab, prompt=a.prompt, decode=a.decode,
              repeats=a.repeats, threads=a.threads, work=a.work)
    print(f"## {res['title']}\n\n{res['markdown']}")
    if a.json:
        a.json.write_text(json.dumps(res["data"], indent=1))


if __name__ == "__main__":
    main()
