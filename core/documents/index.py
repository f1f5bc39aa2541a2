"""The documents index, in the history store itself (``history.sqlite3``, tables made by
:data:`core.history.schema.DOCUMENTS_V3`): each file's content once, keyed by its SHA-256
(a *blob*: its passages, their FTS5 entries for BM25, their embeddings), and collections
(a folder indexed once, kept current by :mod:`core.documents.collect`).

One connection, shared between threads under a lock; every write is one short transaction
(one file's passages at a time), so nothing already indexed is lost when indexing is
cancelled or the process dies, and the UI's own writes to the store never wait long.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from core.documents.bm25 import CANDIDATE_ROWS, Scorer, rare_terms, tokens, varints
from core.documents.chunk import DEFAULT_CHUNK_TOKENS, Chunk, TokenCounter, approx_tokens, chunk_document, counter_key
from core.documents.extract import Document, DocumentError, extract, file_sha256
from core.history.schema import MIGRATIONS, SCHEMA_V1, SCHEMA_VERSION
from core.history.store import History

__all__ = ["DocumentIndex", "Blob", "Collection", "Hit", "blob_key", "fts_query"]


@dataclass(frozen=True)
class Blob:
    """One file's content as indexed (cut by one token counter at one passage size)."""
    id: int
    sha256: str  # the cache key: :func:`blob_key`
    kind: str
    name: str
    size: int
    pages: int | None
    chars: int
    chunks: int
    tokens: int  # the passages' tokens together (in the counter they were cut with)
    notes: tuple[str, ...] = ()
    attached: bool = False


@dataclass(frozen=True)
class Collection:
    """A folder kept indexed; counts as of its last indexing."""
    id: int
    root: str
    name: str
    state: str  # new | indexing | paused | cancelled | done | unreachable | failed
    files: int
    skipped: int
    chunks: int
    updated_at: float
    message: str = ""


@dataclass(frozen=True)
class Hit:
    """A passage found by a search, with where it lies."""
    chunk_id: int
    score: float  # higher is better (BM25 sign flipped; cosine; fused)
    text: str
    source: str  # the file's path (a collection's file) or its name (an attachment)
    page: int | None
    line_start: int
    line_end: int
    heading: str
    blob_id: int
    ordinal: int

    def where(self) -> str:
        return Chunk(self.text, self.source, self.ordinal, self.page, self.line_start, self.line_end).where()


def blob_key(sha256: str, count_tokens: TokenCounter = approx_tokens, max_tokens: int = DEFAULT_CHUNK_TOKENS) -> str:
    """The key a file's passages are cached under: its content's hash, plus the tokenizer
    and the passage size they were cut with when those are not the defaults (the word
    estimate, 256), so a model with another tokenizer gets passages sized in its tokens."""
    key = counter_key(count_tokens)
    size = [str(max_tokens)] if max_tokens != DEFAULT_CHUNK_TOKENS else []
    return "|".join([sha256] + ([key] if key else []) + size)


_TERM = re.compile(r"\w+", re.UNICODE)


def fts_terms(text: str, *, max_terms: int = 64) -> list[str]:
    """The words of free text a search looks for (lower case, each once, at most ``max_terms``)."""
    return list(dict.fromkeys(t.lower() for t in _TERM.findall(text)))[:max_terms]


def fts_query(text: str, *, max_terms: int = 64) -> str:
    """An FTS5 MATCH expression for free text: each word quoted (no operator or column
    syntax from the user reaches FTS5), any of them may match (BM25 ranks by how many)."""
    return _match(fts_terms(text, max_terms=max_terms))


def _match(terms: list[str]) -> str:
    return " OR ".join(f'"{t}"' for t in terms)


class DocumentIndex:
    """The index inside the history store at ``path`` (default: the app's history file)."""

    def __init__(self, path: str | Path | None = None):
        self.path = ":memory:" if str(path) == ":memory:" else Path(path or History.default_path())
        if self.path != ":memory:":
            History(self.path).close()  # creates or upgrades the store (its migrations make our tables)
        self._lock = threading.RLock()
        self._vocab = False  # temp.doc_vocab (row counts per word) made on this connection
        #: rows the rare words of a question may hold before pruning (core/documents/bm25.py)
        self.candidate_rows = CANDIDATE_ROWS
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA foreign_keys = ON")
        # WAL + NORMAL: a commit survives the process dying (only a power cut can undo the last
        # few), and indexing a folder is not an fsync per file; the history's own writes stay FULL.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        if self.path == ":memory:":
            self._create_in_memory()

    def _create_in_memory(self) -> None:
        for stmt in SCHEMA_V1.split(";"):
            if stmt.strip():
                self._conn.execute(stmt)
        for v in range(1, SCHEMA_VERSION):
            MIGRATIONS[v](self._conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "DocumentIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def q(self, sql: str, args: tuple | list = ()) -> list[sqlite3.Row]:
        """Rows of a read query (for this package's modules)."""
        with self._lock:
            if self._conn is None:
                raise DocumentError("the documents index is closed")
            return self._conn.execute(sql, args).fetchall()

    def tx(self):
        """``with index.tx() as c:`` one write transaction (BEGIN IMMEDIATE ... COMMIT)."""
        return _Tx(self)

    # ------------------------------------------------------------------ blobs

    def blob_by_sha(self, sha256: str) -> Blob | None:
        rows = self.q(_BLOB_SQL + " WHERE b.sha256 = ? GROUP BY b.id", (sha256,))
        return _blob(rows[0]) if rows else None

    def blob(self, blob_id: int) -> Blob:
        rows = self.q(_BLOB_SQL + " WHERE b.id = ? GROUP BY b.id", (blob_id,))
        if not rows:
            raise DocumentError(f"no indexed document with id {blob_id}")
        return _blob(rows[0])

    def add_document(self, doc: Document, count_tokens: TokenCounter = approx_tokens, *,
                     max_tokens: int = DEFAULT_CHUNK_TOKENS, attached: bool = False) -> Blob:
        """Index ``doc`` (its passages and their FTS entries), or return the blob already
        indexed with the same content and counter."""
        key = blob_key(doc.sha256, count_tokens, max_tokens)
        have = self.blob_by_sha(key)
        if have is not None:
            if attached:
                with self.tx() as c:
                    c.execute("UPDATE doc_blobs SET attached = 1 WHERE id = ?", (have.id,))
            return have
        chunks = chunk_document(doc, count_tokens, max_tokens=max_tokens)
        with self.tx() as c:
            blob_id = self.insert_blob(c, doc, chunks, max_tokens, attached, key)
        return self.blob(blob_id)

    def insert_blob(self, c, doc: Document, chunks: list[Chunk], max_tokens: int, attached: bool,
                    key: str | None = None) -> int:
        """``doc``'s blob and passages under ``key`` (:func:`blob_key`; default its hash)."""
        key = key or doc.sha256
        row = c.execute("SELECT id FROM doc_blobs WHERE sha256 = ?", (key,)).fetchone()
        if row is not None:  # indexed by another thread meanwhile
            return row[0]
        cur = c.execute("INSERT INTO doc_blobs (sha256, kind, name, size, pages, chars, chunk_tokens, notes,"
                        " attached, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (key, doc.kind, doc.name, doc.size, doc.pages, sum(len(s.text) for s in doc.sections),
                         max_tokens, json.dumps(doc.notes), int(attached), time.time()))
        blob_id = cur.lastrowid
        c.executemany("INSERT INTO doc_chunks (blob_id, ordinal, page, line_start, line_end, heading, text, tokens)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      [(blob_id, k.ordinal, k.page, k.line_start, k.line_end, k.heading, k.text, k.tokens)
                       for k in chunks])
        return blob_id

    def attach(self, path: str | os.PathLike, count_tokens: TokenCounter = approx_tokens, *,
               max_tokens: int = DEFAULT_CHUNK_TOKENS) -> tuple[Blob, Document | None]:
        """Index an attached file (kept when collections are removed): its blob, and the
        document read, or None when this content was indexed before (found by its hash,
        read streamed: a file attached again is not parsed again, unless the passages are to
        be counted by another tokenizer)."""
        have = self.blob_by_sha(blob_key(file_sha256(path)[0], count_tokens, max_tokens))
        if have is not None:
            if not have.attached:
                with self.tx() as c:
                    c.execute("UPDATE doc_blobs SET attached = 1 WHERE id = ?", (have.id,))
            return have, None
        doc = extract(path)
        return self.add_document(doc, count_tokens, max_tokens=max_tokens, attached=True), doc

    def chunks(self, blob_id: int) -> list[Hit]:
        """A blob's passages in order."""
        return [_hit(r, 0.0) for r in self.q(_HIT_SQL + " WHERE k.blob_id = ? ORDER BY k.ordinal", (blob_id,))]

    def hits(self, chunk_ids: list[int], scores: dict[int, float] | None = None) -> list[Hit]:
        """The passages ``chunk_ids`` name, in that order, with their sources."""
        if not chunk_ids:
            return []
        rows = {}
        for i in range(0, len(chunk_ids), 500):
            part = chunk_ids[i:i + 500]
            sql = _HIT_SQL + f" WHERE k.id IN ({','.join('?' * len(part))})"
            rows.update({r["id"]: r for r in self.q(sql, part)})
        scores = scores or {}
        return [_hit(rows[i], scores.get(i, 0.0)) for i in chunk_ids if i in rows]

    def scope_blobs(self, *, collections: list[int] = (), blobs: list[int] = ()) -> list[int]:
        """The blob ids a search over these collections and blobs covers."""
        ids = set(blobs)
        for cid in collections:
            ids.update(r[0] for r in self.q("SELECT DISTINCT blob_id FROM doc_files WHERE collection_id = ?"
                                            " AND blob_id IS NOT NULL AND status = 'ok'", (cid,)))
        return sorted(ids)

    def bm25(self, query: str, blob_ids: list[int], limit: int = 20, *, prune: bool = True) -> list[tuple[int, float]]:
        """[(chunk id, score)] best first, by FTS5's BM25 over the passages of ``blob_ids``.
        ``prune``: when the question's words hold many rows, score fully only the best
        candidates of its rarest words (:mod:`core.documents.bm25`)."""
        terms = fts_terms(query)
        if not terms or not blob_ids:
            return []
        everything = len(set(blob_ids)) >= self.q("SELECT count(*) FROM doc_blobs")[0][0]
        if prune and len(terms) > 1 and all(tokens(t) == [t] for t in terms):
            df = self._df(terms)
            rare = rare_terms(terms, df, self._averages()[0], self.candidate_rows)
            if rare is not None:
                return self._rescored(terms, df, self._holding(_match(rare), blob_ids, everything), limit)
        return self._fts(_match(terms), blob_ids, everything, limit)

    def _fts(self, match: str, blob_ids: list[int], everything: bool, limit: int) -> list[tuple[int, float]]:
        if everything:
            # Everything indexed is in scope: no join to the passages (half the time at 100k).
            rows = self.q("SELECT rowid, bm25(doc_chunks_fts, 1.0, 0.5) AS s FROM doc_chunks_fts"
                          " WHERE doc_chunks_fts MATCH ? ORDER BY s LIMIT ?", (match, int(limit)))
        else:
            scope = ",".join(str(int(b)) for b in blob_ids)
            rows = self.q("SELECT f.rowid, bm25(doc_chunks_fts, 1.0, 0.5) AS s FROM doc_chunks_fts f"
                          " JOIN doc_chunks k ON k.id = f.rowid"
                          f" WHERE doc_chunks_fts MATCH ? AND k.blob_id IN ({scope}) ORDER BY s LIMIT ?",
                          (match, int(limit)))
        return [(r[0], -float(r[1])) for r in rows]

    def _holding(self, match: str, blob_ids: list[int], everything: bool) -> list[int]:
        """The rows (in scope) holding any word of ``match``: no ranking, so no counting."""
        if everything:
            return [r[0] for r in self.q("SELECT rowid FROM doc_chunks_fts WHERE doc_chunks_fts MATCH ?", (match,))]
        scope = ",".join(str(int(b)) for b in blob_ids)
        return [r[0] for r in self.q("SELECT f.rowid FROM doc_chunks_fts f JOIN doc_chunks k ON k.id = f.rowid"
                                     f" WHERE doc_chunks_fts MATCH ? AND k.blob_id IN ({scope})", (match,))]

    def _df(self, terms: list[str]) -> dict[str, int]:
        """{word: rows holding it}, from FTS5's vocabulary (an index lookup per word)."""
        with self._lock:
            if not self._vocab:
                self._conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.doc_vocab"
                                   " USING fts5vocab(main, 'doc_chunks_fts', 'row')")
                self._vocab = True
        return {r[0]: r[1] for r in self.q(f"SELECT term, doc FROM temp.doc_vocab WHERE term IN"
                                           f" ({','.join('?' * len(terms))})", terms)}

    def _averages(self) -> tuple[int, float]:
        """(rows, mean tokens a row) as FTS5's bm25() reads them: its averages record."""
        rows = self.q("SELECT block FROM doc_chunks_fts_data WHERE id = 1")
        v = varints(rows[0][0]) if rows else [0]
        return v[0], sum(v[1:]) / max(v[0], 1)

    def _rescored(self, terms: list[str], df: dict[str, int], candidates: list[int],
                  limit: int) -> list[tuple[int, float]]:
        """The candidates scored with every word (FTS5's formula and statistics), best first."""
        if not candidates:
            return []
        n_rows, avgdl = self._averages()
        scorer = Scorer(terms, df, n_rows, avgdl)
        rows = self.q("SELECT k.id, k.heading, k.text, d.sz FROM doc_chunks k JOIN doc_chunks_fts_docsize d"
                      f" ON d.id = k.id WHERE k.id IN ({','.join(map(str, candidates))})")
        scored = [(r[0], scorer.score(r[2], r[1], sum(varints(r[3])))) for r in rows]
        scored.sort(key=lambda x: (-x[1], x[0]))
        return scored[:limit]

    # ------------------------------------------------------------------ collections

    def collections(self) -> list[Collection]:
        return [_collection(r) for r in self.q(_COLL_SQL + " GROUP BY c.id ORDER BY c.name, c.id")]

    def collection(self, root: str | os.PathLike) -> Collection | None:
        rows = self.q(_COLL_SQL + " WHERE c.root = ? GROUP BY c.id", (_root(root),))
        return _collection(rows[0]) if rows else None

    def add_collection(self, root: str | os.PathLike, name: str | None = None) -> Collection:
        """The collection for folder ``root`` (made when new; indexing is separate)."""
        key = _root(root)
        if not os.path.isdir(key):
            raise DocumentError(f"{key} is not a folder")
        now = time.time()
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO doc_collections (root, name, created_at, updated_at) VALUES (?, ?, ?, ?)",
                      (key, name or Path(key).name or key, now, now))
        return self.collection(key)

    def set_state(self, collection_id: int, state: str, message: str = "") -> None:
        with self.tx() as c:
            c.execute("UPDATE doc_collections SET state = ?, updated_at = ?, meta = json_set(meta, '$.message', ?)"
                      " WHERE id = ?", (state, time.time(), message, collection_id))

    def remove_collection(self, root: str | os.PathLike) -> bool:
        """Forget a collection and the passages no other collection or attachment uses."""
        key = _root(root)
        with self.tx() as c:
            cur = c.execute("DELETE FROM doc_collections WHERE root = ?", (key,))
            self.drop_orphans(c)
        return cur.rowcount > 0

    @staticmethod
    def drop_orphans(c) -> None:
        c.execute("DELETE FROM doc_blobs WHERE attached = 0 AND NOT EXISTS"
                  " (SELECT 1 FROM doc_files f WHERE f.blob_id = doc_blobs.id)")

    def files(self, collection_id: int) -> dict[str, sqlite3.Row]:
        """{path: its row} of a collection's files (size, mtime_ns, blob_id, status, reason)."""
        return {r["path"]: r for r in self.q("SELECT * FROM doc_files WHERE collection_id = ?", (collection_id,))}

    def skipped(self, collection_id: int) -> list[tuple[str, str]]:
        """[(path, why)] of the files a collection could not index."""
        return [(r[0], r[1]) for r in self.q("SELECT path, reason FROM doc_files WHERE collection_id = ?"
                                             " AND status != 'ok' ORDER BY path", (collection_id,))]


def _root(root: str | os.PathLike) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(root)))


class _Tx:
    def __init__(self, index: DocumentIndex):
        self.ix = index

    def __enter__(self):
        self.ix._lock.acquire()
        conn = self.ix._conn
        if conn is None:
            self.ix._lock.release()
            raise DocumentError("the documents index is closed")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.ix._lock.release()
            raise
        return conn

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.ix._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.ix._lock.release()


_BLOB_SQL = ("SELECT b.*, count(k.id) AS n_chunks, coalesce(sum(k.tokens), 0) AS n_tokens"
             " FROM doc_blobs b LEFT JOIN doc_chunks k ON k.blob_id = b.id")
_HIT_SQL = ("SELECT k.*, coalesce((SELECT f.path FROM doc_files f WHERE f.blob_id = k.blob_id LIMIT 1), b.name)"
            " AS source FROM doc_chunks k JOIN doc_blobs b ON b.id = k.blob_id")
_COLL_SQL = ("SELECT c.*, count(f.id) AS n_files, sum(f.status != 'ok') AS n_skipped,"
             " (SELECT count(*) FROM doc_chunks k WHERE k.blob_id IN"
             "  (SELECT blob_id FROM doc_files WHERE collection_id = c.id)) AS n_chunks"
             " FROM doc_collections c LEFT JOIN doc_files f ON f.collection_id = c.id")


def _blob(r) -> Blob:
    return Blob(r["id"], r["sha256"], r["kind"], r["name"], r["size"], r["pages"], r["chars"],
                r["n_chunks"], r["n_tokens"], tuple(json.loads(r["notes"] or "[]")), bool(r["attached"]))


def _hit(r, score: float) -> Hit:
    return Hit(r["id"], score, r["text"], r["source"], r["page"], r["line_start"], r["line_end"],
               r["heading"], r["blob_id"], r["ordinal"])


def _collection(r) -> Collection:
    meta = json.loads(r["meta"] or "{}")
    return Collection(r["id"], r["root"], r["name"], r["state"], r["n_files"] or 0, r["n_skipped"] or 0,
                      r["n_chunks"] or 0, r["updated_at"], meta.get("message", ""))
