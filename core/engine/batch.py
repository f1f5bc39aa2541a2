"""The lanes of one decode loop: which cache row each holds, where it is, what it has
said, and the logits it chooses its next token from.

A lane is one reply (one sampler setting of a comparison, one request of a batch). The
loop runs every row's latest token through the model; a :class:`Batch` then turns the
logits into tokens (choose, take, accept), ends lanes (finish, settle), keeps the time
accounting (time to first token, decode time, warm-up steps kept out of it) and moves
the surviving lanes to the lowest rows (compact) so the next forward shrinks.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from core.engine.constrain import ConstraintState, allowed_tokens, fill_masks, new_bitmask
from core.engine.cpu_rows import finite_rows
from core.engine.events import Done, Stats, Token
from core.engine.sampling import Choice, choose_tokens, top_alternatives
from core.engine.settings import SamplingParams
from core.model.kv_cache import KVCache
from core.tokenizer import StreamDecoder

OVERFLOW = "the model produced NaN or infinite logits: its weights or activations overflow (try float32)"


@dataclass
class Lane:
    index: int
    params: SamplingParams
    generator: torch.Generator
    decoder: StreamDecoder
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # chars of text already sent
    done: Done | None = None
    cancel: threading.Event | None = None
    inspect: int = 0
    stop_ids: frozenset[int] = frozenset()
    t_join: float = 0.0  # when its request joined (TTFT counts from here)
    t_decode: float = 0.0  # when its prefill ended
    constraint: ConstraintState | None = None  # where the lane is in its JSON schema/regex/grammar
    forced: tuple[int, ...] = ()
    min_tokens: int = 0  # vLLM's min_tokens: no stop token is drawn, no stop string ends it, before this
    stop_from: int = 0  # where in text a stop string may begin (past the min_tokens' text)
    tools: object = None  # core.prompt.tool_format.ToolCalling: the calls its text may make

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    @property
    def context(self) -> list[int]:
        """Prompt and reply so far."""
        return self.prompt + self.tokens

    def stop_holdback(self) -> int:
        """Chars at the end of text that could start a stop string: hold them back."""
        hold = 0
        for s in self.params.stop:
            for n in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        return hold


@dataclass
class Step:
    """One choice of the next token for several rows (:meth:`Batch.choose`)."""
    logits: torch.Tensor  # [B, V], masked as sampled
    choice: Choice
    previous: list[torch.Tensor | None]  # the repetition penalty's history per row
    bitmask: torch.Tensor | None
    stuck: dict[int, str]


def finish(lane: Lane, reason: str, stats: Stats | None = None, stop_token: int | None = None) -> Done:
    """The lane's Done for ``reason`` (one of STOP_REASONS); its text flushed where the
    reply ended without a stop string cutting it."""
    if reason in ("eos", "context", "cancelled"):
        lane.text += lane.decoder.flush()
    error = lane.constraint.failure() if reason == "error" and lane.constraint is not None else ""
    if reason == "error" and not error:
        error = OVERFLOW + (f", or the {lane.constraint.describe()} left no token to choose"
                            if lane.constraint is not None else "")
    # A reply that ended on its stop token after writing calls called tools; one cut short
    # (length, a stop string, cancel) made no call, whatever its text began.
    calls = lane.tools.parse(lane.text) if reason == "eos" and lane.tools is not None else []
    return Done(lane.index, "tool_calls" if calls else reason, list(lane.tokens), lane.text, list(lane.logprobs),
                lane.params, stats, stop_token, error, tool_calls=calls)


def choice_masks(lanes: list[Lane], vocab: int) -> tuple[torch.Tensor | None, dict[int, str]]:
    """The constraint bitmask [B, ceil(V/32)] of one choice over ``lanes`` (CPU; None when
    no lane is constrained) and the rows whose constraint allows no token at all, with the
    reason they stop: "eos" when the output is complete, else "error"."""
    held = [(k, lane.constraint) for k, lane in enumerate(lanes) if lane.constraint is not None]
    if not held:
        return None, {}
    bitmask = new_bitmask(len(lanes), vocab)
    fill_masks(held, bitmask)
    empty = (bitmask[[k for k, _ in held]] == 0).all(-1).tolist()
    return bitmask, {k: ("eos" if st.accepting else "error") for (k, st), e in zip(held, empty) if e}


class Batch:
    """The lanes of one decode loop and the cache rows they hold.

    Args:
        cache: the engine's KV cache; row r holds lane ``rows[r]``.
        piece: a token's own text (the inspector and Token events name tokens with it).
        sample_limit: ids from here on are never chosen (a padded vocabulary), or None.
        max_context: a lane whose next position reaches this stops ("context").
        decode_path: which compiled decode path ran, for each Done's stats ("" if none).
    """

    def __init__(self, cache: KVCache, *, piece: Callable[[int], str], sample_limit: int | None,
                 max_context: int, decode_path: Callable[[], str] = str):
        self.cache, self.piece, self.sample_limit = cache, piece, sample_limit
        self.max_context, self.decode_path = max_context, decode_path
        self.lanes: list[Lane] = []
        self.stats: list[Stats] = []
        self.positions: list[int] = []  # next position to write, per lane
        self.rows: list[int] = []  # rows[r] = the lane cache row r holds
        self.logits: dict[int, torch.Tensor] = {}  # lane -> the logits its next token comes from
        self.reports: dict[int, Callable[[], dict]] = {}  # lane -> extra stats for its Done (drafting)

    # -- lanes in and out ------------------------------------------------------------

    def add(self, lane: Lane, prompt_tokens: int) -> None:
        """A lane of a joining request (it holds a row once its prefill ran: :meth:`start`)."""
        self.lanes.append(lane)
        self.stats.append(Stats(prompt_tokens=prompt_tokens))
        self.positions.append(prompt_tokens)

    def prefilled(self, lanes: range, reuse: int, t0: float, seconds: float) -> None:
        for i in lanes:
            self.stats[i].cached_tokens, self.stats[i].prefill_s = reuse, seconds
            self.lanes[i].t_join, self.lanes[i].t_decode = t0, t0 + seconds

    def start(self, lanes: range, logits: torch.Tensor) -> None:
        """``lanes`` take the next rows, each to choose its first token from ``logits``."""
        for i in lanes:
            self.rows.append(i)
            self.logits[i] = logits

    def settle(self, li: int) -> Done | None:
        """Lane li's Done with its stats when it stopped now (or ran out of context, or was
        cancelled), else None."""
        lane = self.lanes[li]
        if lane.done is None and self.positions[li] >= self.max_context:
            lane.done = finish(lane, "context")
        if lane.done is None and lane.cancelled:
            lane.done = finish(lane, "cancelled")
        if lane.done is None:
            return None
        st = self.stats[li]
        st.generated_tokens = len(lane.tokens)
        st.decode_s = time.perf_counter() - lane.t_decode
        st.decode = self.decode_path() or st.decode
        if li in self.reports:
            st.speculative = self.reports[li]()
        lane.done.stats = st
        return lane.done

    def compact(self, moved: Callable[[int, int], None] | None = None) -> bool:
        """Surviving lanes move to the lowest rows so the batch shrinks (``moved(old, new)``
        follows each move); returns whether any lane still runs."""
        keep = [k for k, li in enumerate(self.rows) if self.lanes[li].done is None]
        if not keep:
            self.remember()
        if len(keep) < len(self.rows):
            for new_row, old_row in enumerate(keep):
                if new_row != old_row:
                    self.cache.copy_row(old_row, new_row, self.positions[self.rows[old_row]])
                    if moved is not None:
                        moved(old_row, new_row)
            self.rows[:] = [self.rows[k] for k in keep]
        return bool(keep)

    def remember(self) -> None:
        """Record what each row holds so the next request can reuse it."""
        for r, li in enumerate(self.rows):
            self.cache.tokens[r] = self.lanes[li].context[: self.positions[li]]
        for r in range(len(self.rows), self.cache.batch):
            self.cache.tokens[r] = []

    # -- a forward over the rows -----------------------------------------------------

    def last_tokens(self) -> list[int]:
        """What every row runs next: its lane's latest token."""
        return [self.lanes[li].tokens[-1] for li in self.rows]

    def furthest(self) -> int:
        return max(self.positions[li] for li in self.rows)

    def pos(self, device: torch.device) -> int | torch.Tensor:
        """The rows' positions: one int when they agree, else a tensor [B]."""
        pos = [self.positions[li] for li in self.rows]
        return pos[0] if all(p == pos[0] for p in pos) else torch.tensor(pos, device=device)

    def ran(self, r: int, logits: torch.Tensor) -> None:
        """Row r ran its last token at its position; its next token comes from ``logits``."""
        li = self.rows[r]
        self.positions[li] += 1
        self.logits[li] = logits

    def warmed(self, seconds: float) -> None:
        """A step compiled or recorded a graph: that is not decoding, keep it out of the speed."""
        for li in self.rows:
            self.lanes[li].t_decode += seconds
            self.stats[li].warmup_s += seconds

    # -- choosing tokens -------------------------------------------------------------

    def waiting(self) -> list[int]:
        """The rows whose lanes have logits to choose from."""
        return [r for r, li in enumerate(self.rows) if li in self.logits]

    def choose(self, rows: list[int]) -> Step:
        """The next token of each of ``rows`` in one batched pass (no vocabulary sort), a
        branch's forced tokens in place of the draw. The ids and log-probs are the only
        thing read back from the device."""
        lanes = [self.lanes[self.rows[r]] for r in rows]
        logits = torch.stack([self.logits.pop(lane.index) for lane in lanes])  # [B, V]
        dev = logits.device
        # NaN/inf logits (overflowing activations, broken weights) would sample garbage
        # with NaN log-probs: such a lane stops with the "error" reason instead. The flag
        # stays on the device and comes back with the ids (one sync per step). A row's
        # max and min are finite exactly when all of it is (both propagate NaN): two
        # vectorised reductions, where isfinite().all() took 0.8 ms a 128k row here.
        finite = finite_rows(logits)  # and the non-finite entries zeroed
        if self.sample_limit is not None:
            logits[:, self.sample_limit:] = float("-inf")
        for k, lane in enumerate(lanes):  # a constraint says itself when its output ends
            if len(lane.tokens) < lane.min_tokens and lane.stop_ids and lane.constraint is None:
                logits[k, sorted(lane.stop_ids)] = float("-inf")
        previous = [torch.tensor(lane.context, device=dev) if lane.params.repetition_penalty != 1.0 else None
                    for lane in lanes]
        bitmask, stuck = choice_masks(lanes, logits.shape[-1])
        choice = choose_tokens(logits, [lane.params for lane in lanes], previous,
                               [lane.generator for lane in lanes], flags=finite,
                               bitmask=None if bitmask is None else bitmask.to(dev, non_blocking=True))
        for k, lane in enumerate(lanes):  # a branch's forced tokens replace the draw
            if len(lane.tokens) < len(lane.forced):
                tok = lane.forced[len(lane.tokens)]
                choice.ids[k] = tok
                choice.logprobs[k] = float(logits[k].log_softmax(-1)[tok])
        return Step(logits, choice, previous, bitmask, stuck)

    def take(self, li: int, k: int, step: Step) -> Token | None:
        """Row k of ``step`` into lane li (with its alternatives when inspected); the
        event, or None when the lane stopped (its ``done`` set)."""
        lane = self.lanes[li]
        if not step.choice.flags[k]:
            lane.done = finish(lane, "error")
        elif k in step.stuck:  # the constraint allows nothing more (and no stop token)
            lane.done = finish(lane, step.stuck[k])
        if lane.done is not None:
            self.first_token(li)
            return None
        top = None
        if lane.inspect:
            logits = step.logits[k]
            allowed = None if lane.constraint is None else allowed_tokens(step.bitmask[k], logits.shape[-1])
            top = self.alternatives(lane, logits, step.previous[k], allowed)
        ev = self.accept(lane, step.choice.ids[k], step.choice.logprobs[k], top)
        self.first_token(li)
        return ev

    def alternatives(self, lane: Lane, logits: torch.Tensor, previous: torch.Tensor | None,
                     allowed: torch.Tensor | None, filtered: torch.Tensor | None = None) -> dict:
        """The inspector's top alternatives at one position, each named (the UI has no tokenizer)."""
        top = top_alternatives(logits, lane.params, previous, k=lane.inspect, filtered=filtered,
                               allowed=None if allowed is None else allowed.to(logits.device))
        top["pieces"] = {i: self.piece(i) for i, _ in top["raw"] + top["filtered"]}
        return top

    def first_token(self, li: int) -> None:
        """Time to first token counts from the request's arrival to its first choice."""
        st = self.stats[li]
        if st.ttft_s == 0.0:
            st.ttft_s = time.perf_counter() - self.lanes[li].t_join

    def accept(self, lane: Lane, tok: int, logprob: float, top: dict | None) -> Token | None:
        """Append lane's chosen token; returns its event, or None if the lane just stopped.
        ``logprob`` is under the raw distribution."""
        q = lane.params
        if tok in lane.stop_ids:
            lane.done = finish(lane, "eos", stop_token=tok)
            return None
        if lane.constraint is not None and not lane.constraint.advance(tok):
            lane.done = finish(lane, "error")  # cannot happen with the mask applied
            return None
        lane.tokens.append(tok)
        lane.logprobs.append(logprob)
        lane.text += lane.decoder.push(tok)
        reason = None
        if len(lane.tokens) < lane.min_tokens:  # a stop string may begin only after this text
            lane.stop_from = len(lane.text)
        for s in (q.stop if len(lane.tokens) >= lane.min_tokens else ()):
            at = lane.text.find(s, lane.stop_from)
            if at >= 0:
                lane.text = lane.text[:at]
                reason = "stop"
        if reason is None and len(lane.tokens) >= q.max_new_tokens:
            reason = "length"
        if reason is not None:
            if reason != "stop":
                lane.text += lane.decoder.flush()
            safe = len(lane.text)
        else:
            safe = len(lane.text) - lane.stop_holdback()
        delta = lane.text[lane.emitted:safe] if safe > lane.emitted else ""
        lane.emitted = max(lane.emitted, safe)
        ev = Token(lane.index, len(lane.tokens) - 1, tok, delta, self.piece(tok), logprob, top)
        if reason is not None:
            lane.done = finish(lane, reason)
        return ev

    def accept_run(self, li: int, toks: list[int], raw: torch.Tensor, filt: torch.Tensor | None,
                   masks: torch.Tensor | None):
        """Several tokens of lane li at once (a verification's), ``raw`` the logits each
        was chosen from (``filt`` the same filtered, None: the inspector filters itself;
        ``masks`` the constraint's); yields their events and returns how many joined the
        reply (fewer when the lane stopped on one)."""
        lane = self.lanes[li]
        if not toks:
            return 0
        lps = torch.log_softmax(raw[: len(toks)], -1).gather(
            -1, torch.tensor(toks, device=raw.device).view(-1, 1)).view(-1).tolist()
        start = self.positions[li] + 1  # where the first of them goes in the cache
        appended = 0
        for i, (tok, lp) in enumerate(zip(toks, lps)):
            top = None
            if lane.inspect:
                prev = torch.tensor(lane.context, device=raw.device) if lane.params.repetition_penalty != 1.0 else None
                allowed = None if masks is None else allowed_tokens(masks[i], raw.shape[-1])
                top = self.alternatives(lane, raw[i], prev, allowed, None if filt is None else filt[i])
            before = len(lane.tokens)
            ev = self.accept(lane, tok, lp, top)
            appended += len(lane.tokens) - before
            self.first_token(li)
            if ev is not None:
                yield ev
            if lane.done is None and start + i >= self.max_context:
                lane.done = finish(lane, "context")
            if lane.done is not None:
                break
        return appended
