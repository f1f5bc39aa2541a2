"""Find the passages that answer a question: BM25 (SQLite FTS5's ``bm25()``), dense
embeddings through a pluggable :class:`Embedder`, or both fused by reciprocal rank.

Embeddings are cached in the store per (embedder, passage), and a passage belongs to a
blob keyed by its file's hash, so a file is embedded once whatever collection or chat it
is met in. Nothing here picks a thread: the caller runs searches (and the embedder's
torch work) where it wants, never on a UI thread that must stay responsive.
"""
from __future__ import annotations

import threading
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from core.documents.extract import DocumentError
from core.documents.index import DocumentIndex, Hit

__all__ = ["Embedder", "MODES", "Retriever", "rrf", "fastembed_embedder"]

MODES = ("bm25", "dense", "hybrid")
RRF_K = 60  # the constant of Cormack et al. (2009); ranks past ~60 weigh little
_POOL = 50  # candidates each ranking contributes to a fusion


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors. ``name`` identifies the model (the cache key): two
    embedders with one name must give the same vectors."""
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32."""
        ...


def fastembed_embedder(model_name: str = "BAAI/bge-small-en-v1.5", cache_dir: str | None = None) -> Embedder | None:
    """A fastembed model already on disk, or None (fastembed not installed, model not
    downloaded: nothing is fetched from the network here)."""
    try:
        from fastembed import TextEmbedding  # why: an optional dependency
    except ImportError:
        return None
    try:
        model = TextEmbedding(model_name, cache_dir=cache_dir, local_files_only=True)
    except Exception:  # noqa: BLE001 — not downloaded, or a broken cache: no dense retrieval
        return None

    class _Fast:
        name = f"fastembed:{model_name}"

        def embed(self, texts):
            return np.asarray(list(model.embed(list(texts))), dtype=np.float32)

    return _Fast()


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: each id scores sum(1 / (k + rank)) over the rankings
    (rank from 1); best first, ties by first appearance."""
    score: dict[int, float] = {}
    for ranking in rankings:
        for rank, cid in enumerate(ranking, 1):
            score[cid] = score.get(cid, 0.0) + 1.0 / (k + rank)
    return sorted(score.items(), key=lambda kv: -kv[1])


def _normalized(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(n == 0, 1, n)


class Retriever:
    """Searches over an index's passages, by ``mode`` (bm25 | dense | hybrid)."""

    def __init__(self, index: DocumentIndex, embedder: Embedder | None = None, *, batch: int = 32):
        self.index, self.embedder, self.batch = index, embedder, batch
        self._matrix: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def search(self, query: str, *, collections: Sequence[int] = (), blobs: Sequence[int] = (),
               k: int = 5, mode: str = "bm25") -> list[Hit]:
        """The ``k`` best passages for ``query`` among these collections' and blobs'."""
        scope = self.index.scope_blobs(collections=list(collections), blobs=list(blobs))
        return self.index.hits(*self._ranked(query, scope, k, mode))

    def ranked(self, query: str, blob_ids: Sequence[int], k: int, mode: str = "bm25") -> list[Hit]:
        return self.index.hits(*self._ranked(query, list(blob_ids), k, mode))

    def _ranked(self, query: str, scope: list[int], k: int, mode: str) -> tuple[list[int], dict[int, float]]:
        if mode not in MODES:
            raise DocumentError(f"retrieval mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "bm25" and self.embedder is None:
            raise DocumentError(f"{mode} retrieval needs an embedding model; none is chosen")
        if mode == "bm25":
            pairs = self.index.bm25(query, scope, k)
        elif mode == "dense":
            pairs = self.dense(query, scope, k)
        else:
            pool = max(k, _POOL)
            fused = rrf([[c for c, _ in self.index.bm25(query, scope, pool)],
                         [c for c, _ in self.dense(query, scope, pool)]])
            pairs = fused[:k]
        return [c for c, _ in pairs], dict(pairs)

    # ------------------------------------------------------------------ dense

    def embed_missing(self, blob_ids: Sequence[int], *, cancel: threading.Event | None = None,
                      progress: Callable[[int, int], None] | None = None) -> int:
        """Embed (and store) the passages of ``blob_ids`` not embedded yet by this
        embedder; returns how many were. Stops between batches when ``cancel`` is set."""
        if self.embedder is None or not blob_ids:
            return 0
        scope = ",".join(str(int(b)) for b in blob_ids)
        todo = self.index.q(f"SELECT k.id, k.heading, k.text FROM doc_chunks k WHERE k.blob_id IN ({scope})"
                            " AND NOT EXISTS (SELECT 1 FROM doc_embeddings e WHERE e.embedder = ?"
                            " AND e.chunk_id = k.id) ORDER BY k.id", (self.embedder.name,))
        done = 0
        for i in range(0, len(todo), self.batch):
            if cancel is not None and cancel.is_set():
                break
            part = todo[i:i + self.batch]
            vecs = _normalized(self.embedder.embed([_passage_text(r) for r in part]))
            with self.index.tx() as c:
                c.executemany("INSERT OR REPLACE INTO doc_embeddings (chunk_id, embedder, vector) VALUES (?, ?, ?)",
                              [(r[0], self.embedder.name, v.astype(np.float32).tobytes()) for r, v in zip(part, vecs)])
            done += len(part)
            if progress is not None:
                progress(done, len(todo))
        return done

    def _vectors(self, scope: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, unit vectors) of the scope, held while the scope stays the same."""
        key = (self.embedder.name, tuple(scope))
        n = self.index.q(f"SELECT count(*) FROM doc_chunks WHERE blob_id IN ({','.join(map(str, scope))})")[0][0]
        with self._lock:
            have = self._matrix.get(key)
            if have is not None and len(have[0]) == n:
                return have
        self.embed_missing(scope)
        rows = self.index.q("SELECT e.chunk_id, e.vector FROM doc_embeddings e JOIN doc_chunks k ON k.id = e.chunk_id"
                            f" WHERE e.embedder = ? AND k.blob_id IN ({','.join(map(str, scope))}) ORDER BY e.chunk_id",
                            (self.embedder.name,))
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        mat = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows]) if rows else np.zeros((0, 1), np.float32)
        with self._lock:
            self._matrix = {key: (ids, mat)}  # one scope held: memory stays one matrix
        return ids, mat

    def dense(self, query: str, scope: list[int], k: int) -> list[tuple[int, float]]:
        """[(chunk id, cosine)] best first."""
        if not scope:
            return []
        ids, mat = self._vectors(scope)
        if not len(ids):
            return []
        q = _normalized(self.embedder.embed([query]))[0]
        sims = mat @ q
        top = np.argpartition(-sims, min(k, len(sims)) - 1)[:k] if len(sims) > k else np.arange(len(sims))
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(int(ids[i]), float(sims[i])) for i in top]


def _passage_text(row) -> str:
    return f"{row['heading']}\n{row['text']}" if row["heading"] else row["text"]
