"""llama.cpp as a benchmark peer without compiling it: node-llama-cpp ships llama.cpp's CPU
build prebuilt (`cd bench/peers && npm ci`, ~30 MB, needs Node.js 20+), where
llama-cpp-python compiles llama.cpp for 30+ minutes on a small machine.

One node process per measurement (as each engine gets its own process in the benches); it
prints one JSON object: load, prefill and decode times, greedy tokens, and resident memory
(peak, and what the load and the run added above node's own start, which is the fair part
to set beside a Python process's growth).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

PEERS = Path(__file__).resolve().parent / "peers"
SCRIPT = PEERS / "llamacpp.mjs"
PACKAGE = PEERS / "node_modules" / "node-llama-cpp" / "package.json"


def available() -> tuple[bool, str]:
    """Whether the node peer can run here, and why not."""
    if shutil.which("node") is None:
        return False, "Node.js is not installed (the llama.cpp peer runs through node-llama-cpp)"
    if not PACKAGE.is_file():
        return False, f"node-llama-cpp is not installed: cd {PEERS} && npm ci"
    return True, ""


def version() -> str:
    try:
        return json.loads(PACKAGE.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return "?"


def measure(file: Path | str, prompt: list[int], decode: int, threads: int, *, ctx: int | None = None,
            top: int = 0, timeout: float = 900) -> dict:
    """Load ``file`` in llama.cpp, prefill ``prompt`` (all but its last id), then ``decode``
    greedy tokens; with ``top`` > 0 each token's ``top`` most likely ids and probabilities.

    Keys as bench_quant's: load_s, ttft_after_load_s, prefill_tok_s, decode_tok_s, tokens,
    peak_rss_mb, load_rss_growth_mb, run_rss_growth_mb.
    """
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    job = {"model": str(Path(file).resolve()), "prompt": [int(i) for i in prompt], "decode": int(decode),
           "threads": int(threads), "ctx": int(ctx or len(prompt) + decode + 16), "top": int(top)}
    out = subprocess.run(["node", str(SCRIPT), json.dumps(job)], capture_output=True, text=True, cwd=PEERS,
                         timeout=timeout, env={**os.environ, "NODE_NO_WARNINGS": "1", "NLC_VERSION": version()},
                         check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"llama.cpp (node) failed on {Path(file).name}: {(out.stderr or out.stdout).strip()[-400:]}")
    r = json.loads(lines[-1])
    return {**r, "ttft_after_load_s": r["ttft_s"],
            "rss_after_load_mb": r["load_rss_mb"],
            "load_rss_growth_mb": r["load_rss_mb"] - r["base_rss_mb"],
            "run_rss_growth_mb": r["peak_rss_mb"] - r["base_rss_mb"]}

