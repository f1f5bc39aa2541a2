"""Helpers the benchmark sections share: timing, the machine's read bandwidth, models."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.model.tuning import median_seconds as median_of  # noqa: F401  (the bench scripts' name)

ROOT = Path(__file__).resolve().parent.parent
GB = 1e9
LLAMA3_VOCAB = 128256




# --------------------------------------------------------------------------- machine

def read_bandwidth(quick: bool) -> float:
    """GB/s of the faster of two reads of a buffer far larger than the caches (a sum, and a
    matrix-vector product like a decode step's): the decode floor's denominator."""
    n = (64 if quick else 1024) * (1 << 20) // 4
    buf = torch.ones(n, dtype=torch.float32)
    mat, vec = buf.view(-1, 4096), torch.ones(4096)
    reps = 3 if quick else 7
    s = min(median_of(lambda: buf.sum(), reps), median_of(lambda: mat @ vec, reps))
    return n * 4 / s / GB


def machine(quick: bool, threads: int) -> dict:
    bw = read_bandwidth(quick)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    data = {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "read_bandwidth_gb_s": bw, "cuda": torch.cuda.is_available()}
    md = (f"- CPU: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; {threads} torch thread(s)\n"
          f"- Read bandwidth (sum or matrix-vector product over a {64 if quick else 1024} MiB float32 buffer, "
          f"{threads} thread(s), the faster): "
          f"**{bw:.1f} GB/s**; the decode floor below is bytes read per token at this rate\n"
          "- This machine is shared with other jobs: figures are medians, peers interleaved, "
          "ratios are the comparable numbers")
    return {"title": "Machine", "markdown": md, "data": data}


# --------------------------------------------------------------------------- models

def llama_args(quick: bool, vocab: int):
    from core.model.args import ModelArgs
    if quick:
        return ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=vocab, hidden_dim=128,
                         max_seq_len=1024, rope_theta=500000.0)
    # Llama 3-shaped (GQA 4:1, 128k vocabulary, theta 500k), ~0.3B parameters.
    return ModelArgs(dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, vocab_size=vocab, hidden_dim=3584,
                     max_seq_len=4096, rope_theta=500000.0)


def random_model(args, dtype=torch.float32, logit_std: float = 4.0, seed: int = 0):
    """A random Transformer whose next-token distributions are peaked like a trained model's
    (output weights scaled so logits have std ~logit_std: default init gives near-uniform
    distributions, which no trained model has and which would make top-p keep most of the
    vocabulary)."""
    from core.model.transformer import Transformer
    torch.manual_seed(seed)
    m = Transformer(args).eval()
    with torch.no_grad():
        m.output.weight.mul_(logit_std / (0.02 * args.dim ** 0.5))
    return m.to(dtype)


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every weight except the embedding table (gathered)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "tok_embeddings" not in n)


def fixture_tokenizer(name: str = "llama3-tokenizer.model"):
    """A tokenizer from the shared fixtures (``$LLAMADESK_FIXTURES`` or ``../shared/fixtures``)."""
    from core.tokenizer import load_tokenizer
    fixtures = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
    path = fixtures / name
    if not path.exists():
        raise SystemExit(f"bench needs the tokenizer fixture {name}: {path} is missing")
    return load_tokenizer(path)


def llama3_tokenizer():
    return fixture_tokenizer("llama3-tokenizer.model")


def engine_run(engine: Engine, prompt: list[int], lanes: list[SamplingParams]) -> list[Done]:
    """One request through the real Engine path; its Done events (their stats timed once)."""
    return [e for e in engine.generate_lanes(prompt, lanes) if isinstance(e, Done)]


