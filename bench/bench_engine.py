"""LlamaDesk's Engine against transformers on the same random Llama 3-shaped checkpoint.

Everything goes through the real :class:`core.engine.engine.Engine` path (filters, log-probs,
stream decoding, stop handling): decode tok/s is each request's own timed decode
(``Done.stats``, one run, not a difference of two runs), for greedy, top-p 0.9 and eight
top-p lanes; transformers runs ``generate()`` on the same weights, timed per token by a
logits processor. Runs are interleaved round by round; medians are reported, with each
figure as a share of the read-bandwidth floor. ``python -m bench`` includes this section;
alone:

    python bench/bench_engine.py [--quick] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (GB, LLAMA3_VOCAB, Engine, engine_run, llama3_tokenizer, llama_args, machine,  # noqa: E402
                          median_of, weight_bytes)
from core.engine.settings import SamplingParams  # noqa: E402

def hf_decode_tok_s(hf, prompt: list[int], n: int) -> tuple[float, float]:
    """(decode tok/s from one generate() call, time to first token) with greedy search."""
    from transformers import LogitsProcessor, LogitsProcessorList
    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.inference_mode():
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                    do_sample=False, logits_processor=LogitsProcessorList([Stamp()]), pad_token_id=0)
    ttft = stamps[0] - t0
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), ttft


def decode_rounds(eng: Engine, hf, prompt: list[int], n_new: int, reps: int, greedy: SamplingParams,
                  top_p: SamplingParams) -> dict:
    """Medians over ``reps`` interleaved rounds of every peer's decode tok/s and time to first token."""
    res: dict[str, list[float]] = {k: [] for k in ("greedy", "top_p", "lanes8", "hf", "ttft", "hf_ttft")}
    engine_run(eng, prompt, [greedy])  # warm-up
    for _ in range(reps):  # interleaved: every peer once per round
        eng.cache.reset()
        d = engine_run(eng, prompt, [greedy])[0]
        res["greedy"].append(d.stats.decode_tok_s)
        res["ttft"].append(d.stats.ttft_s)
        eng.cache.reset()
        res["top_p"].append(engine_run(eng, prompt, [top_p])[0].stats.decode_tok_s)
        eng.cache.reset()
        ds = engine_run(eng, prompt, [SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=n_new, seed=i)
                                      for i in range(8)])
        res["lanes8"].append(statistics.median(x.stats.decode_tok_s for x in ds))
        tps, ttft = hf_decode_tok_s(hf, prompt, n_new)
        res["hf"].append(tps)
        res["hf_ttft"].append(ttft)
    return {k: statistics.median(v) for k, v in res.items()}


def engine_section(quick: bool, threads: int, bandwidth: float) -> dict:
    from tests.helpers import meta_from_hf
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = llama3_tokenizer()
    V = LLAMA3_VOCAB
    a = llama_args(quick, V)
    cfg = LlamaConfig(vocab_size=V, hidden_size=a.dim, intermediate_size=a.hidden_dim,
                      num_hidden_layers=a.n_layers, num_attention_heads=a.n_heads,
                      num_key_value_heads=a.n_kv_heads, max_position_embeddings=a.max_seq_len,
                      rms_norm_eps=a.norm_eps, rope_theta=a.rope_theta, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(4.0 / (0.02 * a.dim ** 0.5))  # peaked distributions (see random_model)
    ours = meta_from_hf(hf)
    n_new = 8 if quick else 64
    prompt = [int(t) for t in torch.randint(0, 128000, (16 if quick else 128,),
                                             generator=torch.Generator().manual_seed(1))]
    eng = Engine(ours, tok, stop_ids=set(), max_context=a.max_seq_len)
    greedy = SamplingParams(temperature=0, max_new_tokens=n_new)
    top_p = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=n_new, seed=1)
    wb = weight_bytes(ours)
    reps = 1 if quick else 3
    m = decode_rounds(eng, hf, prompt, n_new, reps, greedy, top_p)
    m.update(step_costs(ours, eng, prompt, 3 if quick else 15))
    floor = bandwidth * GB / wb
    data = {"params": sum(p.numel() for p in ours.parameters()), "weight_bytes_per_token": wb,
            "prompt_tokens": len(prompt), "new_tokens": n_new, "rounds": reps, **m,
            "floor_tok_s": floor}
    md = [f"Random Llama 3-shaped model: dim {a.dim}, {a.n_layers} layers, heads {a.n_heads}/{a.n_kv_heads}, "
          f"FFN {a.hidden_dim}, vocabulary {V:,} ({data['params'] / 1e6:.0f}M parameters, float32, "
          f"{wb / 1e6:.0f} MB read per token); {len(prompt)}-token prompt, {n_new} new tokens, "
          f"median of {reps} interleaved rounds. Decode tok/s is each request's own timed decode "
          f"(`Done.stats`), through `Engine.generate_lanes`.", "",
          "| run | decode tok/s | vs greedy | share of read-bandwidth floor |", "|---|---|---|---|"]
    for label, key in (("LlamaDesk greedy", "greedy"), ("LlamaDesk top-p 0.9", "top_p"),
                       ("LlamaDesk 8 lanes top-p (per lane)", "lanes8"),
                       ("transformers generate() greedy", "hf")):
        md.append(f"| {label} | {m[key]:.1f} | {m[key] / m['greedy']:.2f}x | {m[key] / floor:.0%} |")
    md += ["", f"- Floor: {bandwidth:.1f} GB/s / {wb / 1e6:.0f} MB = {floor:.1f} tok/s.",
           f"- Top-p decode / greedy decode: **{m['top_p'] / m['greedy']:.2f}x** (goal >= 0.95x).",
           f"- 8 lanes: each step costs **{m['greedy'] / m['lanes8']:.2f}x** one greedy lane's step "
           f"(goal <= 1.3x of one lane).",
           f"- The same goals from per-step medians ({3 if quick else 15} steps each, steadier on a busy machine): "
           f"a forward step takes {m['step_1'] * 1e3:.1f} ms for one row and {m['step_8'] * 1e3:.1f} ms for eight "
           f"(**{m['step_8'] / m['step_1']:.2f}x**); choosing a token takes {m['pick_greedy'] * 1e3:.2f} ms greedy, "
           f"{m['pick_top_p'] * 1e3:.2f} ms top-p, {m['pick_top_p_8'] * 1e3:.2f} ms for eight top-p lanes; so top-p "
           f"decode runs at **{(m['step_1'] + m['pick_greedy']) / (m['step_1'] + m['pick_top_p']):.2f}x** greedy "
           f"and eight lanes cost **{(m['step_8'] + m['pick_top_p_8']) / (m['step_1'] + m['pick_top_p']):.2f}x** "
           "one top-p lane per step.",
           f"- LlamaDesk / transformers decode: **{m['greedy'] / m['hf']:.2f}x**; time to first token "
           f"{m['ttft'] * 1e3:.0f} ms vs {m['hf_ttft'] * 1e3:.0f} ms."]
    return {"title": "Engine decode vs transformers (float32 checkpoint)", "markdown": "\n".join(md), "data": data}




def step_costs(model, eng: Engine, prompt: list[int], reps: int) -> dict:
    """Median seconds of one decode forward (1 and 8 rows at the prompt's end) and of the
    engine's token choice on those logits (greedy, top-p, eight top-p lanes)."""
    from core.engine.sampling import choose_tokens, seeded_generator
    eng.cache.reset()
    list(eng.generate_lanes(prompt, [SamplingParams(temperature=0, max_new_tokens=1)] * 8))
    pos = len(prompt)
    out = {}
    with torch.inference_mode():
        for rows in (1, 8):
            x = torch.zeros(rows, 1, dtype=torch.long)
            out[f"step_{rows}"] = median_of(lambda: model(x, pos, eng.cache, last_only=True), reps)
        logits = model(torch.zeros(8, 1, dtype=torch.long), pos, eng.cache, last_only=True)[:, -1]
    for key, rows, q in (("pick_greedy", 1, SamplingParams(temperature=0)),
                         ("pick_top_p", 1, SamplingParams(temperature=0.8, top_p=0.9, seed=1)),
                         ("pick_top_p_8", 8, SamplingParams(temperature=0.8, top_p=0.9, seed=1))):
        gens = [seeded_generator(q) for _ in range(rows)]
        out[key] = median_of(lambda: choose_tokens(logits[:rows], [q] * rows, [None] * rows, gens), reps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bw = machine(a.quick, a.threads)["data"]["read_bandwidth_gb_s"]
    s = engine_section(a.quick, a.threads, bw)
    print(f"## {s['title']}\n\n{s['markdown']}")


if __name__ == "__main__":
    main()
