"""The drafters of speculative decoding: what proposes the tokens the target verifies.

Prompt lookup (:class:`NgramIndex`) proposes the tokens that followed the latest earlier
occurrence of the context's last n-gram: cheap, and right whenever the reply repeats the
prompt (editing a given text, quoting code). A draft model (:class:`DraftModel`) is a
smaller model with the same vocabulary that samples a few tokens ahead, for several lanes
at once. How the drafts are verified and paced is :mod:`core.engine.speculative`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from core.tokenizer.fingerprint import tokenizer_fingerprint
from core.engine.sampling import draw, filter_rows
from core.engine.settings import SamplingParams
from core.errors import DraftModelError
from core.model.kv_cache import KVCache

DRAFT_PREFILL_CHUNK = 256  # draft-model catch-up tokens per forward (cancel lands between)
PROBE_TOKENS = 32  # latest tokens a probing draft model is checked against at most



class NgramIndex:
    """Prompt lookup over one lane's context (prompt and reply so far).

    Maps every m-gram (m = 1..n) to where its latest occurrence ended, so a proposal is
    a dictionary lookup; the context only ever grows by accepted tokens.
    """

    def __init__(self, n: int, context: list[int] = ()):
        self.n = int(n)
        self.maps: list[dict[tuple, int]] = [{} for _ in range(self.n)]
        self.ctx: list[int] = list(context)
        self._indexed = 0  # n-grams ending before this position are in the maps

    def extend(self, tokens: list[int]) -> None:
        self.ctx.extend(tokens)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest (then latest) earlier match of the
        context's last n..1 tokens; [] when there is none."""
        ctx, L = self.ctx, len(self.ctx)
        # The trailing n-gram is not indexed yet, so it cannot match itself.
        for end in range(max(self._indexed, 1), L):
            for m in range(1, min(self.n, end) + 1):
                self.maps[m - 1][tuple(ctx[end - m:end])] = end
        self._indexed = max(self._indexed, L)
        if k <= 0:
            return []
        for m in range(min(self.n, L), 0, -1):
            end = self.maps[m - 1].get(tuple(ctx[L - m:]))
            if end is not None:
                return ctx[end:end + k]
        return []


def same_vocabulary(a, b) -> bool:
    """Whether tokenizers a and b map every id to the same bytes (and count alike)."""
    n = int(getattr(a, "vocab_size", 0) or 0)
    if n <= 0 or n != int(getattr(b, "vocab_size", 0) or 0):
        return False
    return tokenizer_fingerprint(a, n) == tokenizer_fingerprint(b, n)


class DraftModel:
    """A smaller model drafting for a target: same vocabulary, same device.

    Keeps its own KV cache (one row per target row), so a chat's next turn reuses the
    prefix it drafted over, as the target's cache does.

    Raises:
        DraftModelError: the vocabularies differ, or the models sit on different devices.
    """

    def __init__(self, model, tokenizer, *, target_tokenizer, target_device: torch.device, name: str = ""):
        self.name = name or "draft model"
        if not same_vocabulary(tokenizer, target_tokenizer):
            raise DraftModelError(
                f"the draft model {self.name} has another vocabulary than the model it would draft for "
                f"({getattr(tokenizer, 'vocab_size', '?')} vs {getattr(target_tokenizer, 'vocab_size', '?')} "
                "tokens, or different token texts): use a model with the same tokenizer")
        dev = model.tok_embeddings.weight.device
        if dev != torch.device(target_device):
            raise DraftModelError(f"the draft model {self.name} is on {dev}, the model on {target_device}")
        self.model = model
        self.cache = KVCache.for_model(model)

    def _catch_up(self, row: int, ctx: list[int], vocab: int, cancel: threading.Event | None,
                  probe_from: int | None) -> torch.Tensor | None:
        """Run row's cache up to the end of ``ctx``: the logits [V] after it, or None when
        cancelled or a probe failed (see :meth:`propose`)."""
        cache, dev = self.cache, self.model.tok_embeddings.weight.device
        done = cache.reusable_prefix(row, ctx)
        # Catch up on what the target accepted since last time; a probe reads every
        # position from probe_from - 1 on (up to PROBE_TOKENS), the rest only the last,
        # and runs those again when the row holds them already (from an earlier reply).
        probe_at = len(ctx) - 1 if probe_from is None else max(probe_from - 1, len(ctx) - 1 - PROBE_TOKENS)
        done = min(done, probe_at)
        cache.rollback(row, done)
        view = cache.row(row)
        logits = None
        while done < len(ctx):
            if cancel is not None and cancel.is_set():
                return None
            all_rows = probe_from is not None and done >= probe_at
            end = min(done + DRAFT_PREFILL_CHUNK, len(ctx) if all_rows or probe_from is None else probe_at)
            chunk = ctx[done:end]
            logits = self.model(torch.tensor([chunk], device=dev), done, view, last_only=not all_rows)[0]
            done = end
            cache.tokens[row] = list(ctx[:done])
            if all_rows and len(chunk) > 1:
                seen = torch.tensor(ctx[done - len(chunk) + 1:done], device=dev)
                agree = int((logits[:-1, :vocab].argmax(-1) == seen).sum())
                if 2 * agree < len(chunk) - 1:
                    return None
        return logits[-1]

    @torch.inference_mode()
    def propose(self, asks: list["DraftAsk"], vocab: int, limit: int | None
                ) -> list[tuple[list[int], torch.Tensor | None]]:
        """Sample up to ``ask.k`` tokens after each ``ask.ctx`` from the filtered draft
        distribution q, for several target rows at once: after each row's catch-up, one
        forward per drafted position serves every row still drafting.

        ``ask.probe_from``: the lane's last drafts failed; it drafts only if this model's
        own greedy choices agree with at least half of the tokens of ``ctx`` from there
        on that it catches up on now (the target's latest choices), read off the catch-up
        forward's logits. So a draft model that keeps being wrong costs its catch-up,
        not a verification forward.

        Returns:
            per ask, (drafts, q [len(drafts), vocab] or None for greedy lanes, whose q is
            the point mass on each draft); no drafts when cancelled or the probe failed.
        """
        cache, dev = self.cache, self.model.tok_embeddings.weight.device
        cache.ensure(max(a.row for a in asks) + 1, max(len(a.ctx) + a.k for a in asks))
        logits = {i: self._catch_up(a.row, a.ctx, vocab, a.cancel, a.probe_from) for i, a in enumerate(asks)}
        drafts: list[list[int]] = [[] for _ in asks]
        qs: list[list[torch.Tensor]] = [[] for _ in asks]
        live = [i for i in logits if logits[i] is not None and asks[i].k > 0]
        step = 0
        while live:
            rows = torch.stack([_fit(logits[i], vocab, limit) for i in live])
            finite = torch.isfinite(rows).all(-1).tolist()
            prev = [torch.tensor(asks[i].ctx + drafts[i], device=dev) if asks[i].params.repetition_penalty != 1.0
                    else None for i in live]
            filt = filter_rows(rows, [asks[i].params for i in live], prev)
            best = filt.argmax(-1).tolist()
            for j, i in enumerate(live):
                if not finite[j]:
                    continue  # a draft model that overflows drafts no further (the target decides alone)
                if asks[i].params.greedy:
                    drafts[i].append(best[j])
                else:
                    q = filt[j].softmax(-1)
                    drafts[i].append(draw(q, asks[i].generator))
                    qs[i].append(q)
            step += 1
            live = [i for j, i in enumerate(live) if finite[j] and step < asks[i].k]
            if live:
                self._advance([asks[i].row for i in live], [drafts[i][-1] for i in live], logits, live)
        return [(d, None if a.params.greedy or not d else torch.stack(q)) for a, d, q in zip(asks, drafts, qs)]

    def _advance(self, rows: list[int], tokens: list[int], logits: dict, keys: list[int]) -> None:
        """Run each row's newest draft (one forward for all of them); logits[key] after it."""
        cache, dev = self.cache, self.model.tok_embeddings.weight.device
        if len(rows) == 1:
            r = rows[0]
            at = len(cache.tokens[r])
            logits[keys[0]] = self.model(torch.tensor([tokens], device=dev), at, cache.row(r), last_only=True)[0, -1]
            cache.tokens[r].append(tokens[0])
            return
        # The first B rows run together, each at its own position; a row that drafts no
        # further runs a placeholder just past what it holds (never read before it is
        # written again, as a rejected draft's slot).
        B = max(rows) + 1
        x, pos = [0] * B, [len(cache.tokens[r]) for r in range(B)]
        for r, t in zip(rows, tokens):
            x[r] = t
        cache.ensure(B, max(pos) + 1)
        out = self.model(torch.tensor(x, device=dev).view(B, 1), torch.tensor(pos, device=dev), cache)[:, -1]
        for r, t, key in zip(rows, tokens, keys):
            logits[key] = out[r]
            cache.tokens[r].append(t)


@dataclass
class DraftAsk:
    """One lane's request to a draft model: k tokens after ctx, in cache row ``row``."""
    row: int
    ctx: list[int]
    k: int
    params: SamplingParams
    generator: torch.Generator | None
    cancel: threading.Event | None = None
    probe_from: int | None = None


def _fit(logits: torch.Tensor, vocab: int, limit: int | None) -> torch.Tensor:
    """Draft logits over the target's ``vocab`` rows, ids from ``limit`` on never drawn."""
    out = logits.float()
    if out.shape[-1] > vocab:
        out = out[..., :vocab]
    elif out.shape[-1] < vocab:
        out = torch.cat([out, out.new_full((*out.shape[:-1], vocab - out.shape[-1]), float("-inf"))], -1)
    if limit is not None:
        out = out.clone()
        out[..., limit:] = float("-inf")
    return out
