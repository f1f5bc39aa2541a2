"""Prefill: run a prompt through one KV cache row, in pieces small enough for cancel.

A prompt runs in chunks sized from the measured speed so that cancel (checked between
chunks) lands within ~PREFILL_TARGET_S. On CPU-packed weights a long prompt runs layer by
layer instead: each layer's weights are dequantized once per prompt, not once per chunk.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from core.model import quant
from core.model.memory import release_freed_heap
from core.model.kv_cache import KVCache

#: cancel should land within this many seconds of a prefill; chunks are sized to it
PREFILL_TARGET_S = 0.08
MIN_PREFILL_CHUNK = 16
#: most prompt tokens one layer-by-layer prefill pass holds (its hidden states stay in memory)
LAYERED_PASS = 4096


def cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


class Prefill:
    """Prefills rows of ``cache`` for ``model``, learning its speed as it goes.

    Args:
        chunk: most prompt tokens per forward pass.
        use_threads: sets torch's threads for the prefill phase before each pass.
    """

    def __init__(self, model, cache: KVCache, *, chunk: int, use_threads: Callable[[], None]):
        self.model, self.cache, self.chunk = model, cache, chunk
        self.use_threads = use_threads
        self.tok_s: float | None = None  # measured, sizes the next chunks
        self.layer_tok_s: float | None = None  # the same for one layer (layered prefill)
        self.packed = bool(quant.packed_on_cpu(model, dense_only=False))

    @property
    def device(self) -> torch.device:
        return self.model.tok_embeddings.weight.device

    def row(self, row: int, prompt: list[int], cancel) -> tuple[torch.Tensor | None, int]:
        """Run prompt through row's cache, reusing what the row holds.

        Returns:
            (last logits [V] or None when cancelled, number of reused tokens).
        """
        reuse = self.cache.reusable_prefix(row, prompt)
        self.cache.tokens[row] = list(prompt[:reuse])
        view = self.cache.row(row)
        logits = None
        pos = reuse
        while pos < len(prompt):
            if cancelled(cancel):
                return None, reuse
            if self.packed and len(prompt) - pos >= quant.DENSE_ROWS:
                n = min(len(prompt) - pos, LAYERED_PASS)
                logits = self.layered(prompt[pos:pos + n], pos, view, cancel)
                if logits is None:
                    return None, reuse
            else:
                n = min(len(prompt) - pos, self.chunk_size())
                logits = self._chunk(prompt[pos:pos + n], pos, view)
            pos += n
            self.cache.tokens[row] = list(prompt[:pos])
        return logits, reuse

    def _chunk(self, chunk: list[int], pos: int, view) -> torch.Tensor:
        x = torch.tensor([chunk], device=self.device)
        self.use_threads()
        t = time.perf_counter()
        logits = self.model(x, pos, view, last_only=True)[0, -1]
        if self.device.type == "cpu":  # elsewhere the time would measure the launch only
            dt = time.perf_counter() - t
            if dt > 0:
                rate = len(chunk) / dt
                self.tok_s = rate if self.tok_s is None else 0.5 * (self.tok_s + rate)
        return logits

    def layered(self, tokens: list[int], start: int, view, cancel) -> torch.Tensor | None:
        """Prefill ``tokens`` at ``start`` one layer at a time: each layer's packed weights
        are dequantized to bfloat16 once (:func:`core.model.quant.dense_weights`) and run over
        every chunk of the prompt, so chunks stay small enough for cancel to land within
        ~PREFILL_TARGET_S (now one layer's share of a chunk) while each weight is unpacked
        once per prompt instead of once per chunk, and multiplied by dense bfloat16 kernels
        that run ~10x faster per row than the packed ones.

        Returns the last position's logits [V], or None when cancelled (the rows' tokens
        are then left as they were: the positions written are not counted as cached).
        """
        m = self.model
        self.use_threads()
        h = m.tok_embeddings(torch.tensor([tokens], device=self.device))
        for layer in m.layers:
            if cancelled(cancel):
                return None
            with quant.dense_weights(layer, cancel):
                a = 0
                while a < len(tokens):
                    if cancelled(cancel):
                        return None
                    b = min(len(tokens), a + self.layer_chunk())
                    t = time.perf_counter()
                    rope, mask, pos = m.positions(h[:, a:b], start + a, view)
                    h[:, a:b] = layer(h[:, a:b], rope, mask, view, pos)
                    dt = time.perf_counter() - t
                    if dt > 0:
                        rate = (b - a) / dt
                        self.layer_tok_s = rate if self.layer_tok_s is None else 0.5 * (self.layer_tok_s + rate)
                    a = b
            release_freed_heap()  # glibc would keep the layer's freed bf16 copies resident
        return m.output(m.norm(h[:, -1:])).float()[0, -1]

    def layer_chunk(self) -> int:
        """Tokens per step of a layered prefill: what one layer runs in PREFILL_TARGET_S."""
        if self.layer_tok_s is None:
            return min(self.chunk, 4 * MIN_PREFILL_CHUNK)
        return min(self.chunk, max(MIN_PREFILL_CHUNK, round(self.layer_tok_s * PREFILL_TARGET_S)))

    def chunk_size(self) -> int:
        """Prompt tokens per prefill forward: what the measured speed runs in
        PREFILL_TARGET_S (so cancel lands within ~0.1 s), capped by ``chunk``; the first
        chunk of a model is small, to measure it."""
        if self.tok_s is None:
            return min(self.chunk, 4 * MIN_PREFILL_CHUNK)
        return min(self.chunk, max(MIN_PREFILL_CHUNK, round(self.tok_s * PREFILL_TARGET_S)))

    def take_best_row(self, r0: int, prompt: list[int]) -> None:
        """Copy into row ``r0`` the free row (r0 and after) that holds the longest start of
        ``prompt``: after a comparison each surviving lane's row keeps its reply, so a
        branch from any of them reuses its tokens, not only row 0's."""
        best, most = r0, self.cache.reusable_prefix(r0, prompt)
        for r in range(r0 + 1, self.cache.batch):
            n = self.cache.reusable_prefix(r, prompt)
            if n > most:
                best, most = r, n
        if best != r0:
            self.cache.copy_row(best, r0, most)
