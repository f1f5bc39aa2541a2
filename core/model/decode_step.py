"""The engine's decode step: eager, through ``torch.compile``, or a fixed-shape step on a
static KV cache captured as CUDA graphs, falling back to eager once, with the reason.

On CUDA, ``compile`` means the static path: the cache is preallocated (its capacity only
changes when a conversation outgrows it), positions and the attention mask are tensors,
and nothing in the step reads a value back to the host, so ``mode="reduce-overhead"``
records one CUDA graph per batch size (lanes) and capacity and replays it every token. On
the CPU, ``compile`` compiles the ordinary step with dynamic shapes (the cache grows every
step); the static step runs there too (eager or compiled) when asked, which is how it is
tested without a GPU. Prefill always stays eager: its length varies.
"""
from __future__ import annotations

import time

import torch

from core.model.kv_cache import KVCache, StaticRows


def static_step(model, tokens: torch.Tensor, pos: torch.Tensor, k: list[torch.Tensor],
                v: list[torch.Tensor]) -> torch.Tensor:
    """Logits [B, 1, V] of tokens [B, 1] at positions pos [B], against the first B rows of
    the caches k, v (whole capacity): the same shapes every step, no host reads."""
    B = tokens.shape[0]
    rows = StaticRows([t[:B] for t in k], [t[:B] for t in v])
    return model(tokens, pos, rows, last_only=True)


def _counter(group: str, name: str) -> int:
    from torch._dynamo.utils import counters  # dynamo takes seconds to import: only once compiling
    return int(counters[group][name])


class DecodeStep:
    """Runs decode steps for an Engine and says which path ran (``status``).

    Args:
        model: the Transformer.
        compile: False, True (inductor), or a torch.compile backend (its name or itself).
        static: decode on the static cache with fixed shapes; None: when compiling on CUDA.
    """

    def __init__(self, model, compile: bool | str = False, static: bool | None = None):
        self.model = model
        dev = model.tok_embeddings.weight.device
        # A backend: "inductor" for True, else its name or the callable itself.
        self.backend = None if compile is False else "inductor" if compile is True else compile
        self.static = bool(static) if static is not None else (bool(compile) and dev.type == "cuda")
        self.graphs = self.static and dev.type == "cuda" and self.backend == "inductor"
        self._seen: dict[tuple, int] = {}
        self._fn = None
        self.warmup_s = 0.0  # seconds spent compiling or recording (kept out of decode speed)
        if self.backend is None:
            self.status = "eager: compile is off" + (" (static cache)" if self.static else "")
            return
        name = self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "custom")
        what = name + (", CUDA graphs" if self.graphs else ", static cache" if self.static else "")
        try:
            if self.static:
                import torch._dynamo.config as dynamo_config  # start-up time: dynamo only when compiling
                # One graph per lanes count and cache size: serving up to 16 rows at a few
                # sizes passes dynamo's default of 8 recompiles, after which it would
                # quietly run the step eagerly.
                dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
                mode = {"mode": "reduce-overhead"} if self.graphs else {}
                self._fn = torch.compile(static_step, dynamic=False, backend=self.backend, **mode)
            else:
                # dynamic: the cache length grows every step; one graph serves them all.
                self._fn = torch.compile(model, dynamic=True, backend=self.backend)
            self.status = f"compiles at the first decode step ({what})"
        except Exception as e:  # no compiler on this platform, unknown backend, ...
            self.status = f"eager: torch.compile unavailable ({type(e).__name__}: {e})"[:300]
        self._what = what

    def __call__(self, x: torch.Tensor, pos, cache: KVCache) -> torch.Tensor:
        """Logits [B, 1, V] of x [B, 1] at ``pos`` (an int shared by all rows, or [B])."""
        if self.static:
            if not cache.static_addresses:
                cache.mark_static()
            if not isinstance(pos, torch.Tensor):
                pos = torch.full((x.shape[0],), pos, dtype=torch.long)
            pos = pos.to(x.device, non_blocking=True)
            self.model.rope(cache.capacity)  # grown here, never inside a captured step
        if self._fn is not None:
            key = (x.shape[0], cache.capacity)
            seen = self._seen.get(key, 0)
            t0 = time.perf_counter()
            graphs_before = _counter("stats", "unique_graphs")  # (the first call imports dynamo)
            skips_before = _counter("inductor", "cudagraph_skips")
            try:
                if self.graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                    # The graph's output buffer is overwritten by the next replay: copy it.
                    out = self._fn(self.model, x, pos, cache.k, cache.v).clone()
                elif self.static:
                    out = self._fn(self.model, x, pos, cache.k, cache.v)
                else:
                    out = self._fn(x, pos, cache, last_only=True)
            except Exception as e:  # compiling or capturing failed: the step runs eagerly below
                self._fn = None
                self.status = f"eager: compiling failed ({type(e).__name__}: {e})"[:300]
                self.warmup_s += time.perf_counter() - t0  # the attempt was not decoding either
            else:
                self._seen[key] = seen + 1
                compiled = _counter("stats", "unique_graphs") > graphs_before
                # CUDA graph trees run a new shape once to warm up, then record it.
                if compiled or (self.graphs and seen < 2):
                    if x.device.type == "cuda":
                        torch.cuda.synchronize(x.device)
                    self.warmup_s += time.perf_counter() - t0
                if self.graphs and _counter("inductor", "cudagraph_skips") > skips_before:
                    self.status = "compiled (inductor; CUDA graphs skipped, see the log)"
                elif self.status.startswith("compiles"):
                    self.status = f"compiled ({self._what})"
                return out
        if self.static:
            return static_step(self.model, x, pos, cache.k, cache.v)
        return self.model(x, pos, cache, last_only=True)
