"""BM25 at typing speed over a large index: what FTS5's ``bm25()`` computes, for far fewer rows.

FTS5 scores every row that holds any word of the question, after counting those rows
per word for its IDF: six words, some of them common, touch most of 100,000 passages
(0.3-0.8 s). Here the rarest words (together at most :data:`CANDIDATE_ROWS` rows) pick
the candidates, and only those are scored with every word, by FTS5's own formula and
statistics (IDF from its vocabulary's row counts, the row sizes and the averages record
it stores). A passage holding none of the rare words could only win on common words;
recall@5 measured with and without pruning is in docs/PERFORMANCE.md.
"""
from __future__ import annotations

import math
import re
import unicodedata

__all__ = ["CANDIDATE_ROWS", "ROW_COST", "K1", "B", "WEIGHTS", "fold", "tokens", "varints", "rare_terms", "Scorer"]

K1, B = 1.2, 0.75  # FTS5's bm25() constants
WEIGHTS = (1.0, 0.5)  # text, heading: what DocumentIndex.bm25 passes to bm25()
#: the rows the rare words may hold together before a word counts as common
CANDIDATE_ROWS = 500
#: FTS5 rows that cost what scoring one candidate in Python does (measured: ~20)
ROW_COST = 20
_TOKEN = re.compile(r"[^\W_]+")


def fold(text: str) -> str:
    """Lower case without diacritics: what FTS5's ``unicode61 remove_diacritics 2`` indexes."""
    text = text.lower()
    if text.isascii():
        return text
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(fold(text))


def varints(blob: bytes) -> list[int]:
    """SQLite's varints (FTS5's averages record and row sizes)."""
    out, i = [], 0
    while i < len(blob):
        v = 0
        for n in range(9):
            b = blob[i]
            i += 1
            if n == 8:
                v = (v << 8) | b
                break
            v = (v << 7) | (b & 0x7F)
            if not b & 0x80:
                break
        out.append(v)
    return out


def rare_terms(terms: list[str], df: dict[str, int], n_rows: int, budget: int = CANDIDATE_ROWS) -> list[str] | None:
    """The rarest of ``terms`` holding at most ``budget`` rows together (at least one), or
    None when FTS5 alone is about as fast: scoring a row here costs about what FTS5 spends
    on :data:`ROW_COST` rows, and FTS5 reads each row holding any of the words once."""
    out, rows = [], 0
    for t in sorted(terms, key=lambda t: df.get(t, 0)):
        if out and rows + df.get(t, 0) > budget:
            break
        out.append(t)
        rows += df.get(t, 0)
    fts_rows = min(n_rows, sum(df.get(t, 0) for t in terms))
    return out if len(out) < len(terms) and rows * ROW_COST < fts_rows else None


class Scorer:
    """FTS5's BM25 of ``terms`` (plain words: :func:`tokens` gives each back alone) for
    given rows: ``n_rows`` and ``avgdl`` from FTS5's averages record, ``df`` the rows
    holding each term."""

    def __init__(self, terms: list[str], df: dict[str, int], n_rows: int, avgdl: float):
        self.avgdl = max(avgdl, 1e-9)
        self.idf = {}
        for t in terms:
            v = math.log((n_rows - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5))
            self.idf[t] = v if v > 0 else 1e-6  # FTS5's floor for a word in over half the rows
        # One C scan a row for all the words; "_" separates tokens for FTS5 but not for \b,
        # so it becomes a space first.
        alts = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
        self._find = re.compile(rf"\b(?:{alts})\b").findall

    def score(self, text: str, heading: str, length: int) -> float:
        """One row's score; ``length``: its tokens in all columns (FTS5's row size)."""
        freq: dict[str, float] = {}
        for w, col in ((WEIGHTS[0], text), (WEIGHTS[1], heading)):
            for tok in self._find(fold(col).replace("_", " ")):
                freq[tok] = freq.get(tok, 0.0) + w
        norm = K1 * (1 - B + B * length / self.avgdl)
        return sum(self.idf[t] * f * (K1 + 1) / (f + norm) for t, f in freq.items())
