"""Persistent conversations in SQLite (stdlib ``sqlite3``, WAL mode).

Messages form a tree: every message has a ``parent_id`` (None for the first one), and
messages that share a parent and a role are *versions* of each other (a regenerated
reply, an edited-and-resent user message). A conversation remembers the leaf of the
branch on screen (``current_leaf_id``); :meth:`History.current_path` walks from the root
to it. Nothing is ever overwritten by a branch switch, so every version stays reachable.

Durability: each public write is one ``BEGIN IMMEDIATE`` transaction (``self._tx()``), the
journal is WAL with ``synchronous=FULL``, so a committed message survives the process
being killed. :meth:`History.open_or_recover` moves a damaged file aside (never deletes it).
The schema version lives in ``PRAGMA user_version``; :data:`MIGRATIONS` upgrades old
files in place.

Never imports Qt: the CLI and the tests use it too.
"""
from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from core.errors import LlamaDeskError

__all__ = ["History", "Conversation", "Message", "HistoryError", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
APP_DIR_NAME = "LlamaDesk"
KINDS = ("chat", "comparison")


class HistoryError(LlamaDeskError):
    """A history operation that cannot be done: unknown id, bad import data, newer file."""


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    kind: str  # "chat" | "comparison"
    current_leaf_id: int | None
    meta: dict = field(default_factory=dict)


@dataclass
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    text: str
    settings: dict | None
    seed: int | None
    model_id: str | None
    stats: dict | None
    stop_reason: str | None
    created_at: float
    meta: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- schema

_SCHEMA_V1 = """
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

# MIGRATIONS[v] upgrades a version-v database to v+1 (run inside one transaction).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}

_MESSAGE_COLUMNS = ("id", "conversation_id", "parent_id", "role", "text", "settings", "seed",
                    "model_id", "stats", "stop_reason", "created_at", "meta")
_JSON_FIELDS = ("settings", "stats", "meta")
_UPDATABLE = ("role", "text", "settings", "seed", "model_id", "stats", "stop_reason", "meta")


def _json_default(obj: Any) -> Any:
    # Lanes may carry tensors / numpy arrays of tokens or logprobs; store their values.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _dumps(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    except (TypeError, ValueError) as e:
        raise HistoryError(f"cannot store value in history: {e}") from None


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class _Damaged(str):
    """Text read back from bytes that were not valid UTF-8 (a damaged row)."""


def _decode_text(data: bytes) -> str:
    # text_factory: a few corrupt bytes in one row must not make the whole query raise.
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _Damaged(data.decode("utf-8", "replace"))


def _meta_or_empty(text: str | None) -> dict:
    try:
        v = _loads(text)
    except (ValueError, TypeError):
        return {"damaged": ["meta"]}
    return v if isinstance(v, dict) else {}


def clean_text(text: str) -> tuple[str, bool]:
    """(``text`` with lone surrogates replaced by U+FFFD, whether any were): SQLite stores
    UTF-8, and a lone surrogate (broken clipboard data, invalid bytes from argv) cannot be
    encoded, which would make a message silently fail to save."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        from core.tokenizer.base import valid_text
        return valid_text(text), True


def _moved_aside(path: Path) -> Path:
    """Rename a damaged store (and its WAL/SHM files) out of the way; it is never deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(path) + suffix)
        if src.exists():
            os.replace(src, Path(str(target) + suffix))
    return target


def _contains(haystack: str | None, needle: str | None) -> int:
    # Registered as an SQL function: SQLite's LIKE/lower() fold ASCII only, casefold() all.
    if not haystack or needle is None:
        return 0
    return int(needle in haystack.casefold())


class History:
    """The conversation store. One instance per database file; safe to share between
    threads (calls are serialized by a lock), though the app uses it from the UI thread."""

    def __init__(self, path: str | Path):
        self.path = path if str(path) == ":memory:" else Path(path).expanduser()
        if isinstance(self.path, Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = None
        try:
            # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE), so a
            # write never starts while holding a read snapshot that another process changed.
            self._conn = sqlite3.connect(str(self.path), isolation_level=None,
                                         check_same_thread=False, timeout=10.0)
            self._conn.row_factory = sqlite3.Row
            self._conn.text_factory = _decode_text
            self._conn.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise HistoryError(f"cannot use WAL journal for {self.path} (got {mode})")
            # FULL: a commit is on disk before add_message returns (a chat turn is tiny).
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.create_function("ld_contains", 2, _contains, deterministic=True)
            self._migrate()
            if self.path != ":memory:":
                ok = self._conn.execute("PRAGMA quick_check(1)").fetchone()[0]
                if ok != "ok":
                    raise sqlite3.DatabaseError(f"integrity check failed: {ok}")
        except (sqlite3.Error, HistoryError) as e:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if isinstance(e, HistoryError):
                raise
            raise HistoryError(f"cannot open history {self.path}: {e}") from None

    @classmethod
    def open_or_recover(cls, path: str | Path) -> tuple["History", str | None]:
        """Open the store at ``path`` whatever state it is in: (store, notice or None).

        A damaged file is moved aside (kept, never deleted) and a fresh store started;
        when the folder cannot hold a store at all (read-only, full, a file where the
        folder should be), the session uses an in-memory store and the notice says so.
        """
        path = Path(path).expanduser()
        try:
            return cls(path), None
        except (HistoryError, OSError) as first:
            reason = str(first)
        if path.is_file() and _looks_damaged(reason):
            try:
                kept = _moved_aside(path)
                return cls(path), (f"The conversation history was damaged and could not be read; it was kept "
                                   f"as {kept.name} and a new history was started.")
            except (HistoryError, OSError) as e:
                reason = str(e)
        return cls(":memory:"), (f"Conversations cannot be saved in {path.parent} ({reason}); this session "
                                 "keeps them in memory only, and they will be lost when the app closes.")

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def default_path() -> Path:
        """``$LLAMADESK_DATA_DIR/history.sqlite3``, else the platform user data folder
        (the same place Qt's AppDataLocation names for the app "LlamaDesk")."""
        env = os.environ.get("LLAMADESK_DATA_DIR")
        if env:
            return Path(env).expanduser() / "history.sqlite3"
        home = Path.home()
        if sys.platform == "win32":
            base = Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming")
        elif sys.platform == "darwin":
            base = home / "Library" / "Application Support"
        else:
            xdg = os.environ.get("XDG_DATA_HOME", "")
            # The XDG spec says relative values are invalid and must be ignored.
            base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
        return base / APP_DIR_NAME / "history.sqlite3"

    def close(self) -> None:
        """Close the database (idempotent), first moving the WAL's pages into the database
        file, so what was written lives in ``history.sqlite3`` itself."""
        with self._lock:
            if self._conn is not None:
                if self.path != ":memory:":
                    try:
                        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    except sqlite3.Error:  # another process holds a read snapshot: sqlite retries later
                        pass
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tx(self):
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front."""
        return _Transaction(self)

    def _q(self, sql: str, args: tuple | list = ()) -> list[sqlite3.Row]:
        with self._lock:
            if self._conn is None:
                raise HistoryError("history is closed")
            return self._conn.execute(sql, [clean_text(v)[0] if isinstance(v, str) else v for v in args]).fetchall()

    def _migrate(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(f"history {self.path} was written by a newer LlamaDesk "
                               f"(schema {version}, this version reads up to {SCHEMA_VERSION})")
        if version == SCHEMA_VERSION:
            return
        with self._tx() as c:
            if version == 0:
                has_tables = c.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
                if has_tables:
                    raise HistoryError(f"{self.path} is not a LlamaDesk history database")
                c.executescript_in_tx(_SCHEMA_V1)
                version = 1
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](c.conn)
                version += 1
            # PRAGMA cannot take parameters; version is our own int.
            c.execute(f"PRAGMA user_version = {int(version)}")

    # ------------------------------------------------------------------ rows

    @staticmethod
    def _conv(row: sqlite3.Row) -> Conversation:
        return Conversation(id=row["id"], title=row["title"], created_at=row["created_at"],
                            updated_at=row["updated_at"], kind=row["kind"],
                            current_leaf_id=row["current_leaf_id"],
                            meta=_meta_or_empty(row["meta"]))

    @staticmethod
    def _msg(row: sqlite3.Row) -> Message:
        d = {k: row[k] for k in _MESSAGE_COLUMNS}
        damaged = []
        for k in _JSON_FIELDS:
            try:
                d[k] = _loads(d[k])
            except (ValueError, TypeError):
                d[k], damaged = None, damaged + [k]
        if not isinstance(d["meta"], dict):
            d["meta"] = {}
        if isinstance(d["text"], _Damaged):
            d["text"], damaged = str(d["text"]), damaged + ["text"]
        if not isinstance(d["text"], str):
            d["text"], damaged = "", damaged + ["text"]
        if damaged:  # shown as damaged; the rest of the conversation opens as usual
            d["meta"] = {**d["meta"], "damaged": damaged}
        return Message(**d)

    def _message_row(self, msg_id: int) -> sqlite3.Row:
        rows = self._q("SELECT * FROM messages WHERE id = ?", (msg_id,))
        if not rows:
            raise HistoryError(f"no message with id {msg_id}")
        return rows[0]

    def _check_conv(self, conv_id: int) -> sqlite3.Row:
        rows = self._q("SELECT * FROM conversations WHERE id = ?", (conv_id,))
        if not rows:
            raise HistoryError(f"no conversation with id {conv_id}")
        return rows[0]

    # ------------------------------------------------------------------ conversations

    def create_conversation(self, title: str = "New chat", *, kind: str = "chat",
                            meta: dict | None = None) -> Conversation:
        """A new, empty conversation."""
        if kind not in KINDS:
            raise HistoryError(f"conversation kind must be one of {', '.join(KINDS)}, got {kind!r}")
        now = time.time()
        with self._tx() as c:
            cur = c.execute("INSERT INTO conversations (title, created_at, updated_at, kind, meta)"
                            " VALUES (?, ?, ?, ?, ?)", (title, now, now, kind, _dumps(meta or {})))
            conv_id = cur.lastrowid
        return self.conversation(conv_id)

    def conversations(self, search: str | None = None, kind: str | None = None) -> list[Conversation]:
        """All conversations, most recently updated first; ``search`` keeps those whose
        title or any message contains it (case-insensitive)."""
        sql = "SELECT * FROM conversations c WHERE 1"
        args: list = []
        if kind is not None:
            sql += " AND c.kind = ?"
            args.append(kind)
        if search:
            needle = search.casefold()
            sql += (" AND (ld_contains(c.title, ?) OR ld_contains(c.search_text, ?) OR EXISTS"
                    " (SELECT 1 FROM messages m WHERE m.conversation_id = c.id"
                    "  AND ld_contains(m.text, ?)))")
            args += [needle, needle, needle]
        sql += " ORDER BY c.updated_at DESC, c.id DESC"
        return [self._conv(r) for r in self._q(sql, args)]

    def conversation(self, conv_id: int) -> Conversation:
        """One conversation; HistoryError if unknown."""
        return self._conv(self._check_conv(conv_id))

    def rename(self, conv_id: int, title: str) -> None:
        with self._tx() as c:
            cur = c.execute("UPDATE conversations SET title = ?, updated_at = ? WHERE id = ?",
                            (title, time.time(), conv_id))
            if cur.rowcount == 0:
                raise HistoryError(f"no conversation with id {conv_id}")

    def set_meta(self, conv_id: int, meta: dict) -> None:
        """Replace a conversation's meta dict (e.g. the model it was started with)."""
        with self._tx() as c:
            cur = c.execute("UPDATE conversations SET meta = ?, updated_at = ? WHERE id = ?",
                            (_dumps(meta), time.time(), conv_id))
            if cur.rowcount == 0:
                raise HistoryError(f"no conversation with id {conv_id}")

    def delete_conversation(self, conv_id: int) -> None:
        """Delete a conversation and all its messages (a no-op if already gone)."""
        with self._tx() as c:
            # Children first would be needed without cascade; the FK cascade does it.
            c.execute("DELETE FROM messages WHERE conversation_id = ?", (conv_id,))
            c.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    # ------------------------------------------------------------------ messages

    def add_message(self, conv_id: int, *, role: str, text: str, parent_id: int | None = None,
                    settings: dict | None = None, seed: int | None = None,
                    model_id: str | None = None, stats: dict | None = None,
                    stop_reason: str | None = None, meta: dict | None = None,
                    make_current: bool = True) -> Message:
        """Append a message under ``parent_id`` (None: a root). With ``make_current`` the
        new message becomes the conversation's current leaf."""
        now = time.time()
        text, repaired = clean_text(text)
        if repaired:
            meta = {**(meta or {}), "text_repaired": True}
        with self._tx() as c:
            if c.execute("SELECT 1 FROM conversations WHERE id = ?", (conv_id,)).fetchone() is None:
                raise HistoryError(f"no conversation with id {conv_id}")
            if parent_id is not None:
                p = c.execute("SELECT conversation_id FROM messages WHERE id = ?",
                              (parent_id,)).fetchone()
                if p is None or p[0] != conv_id:
                    raise HistoryError(f"parent message {parent_id} is not in conversation {conv_id}")
            cur = c.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, text, settings, seed,"
                " model_id, stats, stop_reason, created_at, meta)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conv_id, parent_id, role, text, _dumps(settings),
                 None if seed is None else int(seed), model_id, _dumps(stats), stop_reason,
                 now, _dumps(meta or {})))
            msg_id = cur.lastrowid
            if make_current:
                c.execute("UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?",
                          (msg_id, now, conv_id))
            else:
                c.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conv_id))
        return self.message(msg_id)

    def message(self, msg_id: int) -> Message:
        """One message; HistoryError if unknown."""
        return self._msg(self._message_row(msg_id))

    def update_message(self, msg_id: int, **fields) -> Message:
        """Change some of a message's fields (text, stats, stop_reason, ... — not its place
        in the tree); returns the updated message."""
        bad = sorted(set(fields) - set(_UPDATABLE))
        if bad:
            raise HistoryError(f"cannot update message field(s) {', '.join(bad)}; "
                               f"updatable: {', '.join(_UPDATABLE)}")
        if not fields:
            return self.message(msg_id)
        if isinstance(fields.get("text"), str):
            fields["text"], repaired = clean_text(fields["text"])
            if repaired:
                fields["meta"] = {**(fields.get("meta") or self.message(msg_id).meta or {}), "text_repaired": True}
        sets, args = [], []
        for k, v in fields.items():
            sets.append(f"{k} = ?")  # k is from the _UPDATABLE whitelist
            if k in _JSON_FIELDS:
                v = _dumps(v if v is not None or k != "meta" else {})
            elif k == "seed" and v is not None:
                v = int(v)
            args.append(v)
        with self._tx() as c:
            cur = c.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, msg_id))
            if cur.rowcount == 0:
                raise HistoryError(f"no message with id {msg_id}")
            c.execute("UPDATE conversations SET updated_at = ? WHERE id ="
                      " (SELECT conversation_id FROM messages WHERE id = ?)", (time.time(), msg_id))
        return self.message(msg_id)

    def delete_message(self, msg_id: int) -> None:
        """Delete a message and everything below it. If the current leaf was in that
        subtree, the current leaf moves to the deleted message's parent (None for a root)."""
        with self._tx() as c:
            row = c.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?",
                            (msg_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no message with id {msg_id}")
            conv_id, parent_id = row
            subtree = {r[0] for r in c.execute(_SUBTREE_SQL, (msg_id,))}
            leaf = c.execute("SELECT current_leaf_id FROM conversations WHERE id = ?",
                             (conv_id,)).fetchone()[0]
            new_leaf = parent_id if leaf in subtree else leaf
            c.execute("DELETE FROM messages WHERE id = ?", (msg_id,))  # FK cascade: subtree
            c.execute("UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?",
                      (new_leaf, time.time(), conv_id))

    def subtree_snapshot(self, msg_id: int) -> dict:
        """A message, everything below it and its conversation's current leaf, as stored:
        what :meth:`restore_subtree` puts back (Undo of :meth:`delete_message`)."""
        row = self._message_row(msg_id)
        cols = ", ".join(_MESSAGE_COLUMNS)
        ids = [r[0] for r in self._q(_SUBTREE_SQL, (msg_id,))]
        rows = [tuple(r) for r in self._q(f"SELECT {cols} FROM messages WHERE id IN "
                                          f"({', '.join('?' * len(ids))}) ORDER BY id", ids)]
        leaf = self._check_conv(row["conversation_id"])["current_leaf_id"]
        return {"conversation_id": row["conversation_id"], "current_leaf_id": leaf, "rows": rows}

    def restore_subtree(self, snapshot: dict) -> None:
        """Put back messages deleted after :meth:`subtree_snapshot`, with their ids, and
        the current leaf of then; HistoryError when that is no longer possible (the
        conversation or the parent is gone, or an id was taken meanwhile)."""
        cols = ", ".join(_MESSAGE_COLUMNS)
        try:
            with self._tx() as c:
                # Parents have smaller ids than their replies: id order inserts parents first.
                for row in snapshot["rows"]:
                    c.execute(f"INSERT INTO messages ({cols}) VALUES ({', '.join('?' * len(row))})", row)
                c.execute("UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?",
                          (snapshot["current_leaf_id"], time.time(), snapshot["conversation_id"]))
        except sqlite3.IntegrityError as e:
            raise HistoryError(f"the deleted messages cannot be put back: {e}") from None

    def messages(self, conv_id: int) -> list[Message]:
        """Every message of a conversation (all branches), in insertion order."""
        self._check_conv(conv_id)
        return [self._msg(r) for r in
                self._q("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,))]

    def current_path(self, conv_id: int) -> list[Message]:
        """The branch on screen: root → current leaf ([] for an empty conversation)."""
        leaf = self._check_conv(conv_id)["current_leaf_id"]
        if leaf is None:
            return []
        return self.path_to(leaf)

    def path_to(self, msg_id: int) -> list[Message]:
        """Root → ``msg_id``."""
        rows = self._q(_ANCESTORS_SQL, (msg_id,))
        if not rows:
            raise HistoryError(f"no message with id {msg_id}")
        return [self._msg(r) for r in reversed(rows)]

    def children(self, msg_id: int | None, conv_id: int | None = None) -> list[Message]:
        """Direct replies to ``msg_id`` (for None: the roots of ``conv_id``), oldest first."""
        if msg_id is None:
            if conv_id is None:
                raise HistoryError("children(None) needs conv_id")
            rows = self._q("SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS NULL"
                           " ORDER BY id", (conv_id,))
        else:
            rows = self._q("SELECT * FROM messages WHERE parent_id = ? ORDER BY id", (msg_id,))
        return [self._msg(r) for r in rows]

    def siblings(self, msg_id: int) -> list[Message]:
        """The versions of a message: same conversation, same parent, same role (itself
        included), oldest first."""
        row = self._message_row(msg_id)
        rows = self._q("SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ?"
                       " AND role = ? ORDER BY id",
                       (row["conversation_id"], row["parent_id"], row["role"]))
        return [self._msg(r) for r in rows]

    def select(self, msg_id: int) -> None:
        """Put ``msg_id`` on screen: the current leaf becomes the most recently created leaf
        below it (itself if it has no replies)."""
        with self._tx() as c:
            row = c.execute("SELECT conversation_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no message with id {msg_id}")
            # Newest descendant that has no children; ids grow with time.
            leaf = c.execute(_NEWEST_LEAF_SQL, (msg_id,)).fetchone()[0]
            c.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?",
                      (leaf if leaf is not None else msg_id, row[0]))

    def set_current_leaf(self, conv_id: int, msg_id: int | None) -> None:
        """Make exactly ``msg_id`` the end of the branch on screen (None: empty)."""
        with self._tx() as c:
            if msg_id is not None:
                row = c.execute("SELECT conversation_id FROM messages WHERE id = ?",
                                (msg_id,)).fetchone()
                if row is None or row[0] != conv_id:
                    raise HistoryError(f"message {msg_id} is not in conversation {conv_id}")
            cur = c.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?",
                            (msg_id, conv_id))
            if cur.rowcount == 0:
                raise HistoryError(f"no conversation with id {conv_id}")

    # ------------------------------------------------------------------ comparisons

    def save_comparison(self, title: str, prompt: dict, lanes: list[dict]) -> Conversation:
        """Store a finished comparison: ``prompt`` (e.g. {"messages": [...]} or {"text": ...},
        plus "chat_format") and one dict per lane (settings, seed, text, tokens, logprobs,
        stop_reason, stats, ...). Returns a conversation of kind "comparison"."""
        if not isinstance(prompt, dict) or not isinstance(lanes, list) \
                or not all(isinstance(lane, dict) for lane in lanes):
            raise HistoryError("save_comparison needs a prompt dict and a list of lane dicts")
        data = {"prompt": prompt, "lanes": lanes}
        meta_json = _dumps({"comparison": data})
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, kind, meta, search_text)"
                " VALUES (?, ?, ?, 'comparison', ?, ?)",
                (title, now, now, meta_json, _comparison_text(data)))
            conv_id = cur.lastrowid
        return self.conversation(conv_id)

    def comparison(self, conv_id: int) -> dict:
        """{"prompt": ..., "lanes": [...]} of a comparison conversation."""
        conv = self.conversation(conv_id)
        data = conv.meta.get("comparison")
        if conv.kind != "comparison" or not isinstance(data, dict):
            raise HistoryError(f"conversation {conv_id} is not a comparison")
        return data

    # ------------------------------------------------------------------ import

    def add_tree(self, conv: dict, msgs: list[dict]) -> Conversation:
        """A new conversation holding ``msgs`` (dicts with ``id``/``parent_id``, parents
        first; fresh ids are given), in one transaction. ``core.history.export`` validates
        imported files before calling this."""
        now = time.time()
        with self._tx() as c:
            meta = conv.get("meta") or {}
            search = _comparison_text(meta["comparison"]) if conv["kind"] == "comparison" \
                and isinstance(meta.get("comparison"), dict) else ""
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, kind, meta, search_text)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conv["title"], conv.get("created_at", now), conv.get("updated_at", now),
                 conv["kind"], _dumps(meta), search))
            new_conv = cur.lastrowid
            id_map: dict[int, int] = {}
            for m in msgs:
                cur = c.execute(
                    "INSERT INTO messages (conversation_id, parent_id, role, text, settings, seed,"
                    " model_id, stats, stop_reason, created_at, meta)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (new_conv, id_map.get(m.get("parent_id")), m["role"], m["text"],
                     _dumps(m.get("settings")), m.get("seed"), m.get("model_id"),
                     _dumps(m.get("stats")), m.get("stop_reason"), m.get("created_at", now),
                     _dumps(m.get("meta") or {})))
                id_map[m["id"]] = cur.lastrowid
            leaf = conv.get("current_leaf_id")
            c.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?",
                      (id_map.get(leaf) if leaf is not None else None, new_conv))
        return self.conversation(new_conv)


# --------------------------------------------------------------------------- helpers

_SUBTREE_SQL = """
WITH RECURSIVE sub(id) AS (
    SELECT id FROM messages WHERE id = ?
    UNION ALL
    SELECT m.id FROM messages m JOIN sub ON m.parent_id = sub.id
)
SELECT id FROM sub
"""

_NEWEST_LEAF_SQL = """
WITH RECURSIVE sub(id) AS (
    SELECT id FROM messages WHERE id = ?
    UNION ALL
    SELECT m.id FROM messages m JOIN sub ON m.parent_id = sub.id
)
SELECT max(id) FROM sub WHERE NOT EXISTS (SELECT 1 FROM messages k WHERE k.parent_id = sub.id)
"""

_ANCESTORS_SQL = """
WITH RECURSIVE up(id, depth) AS (
    SELECT id, 0 FROM messages WHERE id = ?
    UNION ALL
    SELECT m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.id
    WHERE m.parent_id IS NOT NULL
)
SELECT messages.* FROM up JOIN messages ON messages.id = up.id ORDER BY up.depth
"""


def _looks_damaged(reason: str) -> bool:
    r = reason.lower()
    return any(w in r for w in ("not a database", "malformed", "integrity check", "not a llamadesk",
                                "file is not", "disk image", "corrupt", "unsupported file format"))


INCOMPLETE = "incomplete"  # stop_reason of a reply still streaming, or cut short by a crash


class PartialReply:
    """A streaming reply saved as it grows: the first text creates the message with stop
    reason ``incomplete``; then it is rewritten at most every ``every_s`` seconds or
    ``every_chars`` characters, so a crash loses at most that much; :meth:`finish` writes
    the final text and stop reason. Writes happen on the caller's thread (the UI's), never
    the generating one.
    """

    def __init__(self, history: "History", conv_id: int, parent_id: int, *, every_s: float = 0.5,
                 every_chars: int = 200, **fields):
        self.history, self.conv_id, self.parent_id = history, conv_id, parent_id
        self.fields = fields
        self.every_s, self.every_chars = every_s, every_chars
        self.text = ""
        self.msg_id: int | None = None
        self._saved_len = 0
        self._saved_at = 0.0
        self.error: str | None = None  # the last failed save, if any

    def append(self, text: str) -> None:
        self.text += text
        now = time.monotonic()
        if self.msg_id is None or len(self.text) - self._saved_len >= self.every_chars or now - self._saved_at >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.text == "" or (self.msg_id is not None and len(self.text) == self._saved_len):
            return
        try:
            if self.msg_id is None:
                self.msg_id = self.history.add_message(self.conv_id, role="assistant", text=self.text,
                                                       parent_id=self.parent_id, stop_reason=INCOMPLETE,
                                                       **self.fields).id
            else:
                self.history.update_message(self.msg_id, text=self.text)
            self.error = None
        except HistoryError as e:  # full disk, read-only folder: keep streaming, retry at the next piece
            self.error = str(e)
            return
        self._saved_len, self._saved_at = len(self.text), time.monotonic()

    def finish(self, text: str, **fields) -> Message:
        """The final reply: updates the partial message (or adds it) and makes it current."""
        merged = {**self.fields, **fields}
        if self.msg_id is None:
            return self.history.add_message(self.conv_id, role="assistant", text=text,
                                            parent_id=self.parent_id, **merged)
        m = self.history.update_message(self.msg_id, text=text, **merged)
        self.history.set_current_leaf(self.conv_id, self.msg_id)
        return m


class _Transaction:
    """``with history._tx() as c:`` — BEGIN IMMEDIATE … COMMIT, ROLLBACK on error,
    holding the instance lock for the whole transaction."""

    def __init__(self, history: History):
        self.h = history

    def __enter__(self) -> "_Transaction":
        self.h._lock.acquire()
        if self.h._conn is None:
            self.h._lock.release()
            raise HistoryError("history is closed")
        self.conn = self.h._conn
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except BaseException as e:
            self.h._lock.release()
            if isinstance(e, sqlite3.Error):  # a store made read-only, or locked, since it was opened
                raise HistoryError(f"history database error: {e}") from e
            raise
        return self

    def execute(self, sql: str, args: tuple | list = ()) -> sqlite3.Cursor:
        # Every string written (titles, meta JSON too) goes in as valid UTF-8.
        return self.conn.execute(sql, [clean_text(v)[0] if isinstance(v, str) else v for v in args])

    def executescript_in_tx(self, script: str) -> None:
        # executescript() would COMMIT first; run the statements one by one instead.
        for stmt in script.split(";"):
            if stmt.strip():
                self.conn.execute(stmt)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                try:
                    self.conn.execute("COMMIT")
                except sqlite3.Error as e:  # full disk, read-only file: nothing was written
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise HistoryError(f"history database error: {e}") from None
            elif self.conn.in_transaction:  # SQLite already rolled back after some errors (SQLITE_FULL)
                self.conn.execute("ROLLBACK")
        finally:
            self.h._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise HistoryError(f"history database error: {exc}") from exc


def prompt_markdown(prompt: dict) -> str:
    if isinstance(prompt.get("messages"), list):
        return "\n\n".join(f"**{str(m.get('role', '?')).capitalize()}:** {m.get('content', m.get('text', ''))}"
                           for m in prompt["messages"] if isinstance(m, dict))
    return str(prompt.get("text", ""))


def _comparison_text(data: dict) -> str:
    """The words of a comparison that search should find (prompt and lane texts)."""
    parts: list[str] = []
    prompt = data.get("prompt") or {}
    if isinstance(prompt, dict):
        parts.append(prompt_markdown(prompt))
    for lane in data.get("lanes") or []:
        if isinstance(lane, dict):
            parts.append(str(lane.get("text", "")))
    return "\n".join(parts).casefold()
