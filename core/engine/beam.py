"""Beam search: over a step function apart from any model or cache (:func:`beam_search`),
and a reply by it on an engine's services (:func:`beam_generate`).

The engine's step reorders the KV cache rows and runs one batched forward; the tests
drive :func:`beam_search` with a scripted distribution.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from core.engine.batch import OVERFLOW, Lane, finish
from core.engine.events import Beam, Event, Prefilled, Stats, Token
from core.engine.prefill import cancelled
from core.engine.sampling import seeded_generator
from core.engine.settings import SamplingParams
from core.errors import SettingsError
from core.tokenizer import StreamDecoder


@dataclass
class BeamResult:
    """The best hypothesis: its tokens, each token's log-prob, the normalised score, the stop
    token that ended it (None when it ran out of length) and whether it was cancelled;
    ``rest``: the other hypotheses returned (num_beams in all, as transformers'
    ``num_return_sequences=num_beams``), best first."""

    tokens: list[int]
    logprobs: list[float]
    score: float
    stop_token: int | None
    cancelled: bool = False
    rest: list["BeamResult"] = field(default_factory=list)


def beam_search(step: Callable[[list[int], list[int]], torch.Tensor | None], first_logits: torch.Tensor, *,
                num_beams: int, max_new_tokens: int, stop_ids: set[int], length_penalty: float = 1.0) -> BeamResult:
    """Beam search over a step function.

    Args:
        step: step(last_tokens, origin) -> logits [len(last_tokens), V]: feeds each
            beam's last token, after reordering state so beam i continues beam origin[i];
            returns None to cancel.
        first_logits: logits [V] after the prompt.

    Returns:
        the best hypothesis by sum of log-probs / length ** length_penalty, the next
        ``num_beams - 1`` in its ``rest``.
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
    ranked = [BeamResult(toks, lps, score, stop) for score, toks, lps, stop in
              sorted(pool, key=lambda f: f[0], reverse=True)[:num_beams]]
    return BeamResult(ranked[0].tokens, ranked[0].logprobs, ranked[0].score, ranked[0].stop_token, rest=ranked[1:])


def beam_generate(engine, prompt: list[int], params: SamplingParams, cancel, strip_leading_space: bool,
                  stops: frozenset[int], lane: int = 0) -> Iterator[Event]:
    """One reply by beam search on ``engine`` (an :class:`core.engine.engine.Engine`):
    Prefilled, then the best beam's tokens once it is known, then Done (its ``beams``: every
    hypothesis returned, best first). ``lane``: the events' lane (a comparison's)."""
    engine.check_prompt(prompt)
    return _beam_events(engine, prompt, params, cancel, strip_leading_space, stops, lane)


@torch.inference_mode()
def _beam_events(engine, prompt, params: SamplingParams, cancel, strip_leading_space, stops,
                 index: int) -> Iterator[Event]:
    t0 = time.perf_counter()
    nb, cache = params.num_beams, engine.cache
    max_new = min(params.max_new_tokens, engine.max_context - len(prompt))
    cache.ensure(nb, len(prompt) + (max_new if engine.preallocate else 1))
    logits, reuse = engine.prefill_row(0, prompt, cancel)
    stats = Stats(prompt_tokens=len(prompt), cached_tokens=reuse, prefill_s=time.perf_counter() - t0)
    yield Prefilled(len(prompt), reuse, stats.prefill_s, (index,))

    def new_lane() -> Lane:
        return Lane(index, params, seeded_generator(params),
                    StreamDecoder(engine.tokenizer, strip_leading_space=strip_leading_space), prompt)

    lane = new_lane()
    if logits is None:
        yield finish(lane, "cancelled", stats)
        return
    for r in range(1, nb):
        cache.copy_row(0, r, len(prompt))
    pos = len(prompt)
    t_dec = time.perf_counter()

    def step(tokens: list[int], origin: list[int]) -> torch.Tensor | None:
        nonlocal pos
        if cancelled(cancel):
            return None
        cache.ensure(nb, pos + 1)
        cache.reorder(torch.tensor(origin, device=engine.device), pos)
        out = engine.forward(torch.tensor(tokens, device=engine.device).view(len(tokens), 1), pos, last_only=True)
        pos += 1
        return _checked(out[:, -1], engine.sample_limit)

    result = beam_search(step, _checked(logits, engine.sample_limit), num_beams=nb, max_new_tokens=max_new,
                         stop_ids=stops, length_penalty=params.length_penalty)
    ran_out = "length" if max_new == params.max_new_tokens else "context"

    def reason(hyp: BeamResult) -> str:
        return "cancelled" if hyp.cancelled else ("eos" if hyp.stop_token is not None else ran_out)

    cache.reset()  # beams reordered rows; nothing reliable to reuse
    stats.ttft_s = time.perf_counter() - t0
    yield from _replay(lane, result, engine.piece)
    stats.generated_tokens = len(lane.tokens)
    stats.decode_s = time.perf_counter() - t_dec
    done = finish(lane, reason(result), stats, stop_token=result.stop_token)
    done.beams = [Beam(done.tokens, done.text, done.logprobs, result.score, done.stop_reason, done.stop_token)]
    for hyp in result.rest:  # the runners-up, each decoded as its own reply
        other = new_lane()
        _replay(other, hyp, engine.piece)
        d = finish(other, reason(hyp), stats, stop_token=hyp.stop_token)
        done.beams.append(Beam(d.tokens, d.text, d.logprobs, hyp.score, d.stop_reason, d.stop_token))
    yield done


def _replay(lane: Lane, hyp: BeamResult, piece: Callable[[int], str]) -> list[Token]:
    """Put hypothesis ``hyp``'s tokens into ``lane`` (its text decoded as a stream would be);
    returns their Token events."""
    events = []
    for i, (tok, lp) in enumerate(zip(hyp.tokens, hyp.logprobs)):
        lane.tokens.append(tok)
        lane.logprobs.append(lp)
        delta = lane.decoder.push(tok)
        lane.text += delta
        events.append(Token(lane.index, i, tok, delta, piece(tok), lp))
    return events


def _checked(out: torch.Tensor, sample_limit: int | None) -> torch.Tensor:
    """A step's logits, refused when not finite, ids past ``sample_limit`` never chosen."""
    if not bool(torch.isfinite(out).all()):
        raise SettingsError(OVERFLOW)
    if sample_limit is not None:
        out = out.clone()
        out[..., sample_limit:] = float("-inf")
    return out
