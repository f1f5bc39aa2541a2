"""Generation: prefill and decode loops that yield typed events.

One :class:`Engine` owns a model, its tokenizer and a KV cache that it keeps between
requests, so a chat turn that extends the previous prompt only prefills its new tokens.
Everything is a Python generator: callers iterate events, and cancel through a
``threading.Event`` that is checked between prefill chunks and at every decode step.

Rows of the batch are "lanes": a comparison runs N sampler settings over one prompt
(prefilled once, copied into N rows), and ``generate_batch`` runs different prompts
side by side. A single reply is a comparison of one lane, so both share one loop, and
``serve`` lets new requests join that loop between decode steps (continuous batching).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch

from core.model import quant
from core.engine.beam import beam_search
from core.engine.events import Done, Event, Prefilled, Stats, Token
from core.engine.constrain import ConstraintState, Vocabulary, allowed_tokens, fill_masks, new_bitmask
from core.errors import SettingsError
from core.model.decode_step import DecodeStep
from core.model.kv_cache import KVCache, static_capacity
from core.model.memory import release_freed_heap
from core.engine.sampling import Choice, choose_tokens, top_alternatives, seeded_generator
from core.engine.settings import SamplingParams
from core.tokenizer import StreamDecoder, Tokenizer

#: cancel should land within this many seconds of a prefill; chunks are sized to it
PREFILL_TARGET_S = 0.08
MIN_PREFILL_CHUNK = 16
#: most prompt tokens one layer-by-layer prefill pass holds (its hidden states stay in memory)
LAYERED_PASS = 4096


@dataclass
class Joining:
    """One request of a batch: a prompt and the lanes that share its prefill.

    Each lane stops on its own when ``cancel`` is set (checked every decode step).
    """
    prompt: list[int]
    lanes: Sequence[SamplingParams]
    cancel: threading.Event | None = None
    strip_leading_space: bool = False
    inspect: int = 0  # top alternatives to record per token (0: none)
    stop_ids: frozenset[int] | None = None  # None: the engine's default_stop_ids
    forced: tuple[int, ...] = ()  # the reply's first tokens, taken instead of sampled (a branch)


@dataclass
class _Lane:
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
class _Step:
    """One decode step's choice for every row (Engine._choose)."""
    logits: torch.Tensor  # [B, V], masked as sampled
    choice: Choice
    previous: list[torch.Tensor | None]  # the repetition penalty's history per row
    bitmask: torch.Tensor | None
    stuck: dict[int, str]


def _check_cancel(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


class Engine:
    """Runs requests against one model and keeps its KV cache between them.

    Args:
        model: a :class:`core.model.transformer.Transformer` in eval mode.
        tokenizer: the model's tokenizer.
        max_context: most positions a request may use (default: the model's context).
        prefill_chunk: prompt tokens per forward pass, so cancel lands between chunks.
        preallocate: size the KV cache for prompt + max_new_tokens (bounded by max_context)
            when a request starts, so decode never reallocates; by default it grows with
            the conversation, so a huge max_new_tokens costs nothing until tokens exist.
        compile: run decode steps through ``torch.compile`` (True: inductor, or a backend's
            name): on CUDA a static-cache step captured as CUDA graphs, on the CPU the
            ordinary step with dynamic shapes (:mod:`core.model.decode_step`). Where compiling
            fails the engine falls back to eager once and ``compile_status`` says why.
            Prefill stays eager (its length varies).
        static: decode on a preallocated static cache with fixed shapes (default: when
            compiling on CUDA); the cache then grows in powers of two.
        stop_ids: the tokens that end a reply when a call names none (default: the
            tokenizer's); a request's own stop ids go with the request, never onto the engine.
        threads: (prefill, decode) torch threads, set around each phase
            (:func:`core.model.tuning.thread_plan`); None leaves the process setting alone.
    """

    def __init__(self, model, tokenizer: Tokenizer, *, max_context: int | None = None,
                 prefill_chunk: int = 512, stop_ids: Sequence[int] | None = None,
                 preallocate: bool = False, compile: bool | str = False, static: bool | None = None,
                 threads: tuple[int, int] | None = None):
        self.model = model
        self.threads = threads
        self.tokenizer = tokenizer
        self.max_context = int(max_context or model.args.max_seq_len)
        self.prefill_chunk = prefill_chunk
        self.preallocate = preallocate
        self._step = DecodeStep(model, compile, static)
        self.default_stop_ids = frozenset(stop_ids if stop_ids is not None else tokenizer.stop_ids)
        self.cache = KVCache.for_model(model)
        # Embedding rows past the tokenizer (padded vocabularies) cannot be decoded: never sample them.
        tv = int(getattr(tokenizer, "vocab_size", 0) or 0)
        self.sample_limit = tv if 0 < tv < model.args.vocab_size else None
        self._prefill_tok_s: float | None = None  # measured, sizes the next chunks
        self._layer_tok_s: float | None = None  # the same for one layer (layered prefill)
        # CPU-packed weights: a long prompt is prefilled layer by layer (_prefill_layered)
        self._packed = bool(quant.packed_on_cpu(model))
        # Speculative decoding: draft models by name (draft_loader loads one on first use)
        # and the measured time of an undrafted step per batch size (for the speed-up).
        self.drafts: dict = {}
        self.draft_loader: Callable[[str], object] | None = None
        self.spec_step_s: dict[int, float] = {}
        self._vocabulary: Vocabulary | None = None

    @property
    def vocabulary(self) -> Vocabulary:
        """The grammar engine's view of the vocabulary, built on the first constrained request."""
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self.tokenizer, self.model.args.vocab_size)
        return self._vocabulary

    @property
    def compile_status(self) -> str:
        """Which decode path runs: "compiled (inductor, CUDA graphs)", "compiled (inductor)",
        "compiles at the first decode step (...)" before that step, or "eager: <why>"."""
        return self._step.status

    @property
    def device(self) -> torch.device:
        return self.model.tok_embeddings.weight.device

    # -- prefill ---------------------------------------------------------------------

    @torch.inference_mode()
    def _prefill_row(self, row: int, prompt: list[int], cancel) -> tuple[torch.Tensor | None, int]:
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
            if _check_cancel(cancel):
                return None, reuse
            if self._packed and len(prompt) - pos >= quant.DENSE_ROWS:
                n = min(len(prompt) - pos, LAYERED_PASS)
                logits = self._prefill_layered(prompt[pos:pos + n], pos, view, cancel)
                if logits is None:
                    return None, reuse
                pos += n
                self.cache.tokens[row] = list(prompt[:pos])
                continue
            chunk = prompt[pos: pos + self._chunk_size()]
            x = torch.tensor([chunk], device=self.device)
            self._use_threads(0)
            t = time.perf_counter()
            logits = self.model(x, pos, view, last_only=True)[0, -1]
            if self.device.type == "cpu":  # elsewhere the time would measure the launch only
                dt = time.perf_counter() - t
                if dt > 0:
                    rate = len(chunk) / dt
                    self._prefill_tok_s = rate if self._prefill_tok_s is None else 0.5 * (self._prefill_tok_s + rate)
            pos += len(chunk)
            self.cache.tokens[row] = list(prompt[:pos])
        return logits, reuse

    def _prefill_layered(self, tokens: list[int], start: int, view, cancel) -> torch.Tensor | None:
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
        self._use_threads(0)
        h = m.tok_embeddings(torch.tensor([tokens], device=self.device))
        for layer in m.layers:
            if _check_cancel(cancel):
                return None
            with quant.dense_weights(layer):
                a = 0
                while a < len(tokens):
                    if _check_cancel(cancel):
                        return None
                    b = min(len(tokens), a + self._layer_chunk())
                    t = time.perf_counter()
                    rope, mask, pos = m.positions(h[:, a:b], start + a, view)
                    h[:, a:b] = layer(h[:, a:b], rope, mask, view, pos)
                    dt = time.perf_counter() - t
                    if dt > 0:
                        rate = (b - a) / dt
                        self._layer_tok_s = rate if self._layer_tok_s is None else 0.5 * (self._layer_tok_s + rate)
                    a = b
            release_freed_heap()  # glibc would keep the layer's freed bf16 copies resident
        return m.output(m.norm(h[:, -1:])).float()[0, -1]

    def _layer_chunk(self) -> int:
        """Tokens per step of a layered prefill: what one layer runs in PREFILL_TARGET_S."""
        if self._layer_tok_s is None:
            return min(self.prefill_chunk, 4 * MIN_PREFILL_CHUNK)
        return min(self.prefill_chunk, max(MIN_PREFILL_CHUNK, round(self._layer_tok_s * PREFILL_TARGET_S)))

    def _take_best_row(self, r0: int, prompt: list[int]) -> None:
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

    def _chunk_size(self) -> int:
        """Prompt tokens per prefill forward: what the measured speed runs in
        PREFILL_TARGET_S (so cancel lands within ~0.1 s), capped by ``prefill_chunk``;
        the first chunk of a model is small, to measure it."""
        if self._prefill_tok_s is None:
            return min(self.prefill_chunk, 4 * MIN_PREFILL_CHUNK)
        return min(self.prefill_chunk, max(MIN_PREFILL_CHUNK, round(self._prefill_tok_s * PREFILL_TARGET_S)))

    def add_draft(self, name: str, model, tokenizer):
        """Register ``model`` as the draft model lanes call ``name`` (their ``draft``).

        Raises:
            DraftModelError: its vocabulary differs from this engine's tokenizer.
        """
        from core.engine.speculative import DraftModel
        d = DraftModel(model, tokenizer, target_tokenizer=self.tokenizer, target_device=self.device, name=name)
        self.drafts[name] = d
        return d

    def draft_model(self, name: str):
        """The draft model called ``name``, loaded through ``draft_loader`` if need be."""
        if name not in self.drafts:
            if self.draft_loader is None:
                raise SettingsError(f"no draft model {name!r} is loaded")
            d = self.draft_loader(name)
            self.drafts[name] = d if d is not None else self.drafts[name]
        return self.drafts[name]

    def _check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise SettingsError("the prompt is empty: nothing to condition on")
        if len(prompt) >= self.max_context:
            raise SettingsError(
                f"the prompt is {len(prompt)} tokens, but the context holds {self.max_context}")
        vocab = self.model.args.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise SettingsError(f"token id {bad[0]} is outside the vocabulary (size {vocab})")

    # -- public entry points ---------------------------------------------------------

    def generate(self, prompt: list[int], params: SamplingParams, *, cancel: threading.Event | None = None,
                 strip_leading_space: bool = False, inspect: int = 0,
                 stop_ids: Iterable[int] | None = None, forced: Sequence[int] = ()) -> Iterator[Event]:
        """Stream one reply to ``prompt`` (token ids, BOS included).

        Yields Prefilled, then Token events, then one Done. Beam search (num_beams > 1)
        yields its tokens once the best beam is known. ``stop_ids`` end this reply
        (default: the engine's ``default_stop_ids``). ``forced``: the reply's first tokens,
        taken instead of sampled (with their log-probs and alternatives, as if drawn):
        branching a reply at a token is its prefix as the end of ``prompt`` (reused from
        the KV cache) and the chosen alternative forced.
        """
        if params.num_beams > 1:
            if forced:
                raise SettingsError("a forced token (a branch) does not combine with beam search")
            return self._beam(prompt, params.validate(), cancel, strip_leading_space, self._stops(stop_ids))
        return self.generate_lanes(prompt, [params], cancel=cancel, strip_leading_space=strip_leading_space,
                                   inspect=inspect, stop_ids=stop_ids, forced=forced)

    def generate_lanes(self, prompt: list[int], lanes: Sequence[SamplingParams], *,
                       cancel: threading.Event | None = None, strip_leading_space: bool = False,
                       inspect: int = 0, stop_ids: Iterable[int] | None = None,
                       forced: Sequence[int] = ()) -> Iterator[Event]:
        """Decode one prompt under several sampler settings together (a comparison).

        The prompt is prefilled once, copied into one cache row per lane, and every step
        decodes all unfinished lanes in one batched forward. ``forced`` as in :meth:`generate`,
        for every lane.
        """
        if not 1 <= len(lanes) <= 8:
            raise SettingsError(f"a comparison has 1 to 8 lanes, got {len(lanes)}")
        return self._run([Joining(prompt, list(lanes), cancel, strip_leading_space, inspect,
                                  self._stops(stop_ids), tuple(int(t) for t in forced))])

    def _stops(self, stop_ids: Iterable[int] | None) -> frozenset[int]:
        return self.default_stop_ids if stop_ids is None else frozenset(stop_ids)

    def generate_batch(self, prompts: Sequence[list[int]], params: SamplingParams, *,
                       cancel: threading.Event | None = None, strip_leading_space: bool = False) -> Iterator[Event]:
        """Decode several different prompts side by side with the same settings."""
        if not prompts:
            raise SettingsError("no prompts given")
        base = params.resolved()
        # Seed each row differently but reproducibly so rows of a batch do not mirror each other.
        lanes = [SamplingParams.from_dict({**base.to_dict(), "seed": base.seed + i}) for i in range(len(prompts))]
        return self._run([Joining(list(p), [q], cancel, strip_leading_space) for p, q in zip(prompts, lanes)])

    def serve(self, admit: Callable[[int, int], Sequence[Joining]], *, max_rows: int = 16) -> Iterator[Event]:
        """Continuous batching: decode the running requests together and, before every
        step, let new ones join while fewer than ``max_rows`` rows are busy.

        ``admit(free_rows, next_lane)`` returns the requests to start now, validated by
        :meth:`check_request`, using at most ``free_rows`` lanes in all; their lanes are
        numbered from ``next_lane`` in order. Returns once no lane runs and ``admit``
        brings nothing.
        """
        return self._loop([], admit, max_rows)

    def check_request(self, prompt: list[int], lanes: Sequence[SamplingParams]) -> list[SamplingParams]:
        """Raise SettingsError for a prompt or setting the engine cannot run; returns the
        lanes' settings validated, each with a concrete seed."""
        self._check_prompt(prompt)
        lanes = [q.validate().resolved().with_text_bias(self.tokenizer.encode).validate() for q in lanes]
        vocab = self.model.args.vocab_size
        for q in lanes:
            bad = [t for t in q.logit_bias if t >= vocab]
            if bad:
                raise SettingsError(f"logit_bias: token id {bad[0]} is outside the vocabulary (size {vocab})")
            if q.draft:
                self.draft_model(q.draft)  # load and check it now: a bad one fails the request
            if q.constraint is not None:
                self.vocabulary.check(q.constraint)  # ConstraintError before anything streams
        return lanes

    # -- the decode loop -------------------------------------------------------------

    def _run(self, joining: list[Joining]) -> Iterator[Event]:
        for j in joining:
            j.lanes = self.check_request(j.prompt, j.lanes)
            if j.forced:
                self._check_prompt(list(j.prompt) + list(j.forced))
        if any(q.speculative for j in joining for q in j.lanes):
            from core.engine.speculative import speculative_loop
            return speculative_loop(self, joining)
        return self._loop(joining, None, 0)

    def _join(self, j: Joining, lanes: list[_Lane], stats: list[Stats], rows: list[int],
              positions: list[int], logits_by_lane: dict) -> Iterator[Event]:
        """Prefill j's prompt into the first free row, copy it into one row per lane."""
        t0 = time.perf_counter()
        first, r0, n = len(lanes), len(rows), len(j.lanes)
        stops = self._stops(j.stop_ids)
        if self.preallocate or self._step.static:
            need = max(min(len(j.prompt) + q.max_new_tokens, self.max_context) for q in j.lanes)
        else:
            need = len(j.prompt) + 1
        self.cache.ensure(r0 + n, self._capacity(need))
        for q in j.lanes:
            lanes.append(_Lane(len(lanes), q, seeded_generator(q, self.device),
                               StreamDecoder(self.tokenizer, strip_leading_space=j.strip_leading_space),
                               j.prompt, cancel=j.cancel, inspect=j.inspect, stop_ids=stops,
                               constraint=None if q.constraint is None else self.vocabulary.start(q.constraint, stops),
                               forced=j.forced))
            stats.append(Stats(prompt_tokens=len(j.prompt)))
            positions.append(len(j.prompt))
        self._take_best_row(r0, j.prompt)
        logits, reuse = self._prefill_row(r0, j.prompt, j.cancel)
        seconds = time.perf_counter() - t0
        for i in range(first, first + n):
            stats[i].cached_tokens, stats[i].prefill_s = reuse, seconds
            lanes[i].t_join, lanes[i].t_decode = t0, t0 + seconds
        yield Prefilled(prompt_tokens=len(j.prompt), cached_tokens=reuse, seconds=seconds,
                        lanes=tuple(range(first, first + n)))
        if logits is None:
            for i in range(first, first + n):
                yield self._finish(lanes[i], "cancelled", stats[i])
            return
        for k in range(1, n):
            self.cache.copy_row(r0, r0 + k, len(j.prompt))
        for i in range(first, first + n):
            rows.append(i)
            logits_by_lane[i] = logits

    @torch.inference_mode()
    def _loop(self, joining: list[Joining], admit, max_rows: int) -> Iterator[Event]:
        dev = self.device
        lanes: list[_Lane] = []
        stats: list[Stats] = []
        positions: list[int] = []  # next position to write, per lane
        rows: list[int] = []  # rows[i] = lane index held in cache row i
        logits_by_lane: dict[int, torch.Tensor] = {}
        feed: list[int] = []
        while True:
            if rows:
                # Run the token each row just drew.
                x = torch.tensor(feed, device=dev).view(len(rows), 1)
                pos_list = [positions[li] for li in rows]
                self.cache.ensure(len(rows), self._capacity(max(pos_list) + 1))  # grows with the replies
                if all(p == pos_list[0] for p in pos_list):
                    pos = pos_list[0]
                else:
                    pos = torch.tensor(pos_list, device=dev)
                warm = self._step.warmup_s
                out = self._decode(x, pos)[:, -1]  # [B, V]
                warm = self._step.warmup_s - warm
                if warm:  # compiling or recording a graph is not decoding: keep it out of the speed
                    for li in rows:
                        lanes[li].t_decode += warm
                        stats[li].warmup_s += warm
                for r, li in enumerate(rows):
                    logits_by_lane[li] = out[r]
                    positions[li] += 1
            # New requests take the rows after the running ones.
            if admit is not None and max_rows > len(rows):
                joining = list(admit(max_rows - len(rows), len(lanes)))
            for j in joining:
                yield from self._join(j, lanes, stats, rows, positions, logits_by_lane)
            joining = []
            if not rows:
                return
            # Every active lane picks its token in one batched pass (no vocabulary sort);
            # the ids and log-probs are the only thing read back from the device.
            feed = []
            step = self._choose(lanes, rows, torch.stack([logits_by_lane[i] for i in rows]))  # [B, V]
            now = time.perf_counter()
            for r, lane_idx in enumerate(rows):
                lane, st = lanes[lane_idx], stats[lane_idx]
                ev = self._take(lane, r, step)
                if st.ttft_s == 0.0:
                    st.ttft_s = time.perf_counter() - lane.t_join
                if ev is not None:
                    yield ev
                if lane.done is None and positions[lane_idx] >= self.max_context:
                    lane.done = self._finish(lane, "context", None)
                if lane.done is None and _check_cancel(lane.cancel):
                    lane.done = self._finish(lane, "cancelled", None)
                if lane.done is not None:
                    st.generated_tokens = len(lane.tokens)
                    st.decode_s = now - lane.t_decode
                    if self._step.backend is not None:
                        st.decode = self.compile_status
                    lane.done.stats = st
                    yield lane.done
                feed.append(lane.tokens[-1] if lane.tokens else 0)
            keep = [k for k, li in enumerate(rows) if lanes[li].done is None]
            if not keep:
                self._remember(lanes, rows, positions)
                if admit is None:
                    return
            if len(keep) < len(rows):
                # Compact: surviving lanes move to the lowest rows so the batch shrinks.
                for new_row, old_row in enumerate(keep):
                    if new_row != old_row:
                        self.cache.copy_row(old_row, new_row, positions[rows[old_row]])
                feed = [feed[k] for k in keep]
                rows[:] = [rows[k] for k in keep]

    def _choose(self, lanes: list[_Lane], rows: list[int], step_logits: torch.Tensor) -> "_Step":
        """Every row's next token in one batched pass (no vocabulary sort), a branch's
        forced tokens in place of the draw; ``step_logits`` [B, V] is masked in place.
        The ids and log-probs are the only thing read back from the device."""
        dev = step_logits.device
        # NaN/inf logits (overflowing activations, broken weights) would sample garbage
        # with NaN log-probs: such a lane stops with the "error" reason instead. The flag
        # stays on the device and comes back with the ids (one sync per step). A row's
        # max and min are finite exactly when all of it is (both propagate NaN): two
        # vectorised reductions, where isfinite().all() took 0.8 ms a 128k row here.
        finite = torch.isfinite(step_logits.amax(-1)) & torch.isfinite(step_logits.amin(-1))
        # zeroing non-finite entries is the identity on healthy rows, so it is done always
        torch.nan_to_num_(step_logits, nan=0.0, posinf=0.0, neginf=0.0)
        if self.sample_limit is not None:
            step_logits[:, self.sample_limit:] = float("-inf")
        previous = [torch.tensor(lanes[i].prompt + lanes[i].tokens, device=dev)
                    if lanes[i].params.repetition_penalty != 1.0 else None for i in rows]
        bitmask, stuck = self._masks(lanes, rows, step_logits.shape[-1])
        choice = choose_tokens(step_logits, [lanes[i].params for i in rows], previous,
                               [lanes[i].generator for i in rows], flags=finite,
                               bitmask=None if bitmask is None else bitmask.to(dev, non_blocking=True))
        for r, li in enumerate(rows):  # a branch's forced tokens replace the draw
            lane = lanes[li]
            if len(lane.tokens) < len(lane.forced):
                tok = lane.forced[len(lane.tokens)]
                choice.ids[r] = tok
                choice.logprobs[r] = float(step_logits[r].log_softmax(-1)[tok])
        return _Step(step_logits, choice, previous, bitmask, stuck)

    def _take(self, lane: _Lane, r: int, step: "_Step") -> Token | None:
        """Row r's chosen token into its lane (with its alternatives when inspected); the
        event, or None when the lane stopped (its ``done`` set)."""
        if not step.choice.flags[r]:
            lane.done = self._finish(lane, "error", None)
            return None
        if r in step.stuck:  # the constraint allows nothing more (and no stop token)
            lane.done = self._finish(lane, step.stuck[r], None)
            return None
        top = None
        if lane.inspect:
            logits = step.logits[r]
            allowed = None if lane.constraint is None else allowed_tokens(step.bitmask[r], logits.shape[-1])
            top = top_alternatives(logits, lane.params, step.previous[r], k=lane.inspect,
                                   allowed=None if allowed is None else allowed.to(logits.device))
            # The UI has no tokenizer: name every alternative here.
            top["pieces"] = {i: self._piece(i) for i, _ in top["raw"] + top["filtered"]}
        return self._accept(lane, step.choice.ids[r], step.choice.logprobs[r], top)

    @staticmethod
    def _masks(lanes: list[_Lane], rows: list[int], vocab: int) -> tuple[torch.Tensor | None, dict[int, str]]:
        """The step's constraint bitmask [B, ceil(V/32)] (CPU; None when no lane is
        constrained) and the rows whose constraint allows no token at all, with the reason
        they stop: "eos" when the output is complete, else "error"."""
        held = [(r, lanes[li].constraint) for r, li in enumerate(rows) if lanes[li].constraint is not None]
        if not held:
            return None, {}
        bitmask = new_bitmask(len(rows), vocab)
        fill_masks(held, bitmask)
        empty = (bitmask[[r for r, _ in held]] == 0).all(-1).tolist()
        return bitmask, {r: ("eos" if st.accepting else "error") for (r, st), e in zip(held, empty) if e}

    def _use_threads(self, phase: int) -> None:
        """Set torch's threads for prefill (0) or decode (1) when the engine was given a plan."""
        if self.threads is not None and torch.get_num_threads() != self.threads[phase]:
            torch.set_num_threads(self.threads[phase])

    def _decode(self, x: torch.Tensor, pos) -> torch.Tensor:
        """One decode step: compiled when asked and it works, else eager."""
        self._use_threads(1)
        return self._step(x, pos, self.cache)

    def _capacity(self, positions: int) -> int:
        """Cache positions to hold ``positions``: a static cache grows in powers of two."""
        return static_capacity(positions, self.max_context) if self._step.static else positions

    def _remember(self, lanes, rows, positions) -> None:
        """Record what row 0 holds so the next turn can reuse it."""
        # After compaction row r holds lane rows[r]; rows that finished earlier were
        # overwritten, so only the surviving mapping is trustworthy.
        for r, li in enumerate(rows):
            lane = lanes[li]
            self.cache.tokens[r] = (lane.prompt + lane.tokens)[: positions[li]]
        for r in range(len(rows), self.cache.batch):
            self.cache.tokens[r] = []

    def _accept(self, lane: _Lane, tok: int, logprob: float, top: dict | None) -> Token | None:
        """Append lane's chosen token; returns its event, or None if the lane just stopped.
        ``logprob`` is under the raw distribution."""
        q = lane.params
        if tok in lane.stop_ids:
            lane.done = self._finish(lane, "eos", None, stop_token=tok)
            return None
        if lane.constraint is not None and not lane.constraint.advance(tok):
            lane.done = self._finish(lane, "error", None)  # cannot happen with the mask applied
            return None
        lane.tokens.append(tok)
        lane.logprobs.append(logprob)
        lane.text += lane.decoder.push(tok)
        reason = None
        for s in q.stop:
            at = lane.text.find(s)
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
        ev = Token(lane.index, len(lane.tokens) - 1, tok, delta, self._piece(tok), logprob, top)
        if reason is not None:
            lane.done = self._finish(lane, reason, None)
        return ev

    def _beam_logits(self, out: torch.Tensor) -> torch.Tensor:
        if not bool(torch.isfinite(out).all()):
            raise SettingsError("the model produced NaN or infinite logits: its weights or activations "
                                "overflow (try float32)")
        if self.sample_limit is not None:
            out = out.clone()
            out[..., self.sample_limit:] = float("-inf")
        return out

    def _piece(self, tok: int) -> str:
        return self.tokenizer.token_bytes(tok).decode("utf-8", errors="replace")

    def _finish(self, lane: _Lane, reason: str, stats: Stats | None, stop_token: int | None = None) -> Done:
        if reason in ("eos", "context", "cancelled"):
            lane.text += lane.decoder.flush()
        error = lane.constraint.failure() if reason == "error" and lane.constraint is not None else ""
        if reason == "error" and not error:
            error = "the model produced NaN or infinite logits: its weights or activations overflow (try float32)" + (
                f", or the {lane.constraint.describe()} left no token to choose" if lane.constraint is not None else "")
        return Done(lane.index, reason, list(lane.tokens), lane.text, list(lane.logprobs),
                    lane.params, stats, stop_token, error)

    # -- beam search -----------------------------------------------------------------

    def _beam(self, prompt, params: SamplingParams, cancel, strip_leading_space, stops) -> Iterator[Event]:
        self._check_prompt(prompt)
        return self._beam_loop(prompt, params, cancel, strip_leading_space, stops)

    @torch.inference_mode()
    def _beam_loop(self, prompt, params, cancel, strip_leading_space, stops) -> Iterator[Event]:
        t0 = time.perf_counter()
        nb = params.num_beams
        max_new = min(params.max_new_tokens, self.max_context - len(prompt))
        self.cache.ensure(nb, len(prompt) + (max_new if self.preallocate else 1))
        logits, reuse = self._prefill_row(0, prompt, cancel)
        stats = Stats(prompt_tokens=len(prompt), cached_tokens=reuse, prefill_s=time.perf_counter() - t0)
        yield Prefilled(len(prompt), reuse, stats.prefill_s)
        lane = _Lane(0, params, seeded_generator(params), StreamDecoder(self.tokenizer, strip_leading_space=strip_leading_space), prompt)
        if logits is None:
            yield self._finish(lane, "cancelled", stats)
            return
        for r in range(1, nb):
            self.cache.copy_row(0, r, len(prompt))
        pos = len(prompt)
        t_dec = time.perf_counter()

        def step(tokens: list[int], origin: list[int]) -> torch.Tensor | None:
            nonlocal pos
            if _check_cancel(cancel):
                return None
            self.cache.ensure(nb, pos + 1)
            self.cache.reorder(torch.tensor(origin, device=self.device), pos)
            x = torch.tensor(tokens, device=self.device).view(len(tokens), 1)
            self._use_threads(1)
            out = self.model(x, pos, self.cache, last_only=True)[:, -1]
            pos += 1
            return self._beam_logits(out)

        logits = self._beam_logits(logits)

        result = beam_search(step, logits, num_beams=nb, max_new_tokens=max_new, stop_ids=stops,
                             length_penalty=params.length_penalty)
        reason = "cancelled" if result.cancelled else ("eos" if result.stop_token is not None else
                                                       ("length" if max_new == params.max_new_tokens else "context"))
        self.cache.reset()  # beams reordered rows; nothing reliable to reuse
        stats.ttft_s = time.perf_counter() - t0
        for i, (tok, lp) in enumerate(zip(result.tokens, result.logprobs)):
            lane.tokens.append(tok)
            lane.logprobs.append(lp)
            delta = lane.decoder.push(tok)
            lane.text += delta
            yield Token(0, i, tok, delta, self._piece(tok), lp)
        stats.generated_tokens = len(lane.tokens)
        stats.decode_s = time.perf_counter() - t_dec
        yield self._finish(lane, reason, stats, stop_token=result.stop_token)
