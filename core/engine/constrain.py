"""Constrained generation: hold a lane's tokens to a JSON schema, a regular expression or
a grammar (GBNF or Lark).

The grammar engine is llguidance (Microsoft's Rust library behind Guidance): chosen over
xgrammar by measurement on this project's CPU and tokenizers (docs/PERFORMANCE.md,
"Constrained generation"): grammars compile lazily in about 1 ms where xgrammar took
10 ms to 1.9 s per schema at a 128k vocabulary, it reads Lark natively (GBNF through its
own converter), and it adds one 8 MB wheel with no dependencies where xgrammar brings
triton (1 GB), transformers and pydantic and takes seconds to import. Its masks are
slower (0.05-0.1 ms against 0.02-0.03 ms per token), still far under a decode step.

A lane's :class:`~core.engine.constraint.Constraint` (kind + text) travels in its SamplingParams. The engine
turns it into one :class:`ConstraintState` per lane, which writes that lane's row of the
step's bitmask (one int32 bitmask [B, ceil(V/32)] per step for all lanes), is advanced by
the chosen token, and can roll back (speculative decoding verifies drafts with it).
The sampler applies the bitmask before its filters (``sampling.apply_bitmask``).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np
import torch

import llguidance as llg

from core.engine.constraint import DRY_RUN_TOKENS, Constraint, first_lines, parser_limits
from core.errors import ConstraintError

def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 bitmask [rows, ceil(V/32)] with every token allowed (bit i of word w is
    token 32*w + i)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [V]: which tokens a bitmask row allows."""
    bits = (bitmask_row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32, device=bitmask_row.device)) & 1
    return bits.reshape(*bitmask_row.shape[:-1], -1)[..., :vocab_size].bool()


class ConstraintState:
    """One lane's place in its constraint: the hook decode loops (plain and speculative) use.

    ``mask(row)`` writes the tokens allowed next into one int32 bitmask row; ``advance(t)``
    takes the token chosen; ``rollback(n)`` forgets the last n advanced tokens (a rejected
    draft). A stop token is allowed only where the grammar accepts, and only the lane's own
    stop tokens.
    """

    def __init__(self, vocab: "Vocabulary", matcher, constraint: Constraint, stop_ids: Iterable[int]):
        self.vocab = vocab
        self.matcher = matcher
        self.constraint = constraint
        self.stop_ids = sorted(t for t in set(stop_ids) if 0 <= t < vocab.size)

    @property
    def accepting(self) -> bool:
        """True when the output so far is complete (a stop token may end it)."""
        return bool(self.matcher.is_accepting())

    @property
    def error(self) -> str:
        return self.matcher.get_error()

    def failure(self) -> str:
        """Why the grammar engine gave up on this lane, in one line ("" while it has not)."""
        if not self.matcher.is_error():
            return ""
        return f"the {self.constraint.describe()} went past the grammar engine's limits mid-reply: {first_lines(self.error)}"

    def mask(self, bitmask_row: torch.Tensor) -> None:
        """Write the tokens allowed next into ``bitmask_row`` (int32 [ceil(V/32)], CPU, contiguous)."""
        self.matcher.unsafe_compute_mask_ptr(bitmask_row.data_ptr(), bitmask_row.numel() * 4)
        self._fix_stops(bitmask_row)

    def _fix_stops(self, bitmask_row: torch.Tensor) -> None:
        words = bitmask_row.numpy().view(np.uint32)
        for t in self.vocab.eos_ids:  # the engine's idea of EOS, not the lane's
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        if self.accepting:
            for t in self.stop_ids:
                words[t >> 5] |= np.uint32(1 << (t & 31))

    def advance(self, token: int) -> bool:
        """Take the chosen token; False (and an error state) if the constraint forbids it."""
        if token in self.stop_ids:
            return self.accepting
        return bool(self.matcher.consume_token(int(token)))

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` advanced tokens."""
        if n > 0 and not self.matcher.rollback(int(n)):
            raise ConstraintError(f"cannot roll the constraint back by {n} tokens: {self.error}")

    def copy(self) -> "ConstraintState":
        """An independent state at the same place (a branch)."""
        return ConstraintState(self.vocab, self.matcher.deep_copy(), self.constraint, self.stop_ids)


def fill_masks(states: Sequence[tuple[int, ConstraintState]], bitmask: torch.Tensor) -> None:
    """Each (row, state)'s mask into its row of ``bitmask``; rows not named stay as they are.

    One after another: llguidance's parallel executor was slower here (8 lanes: 0.14 ms
    against 0.08 ms per step at 32k and 128k vocabularies, 2 shared cores)."""
    for row, st in states:
        st.mask(bitmask[row])


class Vocabulary:
    """A tokenizer's vocabulary as the grammar engine sees it: compiles constraints
    (cached) and starts lane states. Built once per model, lazily (about 0.2 s for a 32k
    vocabulary, 1.8 s for 128k on the shared 2-core machine).

    Args:
        tokenizer: the model's tokenizer (``token_bytes`` per id; special tokens give b"").
        vocab_size: the model's vocabulary (rows past the tokenizer are never allowed).
    """

    CACHE = 32  # compiled grammars kept

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.size = int(vocab_size)
        self.eos_ids = sorted(t for t in (tokenizer.stop_ids or ()) if 0 <= t < self.size)
        self._lltok = None
        self._lock = threading.Lock()
        self._grammars: OrderedDict[Constraint, str] = OrderedDict()

    def lltokenizer(self):
        with self._lock:
            if self._lltok is None:
                self._lltok = llg.LLTokenizer(llg.TokenizerWrapper(_Tokens(self.tokenizer, self.size)),
                                              n_vocab=self.size, eos_token=self.eos_ids or None)
            return self._lltok

    def check(self, constraint: Constraint) -> str:
        """The compiled grammar of ``constraint``; ConstraintError if it cannot compile."""
        hit = self._grammars.get(constraint)
        if hit is not None:
            self._grammars.move_to_end(constraint)
            return hit

        grammar = constraint.grammar()
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer(),
                                                                          limits=parser_limits())
        if is_error:
            raise ConstraintError(f"the {constraint.describe()} cannot be compiled: {first_lines(messages[0])}")
        # Some grammars compile yet allow nothing (a rule that only refers to itself), or
        # exhaust the lexer's limits a few tokens in (a{99999999}): a short walk ahead says
        # so before a reply starts.
        walk = llg.LLMatcher(self.lltokenizer(), grammar, log_level=0, limits=parser_limits())
        row = new_bitmask(1, self.size)
        for step in range(DRY_RUN_TOKENS):
            row.fill_(-1)
            walk.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
            if walk.is_error():
                why = first_lines(walk.get_error())
                if step == 0:
                    raise ConstraintError(f"the {constraint.describe()} allows no output: {why}")
                raise ConstraintError(f"the {constraint.describe()} is too big for the grammar engine "
                                      f"({step} tokens in): {why}")
            token = _lowest_token(row[0], self.eos_ids)
            if step == 0 and token is None and not walk.is_accepting():
                raise ConstraintError(f"the {constraint.describe()} allows no output: no text matches it")
            if token is None:
                break
            walk.consume_token(token)
        self._grammars[constraint] = grammar
        while len(self._grammars) > self.CACHE:
            self._grammars.popitem(last=False)
        return grammar

    def start(self, constraint: Constraint, stop_ids: Iterable[int], after: str = "") -> ConstraintState:
        """A state for one lane, at the start of its output, or past ``after``: the text
        of a reply being continued, which the output so far already holds (so a JSON reply
        cut at the token limit carries on inside its object, not with a second one)."""

        matcher = llg.LLMatcher(self.lltokenizer(), self.check(constraint), log_level=0, limits=parser_limits())
        if matcher.is_error():
            raise ConstraintError(f"the {constraint.describe()} cannot be compiled: {first_lines(matcher.get_error())}")
        if after and not matcher.consume_tokens(self.lltokenizer().tokenize_str(after)):
            raise ConstraintError(f"the reply to continue does not match the {constraint.describe()}: "
                                  "regenerate it instead")
        return ConstraintState(self, matcher, constraint, stop_ids)


def _lowest_token(bitmask_row: torch.Tensor, but: Sequence[int]) -> int | None:
    """The lowest token id a bitmask row allows, other than ``but``; None if there is none.
    (On the words, in numpy: allowed_tokens' [V] bool tensor costs ~75 ms at 128k.)"""
    words = bitmask_row.numpy().view(np.uint32).copy()
    for t in but:
        words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
    nz = np.flatnonzero(words)
    if not len(nz):
        return None
    w = int(words[nz[0]])
    return int(nz[0]) * 32 + ((w & -w).bit_length() - 1)


class _Tokens:
    """What llguidance's TokenizerWrapper reads: token bytes (special tokens marked with a
    leading 0xFF, so no grammar can produce them) and a tokenize function."""

    def __init__(self, tokenizer, size: int):
        self.tokenizer = tokenizer
        n = min(size, tokenizer.vocab_size)
        special = set(tokenizer.special_tokens.values())
        tokens = []
        for i in range(n):
            b = tokenizer.token_bytes(i)
            tokens.append(b if b and i not in special else b"\xff" + tokenizer.id_to_piece(i).encode("utf-8", "replace"))
        tokens += [b""] * (size - n)
        self.tokens = tokens
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i, b in enumerate(tokens) if b[:1] == b"\xff"]
        self._index = {b: i for i, b in enumerate(tokens) if b and b[:1] != b"\xff"}
        self._longest = max((len(b) for b in self._index), default=1)

    def __call__(self, data: bytes | str) -> list[int]:
        """Ids whose bytes are exactly ``data``: the tokenizer's own where they are (not for
        SentencePiece's dummy prefix, nor bytes that are not UTF-8), else longest match."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        try:
            ids = self.tokenizer.encode(data.decode("utf-8"))
            if b"".join(self.tokens[i] for i in ids) == data:
                return ids
        except (UnicodeDecodeError, IndexError):
            pass
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                j = self._index.get(data[i:i + n])
                if j is not None:
                    out.append(j)
                    i += n
                    break
            else:
                i += 1  # a byte no token spells (no byte fallback): skip it
        return out


