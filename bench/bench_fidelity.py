"""How close LlamaDesk's default path stays to the file, per GGUF type (issue 24's table).

One Llama-3.2-1B-shaped random model (dim 2048, 16 layers, 32/8 heads, FFN 8192, the 128k
Llama 3 vocabulary size, tied embeddings; its final norm scaled so next-token distributions
are peaked like a trained model's) is written as F16, Q8_0 and Q4_K_M at bench time with
our own writer: ``gguf``'s quantizer for Q8_0, this module's Q4_K quantizer and the tests'
Q6_K one (``gguf`` has neither; llama.cpp's ``llama_model_quantize`` is not installed
here), with llama.cpp's Q4_K_M mix (Q6_K for the tied embedding/output and for ``attn_v``
and ``ffn_down`` in its "more bits" layers: half of them).

"Exact" is the file's weights as the ``gguf`` package dequantizes them (``dtype=float32``
loads exactly that), a plain float32 forward and a float64 log-softmax. The engine path is
``dtype=auto`` as the app runs it: a 32-token prompt in one forward, then 64 teacher-forced
tokens one decode step at a time against the KV cache. Per decode position: |Δ log-prob|
of the token exact ranks first, and whether the engine's first choice is the same. Each
case runs in its own process.

    python bench/bench_fidelity.py [--quick] [--layers 16] [--work DIR]
    python -m bench   (imports run() from here)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TYPES = ("F16", "Q8_0", "Q4_K_M")
PROMPT, STEPS = 32, 64
LOGIT_STD = 8.0  # logits' std: exact's first choice then holds ~60% (a trained model's peaks)
#: a small embedding (tied: the output too, its scale made up by the final norm), so the
#: residual stream is the layers' work, not the input token's row (which, as large as the
#: layers' outputs, made a random model predict its input token with certainty)
EMBED_STD = 0.002
#: llama.cpp on the issue's files (teacher-forced, same method): mean |Δ log-prob|, argmax agreement
LLAMA_CPP = {"Q4_K_M": (0.187, 0.89), "Q8_0": (0.116, 0.91), "F16": (0.005, 1.00)}
#: LlamaDesk before this change, from the issue (auto dtype, F16 computed in bfloat16)
BEFORE = {"Q4_K_M": (0.092, 0.88), "Q8_0": (0.079, 0.95), "F16": (0.080, 0.94)}


def model_args(quick: bool, layers: int | None = None):
    from core.model.args import ModelArgs
    if quick:
        return ModelArgs(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=1024, hidden_dim=512,
                         max_seq_len=256, rope_theta=500000.0, tie_word_embeddings=True)
    return ModelArgs(dim=2048, n_layers=layers or 16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                     hidden_dim=8192, max_seq_len=2048, rope_theta=500000.0, tie_word_embeddings=True)


# --------------------------------------------------------------------------- Q4_K (gguf has no quantizer)

def q4_k_blocks(x: np.ndarray) -> np.ndarray:
    """A float [rows, cols] matrix as Q4_K blocks (min/max per 32 weights; 6-bit scales
    and mins under fp16 d and dmin per 256), laid out as ``gguf`` dequantizes them."""
    rows, cols = x.shape
    b = x.astype(np.float32).reshape(-1, 8, 32)  # [blocks, sub-blocks, 32]
    lo = np.minimum(b.min(-1), 0)
    scale = (b.max(-1) - lo) / 15
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = ((-lo).max(-1) / 63).astype(np.float16)
    df, dmf = (np.where(v == 0, 1, v).astype(np.float32)[:, None] for v in (d, dmin))
    sc = np.clip(np.round(scale / df), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / dmf), 0, 63).astype(np.uint8)
    step = np.where(sc == 0, 1, sc).astype(np.float32) * df  # [blocks, 8]
    q = np.clip(np.round((b + (mn * dmf)[..., None]) / step[..., None]), 0, 15).astype(np.uint8)
    s = np.empty((b.shape[0], 12), np.uint8)  # the 12 scale bytes (inverse of gguf_blocks._k_scales)
    s[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    s[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    q = q.reshape(-1, 4, 2, 32)  # chunk of 64: low nibbles hold its first 32, high its last 32
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), s, qs], 1)
    return out.reshape(rows, -1)


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the layers Q4_K_M gives Q6_K for attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(mix: str, gguf_name: str, n_layers: int) -> str:
    if mix != "Q4_K_M":
        return mix
    if gguf_name == "token_embd.weight":
        return "Q6_K"
    if gguf_name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits(int(gguf_name.split(".")[1]), n_layers):
        return "Q6_K"
    return "Q4_K"


# --------------------------------------------------------------------------- the files

def specs(args) -> list[tuple[str, tuple[int, ...], float]]:
    """(Meta name, shape, std) of each tensor of the random model; std 0 means ones (norms),
    a negative std a constant (the final norm: logits = norm(h) * g @ E.T have std
    ~g * EMBED_STD * sqrt(dim), so g sets them to LOGIT_STD)."""
    resid = 0.02 / (2 * args.n_layers) ** 0.5
    kv = args.n_kv_heads * args.head_dim
    out = [("tok_embeddings.weight", (args.vocab_size, args.dim), EMBED_STD)]
    for i in range(args.n_layers):
        p = f"layers.{i}."
        out += [(p + "attention.wq.weight", (args.dim, args.dim), 0.02), (p + "attention.wk.weight", (kv, args.dim), 0.02),
                (p + "attention.wv.weight", (kv, args.dim), 0.02), (p + "attention.wo.weight", (args.dim, args.dim), resid),
                (p + "feed_forward.w1.weight", (args.hidden_dim, args.dim), 0.02),
                (p + "feed_forward.w2.weight", (args.dim, args.hidden_dim), resid),
                (p + "feed_forward.w3.weight", (args.hidden_dim, args.dim), 0.02),
                (p + "attention_norm.weight", (args.dim,), 0.0), (p + "ffn_norm.weight", (args.dim,), 0.0)]
    return out + [("norm.weight", (args.dim,), -LOGIT_STD / (EMBED_STD * args.dim ** 0.5))]


def tensor(index: int, shape: tuple[int, ...], std: float, seed: int = 0) -> np.ndarray:
    """One tensor of the random model (the same on every call)."""
    if std <= 0:
        return np.full(shape, -std if std else 1.0, np.float32)
    return np.random.default_rng([seed, index]).standard_normal(shape, np.float32) * np.float32(std)


def _encoded(x: np.ndarray, kind: str):
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    from tests.core.checkpoints.util import q6_k_blocks
    if x.ndim != 2:
        return x, None
    if kind == "F16":
        return x.astype(np.float16), None
    data = {"Q4_K": q4_k_blocks, "Q6_K": q6_k_blocks}.get(kind, lambda a: quantize(a, Q[kind]))(x)
    return data, Q[kind]


def write_file(path: Path, args, mix: str) -> Path:
    """The model as a GGUF of ``mix`` (streamed: one tensor in memory at a time)."""
    import gguf

    from core.checkpoints.gguf import gguf_name
    from core.checkpoints.gguf_write import add_llama_params
    from tests.core.checkpoints.util import sp_vocab
    if path.exists():
        return path
    tmp = Path(str(path) + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    add_llama_params(w, args, f"bench-fidelity {mix}", "Q4_K" if mix == "Q4_K_M" else mix)
    tokens, scores, types = sp_vocab()
    extra = range(len(tokens), args.vocab_size)  # one piece per row, so every id decodes
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens + [f"\u2581w{i}" for i in extra])
    w.add_token_scores(scores + [-float(i) for i in extra])
    w.add_token_types(types + [1] * len(extra))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    plan = specs(args)
    for meta, shape, _ in plan:  # the tensor infos first: shapes, types, sizes (from one row)
        data, raw = _encoded(np.zeros((1, *shape[1:]) if len(shape) == 2 else shape, np.float32),
                             tensor_type(mix, gguf_name(meta), args.n_layers))
        nbytes = data.nbytes * (shape[0] if len(shape) == 2 else 1)
        w.add_tensor_info(gguf_name(meta), (shape[0], data.shape[1]) if raw is not None else shape, data.dtype,
                          nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (meta, shape, std) in enumerate(plan):
        w.write_tensor_data(_encoded(tensor(i, shape, std), tensor_type(mix, gguf_name(meta), args.n_layers))[0])
    w.close()
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- one case per process

def sequence(vocab: int) -> list[int]:
    """BOS and random ids: a 32-token prompt and the 63 forced tokens after it."""
    import torch
    return [1] + torch.randint(3, vocab, (PROMPT + STEPS - 2,), generator=torch.Generator().manual_seed(1)).tolist()


def _status_mb(key: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return None


def exact_case(file: Path) -> dict:
    """The reference: gguf-dequantized float32 weights, one plain float32 forward."""
    import torch

    from core.checkpoints import load
    lm = load(file, device="cpu", dtype="float32")
    seq = sequence(lm.args.vocab_size)
    with torch.no_grad():
        lp = torch.log_softmax(lm.model(torch.tensor([seq]))[0, PROMPT - 1:].double(), -1)
    top = lp.max(-1)
    return {"tops": top.indices.tolist(), "lp": top.values.tolist(), "p_top": top.values.exp().mean().item()}


def engine_case(file: Path, dtype: str, tops: list[int]) -> dict:
    """The engine's modules as a reply runs them: the prompt in one forward, then one decode
    step per forced token against the KV cache; log-probs of exact's first choices."""
    import torch

    from core.checkpoints import load
    from core.model.kv_cache import KVCache
    t0 = time.perf_counter()
    lm = load(file, device="cpu", dtype=dtype)
    load_s = time.perf_counter() - t0
    seq = sequence(lm.args.vocab_size)
    cache = KVCache.for_model(lm.model, capacity=len(seq))
    with torch.no_grad():
        out = [lm.model(torch.tensor([seq[:PROMPT]]), 0, cache, last_only=True)[0, -1]]
        t = time.perf_counter()
        for i in range(PROMPT, len(seq)):
            out.append(lm.model(torch.tensor([[seq[i]]]), i, cache)[0, -1])
        decode_s = time.perf_counter() - t
    lp = torch.log_softmax(torch.stack(out).double(), -1)
    idx = torch.tensor(tops)[:, None]
    return {"lp": lp.gather(1, idx)[:, 0].tolist(), "argmax": lp.argmax(-1).tolist(), "dtype": lm.info["dtype"],
            "paths": lm.info.get("linear_paths"), "load_s": load_s, "decode_tok_s": (len(seq) - PROMPT) / decode_s,
            "peak_rss_mb": _status_mb("VmHWM")}


def _child(mode: str, file: Path, dtype: str = "auto", tops: list[int] | None = None, threads: int = 1,
           in_process: bool = False, env: dict | None = None) -> dict:
    if in_process and not env:  # quick: the plumbing only (peak RSS then says nothing per case)
        return exact_case(file) if mode == "exact" else engine_case(file, dtype, tops or [])
    cmd = [sys.executable, __file__, "--child", mode, "--file", str(file), "--dtype", dtype, "--threads", str(threads)]
    out = subprocess.run(cmd, input=json.dumps(tops or []), capture_output=True, text=True, cwd=ROOT, check=False,
                         env={**os.environ, **(env or {})})
    if out.returncode:
        raise RuntimeError(f"{mode} {file.name} {dtype} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(exact: dict, got: dict) -> dict:
    delta = np.abs(np.array(got["lp"]) - np.array(exact["lp"]))
    agree = float(np.mean(np.array(got["argmax"]) == np.array(exact["tops"])))
    return {"mean_abs_dlogprob": float(delta.mean()), "argmax_agreement": agree}


# --------------------------------------------------------------------------- the table

#: (row label, file type, dtype[, environment]): the default path on every file, the torch
#: path it takes without compiled kernels, and on F16 what auto did before
NO_KERNELS = {"LLAMADESK_KERNELS": "0"}
CASES = (("auto", "F16", "auto"), ("auto", "Q8_0", "auto"), ("auto", "Q4_K_M", "auto"),
         ("auto without kernels (LLAMADESK_KERNELS=0)", "F16", "auto", NO_KERNELS),
         ("auto without kernels (LLAMADESK_KERNELS=0)", "Q8_0", "auto", NO_KERNELS),
         ("auto without kernels (LLAMADESK_KERNELS=0)", "Q4_K_M", "auto", NO_KERNELS),
         ("before: float32 (auto on this CPU's probe)", "F16", "float32"),
         ("before: bfloat16 (auto where the probe picks bf16, e.g. AMX)", "F16", "bfloat16"))


def measure(files: dict[str, Path], threads: int, in_process: bool = False) -> list[dict]:
    rows = []
    for t, f in files.items():
        exact = _child("exact", f, threads=threads, in_process=in_process)
        for label, kind, dtype, *env in CASES:
            if kind != t:
                continue
            got = _child("engine", f, dtype, exact["tops"], threads, in_process, *env)
            rows.append({"type": t, "path": label, **compare(exact, got), "p_top": exact["p_top"],
                         **{k: got[k] for k in ("dtype", "paths", "load_s", "decode_tok_s", "peak_rss_mb")},
                         "file_mb": f.stat().st_size / 2 ** 20})
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    out = [f"Llama-3.2-1B-shaped random model (dim {meta['dim']}, {meta['layers']} layers, vocab {meta['vocab']}, "
           f"tied), files written here by our writer (no llama.cpp quantizer installed); {PROMPT}-token prompt, "
           f"{STEPS} teacher-forced positions, {meta['threads']} thread(s), one process per case; load average "
           f"{meta['load']}. Δ: |log-prob engine − log-prob exact| of exact's first choice; exact's first choice "
           f"holds {rows[0]['p_top']:.0%} on average (peaked like a trained model). llama.cpp and 'issue' columns: "
           "issue 24's measurements on its llama.cpp-quantized files (context only: not this run, not these files).", "",
           "| file | LlamaDesk path | compute | mean \\|Δ log-prob\\| | argmax = exact | decode tok/s (forced) | "
           "peak RSS MB | file MB | llama.cpp (issue) | LlamaDesk before (issue) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lc, bf = LLAMA_CPP.get(r["type"]), BEFORE.get(r["type"])
        ctx = lambda v: f"{v[0]:.3f}, {v[1]:.0%}" if v and r["path"] == "auto" else ""  # noqa: E731
        out.append(f"| {r['type']} | {r['path']} | {r['dtype']} | {r['mean_abs_dlogprob']:.4f} | "
                   f"{r['argmax_agreement']:.0%} | {r['decode_tok_s']:.1f} | {r['peak_rss_mb']:.0f} | "
                   f"{r['file_mb']:.0f} | {ctx(lc)} | {ctx(bf)} |")
    return "\n".join(out)


def run(quick: bool = False, layers: int | None = None, work: Path | None = None, threads: int = 1,
        types: tuple[str, ...] = TYPES, **_) -> dict:
    """Measure and return {"title", "markdown", "data"} (for ``python -m bench``)."""
    args = model_args(quick, layers)
    work = Path(work or (tempfile.mkdtemp(prefix="bench-fidelity-") if quick else ROOT / "bench" / "work"))
    work.mkdir(parents=True, exist_ok=True)
    stem = f"fidelity-d{args.dim}-l{args.n_layers}-v{args.vocab_size}"
    files = {t: write_file(work / f"{stem}-{t}.gguf", args, t) for t in types}
    load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"
    rows = measure(files, threads, in_process=quick)
    meta = {"dim": args.dim, "layers": args.n_layers, "vocab": args.vocab_size, "threads": threads, "load": load,
            "quick": quick}
    return {"title": "Fidelity: distance from the file's exact forward, per GGUF type",
            "markdown": markdown(rows, meta), "data": {"meta": meta, "rows": rows}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=("exact", "engine"))
    ap.add_argument("--file", type=Path)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="default 16 (quick: 2)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES), help="which files (default all)")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    if a.child == "exact":
        print(json.dumps(exact_case(a.file)))
        return
    if a.child == "engine":
        print(json.dumps(engine_case(a.file, a.dtype, json.loads(sys.stdin.read()))))
        return
    res = run(a.quick, a.layers, a.work, a.threads, tuple(a.types))
    print(f"## {res['title']}\n\n{res['markdown']}")
    if a.json:
        a.json.write_text(json.dumps(res["data"], indent=1))


if __name__ == "__main__":
    main()
