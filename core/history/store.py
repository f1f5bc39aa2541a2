"""Persistent conversations in SQLite (stdlib ``sqlite3``, WAL mode).

Messages form a tree: every message has a ``parent_id`` (None for the first one), and
messages that share a parent and a role are *versions* of each other (a regenerated
reply, an edited-and-resent user message). A conversation remembers the leaf of the
branch on screen (``current_leaf_id``); :meth:`History.current_path` walks from the root
to it. Nothing is ever overwritten by a branch switch, so every version stays reachable.

Durability: each public write is one ``BEGIN IMMEDIATE`` transaction (``self._tx()``), the
journal is WAL with ``synchronous=FULL``, so a committed message survives the process
being killed. :meth:`History.open_or_recover` moves a damaged file aside (never deletes it).
The schema and its migrations are in :mod:`core.history.schema`, the row types and how
their values are stored in :mod:`core.history.records`.

Never imports Qt: the CLI and the tests use it too.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from core.errors import DataFolderError
from core.history.records import (KINDS, Conversation, HistoryDamagedError, HistoryError, Message, clean_text,
                                  comparison_search_text, conversation_from_row, decode_text, dumps,
                                  message_from_row)
from core.history.schema import (ANCESTORS_SQL, MESSAGE_COLUMNS, MIGRATIONS, NEWEST_LEAF_SQL, SCHEMA_V1,
                                 SCHEMA_VERSION, SUBTREE_SQL, JSON_FIELDS, UPDATABLE, expected_columns)
from core.paths import check_folder, data_dir

__all__ = ["History", "HISTORY_NAME"]

HISTORY_NAME = "history.sqlite3"


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


def _wal_mode(conn: sqlite3.Connection, wait: float = 10.0) -> str:
    """Switch ``conn`` to WAL. Two openers of a brand-new file both ask for the exclusive
    lock this needs; SQLite answers one of them "locked" at once (the busy timeout does not
    apply to a lock upgrade that could deadlock), so that one retries until the other's
    switch is done and the file reports WAL."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


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
        self._lock = threading.RLock()
        self._conn = None
        try:
            if isinstance(self.path, Path):
                check_folder(self.path.parent).mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE), so a
            # write never starts while holding a read snapshot that another process changed.
            self._conn = sqlite3.connect(str(self.path), isolation_level=None,
                                         check_same_thread=False, timeout=10.0)
            self._conn.row_factory = sqlite3.Row
            self._conn.text_factory = decode_text
            self._conn.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                mode = _wal_mode(self._conn)
                if str(mode).lower() != "wal":
                    raise HistoryError(f"cannot use WAL journal for {self.path} (got {mode})")
            # FULL: a commit is on disk before add_message returns (a chat turn is tiny).
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.create_function("ld_contains", 2, _contains, deterministic=True)
            self._migrate()
            self._check_schema()
            if self.path != ":memory:":
                ok = self._conn.execute("PRAGMA quick_check(1)").fetchone()[0]
                if ok != "ok":
                    raise HistoryDamagedError(f"history {self.path} failed its integrity check: {ok}")
        except (sqlite3.Error, HistoryError, DataFolderError, OSError, UnicodeDecodeError) as e:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if isinstance(e, HistoryError):
                raise
            if isinstance(e, DataFolderError):
                raise HistoryError(str(e)) from e  # the cause tells open_or_recover what to say
            kind = HistoryDamagedError if _is_damage(e) else HistoryError
            raise kind(f"cannot open history {self.path}: {e}") from None

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
            reason, first_error = str(first), first
        if path.is_file() and isinstance(first_error, HistoryDamagedError):
            try:
                kept = _moved_aside(path)
                return cls(path), (f"The conversation history was damaged and could not be read; it was kept "
                                   f"as {kept.name} and a new history was started.")
            except (HistoryError, OSError) as e:
                reason = str(e)
        where = (f": {reason}" if isinstance(first_error.__cause__, DataFolderError)
                 else f" in {path.parent} ({reason})")
        return cls(":memory:"), (f"Conversations cannot be saved{where}; this session keeps them in memory "
                                 "only, and they will be lost when the app closes.")

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def default_path() -> Path:
        """``history.sqlite3`` in the data folder (:func:`core.paths.data_dir`)."""
        return data_dir() / HISTORY_NAME

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
        version = self._version()
        if version == SCHEMA_VERSION:
            return
        with self._tx() as c:
            # Again under the write lock: another process may have created the store between
            # the read above and BEGIN IMMEDIATE; its new tables are not a foreign database.
            version = self._version()
            if version == SCHEMA_VERSION:
                return
            if version == 0:
                has_tables = c.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
                if has_tables:
                    raise HistoryDamagedError(f"{self.path} is not a LlamaDesk history database")
                c.executescript_in_tx(SCHEMA_V1)
                version = 1
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](c.conn)
                version += 1
            # PRAGMA cannot take parameters; version is our own int.
            c.execute(f"PRAGMA user_version = {int(version)}")

    def _version(self) -> int:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(f"history {self.path} was written by a newer LlamaDesk "
                               f"(schema {version}, this version reads up to {SCHEMA_VERSION})")
        return version

    def _check_schema(self) -> None:
        """Every table and column this version reads must be there: a store missing one
        would open and then fail on every chat, so it is damaged."""
        for table, columns in expected_columns().items():
            have = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}
            if not have:
                raise HistoryDamagedError(f"history {self.path} has no '{table}' table")
            missing = sorted(columns - have)
            if missing:
                raise HistoryDamagedError(f"history {self.path}: table '{table}' lacks the column(s) "
                                          f"{', '.join(missing)}")

    # ------------------------------------------------------------------ rows

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
                            " VALUES (?, ?, ?, ?, ?)", (title, now, now, kind, dumps(meta or {})))
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
        return [conversation_from_row(r) for r in self._q(sql, args)]

    def conversation(self, conv_id: int) -> Conversation:
        """One conversation; HistoryError if unknown."""
        return conversation_from_row(self._check_conv(conv_id))

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
                            (dumps(meta), time.time(), conv_id))
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
                    tool_calls: list | None = None, tool_result: dict | None = None,
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
            msg_id = c.insert_message(dict(
                conversation_id=conv_id, parent_id=parent_id, role=role, text=text, settings=settings, seed=seed,
                model_id=model_id, stats=stats, stop_reason=stop_reason, created_at=now, meta=meta,
                tool_calls=tool_calls, tool_result=tool_result))
            if make_current:
                c.execute("UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?",
                          (msg_id, now, conv_id))
            else:
                c.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conv_id))
        return self.message(msg_id)

    def message(self, msg_id: int) -> Message:
        """One message; HistoryError if unknown."""
        return message_from_row(self._message_row(msg_id))

    def update_message(self, msg_id: int, **fields) -> Message:
        """Change some of a message's fields (text, stats, stop_reason, ... — not its place
        in the tree); returns the updated message."""
        bad = sorted(set(fields) - set(UPDATABLE))
        if bad:
            raise HistoryError(f"cannot update message field(s) {', '.join(bad)}; "
                               f"updatable: {', '.join(UPDATABLE)}")
        if not fields:
            return self.message(msg_id)
        if isinstance(fields.get("text"), str):
            fields["text"], repaired = clean_text(fields["text"])
            if repaired:
                fields["meta"] = {**(fields.get("meta") or self.message(msg_id).meta or {}), "text_repaired": True}
        sets, args = [], []
        for k, v in fields.items():
            sets.append(f"{k} = ?")  # k is from the UPDATABLE whitelist
            if k in JSON_FIELDS:
                v = dumps(v if v is not None or k != "meta" else {})
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
            subtree = {r[0] for r in c.execute(SUBTREE_SQL, (msg_id,))}
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
        cols = ", ".join(MESSAGE_COLUMNS)
        ids = [r[0] for r in self._q(SUBTREE_SQL, (msg_id,))]
        rows = [tuple(r) for r in self._q(f"SELECT {cols} FROM messages WHERE id IN "
                                          f"({', '.join('?' * len(ids))}) ORDER BY id", ids)]
        leaf = self._check_conv(row["conversation_id"])["current_leaf_id"]
        return {"conversation_id": row["conversation_id"], "current_leaf_id": leaf, "rows": rows}

    def restore_subtree(self, snapshot: dict) -> None:
        """Put back messages deleted after :meth:`subtree_snapshot`, with their ids, and
        the current leaf of then; HistoryError when that is no longer possible (the
        conversation or the parent is gone, or an id was taken meanwhile)."""
        cols = ", ".join(MESSAGE_COLUMNS)
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
        return [message_from_row(r) for r in
                self._q("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,))]

    def current_path(self, conv_id: int) -> list[Message]:
        """The branch on screen: root → current leaf ([] for an empty conversation)."""
        leaf = self._check_conv(conv_id)["current_leaf_id"]
        if leaf is None:
            return []
        return self.path_to(leaf)

    def path_to(self, msg_id: int) -> list[Message]:
        """Root → ``msg_id``."""
        rows = self._q(ANCESTORS_SQL, (msg_id,))
        if not rows:
            raise HistoryError(f"no message with id {msg_id}")
        return [message_from_row(r) for r in reversed(rows)]

    def children(self, msg_id: int | None, conv_id: int | None = None) -> list[Message]:
        """Direct replies to ``msg_id`` (for None: the roots of ``conv_id``), oldest first."""
        if msg_id is None:
            if conv_id is None:
                raise HistoryError("children(None) needs conv_id")
            rows = self._q("SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS NULL"
                           " ORDER BY id", (conv_id,))
        else:
            rows = self._q("SELECT * FROM messages WHERE parent_id = ? ORDER BY id", (msg_id,))
        return [message_from_row(r) for r in rows]

    def siblings(self, msg_id: int) -> list[Message]:
        """The versions of a message: same conversation, same parent, same role (itself
        included), oldest first."""
        row = self._message_row(msg_id)
        rows = self._q("SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ?"
                       " AND role = ? ORDER BY id",
                       (row["conversation_id"], row["parent_id"], row["role"]))
        return [message_from_row(r) for r in rows]

    def select(self, msg_id: int) -> None:
        """Put ``msg_id`` on screen: the current leaf becomes the most recently created leaf
        below it (itself if it has no replies)."""
        with self._tx() as c:
            row = c.execute("SELECT conversation_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no message with id {msg_id}")
            # Newest descendant that has no children; ids grow with time.
            leaf = c.execute(NEWEST_LEAF_SQL, (msg_id,)).fetchone()[0]
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
        meta_json = dumps({"comparison": data})
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, kind, meta, search_text)"
                " VALUES (?, ?, ?, 'comparison', ?, ?)",
                (title, now, now, meta_json, comparison_search_text(data)))
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
            search = comparison_search_text(meta["comparison"]) if conv["kind"] == "comparison" \
                and isinstance(meta.get("comparison"), dict) else ""
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, kind, meta, search_text)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conv["title"], conv.get("created_at", now), conv.get("updated_at", now),
                 conv["kind"], dumps(meta), search))
            new_conv = cur.lastrowid
            id_map: dict[int, int] = {}
            for m in msgs:
                id_map[m["id"]] = c.insert_message({**m, "conversation_id": new_conv,
                                                    "parent_id": id_map.get(m.get("parent_id")),
                                                    "created_at": m.get("created_at", now)})
            leaf = conv.get("current_leaf_id")
            c.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?",
                      (id_map.get(leaf) if leaf is not None else None, new_conv))
        return self.conversation(new_conv)


# --------------------------------------------------------------------------- helpers

# SQLite's result codes for a file that is not (or no longer) a readable database.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_DAMAGE_WORDS = ("not a database", "malformed", "file is not", "disk image", "corrupt", "unsupported file format")


def _is_damage(e: BaseException) -> bool:
    """Whether SQLite's own error says the file is damaged: its result code, else (Python
    before 3.11) its message; never the path, which the caller's message would add."""
    if isinstance(e, UnicodeDecodeError):  # SQLite's message quoted damaged bytes, not text
        return True
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return isinstance(e, sqlite3.DatabaseError) and any(w in str(e).lower() for w in _DAMAGE_WORDS)


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

    def insert_message(self, fields: dict) -> int:
        """One new message row from ``fields`` (every column but ``id``; a missing one is
        NULL, JSON fields are encoded); returns its id."""
        cols = [k for k in MESSAGE_COLUMNS if k != "id"]
        values = {k: fields.get(k) for k in cols}
        values["meta"] = values["meta"] or {}
        if values["seed"] is not None:
            values["seed"] = int(values["seed"])
        args = [dumps(values[k]) if k in JSON_FIELDS else values[k] for k in cols]
        sql = f"INSERT INTO messages ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        return self.execute(sql, args).lastrowid

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


