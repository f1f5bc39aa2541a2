"""Generation: prefill and the one decode loop, yielding typed events.

One :class:`Engine` owns a model, its tokenizer and a KV cache that it keeps between
requests, so a chat turn that extends the previous prompt only prefills its new tokens.
Everything is a Python generator: callers iterate events, and cancel through a
``threading.Event`` that is checked between prefill chunks and at every decode step.

Rows of the batch are "lanes" (:mod:`core.engine.batch`): a comparison runs N sampler
settings over one prompt (prefilled once, copied into N rows), and ``generate_batch`` runs
different prompts side by side. A single reply is a comparison of one lane, so all share
one loop; lanes that draft (:mod:`core.engine.speculative`) take part in it too, and
``serve`` lets any new request join that loop between decode steps (continuous batching).
Speculative decoding and beam search use the engine's public services: ``decode``,
``forward``, ``prefill_row``, ``capacity``, ``piece``.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch

from core import limits
from core.engine.batch import Batch, Lane, finish
from core.engine.beam import beam_generate
from core.engine.constrain import Vocabulary
from core.engine.constraint import Constraint
from core.engine.drafters import DraftModel
from core.engine.events import Event, Prefilled
from core.engine.prefill import Prefill
from core.engine.sampling import seeded_generator
from core.engine.settings import SamplingParams
from core.engine.speculative import Drafting
from core.errors import ConstraintError, SettingsError
from core.model.decode_step import DecodeStep
from core.model.kv_cache import KVCache, static_capacity
from core.prompt.tool_format import ToolCalling
from core.tokenizer import StreamDecoder, Tokenizer
from core.tools.spec import ToolError

MAX_LANES = 8  # lanes of one comparison


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
    continued: str = ""  # a continued reply's text so far: its output format starts past it
    min_tokens: int = 0  # stop tokens and stop strings end no lane before it has this many tokens
    tools: ToolCalling | None = None  # the functions its replies may call (each lane's tool_choice says how)


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
        # Batch invariance (core.model.transformer) where a decode step can be shared: serve,
        # comparison lanes, batches. A lone reply shares no step and takes the fast one-row path:
        # at one row invariance cost 0.36x of decode speed on a 2048-dim float32 model.
        self.batch_invariant = True
        self.threads = threads
        self.tokenizer = tokenizer
        self.max_context = int(max_context or model.args.max_seq_len)
        self.preallocate = preallocate
        self._step = DecodeStep(model, compile, static)
        self.default_stop_ids = frozenset(stop_ids if stop_ids is not None else tokenizer.stop_ids)
        self.cache = KVCache.for_model(model)
        self._prefill = Prefill(model, self.cache, chunk=prefill_chunk, use_threads=lambda: self._use_threads(0))
        # Embedding rows past the tokenizer (padded vocabularies) cannot be decoded: never sample them.
        tv = int(getattr(tokenizer, "vocab_size", 0) or 0)
        self.sample_limit = tv if 0 < tv < model.args.vocab_size else None
        # Speculative decoding: draft models by name (draft_loader loads one on first use).
        self.drafts: dict = {}
        self.draft_loader: Callable[[str], object] | None = None
        # The measured time of a plain decode step per batch size: what drafting lanes'
        # tokens would have cost without drafting (their speed-up).
        self.plain_step_s: dict[int, float] = {}
        self._choice_s = 0.0  # what one batched choice of tokens takes (a running mean)
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

    # -- services (the loop, speculative decoding and beam search run on these) -------

    def prefill_row(self, row: int, prompt: list[int], cancel) -> tuple[torch.Tensor | None, int]:
        """Run prompt through cache row ``row``, reusing what the row holds: (the last
        logits [V], or None when cancelled; how many tokens were reused)."""
        with torch.inference_mode():
            return self._prefill.row(row, prompt, cancel)

    def decode(self, x: torch.Tensor, pos) -> torch.Tensor:
        """One decode step of x [B, 1] at ``pos`` over the first B rows: compiled when
        asked and it works, else eager. Logits [B, 1, V]."""
        self._use_threads(1)
        return self._step(x, pos, self.cache)

    def forward(self, x: torch.Tensor, pos, *, last_only: bool = False) -> torch.Tensor:
        """The model over x [B, T] at ``pos`` against the first B cache rows, eagerly
        (verification forwards, beams): logits [B, T, V] (the last position's with ``last_only``)."""
        self._use_threads(1)
        return self.model(x, pos, self.cache, last_only=last_only)

    def capacity(self, positions: int) -> int:
        """Cache positions to hold ``positions``: a static cache grows in powers of two."""
        return static_capacity(positions, self.max_context) if self._step.static else positions

    def piece(self, tok: int) -> str:
        """A token's own text (bytes that are not UTF-8 replaced)."""
        return self.tokenizer.token_bytes(tok).decode("utf-8", errors="replace")

    def decode_path(self) -> str:
        """The compiled decode path that ran, when compiling was asked; "" otherwise."""
        return self.compile_status if self._step.backend is not None else ""

    def check_prompt(self, prompt: list[int]) -> None:
        """Raise SettingsError for a prompt the engine cannot run."""
        if not prompt:
            raise SettingsError("the prompt is empty: nothing to condition on")
        if len(prompt) >= self.max_context:
            raise SettingsError(
                f"the prompt is {len(prompt)} tokens, but the context holds {self.max_context}")
        vocab = self.model.args.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise SettingsError(f"token id {bad[0]} is outside the vocabulary (size {vocab})")

    def _use_threads(self, phase: int) -> None:
        """Set torch's threads for prefill (0) or decode (1) when the engine was given a plan."""
        if self.threads is not None and torch.get_num_threads() != self.threads[phase]:
            torch.set_num_threads(self.threads[phase])

    # -- draft models ----------------------------------------------------------------

    def add_draft(self, name: str, model, tokenizer) -> DraftModel:
        """Register ``model`` as the draft model lanes call ``name`` (their ``draft``).

        Raises:
            DraftModelError: its vocabulary differs from this engine's tokenizer.
        """
        d = DraftModel(model, tokenizer, target_tokenizer=self.tokenizer, target_device=self.device, name=name)
        self.drafts[name] = d
        return d

    def draft_model(self, name: str) -> DraftModel:
        """The draft model called ``name``, loaded through ``draft_loader`` if need be."""
        if name not in self.drafts:
            if self.draft_loader is None:
                raise SettingsError(f"no draft model {name!r} is loaded")
            d = self.draft_loader(name)
            self.drafts[name] = d if d is not None else self.drafts[name]
        return self.drafts[name]

    # -- public entry points ---------------------------------------------------------

    def generate(self, prompt: list[int], params: SamplingParams, *, cancel: threading.Event | None = None,
                 strip_leading_space: bool = False, inspect: int = 0,
                 stop_ids: Iterable[int] | None = None, forced: Sequence[int] = (),
                 continued: str = "", tools: ToolCalling | None = None) -> Iterator[Event]:
        """Stream one reply to ``prompt`` (token ids, BOS included).

        Yields Prefilled, then Token events, then one Done. Beam search (num_beams > 1)
        yields its tokens once the best beam is known. ``stop_ids`` end this reply
        (default: the engine's ``default_stop_ids``). ``forced``: the reply's first tokens,
        taken instead of sampled (with their log-probs and alternatives, as if drawn):
        branching a reply at a token is its prefix as the end of ``prompt`` (reused from
        the KV cache) and the chosen alternative forced. ``continued``: the text of the
        reply this one carries on (the end of ``prompt``), which an output format has matched.
        ``tools``: the functions the reply may call (:func:`lane_constraint` says how a
        call is held; a reply that calls ends with stop reason "tool_calls").
        """
        if params.num_beams > 1:
            _no_tools_with_beams(params, tools)
            if forced:
                raise SettingsError("a forced token (a branch) does not combine with beam search")
            self.check_memory(len(prompt), [params])
            return beam_generate(self, prompt, params.validate(), cancel, strip_leading_space, self._stops(stop_ids))
        return self.generate_lanes(prompt, [params], cancel=cancel, strip_leading_space=strip_leading_space,
                                   inspect=inspect, stop_ids=stop_ids, forced=forced, continued=continued,
                                   shared=False, tools=tools)

    def generate_lanes(self, prompt: list[int], lanes: Sequence[SamplingParams], *,
                       cancel: threading.Event | None = None, strip_leading_space: bool = False,
                       inspect: int = 0, stop_ids: Iterable[int] | None = None,
                       forced: Sequence[int] = (), continued: str = "", shared: bool = True,
                       tools: ToolCalling | None = None) -> Iterator[Event]:
        """Decode one prompt under several sampler settings together (a comparison).

        The prompt is prefilled once, copied into one cache row per lane, and every step
        decodes all unfinished lanes in one batched forward. ``forced`` as in :meth:`generate`,
        for every lane. A lane with num_beams > 1 runs its beam search on its own after
        the sampled lanes (its beams take the cache's rows). ``shared``: decode steps run
        batch-invariant, so a lane gives the same tokens alone and beside others (False: a
        lone reply, :meth:`generate`).
        """
        if not 1 <= len(lanes) <= MAX_LANES:
            raise SettingsError(f"a comparison has 1 to {MAX_LANES} lanes, got {len(lanes)}")
        beams = [k for k, q in enumerate(lanes) if q.num_beams > 1]
        for k in beams:
            _no_tools_with_beams(lanes[k], tools)
        if beams and forced:
            raise SettingsError("a forced token (a branch) does not combine with beam search")
        sampled = [k for k in range(len(lanes)) if k not in beams]
        for k in beams:  # each runs on its own, one cache row per beam
            self.check_memory(len(prompt), [lanes[k]])
        parts = [(k, beam_generate(self, prompt, lanes[k].validate().resolved(), cancel, strip_leading_space,
                                   self._stops(stop_ids), lane=k)) for k in beams]
        if not sampled:
            return _chained([], parts)
        run = self._run([Joining(prompt, [lanes[k] for k in sampled], cancel, strip_leading_space, inspect,
                                 self._stops(stop_ids), tuple(int(t) for t in forced), continued, tools=tools)],
                        shared=shared)
        return run if not beams else _chained([(sampled, run)], parts)

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

    def serve(self, admit: Callable[[int, int], Sequence[Joining]], *, max_rows: int = 16,
              on_step: Callable[[], None] | None = None) -> Iterator[Event]:
        """Continuous batching: decode the running requests together and, before every
        step, let new ones join while fewer than ``max_rows`` rows are busy.

        ``admit(free_rows, next_lane)`` returns the requests to start now, validated by
        :meth:`check_request`, using at most ``free_rows`` lanes in all; their lanes are
        numbered from ``next_lane`` in order. Returns once no lane runs and ``admit``
        brings nothing. ``on_step()`` runs before every forward (decode step or prefill),
        once the events of the work before it have been yielded: the server sends a
        step's tokens there, all together.
        """
        return self._loop([], admit, max_rows, on_step=on_step)

    def check_request(self, prompt: list[int], lanes: Sequence[SamplingParams],
                      tools: ToolCalling | None = None) -> list[SamplingParams]:
        """Raise SettingsError for a prompt or setting the engine cannot run; returns the
        lanes' settings validated, each with a concrete seed. ``tools``: what the lanes
        may call (a tool_choice naming no declared tool, or a tool schema that cannot
        compile, is refused here)."""
        self.check_prompt(prompt)
        lanes = [q.validate().resolved().with_text_bias(self.tokenizer.encode).validate() for q in lanes]
        self.check_memory(len(prompt), lanes)  # before a draft model is loaded for it
        vocab = self.model.args.vocab_size
        for q in lanes:
            bad = [t for t in q.logit_bias if t >= vocab]
            if bad:
                raise SettingsError(f"logit_bias: token id {bad[0]} is outside the vocabulary (size {vocab})")
            if q.draft:
                self.draft_model(q.draft)  # load and check it now: a bad one fails the request
            constraint = lane_constraint(q, tools)
            if constraint is not None and constraint is not q.constraint:
                self._check_tools(constraint, tools)
            elif constraint is not None:
                self.vocabulary.check(constraint)  # ConstraintError before anything streams
        return lanes

    def _check_tools(self, constraint: Constraint, tools: ToolCalling) -> None:
        """Compile a lane's call grammar; where it fails, name the tool whose schema does."""
        try:
            self.vocabulary.check(constraint)
        except ConstraintError as e:
            for t in tools.tools:
                try:
                    self.vocabulary.check(Constraint("json_schema", json.dumps(t.parameters)))
                except ConstraintError as bad:
                    raise ToolError(f"tool {t.name}: its parameter schema cannot hold a call: "
                                    f"{str(bad).removeprefix('the JSON schema ')}") from None
            raise ToolError(f"the tools cannot hold a call: {e}") from None

    def check_memory(self, prompt_tokens: int, lanes: Sequence[SamplingParams]) -> None:
        """Raise ResourceError, saying how much it needs, for a request whose KV cache
        cannot fit in free memory: the prompt and the most new tokens a lane may make,
        capped by the context, one cache row per lane and beam. The cache grows as tokens
        come, so without this a request the machine cannot hold would run until it fails."""
        if not lanes:
            return
        rows = len(lanes) * max(q.num_beams for q in lanes)
        tokens = min(prompt_tokens + max(q.max_new_tokens for q in lanes), self.max_context)
        limits.check_request(self.model.args, tokens, rows=rows, itemsize=self.cache.dtype.itemsize,
                             held=self.cache.nbytes(), device=self.device)

    # -- the decode loop -------------------------------------------------------------

    def _run(self, joining: list[Joining], shared: bool = True) -> Iterator[Event]:
        for j in joining:
            j.lanes = self.check_request(j.prompt, j.lanes, j.tools)
            if j.forced:
                self.check_prompt(list(j.prompt) + list(j.forced))
        return self._loop(joining, None, 0, shared)

    @torch.inference_mode()
    def _loop(self, joining: list[Joining], admit, max_rows: int, shared: bool = True,
              on_step: Callable[[], None] | None = None) -> Iterator[Event]:
        """The one decode loop: every step runs each row's latest token (and the drafts
        of lanes that draft), lets new requests join, chooses the next token of every
        row that has logits to choose from, and drops the lanes that stopped."""
        batch = Batch(self.cache, piece=self.piece, sample_limit=self.sample_limit,
                      max_context=self.max_context, decode_path=self.decode_path)
        drafting = Drafting(self, batch)
        self._share_steps(shared or admit is not None)
        step = on_step or (lambda: None)
        while True:
            if batch.rows:
                step()
                yield from self._advance(batch, drafting)
                batch.compact(drafting.moved)  # lanes that stopped on verified drafts
            yield from self._joins(batch, drafting, joining, admit, max_rows, step)
            joining = []
            if not batch.rows:
                return
            yield from self._choose(batch, drafting)
            if not batch.compact(drafting.moved) and admit is None:
                return

    def _joins(self, batch: Batch, drafting: Drafting, joining: list[Joining], admit, max_rows: int,
               step: Callable[[], None]) -> Iterator[Event]:
        """Prefill the joining requests one by one (and, serving, those that arrive
        meanwhile) into the batch. The rows waiting for a choice (the decode step's, the
        joiners' first tokens) are chosen together, in one batched pass, before the next
        prefill once they have waited as long as a pass takes: a burst of joiners does not
        wait for every prefill of the burst, nor pay one sampler pass each."""
        waiting_since = time.perf_counter()
        while True:
            if admit is not None and max_rows > len(batch.rows):
                joining = joining + list(admit(max_rows - len(batch.rows), len(batch.lanes)))
            if not joining:
                return
            # the burst's rows in one growth of the cache: grown joiner by joiner, a first
            # burst of 16 reallocated every layer's keys and values 16 times (~13 ms here)
            self.cache.ensure(len(batch.rows) + sum(len(j.lanes) for j in joining),
                              self.capacity(max(self._positions_needed(j) for j in joining)))
            for j in joining:
                if batch.waiting() and self._choice_due(time.perf_counter() - waiting_since):
                    yield from self._choose(batch, drafting)
                step()  # what was chosen goes out before this prefill
                fresh = not batch.waiting()
                yield from self._join(j, batch, drafting)
                if fresh:
                    waiting_since = time.perf_counter()
            joining = []

    def _choice_due(self, waited: float) -> bool:
        """Whether rows that have waited ``waited`` seconds for a choice get it before the
        next prefill: once they have waited as long as a batched choice takes, waiting for
        more rows to share it would cost them more than it saves."""
        return waited >= self._choice_s

    def _share_steps(self, shared: bool) -> None:
        """Run decode steps batch-invariant when they may be shared (see ``batch_invariant``)."""
        want = self.batch_invariant and shared
        if getattr(self.model, "invariant", want) != want:
            self.model.batch_invariant(want)

    def _positions_needed(self, j: Joining) -> int:
        """Cache positions j's rows need as it joins: its prompt and every new token when the
        cache is sized up front (preallocate, a static cache), else its prompt and one more."""
        if self.preallocate or self._step.static:
            return max(min(len(j.prompt) + q.max_new_tokens, self.max_context) for q in j.lanes)
        return len(j.prompt) + 1

    def _join(self, j: Joining, batch: Batch, drafting: Drafting) -> Iterator[Event]:
        """Prefill j's prompt into the first free row, copy it into one row per lane."""
        t0 = time.perf_counter()
        first, r0, n = len(batch.lanes), len(batch.rows), len(j.lanes)
        stops = self._stops(j.stop_ids)  # (its rows were allocated with its burst's: _joins)
        for q in j.lanes:
            constraint = lane_constraint(q, j.tools)
            batch.add(Lane(len(batch.lanes), q, seeded_generator(q, self.device),
                           StreamDecoder(self.tokenizer, strip_leading_space=j.strip_leading_space),
                           j.prompt, cancel=j.cancel, inspect=j.inspect, stop_ids=stops,
                           constraint=None if constraint is None
                           else self.vocabulary.start(constraint, stops, j.continued),
                           forced=j.forced, min_tokens=j.min_tokens,
                           tools=j.tools if q.tool_choice != "none" else None), len(j.prompt))
        self._prefill.take_best_row(r0, j.prompt)
        logits, reuse = self._prefill.row(r0, j.prompt, j.cancel)
        seconds = time.perf_counter() - t0
        lanes = range(first, first + n)
        batch.prefilled(lanes, reuse, t0, seconds)
        yield Prefilled(prompt_tokens=len(j.prompt), cached_tokens=reuse, seconds=seconds, lanes=tuple(lanes))
        if logits is None:
            for i in lanes:
                yield finish(batch.lanes[i], "cancelled", batch.stats[i])
            return
        for k in range(1, n):
            self.cache.copy_row(r0, r0 + k, len(j.prompt))
        batch.start(lanes, logits)
        for i in lanes:
            drafting.join(i)

    def _advance(self, batch: Batch, drafting: Drafting) -> Iterator[Event]:
        """Run every row's latest token: a verification forward when some lane drafts,
        else plain decoding's step (compiled when the engine compiles)."""
        plan = drafting.plan()
        if plan:
            yield from drafting.step(plan)
            return
        last = batch.last_tokens()
        self.cache.ensure(len(last), self.capacity(batch.furthest() + 1))  # grows with the replies
        pos = batch.pos(self.device)
        warm = self._step.warmup_s
        t0 = time.perf_counter()
        out = self.decode(torch.tensor(last, device=self.device).view(len(last), 1), pos)[:, -1]  # [B, V]
        took = time.perf_counter() - t0
        warm = self._step.warmup_s - warm
        if warm:  # compiling or recording a graph is not decoding: keep it out of the speed
            took -= warm
            batch.warmed(warm)
        B = len(last)
        self.plain_step_s[B] = took if B not in self.plain_step_s else 0.5 * (self.plain_step_s[B] + took)
        plain = drafting.plain_cost(B)
        for r, li in enumerate(batch.rows):
            self.cache.tokens[r].append(last[r])
            batch.ran(r, out[r])
            drafting.ran(li, took, plain)

    def _choose(self, batch: Batch, drafting: Drafting) -> Iterator[Event]:
        """Every row with logits to choose from picks its token in one batched pass (a
        row's choice does not depend on the others in it)."""
        rows = batch.waiting()
        if not rows:
            return
        t0 = time.perf_counter()
        step = batch.choose(rows)
        self._choice_s = 0.5 * (self._choice_s + time.perf_counter() - t0)
        for k, r in enumerate(rows):
            li = batch.rows[r]
            ev = batch.take(li, k, step)
            if ev is not None:
                yield ev
                drafting.took(li, ev.token_id)
            done = batch.settle(li)
            if done is not None:
                yield done


def lane_constraint(q: SamplingParams, tools: ToolCalling | None) -> Constraint | None:
    """What a lane's output is held to: its own output format, or where the request
    declares tools, the grammar of its tool_choice (:meth:`ToolCalling.grammar`: calls
    held to their schemas unless tool_constraint is off; none masks the call-start token).
    An output format and possible calls do not combine: SettingsError."""
    if tools is None or not tools.tools:
        return q.constraint
    if q.constraint is not None:
        if q.tool_choice == "none":
            return q.constraint  # a format names no special token, so no call can start
        raise SettingsError(f"an output format ({q.constraint.describe()}) does not combine with tool calls: "
                            "set tool_choice to none or remove the format")
    grammar = tools.grammar(q.tool_choice, q.tool_constraint)
    return None if grammar is None else Constraint("grammar", grammar)


def _no_tools_with_beams(q: SamplingParams, tools: ToolCalling | None) -> None:
    if tools is not None and tools.tools and q.tool_choice != "none":
        raise SettingsError("beam search does not combine with tool calls: set tool_choice to none or use one beam")


def _chained(batched: list[tuple[list[int], Iterator[Event]]], beams: list[tuple[int, Iterator[Event]]]) -> Iterator[Event]:
    """The events of a comparison's batched lanes (renumbered: their lane k is the
    comparison's ``lanes[k]``), then each beam-search lane's, one after another."""
    try:
        for lanes, events in batched:
            for ev in events:
                if isinstance(ev, Prefilled):
                    ev.lanes = tuple(lanes[i] for i in ev.lanes)
                else:
                    ev.lane = lanes[ev.lane]
                yield ev
        for _, events in beams:
            yield from events
    finally:
        for events in [e for _, e in batched] + [e for _, e in beams]:
            events.close()
