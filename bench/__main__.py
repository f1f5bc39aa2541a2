"""One benchmark entry point: ``python -m bench [--quick] [--out DIR] [--threads N]``.

Writes ``PERFORMANCE.md`` and ``performance.json`` (default: docs/). Every figure comes
from this run on this machine, through the real :class:`core.engine.engine.Engine` path
(filters, log-probs, stream decoding, stop handling); peers run in the same process,
interleaved, at the same thread count, and each decode figure is also given as a share of
the machine's read bandwidth measured here. ``--quick`` uses tiny models so the suite
can run it in seconds (its numbers mean nothing; it checks the plumbing).

Each section is ``run(quick, threads) -> {"title", "markdown", "data"}``; the GGUF files
against llama.cpp come from ``bench.bench_quant``; other modules' sections
(``bench.bench_serve``) are included when present.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_quant  # noqa: E402
from bench.bench_engine import engine_section  # noqa: E402
from bench.bench_sampler import sampler_section  # noqa: E402
from bench.common import machine  # noqa: E402

# --------------------------------------------------------------------------- GPU note and assembly

def gpu_section(quick: bool, threads: int) -> dict:
    if torch.cuda.is_available():
        md = ("A CUDA device is present: run `python bench/gpu.py` (one script, < 8 minutes) for the "
              "GPU table; this CPU run does not measure it.")
    else:
        md = ("**Unmeasured**: no CUDA device on this machine. `python bench/gpu.py` measures decode "
              "tok/s of an 8B-shaped random model in bfloat16/int8/int4 against the GPU's measured "
              "memory bandwidth, bfloat16 decode with CUDA graphs (`--compile`) against eager in the "
              "same run, prefill tok/s, 4-lane cost and transformers on the same GPU.")
    return {"title": "GPU", "markdown": md, "data": {"measured": False}}


EXTRA = ("bench.bench_files", "bench.bench_fidelity", "bench.bench_q6k", "bench.bench_serve", "bench.bench_speculative", "bench.bench_constrain",
         "bench.bench_tools", "bench.tool_validity")


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
    sections.append(sampler_section(a.quick, a.threads))  # bench/bench_sampler.py
    sections.append(engine_section(a.quick, a.threads, bw))  # bench/bench_engine.py
    if "bench_quant" in a.skip:
        sections.append({"title": "GGUF files (skipped)", "markdown": "Skipped in this run (`--skip bench_quant`).",
                         "data": {"skipped": True, "llama_cpp": False, "why_not": "skipped"}})
    else:  # bench/bench_quant.py: LlamaDesk (packed, dequantized) and llama.cpp, a process per case
        sections.append(bench_quant.run(a.quick, bandwidth=bw, threads=a.threads))
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
