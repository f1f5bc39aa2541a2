"""Ground a question in documents: the text that goes to the model, with numbered sources.

When everything attached fits the context budget (a setting; by default half the
context) it goes in whole ("read in full"); otherwise the best passages for the question
are retrieved until the budget is spent ("12 of 340 passages used"). Either way the prompt
numbers its sources [1], [2], … and :class:`Grounding` maps each number to its file, page
or lines, passage ids and the character span of its text in the prompt, so a GUI can link
a citation to its passage and the attention attribution can find each passage's tokens.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Sequence

from core.documents.chunk import DEFAULT_CHUNK_TOKENS, TokenCounter, approx_tokens, place
from core.documents.extract import DocumentError
from core.documents.index import DocumentIndex, Hit
from core.documents.retrieve import Embedder, Retriever

__all__ = ["Grounding", "Source", "ground", "default_budget", "INSTRUCTION"]

INSTRUCTION = ("Answer the question using the numbered sources below. Cite the sources you use "
               "as [1], [2], … right after the statements they support.")
_POOL = 64  # passages ranked before the budget picks among them


def default_budget(context_tokens: int) -> int:
    """The default documents budget: half the model's context."""
    return max(context_tokens // 2, 1)


@dataclass(frozen=True)
class Source:
    """One numbered source in a grounded prompt."""
    number: int
    source: str  # the file's path (or an attachment's name)
    page: int | None
    line_start: int
    line_end: int
    chunk_ids: tuple[int, ...]  # the passages it holds (a whole document: all of them)
    span: tuple[int, int]  # [start, end) of its text in Grounding.prompt
    whole: bool = False  # a whole document rather than one passage

    def where(self) -> str:
        return place(self.source, self.page, self.line_start, self.line_end, self.whole)


@dataclass
class Grounding:
    """The prompt text for the model and what it was built from."""
    prompt: str
    question: str
    sources: list[Source]
    mode: str  # full | retrieved | none
    used: int  # passages in the prompt
    total: int  # passages there were to choose from
    tokens: int  # the prompt's tokens, by the counter given
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if self.mode == "full":
            return "read in full"
        if self.mode == "none":
            return "no passage matched"
        return f"{self.used} of {self.total} passage{'s' if self.total != 1 else ''} used"

    def source(self, number: int) -> Source | None:
        return next((s for s in self.sources if s.number == number), None)

    def to_meta(self) -> dict:
        """A JSON-able dict (stored with the message) that :meth:`from_meta` reads back."""
        d = asdict(self)
        d["summary"] = self.summary
        return d

    @classmethod
    def from_meta(cls, d: dict) -> "Grounding":
        d = {k: v for k, v in d.items() if k != "summary"}
        d["sources"] = [Source(**{**s, "chunk_ids": tuple(s["chunk_ids"]), "span": tuple(s["span"])})
                        for s in d.get("sources", [])]
        return cls(**d)


def ground(question: str, index: DocumentIndex, *, attachments: Sequence[str | os.PathLike] = (),
           collections: Sequence[str | os.PathLike] = (), budget_tokens: int,
           count_tokens: TokenCounter = approx_tokens, k: int | None = None, mode: str = "bm25",
           embedder: Embedder | None = None, max_chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> Grounding:
    """Read ``attachments`` (indexed, cached by content), look ``collections`` up (indexed
    before: :mod:`core.documents.collect`), and build the grounded prompt within
    ``budget_tokens``. ``k`` caps the passages retrieved (default: as many as fit)."""
    blob_ids, notes = [], []
    for path in attachments:
        blob, _ = index.attach(path, count_tokens, max_tokens=max_chunk_tokens)
        blob_ids.append(blob.id)
        notes += [f"{os.path.basename(os.fspath(path))}: {n}" for n in blob.notes]
    coll_ids = []
    for root in collections:
        c = index.collection(root)
        if c is None:
            raise DocumentError(f"{root} is not an indexed collection (index it first)")
        if c.state == "unreachable":
            notes.append(f"{c.name}: {c.message or 'the folder is not reachable'}; its last index is used")
        coll_ids.append(c.id)
    scope = index.scope_blobs(collections=coll_ids, blobs=blob_ids)
    if not collections:
        whole = _whole(question, index, blob_ids, budget_tokens, count_tokens, notes)
        if whole is not None:
            return whole
    total = index.q(f"SELECT count(*) FROM doc_chunks WHERE blob_id IN ({','.join(map(str, scope)) or 'NULL'})")[0][0]
    hits = Retriever(index, embedder).ranked(question, scope, max(k or 0, _POOL), mode)
    return _retrieved(question, hits, total, budget_tokens, count_tokens, k, notes)


def _whole(question, index, blob_ids, budget, count, notes) -> Grounding | None:
    """Every attachment whole, or None when they do not fit the budget together."""
    docs = []
    for b in dict.fromkeys(blob_ids):
        chunks = index.chunks(b)
        docs.append((chunks, "\n\n".join(h.text for h in chunks)))
    passages = [(_whole_source(chunks), text) for chunks, text in docs if chunks]
    g = _build(question, passages, "full", sum(len(c) for c, _ in docs), count, notes)
    return g if g.tokens <= budget else None


def _whole_source(chunks: list[Hit]) -> Source:
    first = chunks[0]
    return Source(0, first.source, first.page, first.line_start, chunks[-1].line_end,
                  tuple(h.chunk_id for h in chunks), (0, 0), whole=True)


def _retrieved(question, hits: list[Hit], total, budget, count, k, notes) -> Grounding:
    chosen: list[tuple[Source, str]] = []
    base = count(_render(question, []))
    used = base
    for h in hits:
        if k is not None and len(chosen) >= k:
            break
        cost = count(f"[{len(chosen) + 1}] {h.where()}\n{h.text}\n\n")
        if used + cost > budget:
            continue  # a shorter passage further down may still fit
        used += cost
        chosen.append((Source(0, h.source, h.page, h.line_start, h.line_end, (h.chunk_id,), (0, 0)), h.text))
    if not chosen and hits:
        notes.append(f"no passage fits the documents budget of {budget} tokens")
    return _build(question, chosen, "retrieved" if chosen else "none", total, count, notes)


def _render(question: str, passages: list[tuple[Source, str]]) -> str:
    return _layout(question, passages)[0]


def _layout(question: str, passages: list[tuple[Source, str]]) -> tuple[str, list[Source]]:
    parts, sources, pos = [INSTRUCTION, "\n\n"], [], len(INSTRUCTION) + 2
    for n, (src, text) in enumerate(passages, 1):
        head = f"[{n}] {Source(n, src.source, src.page, src.line_start, src.line_end, (), (0, 0), src.whole).where()}\n"
        start = pos + len(head)
        sources.append(Source(n, src.source, src.page, src.line_start, src.line_end, src.chunk_ids,
                              (start, start + len(text)), src.whole))
        parts += [head, text, "\n\n"]
        pos = start + len(text) + 2
    parts.append(f"Question: {question}")
    return "".join(parts), sources


def _build(question, passages, mode, total, count, notes) -> Grounding:
    prompt, sources = _layout(question, passages)
    return Grounding(prompt, question, sources, mode, len(sources) if mode != "full" else total, total,
                     count(prompt), list(notes))
