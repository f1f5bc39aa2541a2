"""The GPU table in one prepared script (< 8 minutes on one GPU): ``python bench/gpu.py [--out DIR]``.

An 8B-shaped random Llama (Llama 3 8B's shapes: dim 4096, 32 layers, GQA 32/8, FFN 14336,
vocabulary 128,256) on the first CUDA device, through the real Engine path:

- the device's read bandwidth, measured here (sum of an 8 GiB buffer, CUDA events);
- decode tok/s in bfloat16, int8 and int4 (weight-only, core.model.quant), each as a share of
  the bandwidth floor for the bytes its weights take;
- bfloat16 decode again with CUDA graphs (Engine(compile=True): a static KV cache, the step
  captured once by torch.compile's reduce-overhead mode and replayed every token), as a
  ratio to the eager decode measured in the same run, with the compile/capture time;
- prefill tok/s (512 tokens) in bfloat16;
- the cost of 4 comparison lanes (top-p) against one lane;
- transformers' LlamaForCausalLM (bfloat16, generate()) on the same GPU and shapes.

Writes gpu.json and gpu.md into --out (default: the current folder) and prints the table.
Stages that fail (out of memory, a missing kernel) are recorded with their error; the
others still run.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done
from core.model.transformer import Transformer  # noqa: E402
from core.model.args import ModelArgs
from core.engine.settings import SamplingParams  # noqa: E402
from core.model.tuning import median_seconds  # noqa: E402

GB = 1e9
ARGS_8B = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, hidden_dim=14336,
               max_seq_len=8192, rope_theta=500000.0)
SMALL = dict(ARGS_8B, dim=256, n_layers=2, n_heads=8, n_kv_heads=2, hidden_dim=512)
SHAPE = ARGS_8B


class IdTokenizer:
    """Enough of a tokenizer for the Engine when the Llama 3 fixture is not on this machine."""
    kind, source = "ids", "bench"
    vocab_size = ARGS_8B["vocab_size"]
    bos_id, eos_id, pad_id = 128000, 128001, None
    stop_ids: set[int] = set()
    special_tokens: dict[str, int] = {}
    add_dummy_prefix = False

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        return []  # the bench sends ids, never text (the Engine asks only for logit-bias text)

    def token_bytes(self, i: int) -> bytes:
        return f"<{i}>".encode()

    def decode(self, ids) -> str:
        return "".join(f"<{i}>" for i in ids)

    def id_to_piece(self, i: int) -> str:
        return f"<{i}>"


def tokenizer():
    fixtures = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
    if (fixtures / "llama3-tokenizer.model").exists():
        from core.tokenizer import load_tokenizer
        return load_tokenizer(fixtures / "llama3-tokenizer.model")
    return IdTokenizer()


def cuda_time(fn, repeats: int) -> float:
    """Median seconds of fn() on the GPU (CUDA events, after a warm-up)."""
    if not torch.cuda.is_available():  # --cpu-dry-run
        return median_seconds(fn, repeats)
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def bandwidth(dev, gib: float = 8) -> float:
    n = int(gib * 2**30)
    x = torch.ones(n // 2, dtype=torch.bfloat16, device=dev)
    s = cuda_time(lambda: x.sum(dtype=torch.float32), 10)
    del x
    _empty_cache()
    return n / s / GB


def _empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def weight_bytes(model) -> int:
    """Bytes a decode step reads: weights and packed buffers, less the embedding table."""
    n = 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if "tok_embeddings" not in name:
            n += t.numel() * t.element_size()
    return n


def build(dev) -> Transformer:
    torch.manual_seed(0)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            model = Transformer(ModelArgs(**SHAPE))
    finally:
        torch.set_default_dtype(saved)
    with torch.no_grad():  # peaked next-token distributions, as a trained model has
        model.output.weight.mul_(4.0 / (0.02 * SHAPE["dim"] ** 0.5))
    return model.eval()


def quantized(model: Transformer, kind: str, dev) -> Transformer:
    from core.model.pack import packable, quantizer
    from core.model.quant import swap_linear
    q = copy.deepcopy(model)
    for name, p in list(q.named_parameters()):
        if p.dim() == 2 and name != "tok_embeddings.weight" and packable(kind, tuple(p.shape), dev) is None:
            swap_linear(q, name, quantizer(kind)(p.data, dev))
    gc.collect()
    _empty_cache()
    return q


def decode(engine: Engine, prompt, lanes) -> list[Done]:
    return [e for e in engine.generate_lanes(prompt, lanes) if isinstance(e, Done)]


def engine_figures(model, tok, prompt, n_new, floor_bw, compile: bool = False) -> dict:
    eng = Engine(model, tok, stop_ids=set(), max_context=len(prompt) + n_new + 8, compile=compile)
    greedy = SamplingParams(temperature=0, max_new_tokens=n_new)
    # Warm-up; compiled, with the whole prompt, so the static cache already has the size
    # the measured runs use (each new size is a new capture).
    t0 = time.perf_counter()
    warm = decode(eng, prompt if compile else prompt[:16], [SamplingParams(temperature=0, max_new_tokens=4)])
    warm_s = time.perf_counter() - t0
    runs = []
    for _ in range(3):
        eng.cache.reset()
        runs.append(decode(eng, prompt, [greedy])[0].stats)
    tps = statistics.median(s.decode_tok_s for s in runs)
    wb = weight_bytes(model)
    out = {"decode_tok_s": tps, "ttft_s": statistics.median(s.ttft_s for s in runs), "weight_gb": wb / GB,
           "floor_tok_s": floor_bw * GB / wb, "floor_share": tps * wb / (floor_bw * GB)}
    if compile:
        out.update(decode_path=eng.compile_status, warmup_s=warm_s, capture_s=warm[0].stats.warmup_s,
                   recaptured_in_runs_s=sum(s.warmup_s for s in runs))
    del eng
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--no-graphs", action="store_true",
                    help="skip the CUDA-graphs decode stage (it compiles the model: a minute or more)")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="a tiny model on the CPU: checks the script's plumbing without a GPU")
    return ap.parse_args()


def prefill_tok_s(model, dev: torch.device, prompt: list[int]) -> float:
    from core.model.kv_cache import KVCache
    ids = torch.tensor([prompt], device=dev)
    cache = KVCache.for_model(model, capacity=len(prompt) + 1)
    with torch.inference_mode():
        s = cuda_time(lambda: model(ids, 0, cache, last_only=True), 3)
    return len(prompt) / s


def lanes_figures(model, tok, prompt: list[int], new_tokens: int) -> dict:
    eng = Engine(model, tok, stop_ids=set(), max_context=len(prompt) + new_tokens + 8)
    one = [SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=new_tokens, seed=0)]
    four = [SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=new_tokens, seed=i) for i in range(4)]
    decode(eng, prompt[:16], one)
    t1 = statistics.median(decode(eng, prompt, one)[0].stats.decode_tok_s for _ in range(2))
    t4 = statistics.median(statistics.median(d.stats.decode_tok_s for d in decode(eng, prompt, four))
                           for _ in range(2))
    return {"one_lane_tok_s": t1, "four_lanes_tok_s_per_lane": t4, "step_cost_vs_one": t1 / t4}


def graphs_figures(model, tok, prompt: list[int], new_tokens: int, bw: float, dev: torch.device,
                   res: dict) -> dict:
    if dev.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device (skipped in the CPU dry run)")
    import torch._dynamo
    torch._dynamo.reset()
    r = engine_figures(model, tok, prompt, new_tokens, bw, compile=True)
    eager = res.get("bf16", {}).get("decode_tok_s")
    r["vs_eager"] = r["decode_tok_s"] / eager if eager else None
    return r


def hf_decode(dev: torch.device, prompt: list[int], new_tokens: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList
    cfg = LlamaConfig(vocab_size=SHAPE["vocab_size"], hidden_size=SHAPE["dim"],
                      intermediate_size=SHAPE["hidden_dim"], num_hidden_layers=SHAPE["n_layers"],
                      num_attention_heads=SHAPE["n_heads"], num_key_value_heads=SHAPE["n_kv_heads"],
                      max_position_embeddings=SHAPE["max_seq_len"], rope_theta=SHAPE["rope_theta"])
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            m = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(saved)
    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if scores.is_cuda:
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return scores
    ids = torch.tensor([prompt], device=dev)
    out = []
    for _ in range(2):
        stamps.clear()
        with torch.inference_mode():
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([Stamp()]))
        out.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return {"decode_tok_s": out[-1]}


def write_report(res: dict, errors: dict[str, str], a: argparse.Namespace, bw: float, t_start: float) -> None:
    res["errors"] = errors
    res["seconds"] = time.perf_counter() - t_start
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu.json").write_text(json.dumps(res, indent=2, default=str))
    md = [f"GPU: {res['device']}, torch {res['torch']}; read bandwidth {bw:.0f} GB/s (measured in this run); "
          f"{a.prompt_tokens}-token prompt, {a.new_tokens} greedy tokens through the Engine.", "",
          "| weights | decode tok/s | bytes/token | floor tok/s | share of floor | TTFT |", "|---|---|---|---|---|---|"]
    for kind in ("bf16", "int8", "int4"):
        r = res.get(kind)
        if r:
            md.append(f"| {kind} | {r['decode_tok_s']:.1f} | {r['weight_gb']:.1f} GB | {r['floor_tok_s']:.1f} | "
                      f"{r['floor_share']:.0%} | {r['ttft_s'] * 1e3:.0f} ms |")
        else:
            md.append(f"| {kind} | failed: {errors.get(kind, '?')[:80]} | | | | |")
    if "bf16" in res and "int4" in res:
        md.append(f"\nint4 / bf16 decode: {res['int4']['decode_tok_s'] / res['bf16']['decode_tok_s']:.2f}x (goal >= 2.5x).")
    g = res.get("bf16_cuda_graphs")
    if g:
        vs = f"{g['vs_eager']:.2f}x eager bf16 in this run" if g.get("vs_eager") else "no eager figure to compare"
        md.append(f"\nbf16 with CUDA graphs ({g['decode_path']}): {g['decode_tok_s']:.1f} tok/s, {vs}, "
                  f"{g['floor_share']:.0%} of the floor; compiling and capturing took {g['warmup_s']:.0f} s "
                  f"before the first token.")
    elif "bf16_cuda_graphs" in errors:
        md.append(f"\nbf16 with CUDA graphs: failed: {errors['bf16_cuda_graphs'][:120]}")
    if "bf16_prefill_tok_s" in res:
        md.append(f"Prefill (bf16, {a.prompt_tokens} tokens): {res['bf16_prefill_tok_s']:.0f} tok/s.")
    if "lanes" in res:
        md.append(f"4 top-p lanes: each step costs {res['lanes']['step_cost_vs_one']:.2f}x one lane's.")
    if "transformers_bf16" in res and "bf16" in res:
        t = res["transformers_bf16"]["decode_tok_s"]
        md.append(f"transformers generate() bf16: {t:.1f} tok/s; LlamaDesk / transformers: "
                  f"{res['bf16']['decode_tok_s'] / t:.2f}x.")
    md.append(f"\nWhole script: {res['seconds']:.0f} s.")
    (a.out / "gpu.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def main() -> int:
    a = parse_args()
    global SHAPE
    if a.cpu_dry_run:
        SHAPE = SMALL
        a.prompt_tokens, a.new_tokens = min(a.prompt_tokens, 32), min(a.new_tokens, 8)
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA device; none is available here", file=sys.stderr)
        return 2
    else:
        dev = torch.device("cuda")
    t_start = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (dry run)"
    res: dict = {"device": name, "torch": torch.__version__,
                 "shape": SHAPE, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens}
    errors: dict[str, str] = {}

    def stage(name, fn):
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # record and go on: one missing kernel must not lose the table
            errors[name] = f"{type(e).__name__}: {e}"[:500]
        print(f"[{time.perf_counter() - t_start:6.1f} s] {name}: {res.get(name, errors.get(name))} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        gc.collect()
        _empty_cache()

    stage("bandwidth_gb_s", lambda: bandwidth(dev, 0.25 if a.cpu_dry_run else 8))
    bw = res.get("bandwidth_gb_s", float("nan"))
    tok = tokenizer()
    g = torch.Generator().manual_seed(1)
    prompt = [int(t) for t in torch.randint(0, 128000, (a.prompt_tokens,), generator=g)]
    model = build(dev)

    stage("bf16", lambda: engine_figures(model, tok, prompt, a.new_tokens, bw))
    stage("bf16_prefill_tok_s", lambda: prefill_tok_s(model, dev, prompt))
    stage("lanes", lambda: lanes_figures(model, tok, prompt, a.new_tokens))

    for kind in ("int8", "int4"):
        def run_kind(kind=kind):
            q = quantized(model, kind, dev)
            try:
                return engine_figures(q, tok, prompt, a.new_tokens, bw)
            finally:
                del q
        stage(kind, run_kind)

    if not a.no_graphs:
        stage("bf16_cuda_graphs", lambda: graphs_figures(model, tok, prompt, a.new_tokens, bw, dev, res))

    del model
    gc.collect()
    _empty_cache()

    stage("transformers_bf16", lambda: hf_decode(dev, prompt, a.new_tokens))

    write_report(res, errors, a, bw, t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
