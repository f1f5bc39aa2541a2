"""Speculative decoding: a drafting strategy inside the engine's one decode loop.

Lanes that draft (prompt lookup or a draft model, :mod:`core.engine.drafters`) propose a
few tokens; the target model runs each row's last token and its drafts in one batched
forward, and the standard rule (Leviathan et al. 2023; Chen et al. 2023) keeps draft d
with probability min(1, p(d) / q(d)) and, at the first rejection, draws from the residual
max(0, p - q) normalised (prompt lookup's q is a point mass: p without d). Whatever q is,
every token is distributed exactly as plain sampling's; greedy lanes keep a draft only if
it is the target's own choice. p and q are both taken after the lane's filters
(repetition penalty over the context so far, temperature, top-k, top-p, min-p).

Drafting costs a wider forward (and draft-model steps). A step where no lane drafts is
the loop's plain step (the same operations, compiled when the engine compiles); at a
step where some lanes draft, the others take their plain choice from the same forward.
A lane whose drafts were all rejected sends drafts again only on evidence that its
drafter is right now (:class:`Pace`), so nothing accepted costs close to nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import torch

from core.engine.batch import Batch, Lane, finish
from core.engine.constrain import allowed_tokens, new_bitmask
from core.engine.drafters import DraftAsk, DraftModel, NgramIndex
from core.engine.events import Event
from core.engine.sampling import apply_bitmask, choose_tokens, draw, filter_rows
from core.engine.settings import SamplingParams

LOOKUP_MAX_DRAFT = 8  # tokens prompt lookup proposes at most per step
MODEL_MAX_DRAFT = 6  # tokens a draft model samples ahead at most per step
MAX_PAUSE = 32  # steps a draft model with nothing accepted waits at most before probing again


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


@dataclass
class Draft:
    """What one row runs after its last token at a verification step."""
    tokens: list[int]
    q: torch.Tensor | None = None  # the draft distributions [k, V]; None: point masses
    masks: torch.Tensor | None = None  # the lane's constraint masks at each position
    closed: str | None = None  # why the lane stops after the last draft (its constraint allows nothing)
    forced: bool = False  # the drafts are a branch's forced tokens, always kept


class Drafting:
    """The lanes of one decode loop that draft, what they draft at each step, how the
    target's verification forward is read for them, and their counts.

    Lanes that do not draft never enter here. A step where nobody drafts is the loop's
    plain step; a step where some do is :meth:`step`: one forward for every row, the
    drafting rows verified, the others handed back to the loop's plain choice.

    Args:
        engine: the :class:`core.engine.engine.Engine` (its public services).
        batch: the loop's lanes.
    """

    def __init__(self, engine, batch: Batch):
        self.engine, self.batch = engine, batch
        self.specs: dict[int, _Spec] = {}  # lane -> its drafter and counts
        self.drafters: dict[str, DraftModel] = {}  # the draft models lanes of this loop use

    def join(self, li: int) -> None:
        """Lane li joined the loop: give it its drafter when its settings ask for one."""
        lane = self.batch.lanes[li]
        q = lane.params
        if q.draft:
            d = self.drafters[q.draft] = self.drafters.get(q.draft) or self.engine.draft_model(q.draft)
            spec = _Spec(Pace(MODEL_MAX_DRAFT), draft=d)
        elif q.lookup:
            spec = _Spec(Pace(LOOKUP_MAX_DRAFT, guesses=True), lookup=NgramIndex(q.lookup, lane.prompt))
        else:
            return
        self.specs[li] = spec
        self.batch.reports[li] = partial(spec.stats, q)

    def took(self, li: int, token: int) -> None:
        """The loop's plain choice gave lane li ``token``: prompt lookup reads it, and
        learns whether its guess was right."""
        sp = self.specs.get(li)
        if sp is not None and sp.lookup is not None:
            sp.lookup.extend([token])
            if sp.guess is not None:
                sp.pace.guessed(token == sp.guess)

    def ran(self, li: int, took: float, plain: float | None) -> None:
        """Lane li ran one plain position in a forward of ``took`` seconds."""
        sp = self.specs.get(li)
        if sp is not None:
            sp.rounds += 1
            sp.round_s += took
            if plain is not None:
                sp.plain_s += plain

    def moved(self, old_row: int, new_row: int) -> None:
        """The loop moved a lane from cache row old_row to new_row: its draft rows follow."""
        for d in self.drafters.values():
            d.cache.ensure(new_row + 1, 0)
            if old_row < d.cache.batch:
                d.cache.copy_row(old_row, new_row, len(d.cache.tokens[old_row]))

    def plain_cost(self, rows: int) -> float | None:
        """The measured time of an undrafted step at ``rows`` rows (the nearest measured)."""
        steps = self.engine.plain_step_s
        if not steps:
            return None
        return steps[min(steps, key=lambda b: (abs(b - rows), b))]

    # -- what the rows draft ---------------------------------------------------------

    def plan(self) -> dict[int, Draft]:
        """Row -> what it drafts at this step; rows that draft nothing are left out."""
        if not self.specs:
            return {}
        b, eng = self.batch, self.engine
        measuring = not eng.plain_step_s  # an undrafted step first, to estimate the speed-up
        plan: dict[int, Draft] = {}
        asks: dict[DraftModel, list[DraftAsk]] = {}
        for r, li in enumerate(b.rows):
            sp = self.specs.get(li)
            if sp is None:
                continue
            lane = b.lanes[li]
            room = min(eng.max_context - b.positions[li] - 1, lane.params.max_new_tokens - len(lane.tokens) - 1)
            k = 0 if measuring else min(sp.pace.next(), room)
            sp.guess = None
            forced = lane.forced[len(lane.tokens):]
            if forced:  # the branch's remaining tokens run as drafts that are always kept
                plan[r] = Draft(list(forced[: max(room, 0)]), forced=True)
            elif sp.lookup is not None:
                if k > 0:
                    plan[r] = Draft(sp.lookup.propose(k))
                else:  # what it would draft: free to check against the step's token
                    guess = sp.lookup.propose(1)
                    sp.guess = guess[0] if guess else None
            elif k > 0 and sp.draft is not None:
                asks.setdefault(sp.draft, []).append(
                    DraftAsk(r, lane.context, k, lane.params, lane.generator, lane.cancel,
                             probe_from=len(lane.prompt) if sp.pace.probing else None))
        self._ask(asks, plan)
        return self._constrained(plan)

    def _ask(self, asks: dict[DraftModel, list[DraftAsk]], plan: dict[int, Draft]) -> None:
        """Every lane drafting with one draft model drafts together."""
        eng = self.engine
        for d, rows in asks.items():
            for a, (drafts, q) in zip(rows, d.propose(rows, eng.model.args.vocab_size, eng.sample_limit)):
                plan[a.row] = Draft(drafts, q)
                if not drafts:
                    self.specs[self.batch.rows[a.row]].pace.miss()  # its latest choices disagreed: no check

    def _constrained(self, plan: dict[int, Draft]) -> dict[int, Draft]:
        """The constraint's masks at each drafted position; drafts it ends are cut."""
        b, V = self.batch, self.engine.model.args.vocab_size
        for r, d in plan.items():
            lane = b.lanes[b.rows[r]]
            if d.tokens and lane.constraint is not None:
                d.masks, d.tokens, d.closed = constraint_masks(lane.constraint, d.tokens, lane.stop_ids, V)
                d.q = None if d.q is None else d.q[: len(d.tokens)]
        # A row left with nothing to run takes the plain choice (its constraint's end included).
        return {r: d for r, d in plan.items() if d.tokens}

    # -- the verification step -------------------------------------------------------

    def step(self, plan: dict[int, Draft]) -> Iterator[Event]:
        """One forward for every row: its last token, then its drafts (padded to the
        widest). Drafting rows keep what the target confirms (their events out); the
        others get their position's logits for the loop's plain choice."""
        b, eng = self.batch, self.engine
        width = 1 + max(len(d.tokens) for d in plan.values())
        inputs = [[tok] + (plan[r].tokens if r in plan else []) for r, tok in enumerate(b.last_tokens())]
        inputs = [x + [0] * (width - len(x)) for x in inputs]
        eng.cache.ensure(len(inputs), eng.capacity(b.furthest() + width))
        t0 = time.perf_counter()
        out = eng.forward(torch.tensor(inputs, device=eng.device), b.pos(eng.device))  # [B, T, V]
        for r, x in enumerate(inputs):
            eng.cache.tokens[r].extend(x)
        results = {r: self._verify(b.rows[r], out[r], d) for r, d in plan.items()}
        took = time.perf_counter() - t0
        plain = self.plain_cost(len(inputs))
        for r, li in enumerate(b.rows):
            if r in plan:
                yield from self._keep(r, li, plan[r], results[r], out[r], took, plain)
                done = b.settle(li)
                if done is not None:
                    yield done
            else:  # an undrafted row: its plain choice comes with the others'
                eng.cache.rollback(r, b.positions[li] + 1)
                b.ran(r, out[r, 0])
                self.ran(li, took, plain)

    def _verify(self, li: int, out: torch.Tensor, d: Draft) -> tuple[list[int], int, torch.Tensor | None] | None:
        """The tokens lane li keeps from its row ``out`` [T, V] of the forward (see
        :func:`verify`); None when the logits it reads are not finite."""
        lane, n = self.batch.lanes[li], len(d.tokens)
        if not bool(torch.isfinite(out[: n + 1]).all()):
            return None
        if self.engine.sample_limit is not None:
            out[:, self.engine.sample_limit:] = float("-inf")
        context = lane.context if lane.params.repetition_penalty != 1.0 else []  # read by the penalty only
        if not d.forced:
            return verify(out, d.tokens, d.q, lane.params, context, lane.generator, d.masks,
                          last_open=d.closed is None)
        # Rows 0..n give the forced tokens' log-probs; the row after the last forced one
        # draws, as plain decoding would there. A constraint that allows nothing at row n
        # ends the lane before it.
        toks = list(lane.forced[len(lane.tokens):][: n + (d.closed is None)])
        _draw_forced(lane, len(toks), out.device)
        if len(toks) == n and d.closed is None:
            toks += verify(out[n:n + 1], [], None, lane.params, context + toks, lane.generator,
                           None if d.masks is None else d.masks[n:n + 1])[0]
        return toks, n, None

    def _keep(self, r: int, li: int, d: Draft, res, out: torch.Tensor, took: float, plain: float | None):
        """Lane li's verified tokens into its reply (events out), its cache row rolled
        back to what it kept, its drafter told how the drafts fared."""
        b, sp, lane = self.batch, self.specs[li], self.batch.lanes[li]
        if res is None:
            lane.done = finish(lane, "error")
            self.engine.cache.rollback(r, b.positions[li])
            return
        toks, n, filt = res
        appended = yield from b.accept_run(li, toks, out, filt, d.masks)
        if lane.done is None and d.closed is not None and len(toks) == n:
            lane.done = finish(lane, d.closed)  # the constraint allows nothing more
        valid = min(appended, n)
        self.engine.cache.rollback(r, b.positions[li] + 1 + valid)
        b.positions[li] += 1 + valid
        sp.rounds += 1
        sp.round_s += took
        if plain is not None:
            sp.plain_s += appended * plain
        if d.tokens and not d.forced:
            sp.drafting_rounds += 1
            sp.drafted += len(d.tokens)
            sp.accepted += n
            sp.pace.update(len(d.tokens), n)
        if sp.lookup is not None:
            sp.lookup.extend(toks[:appended])


def _draw_forced(lane: Lane, n: int, device: torch.device) -> None:
    """Plain decoding draws at a forced position too (then replaces the draw): use the
    generator alike, so a lane's later draws see the same random stream."""
    if not lane.params.greedy:
        for _ in range(n):
            torch.rand((), generator=lane.generator, dtype=torch.float32, device=device)
