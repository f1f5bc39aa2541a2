"""Beam search over a step function, apart from any model or cache.

The engine drives it with a step that reorders the KV cache rows and runs one batched
forward; the tests drive it with a scripted distribution.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class BeamResult:
    """The best hypothesis: its tokens, each token's log-prob, the normalised score, the stop
    token that ended it (None when it ran out of length) and whether it was cancelled."""

    tokens: list[int]
    logprobs: list[float]
    score: float
    stop_token: int | None
    cancelled: bool = False


def beam_search(step: Callable[[list[int], list[int]], torch.Tensor | None], first_logits: torch.Tensor, *,
                num_beams: int, max_new_tokens: int, stop_ids: set[int], length_penalty: float = 1.0) -> BeamResult:
    """Beam search over a step function.

    Args:
        step: step(last_tokens, origin) -> logits [len(last_tokens), V]: feeds each
            beam's last token, after reordering state so beam i continues beam origin[i];
            returns None to cancel.
        first_logits: logits [V] after the prompt.

    Returns:
        the best hypothesis by sum of log-probs / length ** length_penalty.
    """
    def norm(score: float, length: int) -> float:
        return score / (max(length, 1) ** length_penalty)

    beams: list[tuple[float, list[int], list[float]]] = [(0.0, [], [])]
    finished: list[tuple[float, list[int], list[float], int]] = []
    logp = torch.log_softmax(first_logits.float(), -1).unsqueeze(0)  # [1, V]
    for t in range(max_new_tokens):
        scores = torch.tensor([b[0] for b in beams]).view(-1, 1) + logp.cpu()
        flat = scores.view(-1)
        cand = torch.topk(flat, min(2 * num_beams, flat.numel()))
        V = logp.shape[-1]
        nxt: list[tuple[float, list[int], list[float]]] = []
        origin: list[int] = []
        for s, idx in zip(cand.values.tolist(), cand.indices.tolist()):
            b, tok = divmod(idx, V)
            tok_lp = float(logp[b, tok])
            if tok in stop_ids:
                finished.append((norm(s, len(beams[b][1]) + 1), beams[b][1], beams[b][2], tok))
            else:
                nxt.append((s, beams[b][1] + [tok], beams[b][2] + [tok_lp]))
                origin.append(b)
            if len(nxt) == num_beams:
                break
        best_running = max(norm(s, len(toks)) for s, toks, _ in nxt) if nxt else float("-inf")
        if len(finished) >= num_beams and max(f[0] for f in finished) >= best_running:
            break
        beams = nxt
        if t == max_new_tokens - 1 or not beams:
            break
        out = step([b[1][-1] for b in beams], origin)
        if out is None:
            best = max(beams, key=lambda b: norm(b[0], len(b[1])))
            return BeamResult(best[1], best[2], best[0], None, cancelled=True)
        logp = torch.log_softmax(out.float(), -1)
    pool = [(f[0], f[1], f[2], f[3]) for f in finished]
    pool += [(norm(s, len(toks)), toks, lps, None) for s, toks, lps in beams]
    best = max(pool, key=lambda f: f[0])
    return BeamResult(best[1], best[2], best[0], best[3])
