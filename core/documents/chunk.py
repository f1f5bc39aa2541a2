"""Split a document into passages along its headings and paragraphs, each at most
``max_tokens`` tokens of the current model's tokenizer (a token-count callable), each
knowing where it came from: the file, the PDF page, the line range.

A heading starts a new passage (and is remembered as the passage's heading); paragraphs
are packed together while they fit; a paragraph too long for one passage is cut at lines,
then sentences, then words.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator

from core.documents.extract import Document
from core.tokenizer.fingerprint import tokenizer_fingerprint

__all__ = ["Chunk", "chunk_document", "place", "approx_tokens", "TokenCounter", "TokenizerCounter", "counter_key",
           "model_counter",
           "DEFAULT_CHUNK_TOKENS"]

TokenCounter = Callable[[str], int]
DEFAULT_CHUNK_TOKENS = 256
_HEADING = re.compile(r"^(#{1,6})\s+\S")
_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (words and punctuation marks), for when no model is loaded;
    close to what BPE tokenizers count for English prose."""
    return len(_WORD.findall(text))


class TokenizerCounter:
    """Counts text in a model's own tokens: what passages and the documents budget are sized
    in once a model is loaded. ``key`` names the tokenizer (its fingerprint), so passages cut
    with one tokenizer are not reused for another. Callable from any thread: encoding only
    reads the tokenizer (SentencePiece, tiktoken and HF tokenizers are native and re-entrant)."""

    def __init__(self, tokenizer, key: str):
        self.tokenizer, self.key = tokenizer, key

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def __repr__(self) -> str:
        return f"TokenizerCounter({self.key})"


def model_counter(loaded) -> TokenizerCounter:
    """A loaded model's counter, keyed by its tokenizer's fingerprint (the one the worker reports)."""
    return TokenizerCounter(loaded.tokenizer, tokenizer_fingerprint(loaded.tokenizer, loaded.args.vocab_size))


def counter_key(count: TokenCounter) -> str:
    """What distinguishes ``count``'s passages in the cache: its ``key``, "" for the estimate."""
    return str(getattr(count, "key", "") or "")


@dataclass(frozen=True)
class Chunk:
    """One passage: its text and where it lies in its source."""
    text: str
    source: str  # the file's path
    ordinal: int  # position among the document's chunks, from 0
    page: int | None  # PDF page (1-based), else None
    line_start: int  # 1-based, inclusive, within the page for PDFs
    line_end: int
    heading: str = ""
    tokens: int = 0

    def where(self) -> str:
        """'notes.md, lines 3-20' / 'paper.pdf, p. 4, lines 1-9'."""
        return place(self.source, self.page, self.line_start, self.line_end)


def place(source: str, page: int | None, line_start: int, line_end: int, whole: bool = False) -> str:
    """Where a passage is, for people: 'notes.md, lines 3-20', 'paper.pdf, p. 4, line 1',
    or the file's name alone for a ``whole`` document."""
    name = source.replace("\\", "/").rsplit("/", 1)[-1]
    if whole:
        return name
    lines = f"line {line_start}" if line_start == line_end else f"lines {line_start}-{line_end}"
    return f"{name}, p. {page}, {lines}" if page is not None else f"{name}, {lines}"


@dataclass
class _Block:
    text: str
    first: int
    last: int
    heading: bool


def _blocks(text: str, first_line: int) -> Iterator[_Block]:
    """Paragraphs (runs of non-blank lines) with their line numbers; a heading line is a
    block of its own."""
    cur: list[str] = []
    start = first_line
    for i, line in enumerate(text.split("\n")):
        n = first_line + i
        if _HEADING.match(line):
            if cur:
                yield _Block("\n".join(cur), start, n - 1, False)
                cur = []
            yield _Block(line.strip(), n, n, True)
        elif line.strip():
            if not cur:
                start = n
            cur.append(line.rstrip())
        elif cur:
            yield _Block("\n".join(cur), start, n - 1, False)
            cur = []
    if cur:
        yield _Block("\n".join(cur), start, start + len(cur) - 1, False)


def _split_long(block: _Block, count: TokenCounter, max_tokens: int) -> Iterator[_Block]:
    """A block over ``max_tokens`` in pieces: by lines, then sentences, then words."""
    lines = block.text.split("\n")
    if len(lines) > 1:
        for i, line in enumerate(lines):
            yield from _split_long(_Block(line, block.first + i, block.first + i, False), count, max_tokens)
        return
    if count(block.text) <= max_tokens:
        yield block
        return
    parts = re.split(r"(?<=[.!?])\s+", block.text)
    if len(parts) == 1:
        parts = block.text.split(" ")
    if len(parts) == 1:  # one giant "word": cut by characters
        step = max(1, len(block.text) * max_tokens // max(count(block.text), 1))
        parts = [block.text[i:i + step] for i in range(0, len(block.text), step)]
        for p in parts:
            yield _Block(p, block.first, block.last, False)
        return
    cur = ""
    for p in parts + [None]:
        trial = p if not cur else cur if p is None else f"{cur} {p}"
        if cur and (p is None or count(trial) > max_tokens):
            piece = _Block(cur, block.first, block.last, False)
            if count(cur) > max_tokens and cur != block.text:
                yield from _split_long(piece, count, max_tokens)
            else:
                yield piece
            cur = p or ""
        else:
            cur = trial or ""


def chunk_document(doc: Document, count_tokens: TokenCounter = approx_tokens, *,
                   max_tokens: int = DEFAULT_CHUNK_TOKENS) -> list[Chunk]:
    """``doc``'s passages in order; each at most ``max_tokens`` (by ``count_tokens``)."""
    if max_tokens < 8:
        raise ValueError(f"max_tokens must be at least 8, got {max_tokens}")
    out: list[Chunk] = []
    heading = ""
    for sec in doc.sections:
        cur: list[_Block] = []
        cur_tokens = 0

        def flush():
            nonlocal cur, cur_tokens
            if cur and any(not b.heading for b in cur):
                text = "\n\n".join(b.text for b in cur)
                out.append(Chunk(text, doc.path, len(out), sec.page, cur[0].first, cur[-1].last,
                                 heading, count_tokens(text)))
            cur, cur_tokens = [], 0

        for block in _blocks(sec.text, sec.line):
            if block.heading:
                flush()
                heading = block.text.lstrip("#").strip()
                cur, cur_tokens = [block], count_tokens(block.text)
                continue
            n = count_tokens(block.text)
            pieces = [block] if n <= max_tokens else list(_split_long(block, count_tokens, max_tokens))
            for piece in pieces:
                pn = n if piece is block else count_tokens(piece.text)
                if cur and cur_tokens + pn + 1 > max_tokens:
                    if len(cur) == 1 and cur[0].heading:  # a lone heading: kept as the chunk's heading
                        cur, cur_tokens = [], 0
                    else:
                        flush()
                cur.append(piece)
                cur_tokens += pn + (1 if len(cur) > 1 else 0)
        flush()
    return out
