"""Serving under load: 1, 4, 16 and 32 concurrent streaming clients against ``serve``.

Each client sends one streaming /v1/completions request; we measure aggregate generated
tokens per second (all tokens / wall time from the first request to the last reply) and
time to first token (TTFT) p50 / p99 as the clients see it. Batched decoding should make
16 clients cost far less than 16x one: the goal is aggregate tok/s at 16 clients >= 4x
that of one client. Runs on the fixture story model (260K parameters) and a random
~125M Llama, with the server in this process on loopback (its own HTTP and engine
threads) and the clients on an asyncio loop. Levels are interleaved and repeated; the
median of each is reported, with ratios taken within the same run.

    python bench/bench_serve.py [--quick] [--threads N]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_invariance  # noqa: E402
from core.checkpoints.common import LoadedModel  # noqa: E402
from core.model.transformer import Transformer  # noqa: E402
from core.model.args import ModelArgs
from core.serving.run import RunningServer  # noqa: E402
from core.serving.state import ServerState  # noqa: E402

LEVELS = (1, 4, 16, 32)


class _NoStopTokenizer:
    """Enough of a tokenizer for a random model: no stop ids; every token is "x"."""
    stop_ids: set = set()
    add_dummy_prefix = False

    def token_bytes(self, i):
        return b"x"

    def decode(self, ids):
        return "x" * len(ids)

    def encode(self, text, **kw):  # requests here carry no logit bias by text
        return []


def random_model(small: bool = False) -> LoadedModel:
    """A random ~125M Llama (or a ~10M one for a quick run)."""
    torch.manual_seed(0)
    if small:
        args = ModelArgs(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=32000, hidden_dim=768,
                         max_seq_len=2048)
    else:
        args = ModelArgs(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, vocab_size=32000, hidden_dim=2048,
                         max_seq_len=2048)
    model = Transformer(args).eval().requires_grad_(False)
    info = {"name": "random-10M" if small else "random-125M", "dtype": "float32", "device": "cpu"}
    return LoadedModel(model, _NoStopTokenizer(), SimpleNamespace(name="raw", stop_ids=frozenset), args, set(), info)


def fixture_model() -> LoadedModel | None:
    path = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures")) / "stories260K.gguf"
    if not path.exists():
        return None
    from core.checkpoints import load
    lm = load(path, device="cpu", dtype="float32")
    lm.stop_ids = set()  # no early end of story: every client does the same work
    return lm


async def one_client(http, url: str, prompt, tokens: int, t_start: float) -> tuple[float, int]:
    """(TTFT seconds, tokens received) of one streaming request."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 1.0, "top_p": 0.95, "seed": 1,
            "stream": True, "return_token_ids": True}
    ttft, n = None, 0
    async with http.stream("POST", url + "/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            c = json.loads(line[5:])["choices"][0]
            if c.get("token_ids"):
                n += len(c["token_ids"])
                if ttft is None:
                    ttft = time.perf_counter() - t_start
    return ttft, n


async def level(url: str, clients: int, prompts, tokens: int) -> dict:
    import httpx
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one_client(http, url, prompts[i % len(prompts)], tokens, t0)
                                     for i in range(clients)))
        wall = time.perf_counter() - t0
    total = sum(n for _, n in res)
    assert total == clients * tokens, (total, clients, tokens)
    return {"tok_s": total / wall, "ttft": [t for t, _ in res], "wall_s": wall}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def bench_model(lm: LoadedModel, prompts, tokens: int, repeats: int) -> dict:
    state = ServerState(lm, max_batch=max(LEVELS))
    with RunningServer(state) as srv:
        asyncio.run(level(srv.url, 2, prompts, 4))  # warm-up
        runs = {n: [] for n in LEVELS}
        for _ in range(repeats):
            for n in LEVELS:  # interleaved, so drift on a shared machine hits every level alike
                runs[n].append(asyncio.run(level(srv.url, n, prompts, tokens)))
    out = {}
    for n, rs in runs.items():
        ttfts = [t for r in rs for t in r["ttft"]]
        out[n] = {"tok_s": statistics.median(r["tok_s"] for r in rs), "ttft_p50_s": pct(ttfts, 50),
                  "ttft_p99_s": pct(ttfts, 99)}
    for n in LEVELS:
        out[n]["x_one_client"] = out[n]["tok_s"] / out[1]["tok_s"]
    return out


def run(quick: bool = False, repeats: int | None = None) -> dict:
    """Both models at 1, 4, 16 and 32 clients, then the cost of batch invariance;
    ``{"title", "markdown", "data"}``. ``quick``: 8 tokens, one run, and a ~10M random model
    instead of the 125M one (seconds, not minutes)."""
    tokens, repeats = (8, 1) if quick else (48, repeats or 2)
    data = {"threads": torch.get_num_threads(), "tokens_per_request": tokens, "repeats": repeats, "models": {}}
    lm = fixture_model()
    if lm is not None:
        prompts = [lm.tokenizer.encode(f"Once upon a time {w}", bos=True)
                   for w in ("there", "a cat", "Lily", "in a park", "the sun", "Tom", "a big dog", "Mom")]
        data["models"]["stories260K"] = bench_model(lm, prompts, tokens, repeats)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 32000, (32,), generator=g).tolist() for _ in range(8)]
    small = random_model(small=quick)
    data["models"][small.info["name"]] = bench_model(small, prompts, tokens, repeats)
    lines = [f"{tokens} new tokens per streaming request, median of {repeats} interleaved runs, "
             f"{data['threads']} torch threads, server and clients in one process on loopback.", "",
             "| model | clients | aggregate tok/s | × one client | TTFT p50 | TTFT p99 |",
             "|---|---|---|---|---|---|"]
    for name, res in data["models"].items():
        for n in LEVELS:
            r = res[n]
            lines.append(f"| {name} | {n} | {r['tok_s']:.1f} | {r['x_one_client']:.2f} | "
                         f"{r['ttft_p50_s'] * 1000:.0f} ms | {r['ttft_p99_s'] * 1000:.0f} ms |")
    lines += ["", "Goal: aggregate tok/s at 16 clients ≥ 4× one client."]
    inv = bench_invariance.run(quick)  # what the default batch-invariant decode step costs
    data["invariance"] = inv["data"]
    lines += ["", f"**{inv['title']}** (`bench/bench_invariance.py`)", "", inv["markdown"]]
    return {"title": "Serving: concurrent streaming clients", "markdown": "\n".join(lines), "data": data}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(run(quick=a.quick, repeats=a.repeats)["markdown"])


if __name__ == "__main__":
    main()
