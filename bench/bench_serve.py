"""Serving under load: 1, 4, 16 and 32 concurrent streaming clients against ``serve``,
and ``serve`` beside llama.cpp's own server (and llama-cpp-python's) on the same file.

Each client sends one streaming /v1/completions request; we measure aggregate generated
tokens per second (all tokens / wall time from the first request to the last reply) and
time to first token (TTFT) p50 / p99 as the clients see it. Batched decoding should make
16 clients cost far less than 16x one: the goal is aggregate tok/s at 16 clients >= 4x
that of one client. Runs on the fixture story model (260K parameters) and a random
~125M Llama, with the server in this process on loopback (its own HTTP and engine
threads) and the clients on an asyncio loop. Levels are interleaved and repeated; the
median of each is reported, with ratios taken within the same run.

The side-by-side part (:func:`peer_section`, ``--peers`` alone) runs every server as its own
process (``python -m core serve``, ``llama-server`` and ``python -m llama_cpp.server`` from
the ``bench`` extra, bench/llamacpp_server.py) at 1, 16 and 32 clients on stories260K and
on a Llama 3-shaped 128k-vocabulary F16 file written here.

    python bench/bench_serve.py [--quick] [--threads N] [--peers] [--json FILE]
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

from bench import bench_invariance, llamacpp_server  # noqa: E402
from core.checkpoints.common import LoadedModel  # noqa: E402
from core.model.transformer import Transformer  # noqa: E402
from core.model.args import ModelArgs  # noqa: E402
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


async def level(url: str, clients: int, prompts, tokens: int, client=one_client) -> dict:
    import httpx
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(client(http, url, prompts[i % len(prompts)], tokens, t0)
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


# --------------------------------------------------------------------------- against llama.cpp's servers

PEER_LEVELS = (1, 16, 32)
EOS = 2  # both files' end-of-sequence id: banned, so every client of every server does the same work
PEER_NOTE = ("Each server is its own process on loopback, started on the same GGUF file with the same thread "
             "count (`serve --threads T`, `llama-server -t T -tb T`), slots (`--max-batch S`, `-np S`) and "
             "per-request context (llama-server's unified KV cache holds S × the context serve gives every "
             "request); the clients are streaming /v1/completions requests (text prompt, temperature 1, "
             "top-p 0.95, seed, end of text banned by logit_bias) on an asyncio loop in the bench process. "
             "Servers take turns level by level, round by round (interleaved); medians of the rounds' "
             "aggregate tok/s, TTFT percentiles over every client of every round; a server's CPU time (all its "
             "threads, /proc) per token generated, over every round.")


class LlamaDeskServer(llamacpp_server.PeerServer):
    """``python -m core serve FILE`` in its own process, as a user starts it (dtype auto)."""
    name = "LlamaDesk serve"
    cwd = ROOT  # this checkout's core, not an installed one

    def command(self) -> list[str]:
        return [sys.executable, "-m", "core", "serve", self.model, "--port", str(self.port),
                "--threads", str(self.threads), "--max-batch", str(self.slots), *self.extra]

    def env(self) -> dict:
        return {k: v for k, v in os.environ.items() if k not in ("LLAMADESK_API_KEY", "LLAMADESK_THREADS")}


async def stream_one(http, url: str, prompt, tokens: int, t_start: float) -> tuple[float, int]:
    """(TTFT seconds, tokens generated) of one streaming request to any OpenAI-style server:
    tokens from the usage the last chunk carries, else one per chunk with text."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 1.0, "top_p": 0.95, "seed": 1, "stream": True,
            "logit_bias": {str(EOS): -100}, "stream_options": {"include_usage": True}}
    ttft, chunks, used = None, 0, None
    async with http.stream("POST", url + "/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            d = json.loads(line[5:])
            used = (d.get("usage") or {}).get("completion_tokens", used)
            if (d.get("choices") or [{}])[0].get("text"):
                chunks += 1
                ttft = ttft if ttft is not None else time.perf_counter() - t_start
    return ttft, used if used is not None else chunks


def llama3_shaped_file(work: Path) -> Path:
    """A random Llama 3-shaped F16 GGUF: 128,256-token vocabulary, tied embeddings, GQA (4 KV
    heads of 64), RoPE theta 500k; 8 layers of dim 768 (~150M parameters, 2/3 of them the
    vocabulary) so 32 clients finish in seconds on two cores. Written once into ``work``."""
    from bench import bench_fidelity
    args = ModelArgs(dim=768, n_layers=8, n_heads=12, n_kv_heads=4, vocab_size=128256, hidden_dim=2048,
                     max_seq_len=2048, rope_theta=500000.0, tie_word_embeddings=True)
    work.mkdir(parents=True, exist_ok=True)
    return bench_fidelity.write_file(work / "serve-llama3-shaped-d768-l8-F16.gguf", args, "F16")


def start_servers(file: Path, threads: int, slots: int, peers: tuple[str, ...], variants: dict | None = None) -> dict:
    """{name: started server}: LlamaDesk's first (its context sizes the others'), then
    ``variants`` ({name: extra serve options}), then the peers."""
    import httpx
    servers: dict = {}
    try:
        servers["LlamaDesk"] = LlamaDeskServer(file, threads=threads, slots=slots, timeout=300).start()
        for name, extra in (variants or {}).items():
            servers[name] = LlamaDeskServer(file, threads=threads, slots=slots, extra=extra, timeout=300).start()
        card = httpx.get(servers["LlamaDesk"].url + "/models", timeout=30).json()["data"][0]
        ctx = int(card["max_model_len"])
        if "llama.cpp" in peers:
            servers["llama.cpp"] = llamacpp_server.LlamaServer(file, threads=threads, ctx=ctx, slots=slots,
                                                               timeout=300).start()
        if "llama-cpp-python" in peers:  # one request at a time; queued, not cut off
            servers["llama-cpp-python"] = llamacpp_server.LlamaCppPythonServer(
                file, threads=threads, ctx=ctx, extra=("--interrupt_requests", "False"), timeout=300).start()
    except Exception:
        for srv in servers.values():
            srv.stop()
        raise
    return servers


def compare_servers(file: Path, prompts, tokens: int, repeats: int, threads: int, levels=PEER_LEVELS,
                    peers: tuple[str, ...] = ("llama.cpp",), variants: dict | None = None) -> dict:
    """Every server at every level, interleaved; per server and level the median aggregate
    tok/s and TTFT p50/p99, with the load average before each round."""
    servers = start_servers(file, threads, max(levels), peers, variants)
    runs = {(name, n): [] for name in servers for n in levels}
    loads = []
    try:
        for srv in servers.values():
            asyncio.run(level(srv.url, 2, prompts, 4, stream_one))  # warm-up
        for _ in range(repeats):
            loads.append(os.getloadavg()[0])
            for n in levels:
                for name, srv in servers.items():
                    c0 = cpu_seconds(srv.proc.pid)
                    r = asyncio.run(level(srv.url, n, prompts, tokens, stream_one))
                    r["cpu_s"] = cpu_seconds(srv.proc.pid) - c0
                    runs[(name, n)].append(r)
                    print(f"{file.name}: {name} {n} clients {r['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
        loads.append(os.getloadavg()[0])
    finally:
        for srv in servers.values():
            srv.stop()
    out = {"servers": list(servers), "load": loads, "levels": {}}
    for n in levels:
        row = out["levels"][n] = {}
        for name in servers:
            rs = runs[(name, n)]
            ttfts = [t for r in rs for t in r["ttft"]]
            row[name] = {"tok_s": statistics.median(r["tok_s"] for r in rs), "ttft_p50_s": pct(ttfts, 50),
                         "ttft_p99_s": pct(ttfts, 99),
                         "cpu_ms_per_token": sum(r["cpu_s"] for r in rs) * 1000 / (len(rs) * n * tokens)}
    return out


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) process ``pid`` has used, from /proc (Linux;
    0 elsewhere): what a server spends per token, whatever the machine's load lets it run."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peer_markdown(data: dict) -> str:
    res = data["models"]
    names = list(dict.fromkeys(x for r in res.values() for x in r["servers"]))  # LlamaDesk first
    peers = [x for x in names if not x.startswith("LlamaDesk")]  # the ratios: plain serve against each peer
    head = ["model", "clients", *(f"{n} tok/s" for n in names), *(f"× {p}" for p in peers),
            *(f"{n} TTFT p50 / p99" for n in names), *(f"{n} CPU ms/token" for n in names)]
    lines = [f"{data['tokens_per_request']} new tokens per streaming request, {data['threads']} thread(s) per "
             f"server, {data['repeats']} interleaved round(s); load average (1 min) "
             + "; ".join(f"{m}: {' → '.join(f'{x:.1f}' for x in r['load'])}" for m, r in res.items()) + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, r in res.items():
        for n, row in r["levels"].items():
            cells = [model, str(n), *(f"{row[x]['tok_s']:.1f}" if x in row else "—" for x in names),
                     *(f"{row['LlamaDesk']['tok_s'] / row[p]['tok_s']:.2f}" if p in row else "—" for p in peers),
                     *(f"{row[x]['ttft_p50_s'] * 1000:.0f} / {row[x]['ttft_p99_s'] * 1000:.0f} ms" if x in row
                       else "—" for x in names),
                     *(f"{row[x]['cpu_ms_per_token']:.2f}" if x in row else "—" for x in names)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", PEER_NOTE])


def peer_section(quick: bool = False, threads: int = 1, repeats: int | None = None, work: Path | None = None,
                 peers: tuple[str, ...] = ("llama.cpp", "llama-cpp-python")) -> dict:
    """LlamaDesk's serve beside llama.cpp's llama-server (and llama-cpp-python's server) on
    stories260K and a Llama 3-shaped 128k-vocabulary file. ``quick``: stories260K, 1 and 4
    clients, 8 tokens, llama-server only (the plumbing, in seconds)."""
    title = "Serving beside llama.cpp's server: the same file, threads and slots"
    why = llamacpp_server.why_not()
    if why:
        return {"title": title, "markdown": f"Not measured: {why}.", "data": {"why_not": why}}
    tokens, repeats = (8, 1) if quick else (32, repeats or 3)
    levels = (1, 4) if quick else PEER_LEVELS
    data = {"threads": threads, "tokens_per_request": tokens, "repeats": repeats, "models": {}}
    stories = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures")) / "stories260K.gguf"
    if not stories.exists():
        stories = ROOT / "tests" / "fixtures" / "stories260K.gguf"
    texts = [f"Once upon a time {w}" for w in ("there", "a cat", "Lily", "in a park", "the sun", "Tom", "a big dog", "Mom")]
    data["models"]["stories260K"] = compare_servers(stories, texts, tokens, repeats, threads, levels,
                                                    ("llama.cpp",) if quick else peers)
    if not quick:  # the 128k vocabulary: llama-cpp-python's one-at-a-time server would take minutes here
        words = [" ".join(f"w{300 + (k * 131 + j * 17) % 120000}" for k in range(32)) for j in range(8)]
        file = llama3_shaped_file(Path(work or ROOT / "bench" / "work"))
        # the same file with its F16 matrices widened at load: what the float16 kernels cost
        data["models"]["Llama 3-shaped 128k F16"] = compare_servers(
            file, words, tokens, repeats, threads, levels, ("llama.cpp",),
            {"LlamaDesk --dtype float32": ("--dtype", "float32")})
    return {"title": title, "markdown": peer_markdown(data), "data": data}


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
    if quick:  # four server processes and two files: minutes, not the suite's seconds
        lines += ["", "Beside llama.cpp's server: not in --quick (`python bench/bench_serve.py --peers`)."]
    else:
        peers = peer_section(threads=data["threads"])
        data["peers"] = peers["data"]
        lines += ["", f"**{peers['title']}**", "", peers["markdown"]]
    inv = bench_invariance.run(quick)  # what the default batch-invariant decode step costs
    data["invariance"] = inv["data"]
    lines += ["", f"**{inv['title']}** (`bench/bench_invariance.py`)", "", inv["markdown"]]
    return {"title": "Serving: concurrent streaming clients", "markdown": "\n".join(lines), "data": data}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--peers", action="store_true",
                    help="only serve beside llama.cpp's servers (each in its own process, --threads each)")
    ap.add_argument("--json", type=Path, default=None, help="also write the section's data here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = (peer_section(a.quick, a.threads, a.repeats) if a.peers else run(quick=a.quick, repeats=a.repeats))
    print(res["markdown"])
    if a.json:
        a.json.write_text(json.dumps(res["data"], indent=1))


if __name__ == "__main__":
    main()
