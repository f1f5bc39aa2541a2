"""Speculative decoding: draft a few tokens cheaply, verify them in one forward pass.

Two drafters. Prompt lookup proposes the tokens that followed the latest earlier
occurrence of the context's last n-gram (cheap, and right whenever the reply repeats
the prompt: editing a given text, quoting code). A draft model is a smaller model with
the same vocabulary that samples k tokens ahead.

The target model runs each lane's last token and its drafts in one batched forward.
The standard rule (Leviathan et al. 2023; Chen et al. 2023) then keeps draft d with
probability min(1, p(d) / q(d)) and, at the first rejection, draws from the residual
max(0, p - q) normalised (prompt lookup's q is a point mass: p without d). Whatever q
is, every token is distributed exactly as plain sampling's; greedy lanes keep a draft
only if it is the target's own choice. p and q are both taken after the lane's filters
(repetition penalty over the context so far, temperature, top-k, top-p, min-p).

Drafting costs a wider forward (and draft-model steps). A step where no lane drafts is
plain decoding's own step (the same operations, compiled when the engine compiles), and a
lane whose drafts were all rejected sends drafts again only on evidence that its drafter
is right now (:class:`Pace`), so nothing accepted costs close to nothing.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from core.tokenizer.fingerprint import tokenizer_fingerprint
from core.errors import DraftModelError
from core.model.kv_cache import KVCache
from core.engine.constrain import allowed_tokens, new_bitmask
from core.engine.sampling import apply_bitmask, choose_tokens, draw, filter_rows, top_alternatives
from core.engine.settings import SamplingParams

LOOKUP_MAX_DRAFT = 8  # tokens prompt lookup proposes at most per step
MODEL_MAX_DRAFT = 6  # tokens a draft model samples ahead at most per step
MAX_PAUSE = 32  # steps a draft model with nothing accepted waits at most before probing again
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


def verify(logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None, params: SamplingParams,
           context: list[int], generator: torch.Generator | None, bitmask: torch.Tensor | None = None,
           last_open: bool = True) -> tuple[list[int], int, torch.Tensor]:
    """The tokens a lane emits after one verification forward.

    Args:
        logits: the target's raw logits [k + 1, V] after the last token and each draft.
        drafts: the k drafted ids.
        q: the draft distributions [k, V] they were sampled from; None means point
            masses on the drafts (prompt lookup, greedy drafting).
        context: prompt and reply so far (the repetition penalty's history).
        bitmask: the lane's constraint masks [k + 1, W] at each position (the drafts
            before it taken), applied before the filters as in plain decoding.
        last_open: False when the constraint allows nothing after the last draft: then
            nothing is drawn there once every draft is accepted.

    Returns:
        (the accepted drafts and, unless the last row is closed, one token more; how many
        drafts were accepted; the filtered logits [k + 1, V], None when nothing was drafted).
    """
    k = len(drafts)
    if k == 0:  # nothing drafted: plain decoding's own sampler (no vocabulary sort)
        if not last_open:
            return [], 0, None
        prev = torch.tensor(context, device=logits.device) if params.repetition_penalty != 1.0 else None
        choice = choose_tokens(logits[:1], [params], [prev], [generator], bitmask=bitmask)
        return choice.ids, 0, None
    rows = apply_bitmask(logits[: k + 1], bitmask)
    if params.repetition_penalty != 1.0:
        prev = [torch.tensor(context + drafts[:i], device=rows.device) for i in range(k + 1)]
    else:
        prev = [None] * (k + 1)
    filt = filter_rows(rows, [params] * (k + 1), prev)
    if params.greedy:
        best = filt.argmax(-1).tolist()
        n = 0
        while n < k and best[n] == drafts[n]:
            n += 1
        return drafts[:n] + ([best[n]] if n < k or last_open else []), n, filt
    p = filt.softmax(-1)
    if k:
        d = torch.tensor(drafts, device=p.device).view(k, 1)
        pd = p[:k].gather(-1, d).view(k)
        qd = q[:k].gather(-1, d).view(k) if q is not None else torch.ones_like(pd)
        u = torch.rand(k, generator=generator, dtype=p.dtype, device=p.device)
        # Accept d_i when u_i < p(d_i) / q(d_i); q(d_i) > 0 since d_i was drawn from q.
        rejected = (u * qd >= pd).tolist()
        n = rejected.index(True) if True in rejected else k
    else:
        n = 0
    if n == k:
        return drafts + ([draw(p[k], generator)] if last_open else []), n, filt
    if q is None:
        resid = p[n].clone()
        resid[drafts[n]] = 0.0
    else:
        resid = (p[n] - q[n]).clamp_min(0.0)
    if not float(resid.sum()) > 0.0:  # p == q up to rounding: nothing to correct
        resid = p[n]
    return drafts[:n] + [draw(resid, generator)], n, filt


def constraint_masks(state, drafts: list[int], stop_ids, vocab: int) -> tuple[torch.Tensor, list[int], str | None]:
    """The constraint's mask at each drafted position, from a lane's ``state`` (left
    where it was).

    A draft the constraint forbids stays (the target gives it no mass, so it is rejected
    and the residual is drawn, as exactness needs) and ends the drafts; so does a stop
    token. Returns (masks [k + 1, W], the drafts kept, and when the constraint allows
    nothing after the last kept draft, the reason the lane stops there: "eos" when its
    output is complete, else "error").
    """
    masks = new_bitmask(len(drafts) + 1, vocab)
    consumed, kept, closed = 0, len(drafts), None
    try:
        for i in range(len(drafts) + 1):
            state.mask(masks[i])
            if not bool(masks[i].any()):  # nothing allowed here: the lane ends before it
                kept, closed = i, ("eos" if state.accepting else "error")
                break
            if i == len(drafts):
                break
            d = drafts[i]
            if not bool(allowed_tokens(masks[i], vocab)[d]) or d in stop_ids:
                kept = i + 1
                break
            if not state.advance(d):
                kept = i + 1
                break
            consumed += 1
    finally:
        state.rollback(consumed)
    return masks[: kept + 1], drafts[:kept], closed


class Pace:
    """How many tokens a lane drafts next, from how its drafts fared.

    More while they are accepted, fewer when not. After a step that accepted nothing the
    lane is *probing*: it sends drafts to the target again only on evidence that the
    drafter is right now, since a verification forward wider than one token costs about
    two plain steps on a CPU (a matrix product instead of a matrix-vector one) however
    few tokens it checks. Prompt lookup's evidence is free (``guessed``: what it would
    have drafted, against the token the step chose), so it waits for a right guess. A
    draft model waits 1, 3, 7, ... up to MAX_PAUSE steps after each miss, then shows its
    evidence on the tokens it catches up on (:meth:`DraftModel.propose`'s probe).
    """

    def __init__(self, most: int, *, guesses: bool = False):
        self.most = most
        self.k = max(1, most // 2)
        self.misses = 0
        self.wait = 0
        self.guesses = guesses
        self.probing = True  # nothing accepted yet, or the last drafts all failed

    def next(self) -> int:
        if self.guesses and self.probing:
            return 0
        if self.wait > 0:
            self.wait -= 1
            return 0
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        """After a verification of ``drafted`` tokens, ``accepted`` of them kept."""
        if drafted == 0:
            return
        if accepted == drafted:
            self.k = min(self.most, self.k + 2)
        else:
            self.k = max(1, accepted + 1)
        if accepted == 0:
            self.miss()
        else:
            self.misses = 0
            self.probing = False

    def miss(self) -> None:
        """The drafts failed, or the drafter's evidence says they would have."""
        self.misses += 1
        self.probing = True
        self.wait = min(2 ** self.misses, MAX_PAUSE) - 1

    def guessed(self, right: bool) -> None:
        """What the drafter would have proposed at an undrafted step was ``right``."""
        if right and self.probing:
            self.probing, self.wait = False, 0


@dataclass
class _Spec:
    """One lane's drafter and its counts."""
    pace: Pace
    lookup: NgramIndex | None = None
    guess: int | None = None  # prompt lookup's first token at an undrafted step
    draft: DraftModel | None = None
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0  # verification forwards the lane took part in
    drafting_rounds: int = 0
    round_s: float = 0.0
    plain_s: float = 0.0  # what its tokens would have cost one step each (estimated)

    def stats(self, params: SamplingParams) -> dict:
        kind = "lookup" if self.lookup is not None else ("draft" if self.draft is not None else "off")
        return {
            "kind": kind, "lookup": params.lookup, "draft": params.draft,
            "drafted": self.drafted, "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_draft": self.drafted / self.drafting_rounds if self.drafting_rounds else 0.0,
            "forwards": self.rounds,
            "speedup": self.plain_s / self.round_s if self.round_s > 0 and self.plain_s > 0 else None,
        }


def _plain_step(engine, batch: int) -> float | None:
    """The measured time of an undrafted step at ``batch`` rows (the nearest batch measured)."""
    steps = engine.spec_step_s
    if not steps:
        return None
    return steps[min(steps, key=lambda b: (abs(b - batch), b))]


@torch.inference_mode()
def speculative_loop(engine, joining) -> Iterator:
    """Engine._loop's job for lanes that may draft: prefill, then verify-and-emit steps.

    Lanes without a drafter take part with nothing drafted (a plain step), so a
    comparison can mix them. Yields the engine's own events.
    """
    from core.engine.engine import _check_cancel  # the engine imports this module lazily

    dev = engine.device
    cache = engine.cache
    lanes, stats, positions, rows = [], [], [], []
    logits_by_lane: dict[int, torch.Tensor] = {}
    for j in joining:
        yield from engine._join(j, lanes, stats, rows, positions, logits_by_lane)
    specs: dict[int, _Spec] = {}
    drafters = {}
    for li in rows:
        q = lanes[li].params
        if q.draft:
            d = drafters[q.draft] = drafters.get(q.draft) or engine.draft_model(q.draft)
            specs[li] = _Spec(Pace(MODEL_MAX_DRAFT), draft=d)
        elif q.lookup:
            specs[li] = _Spec(Pace(LOOKUP_MAX_DRAFT, guesses=True), lookup=NgramIndex(q.lookup, lanes[li].prompt))
        else:
            specs[li] = _Spec(Pace(0))
    V = engine.model.args.vocab_size
    limit = engine.sample_limit

    def emit(li: int, toks: list[int], raw: torch.Tensor, filt: torch.Tensor | None, start: int,
             masks: torch.Tensor | None):
        """Accept toks (rows of raw/filt in order) into lane li; events out; returns how
        many were appended to its reply. ``filt`` None: the inspector filters itself."""
        lane, st = lanes[li], stats[li]
        if not toks:
            return 0
        lps = torch.log_softmax(raw[: len(toks)], -1).gather(
            -1, torch.tensor(toks, device=raw.device).view(-1, 1)).view(-1).tolist()
        appended = 0
        for i, (tok, lp) in enumerate(zip(toks, lps)):
            top = None
            if lane.inspect:
                prev = (torch.tensor(lane.prompt + lane.tokens, device=dev)
                        if lane.params.repetition_penalty != 1.0 else None)
                allowed = None if masks is None else allowed_tokens(masks[i], raw.shape[-1]).to(raw.device)
                top = top_alternatives(raw[i], lane.params, prev, k=lane.inspect,
                                       filtered=None if filt is None else filt[i], allowed=allowed)
                top["pieces"] = {t: engine._piece(t) for t, _ in top["raw"] + top["filtered"]}
            before = len(lane.tokens)
            ev = engine._accept(lane, tok, lp, top)
            appended += len(lane.tokens) - before
            if st.ttft_s == 0.0:
                st.ttft_s = time.perf_counter() - lane.t_join
            if ev is not None:
                yield ev
            if lane.done is None and start + i >= engine.max_context:
                lane.done = engine._finish(lane, "context", None)
            if lane.done is not None:
                break
        return appended

    def finish_if_done(li: int):
        lane, st = lanes[li], stats[li]
        if lane.done is None and _check_cancel(lane.cancel):
            lane.done = engine._finish(lane, "cancelled", None)
        if lane.done is not None:
            st.generated_tokens = len(lane.tokens)
            st.decode_s = time.perf_counter() - lane.t_decode
            sp = specs[li]
            if sp.lookup is not None or sp.draft is not None:
                st.speculative = sp.stats(lane.params)
            if engine._step.backend is not None:
                st.decode = engine.compile_status
            lane.done.stats = st
            yield lane.done

    def compact():
        keep = [k for k, li in enumerate(rows) if lanes[li].done is None]
        if not keep:
            engine._remember(lanes, rows, positions)
        elif len(keep) < len(rows):
            for new_row, old_row in enumerate(keep):
                if new_row != old_row:
                    cache.copy_row(old_row, new_row, positions[rows[old_row]])
                    for d in drafters.values():
                        d.cache.ensure(new_row + 1, 0)
                        if old_row < d.cache.batch:
                            d.cache.copy_row(old_row, new_row, len(d.cache.tokens[old_row]))
        rows[:] = [rows[k] for k in keep]

    def forced_left(lane) -> tuple[int, ...]:
        return lane.forced[len(lane.tokens):]

    def take_forced(lane, n: int) -> None:
        """Plain decoding draws at a forced position too (then replaces the draw): use the
        generator alike, so a lane's later draws see the same random stream."""
        if not lane.params.greedy:
            for _ in range(n):
                torch.rand((), generator=lane.generator, dtype=torch.float32, device=dev)

    def plain_step(step_logits: torch.Tensor, ran: list[int] | None, took: float):
        """Plain decoding's own step for every row (its sampler, one read from the device):
        the first tokens (from the prefill's logits) and every step nobody drafts in."""
        step = engine._choose(lanes, rows, step_logits)
        plain = _plain_step(engine, len(rows))
        for r, li in enumerate(rows):
            lane, st, sp = lanes[li], stats[li], specs[li]
            if ran is not None:  # the row ran its last token at its position
                cache.tokens[r].append(ran[r])
                positions[li] += 1
                sp.rounds += 1
                sp.round_s += took
                if plain is not None:
                    sp.plain_s += plain
            ev = engine._take(lane, r, step)
            if st.ttft_s == 0.0:
                st.ttft_s = time.perf_counter() - lane.t_join
            if ev is not None:
                yield ev
                if sp.lookup is not None:
                    sp.lookup.extend([ev.token_id])
                    if sp.guess is not None:
                        sp.pace.guessed(ev.token_id == sp.guess)
            if lane.done is None and positions[li] >= engine.max_context:
                lane.done = engine._finish(lane, "context", None)
            yield from finish_if_done(li)

    # The first token of every lane comes from its prefill's logits.
    yield from plain_step(torch.stack([logits_by_lane.pop(li) for li in rows]), None, 0.0)
    compact()

    measure = not engine.spec_step_s  # an undrafted step first, to estimate the speed-up
    while rows:
        plan: list[tuple[list[int], torch.Tensor | None, torch.Tensor | None, str | None]] = []
        forcing: set[int] = set()  # rows whose drafts are a branch's forced tokens
        asks: dict[DraftModel, list[tuple[int, DraftAsk]]] = {}
        for r, li in enumerate(rows):
            lane, sp = lanes[li], specs[li]
            room = min(engine.max_context - positions[li] - 1, lane.params.max_new_tokens - len(lane.tokens) - 1)
            k = 0 if measure else min(sp.pace.next(), room)
            drafts, q = [], None
            sp.guess = None
            forced = forced_left(lane)
            if forced:  # the branch's remaining tokens run as drafts that are always kept
                drafts = list(forced[: max(room, 0)])
                forcing.add(r)
            elif sp.lookup is not None:
                if k > 0:
                    drafts = sp.lookup.propose(k)
                else:  # what it would draft: free to check against the step's token
                    guess = sp.lookup.propose(1)
                    sp.guess = guess[0] if guess else None
            elif k > 0 and sp.draft is not None:
                asks.setdefault(sp.draft, []).append(
                    (r, DraftAsk(r, lane.prompt + lane.tokens, k, lane.params, lane.generator, lane.cancel,
                                 probe_from=len(lane.prompt) if sp.pace.probing else None)))
            plan.append((drafts, q, None, None))
        for d, rq in asks.items():  # every lane drafting with one draft model, together
            for (r, _), (drafts, q) in zip(rq, d.propose([a for _, a in rq], V, limit)):
                plan[r] = (drafts, q, None, None)
                if not drafts:
                    specs[rows[r]].pace.miss()  # its latest choices disagreed with the model's: no check
        for r, li in enumerate(rows):
            lane, (drafts, q, _, _) = lanes[li], plan[r]
            if drafts and lane.constraint is not None:
                masks, drafts, closed = constraint_masks(lane.constraint, drafts, lane.stop_ids, V)
                plan[r] = (drafts, None if q is None else q[: len(drafts)], masks, closed)
        T = 1 + max(len(p[0]) for p in plan)
        B = len(rows)
        pos_list = [positions[li] for li in rows]
        cache.ensure(B, engine._capacity(max(pos_list) + T))
        pos = pos_list[0] if all(p == pos_list[0] for p in pos_list) else torch.tensor(pos_list, device=dev)
        if T == 1:  # nobody drafts: a plain decoding step (compiled, when the engine compiles)
            last = [lanes[li].tokens[-1] for li in rows]
            warm = engine._step.warmup_s
            t0 = time.perf_counter()
            out = engine._decode(torch.tensor(last, device=dev).view(B, 1), pos)[:, -1]  # [B, V]
            took = time.perf_counter() - t0
            warm = engine._step.warmup_s - warm
            if warm:  # compiling or recording a graph is not decoding: keep it out of the speed
                took -= warm
                for li in rows:
                    lanes[li].t_decode += warm
                    stats[li].warmup_s += warm
            engine.spec_step_s[B] = took if B not in engine.spec_step_s else 0.5 * (engine.spec_step_s[B] + took)
            measure = False
            yield from plain_step(out, last, took)
            compact()
            continue
        inputs = [[lanes[li].tokens[-1]] + p[0] + [0] * (T - 1 - len(p[0])) for li, p in zip(rows, plan)]
        t0 = time.perf_counter()
        engine._use_threads(1)
        out = engine.model(torch.tensor(inputs, device=dev), pos, cache)  # [B, T, V]
        for r in range(B):
            cache.tokens[r].extend(inputs[r])
        finite = torch.isfinite(out).all(-1).tolist()  # [B][T]
        if limit is not None:
            out[..., limit:] = float("-inf")
        results = []
        for r, li in enumerate(rows):
            drafts, q, masks, closed = plan[r]
            lane = lanes[li]
            if not all(finite[r][: len(drafts) + 1]):
                results.append(None)
                continue
            if not drafts and lane.constraint is not None:
                masks, _, closed = constraint_masks(lane.constraint, [], lane.stop_ids, V)
                plan[r] = (drafts, q, masks, closed)
            context = lane.prompt + lane.tokens if lane.params.repetition_penalty != 1.0 else []  # read by the penalty only
            if r in forcing:
                forced = forced_left(lane)
                # Rows 0..len(drafts) give the forced tokens' log-probs; the row after the
                # last forced one draws, as plain decoding would there.
                n = len(drafts)
                # A constraint that allows nothing at row n ends the lane before it.
                toks = list(forced[: n + (closed is None)])
                take_forced(lane, len(toks))
                if len(toks) == n and closed is None:
                    toks += verify(out[r, n:n + 1], [], None, lane.params, context + toks,
                                   lane.generator, None if masks is None else masks[n:n + 1])[0]
                results.append((toks, n, None))
                continue
            results.append(verify(out[r], drafts, q, lane.params, context, lane.generator,
                                  masks, last_open=closed is None))
        took = time.perf_counter() - t0
        plain = _plain_step(engine, B)
        for r, li in enumerate(rows):
            lane, sp, res = lanes[li], specs[li], results[r]
            drafts, _, masks, closed = plan[r]
            if res is None:
                lane.done = engine._finish(lane, "error", None)
                cache.rollback(r, positions[li])
            else:
                toks, n, filt = res
                start = positions[li] + 1
                appended = yield from emit(li, toks, out[r], filt, start, masks)
                if lane.done is None and closed is not None and len(toks) == n:
                    lane.done = engine._finish(lane, closed, None)  # the constraint allows nothing more
                valid = min(appended, n)
                cache.rollback(r, positions[li] + 1 + valid)
                positions[li] += 1 + valid
                sp.rounds += 1
                sp.round_s += took
                if plain is not None:
                    sp.plain_s += appended * plain
                if drafts and r not in forcing:
                    sp.drafting_rounds += 1
                    sp.drafted += len(drafts)
                    sp.accepted += n
                    sp.pace.update(len(drafts), n)
                elif sp.guess is not None and toks:
                    sp.pace.guessed(toks[0] == sp.guess)
                if sp.lookup is not None:
                    sp.lookup.extend(toks[:appended])
            yield from finish_if_done(li)
        compact()
