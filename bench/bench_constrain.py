"""Constrained generation: what the grammar mask costs per decoded token.

Two measurements, each at a 32k (Llama 2 SentencePiece) and a 128k (Llama 3 tiktoken)
vocabulary with the real tokenizers from the fixtures:

1. The mask alone: llguidance computing one bitmask row per lane for a JSON schema
   (states taken along a real JSON output), plus the sampler's apply_bitmask, per step,
   for 1 and 8 lanes.
2. End to end through the real Engine: the Llama 3-shaped ~0.3B random model of
   bench.common decoding N tokens with and without the schema (stop tokens off, so both
   decode the same number of tokens), plain and constrained runs interleaved, medians.
   The overhead is (constrained - plain) / plain decode time per token; goal <= 10%.

    python bench/bench_constrain.py [--quick] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import llama_args, median_of, random_model  # noqa: E402
from core.engine.constrain import Vocabulary, fill_masks, new_bitmask  # noqa: E402
from core.engine.constraint import Constraint
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done
from core.engine.sampling import apply_bitmask  # noqa: E402
from core.engine.settings import SamplingParams

SCHEMA = {"type": "object", "required": ["items"], "properties": {"items": {"type": "array", "items": {
    "type": "object", "required": ["name", "score"],
    "properties": {"name": {"type": "string"}, "score": {"type": "number"}, "tags": {"type": "array",
                                                                                     "items": {"type": "string"}}}}}}}
# The same with at least 16 items: a random model cannot close it early, so every decode
# run has the same length.
OPEN_SCHEMA = {**SCHEMA, "properties": {"items": {**SCHEMA["properties"]["items"], "minItems": 16}}}
# A valid output the mask states are taken along (the mask costs differ inside strings,
# numbers and between keys).
SAMPLE = ('{"items": [{"name": "first entry", "score": 12.5, "tags": ["a", "bc"]}, '
          '{"name": "second one here", "score": -3, "tags": []}]}')


def _tokenizers(quick: bool):
    from core.tokenizer import load_tokenizer
    if quick:
        from core.checkpoints import load
        lm = load(ROOT / "tests" / "fixtures" / "stories260K.gguf", device="cpu", dtype="float32")
        return [("512 (stories260K, quick)", lm.tokenizer)]
    fixtures = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
    out = []
    for label, name in (("32k (Llama 2)", "llama2-tokenizer.model"), ("128k (Llama 3)", "llama3-tokenizer.model")):
        if not (fixtures / name).exists():
            raise SystemExit(f"bench_constrain needs {fixtures / name}")
        out.append((label, load_tokenizer(fixtures / name)))
    return out


def mask_alone(tok, lanes: int, reps: int) -> dict:
    """Seconds per step to fill ``lanes`` mask rows (states along SAMPLE) and apply them."""
    V = tok.vocab_size
    vocab = Vocabulary(tok, V)
    t0 = time.perf_counter()
    lltok = vocab.lltokenizer()
    setup = time.perf_counter() - t0
    c = Constraint("json_schema", json.dumps(SCHEMA))
    t0 = time.perf_counter()
    vocab.check(c)
    compile_s = time.perf_counter() - t0
    ids = lltok.tokenize_str(SAMPLE)
    states = [vocab.start(c, tok.stop_ids) for _ in range(lanes)]
    bitmask = new_bitmask(lanes, V)
    logits = torch.randn(lanes, V)
    fill, apply = [], []
    held = list(enumerate(states))
    for t in ids:
        # Once per step, as decoding does (a repeated call at the same state is cheaper).
        t0 = time.perf_counter()
        fill_masks(held, bitmask)
        fill.append(time.perf_counter() - t0)
        apply.append(median_of(lambda: apply_bitmask(logits, bitmask), reps))
        for st in states:
            assert st.advance(t)
    return {"setup_s": setup, "compile_s": compile_s, "steps": len(ids),
            "fill_ms": statistics.median(fill) * 1e3, "fill_p90_ms": sorted(fill)[int(0.9 * len(fill))] * 1e3,
            "apply_ms": statistics.median(apply) * 1e3}


def end_to_end(tok, quick: bool, lanes: int, rounds: int, new_tokens: int) -> dict:
    """Decode seconds per token of the real Engine, plain and constrained, interleaved."""
    V = tok.vocab_size
    model = random_model(llama_args(quick, V))
    engine = Engine(model, tok, stop_ids=[])
    prompt = [tok.bos_id if tok.bos_id is not None else 1] + tok.encode("Give the list as JSON:")
    c = Constraint("json_schema", json.dumps(OPEN_SCHEMA))

    def run(constraint) -> float:
        params = [SamplingParams(temperature=1.0, top_p=0.95, seed=i, max_new_tokens=new_tokens,
                                 constraint=constraint) for i in range(lanes)]
        done = [e for e in engine.generate_lanes(prompt, params) if isinstance(e, Done)]
        # minItems keeps a random model's JSON open, so every lane decodes new_tokens.
        assert all(d.stop_reason == "length" for d in done), [d.stop_reason for d in done]
        return max(d.stats.decode_s for d in done) / (new_tokens - 1)

    run(c)  # warm: builds the vocabulary, compiles the schema
    run(None)
    plain, held = [], []
    for _ in range(rounds):
        plain.append(run(None))
        held.append(run(c))
    p, h = statistics.median(plain), statistics.median(held)
    return {"plain_ms_per_token": p * 1e3, "constrained_ms_per_token": h * 1e3, "overhead": (h - p) / p,
            "params": sum(x.numel() for x in model.parameters())}


def run(quick: bool = False, threads: int | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    reps = 2 if quick else 5
    rounds, new_tokens = (1, 8) if quick else (3, 24)
    data, rows = {}, []
    for label, tok in _tokenizers(quick):
        d = data[label] = {}
        for lanes in (1, 8):
            m = mask_alone(tok, lanes, reps)
            e = end_to_end(tok, quick, lanes, rounds, new_tokens)
            mask_share = (m["fill_ms"] + m["apply_ms"]) / e["plain_ms_per_token"]
            d[f"{lanes}_lanes"] = {**m, **e, "mask_share": mask_share}
            rows.append(f"| {label} | {lanes} | {m['compile_s'] * 1e3:.1f} ms | {m['fill_ms']:.3f} ms "
                        f"(p90 {m['fill_p90_ms']:.3f}) | {m['apply_ms']:.3f} ms | {e['plain_ms_per_token']:.1f} ms | "
                        f"**{mask_share * 100:.2f}%** | {e['constrained_ms_per_token']:.1f} ms | "
                        f"{e['overhead'] * 100:+.1f}% |")
        d["tokenizer_setup_s"] = m["setup_s"]
    worst = max(v["mask_share"] for d in data.values() for k, v in d.items() if k.endswith("_lanes"))
    md = [f"llguidance {_version()} masks for a JSON schema (nested objects, arrays, strings, numbers), "
          f"states taken along a {len(SAMPLE)}-character valid output; mask = computing the lanes' rows of "
          f"the step's bitmask, timed once per step as decoding does; apply = the sampler's -inf fill from it "
          f"(median of {reps}); medians over the steps. Decode: the Llama 3-shaped random model (~0.3B parameters at 128k) "
          f"through the real Engine, {new_tokens} tokens, top-p 0.95, stop tokens off, plain and constrained "
          f"runs interleaved, median of {rounds}; the lanes decode as one batch. "
          f"(mask + apply) / step: what the constraint adds to a decode step, as a share of the plain step; "
          f"end-to-end share = (constrained - plain) / plain decode time, which on a shared machine is "
          f"within run-to-run noise. Goal: <= 10% at 128k.", "",
          "| vocabulary | lanes | schema compile | mask per step | apply per step | plain decode / step | "
          "(mask + apply) / step | constrained decode / step | end-to-end share |",
          "|---|---|---|---|---|---|---|---|---|", *rows, "",
          "Tokenizer setup (once per model, on the first constrained request): " + ", ".join(
              f"{label} {d['tokenizer_setup_s']:.2f} s" for label, d in data.items()) + ". "
          f"Largest (mask + apply) share this run: {worst * 100:.2f}%. The mask's cost is per step, not per "
          "parameter: for a model larger than this one its share is smaller still."]
    return {"title": "Constrained generation: mask cost (`bench/bench_constrain.py`)", "markdown": "\n".join(md),
            "data": data}


def _version() -> str:
    try:
        import llguidance
        return llguidance.__version__
    except Exception:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    out = run(a.quick, a.threads)
    print(out["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
