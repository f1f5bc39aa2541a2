"""The history database's schema: its tables, version and migrations, the columns code
reads and writes, and the recursive queries that walk the message tree.

The schema version lives in ``PRAGMA user_version``; :data:`MIGRATIONS` upgrades an older
file in place, one version at a time, inside the transaction that opens it.
"""
from __future__ import annotations

import functools
import sqlite3
from typing import Callable

SCHEMA_VERSION = 3

SCHEMA_V1 = """
CREATE TABLE conversations (
    id              INTEGER PRIMARY KEY,
    title           TEXT    NOT NULL,
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL,
    kind            TEXT    NOT NULL DEFAULT 'chat',
    current_leaf_id INTEGER,
    meta            TEXT    NOT NULL DEFAULT '{}',
    -- text held in meta that search must see (a comparison's prompt and lanes)
    search_text     TEXT    NOT NULL DEFAULT ''
);
CREATE TABLE messages (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id       INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role            TEXT    NOT NULL,
    text            TEXT    NOT NULL,
    settings        TEXT,
    seed            INTEGER,
    model_id        TEXT,
    stats           TEXT,
    stop_reason     TEXT,
    created_at      REAL    NOT NULL,
    meta            TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
CREATE INDEX messages_by_parent ON messages(parent_id);
CREATE INDEX conversations_by_update ON conversations(updated_at);
"""



def _v1_to_v2(con: sqlite3.Connection) -> None:
    """Tool use (issue 25): a reply's calls (``tool_calls``, a JSON list of OpenAI-shaped
    calls, each with the ``source`` that runs it) and, on a ``tool`` message, which call
    its text answers (``tool_result``: call id, name, source, truncated, is_error)."""
    con.execute("ALTER TABLE messages ADD COLUMN tool_calls TEXT")
    con.execute("ALTER TABLE messages ADD COLUMN tool_result TEXT")


# v3: documents (core/documents/index.py). A blob is one file's content, keyed by its hash,
# so a file met twice (attached again, in two collections) is read and embedded once.
DOCUMENTS_V3 = (
    """CREATE TABLE doc_collections (
        id INTEGER PRIMARY KEY, root TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL,
        state TEXT NOT NULL DEFAULT 'new', meta TEXT NOT NULL DEFAULT '{}')""",
    """CREATE TABLE doc_blobs (
        id INTEGER PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, name TEXT NOT NULL,
        size INTEGER NOT NULL, pages INTEGER, chars INTEGER NOT NULL, chunk_tokens INTEGER NOT NULL,
        notes TEXT NOT NULL DEFAULT '[]', attached INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL)""",
    """CREATE TABLE doc_chunks (
        id INTEGER PRIMARY KEY, blob_id INTEGER NOT NULL REFERENCES doc_blobs(id) ON DELETE CASCADE,
        ordinal INTEGER NOT NULL, page INTEGER, line_start INTEGER NOT NULL, line_end INTEGER NOT NULL,
        heading TEXT NOT NULL DEFAULT '', text TEXT NOT NULL, tokens INTEGER NOT NULL)""",
    "CREATE INDEX doc_chunks_by_blob ON doc_chunks(blob_id, ordinal)",
    """CREATE TABLE doc_files (
        id INTEGER PRIMARY KEY,
        collection_id INTEGER NOT NULL REFERENCES doc_collections(id) ON DELETE CASCADE,
        path TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
        blob_id INTEGER REFERENCES doc_blobs(id) ON DELETE SET NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', indexed_at REAL NOT NULL,
        UNIQUE (collection_id, path))""",
    "CREATE INDEX doc_files_by_blob ON doc_files(blob_id)",
    """CREATE TABLE doc_embeddings (
        chunk_id INTEGER NOT NULL REFERENCES doc_chunks(id) ON DELETE CASCADE,
        embedder TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (embedder, chunk_id))""",
    # BM25 over the chunks; external content, kept in step by the triggers below.
    """CREATE VIRTUAL TABLE doc_chunks_fts USING fts5(
        text, heading, content='doc_chunks', content_rowid='id', tokenize='unicode61 remove_diacritics 2')""",
    """CREATE TRIGGER doc_chunks_ai AFTER INSERT ON doc_chunks BEGIN
        INSERT INTO doc_chunks_fts(rowid, text, heading) VALUES (new.id, new.text, new.heading); END""",
    """CREATE TRIGGER doc_chunks_ad AFTER DELETE ON doc_chunks BEGIN
        INSERT INTO doc_chunks_fts(doc_chunks_fts, rowid, text, heading)
        VALUES ('delete', old.id, old.text, old.heading); END""",
)


def _v2_to_v3_documents(conn: sqlite3.Connection) -> None:
    for stmt in DOCUMENTS_V3:
        conn.execute(stmt)


# MIGRATIONS[v] upgrades a version-v database to v+1 (run inside one transaction).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3_documents}

MESSAGE_COLUMNS = ("id", "conversation_id", "parent_id", "role", "text", "settings", "seed",
                   "model_id", "stats", "stop_reason", "created_at", "meta", "tool_calls", "tool_result")
JSON_FIELDS = ("settings", "stats", "meta", "tool_calls", "tool_result")
UPDATABLE = ("role", "text", "settings", "seed", "model_id", "stats", "stop_reason", "meta", "tool_calls",
             "tool_result")

SUBTREE_SQL = """
WITH RECURSIVE sub(id) AS (
    SELECT id FROM messages WHERE id = ?
    UNION ALL
    SELECT m.id FROM messages m JOIN sub ON m.parent_id = sub.id
)
SELECT id FROM sub
"""

NEWEST_LEAF_SQL = """
WITH RECURSIVE sub(id) AS (
    SELECT id FROM messages WHERE id = ?
    UNION ALL
    SELECT m.id FROM messages m JOIN sub ON m.parent_id = sub.id
)
SELECT max(id) FROM sub WHERE NOT EXISTS (SELECT 1 FROM messages k WHERE k.parent_id = sub.id)
"""

ANCESTORS_SQL = """
WITH RECURSIVE up(id, depth) AS (
    SELECT id, 0 FROM messages WHERE id = ?
    UNION ALL
    SELECT m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.id
    WHERE m.parent_id IS NOT NULL
)
SELECT messages.* FROM up JOIN messages ON messages.id = up.id ORDER BY up.depth
"""


@functools.lru_cache(maxsize=1)
def expected_columns() -> dict[str, frozenset[str]]:
    """{table: its columns} of a store of the current version, read from the schema itself
    (an in-memory database built from it), so the open-time check never drifts from it."""
    con = sqlite3.connect(":memory:")
    try:
        for stmt in SCHEMA_V1.split(";"):
            if stmt.strip():
                con.execute(stmt)
        for v in range(1, SCHEMA_VERSION):
            MIGRATIONS[v](con)
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: frozenset(r[1] for r in con.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        con.close()
