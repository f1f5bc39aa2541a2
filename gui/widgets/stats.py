"""One line (or three) of facts about a reply or a lane, shared by the chat and the comparison.

``format_stats`` says tokens, time to first token, speed, which decode path ran, cached prompt
tokens, stop reason and seed, plus drafting and (for lanes) log-prob, perplexity, distinct-n.
"""
from __future__ import annotations

import math

from core.engine.lanes import draft_name


def decode_label(status: str) -> str:
    """A few words for the status bar from the engine's ``compile_status``: "CUDA graphs",
    "compiled", "compiling…" (before the first step), "eager (compile failed)"; "" when
    compiling was not asked for."""
    if not status or status.startswith("eager: compile is off"):
        return ""
    if status.startswith("compiled"):
        return "CUDA graphs" if "CUDA graphs)" in status else "compiled"
    if status.startswith("compiles"):
        return "compiling…"
    if not status.startswith("eager"):  # a server's lanes ran one after another (core.remote.runner.SERIAL)
        return status
    return "eager (compile failed)"


def format_stats(m: dict) -> str:
    """A reply's facts on one line: tokens, time to first token, tokens/s, stop reason, seed.

    ``m`` is a stored message (or one shaped like it: "stats", "stop_reason", "seed"). A
    compare lane's stats (core.engine.lanes.lane_stats) also carry mean log-prob, perplexity and
    distinct-n: those go on two more lines.
    """
    s = m.get("stats") or {}
    parts = []
    tokens = s.get("generated_tokens", s.get("tokens"))
    if tokens is not None:
        parts.append(f"{tokens} tokens")
    if s.get("ttft_s"):
        parts.append(f"TTFT {s['ttft_s'] * 1000:.0f} ms")
    rate = s.get("decode_tok_s") or s.get("tokens_per_s")
    if rate:
        parts.append(f"{rate:.1f} tok/s")
    if s.get("decode"):  # which compiled path decoded it (only when compiling was asked for)
        parts.append(decode_label(s["decode"]))
    if s.get("warmup_s"):  # compiling (or recording a graph) before decoding: not in TTFT or speed
        w = s["warmup_s"]
        parts.append(f"compile warm-up {w:.1f} s" if w >= 0.1 else f"compile warm-up {w * 1000:.0f} ms")
    if s.get("cached_tokens") and s.get("prompt_tokens"):  # the prompt's start came from the KV cache
        parts.append(f"{s['cached_tokens']}/{s['prompt_tokens']} prompt tokens cached")
    if m.get("stop_reason"):
        parts.append(f"stop: {m['stop_reason']}")
    beam = s.get("beam")
    if isinstance(beam, dict):  # beam search: no seed plays a part
        parts.append(f"beam {beam.get('rank')} of {beam.get('of')} (score {beam.get('score', 0.0):.3f})")
    elif m.get("seed") is not None:
        parts.append(f"seed {m['seed']}")
    lines = [" · ".join(parts)]
    sp = s.get("speculative")
    if sp and sp.get("kind") in ("lookup", "draft"):
        how = f"lookup {sp.get('lookup')}" if sp["kind"] == "lookup" else \
            f"draft {draft_name(sp['draft'])}" if isinstance(sp.get("draft"), str) and sp["draft"] else "draft model"
        line = f"speculative ({how}): {sp.get('acceptance', 0.0) * 100:.0f}% of {sp.get('drafted', 0)} drafted accepted"
        if sp.get("mean_draft"):
            line += f", {sp['mean_draft']:.1f} a step"
        if sp.get("speedup"):
            line += f" · ≈{sp['speedup']:.2f}× plain"
        lines.append(line)
    if "perplexity" in s:
        def num(v, fmt):
            return "–" if v is None else format(v, fmt)
        ppl = "∞" if s["perplexity"] == math.inf else num(s["perplexity"], ".2f")
        lines.append(f"mean log p {num(s.get('mean_logprob'), '.3f')} · perplexity {ppl}")
        lines.append(f"distinct-1 {num(s.get('distinct_1'), '.2f')} · distinct-2 {num(s.get('distinct_2'), '.2f')}")
    return "\n".join(lines)
