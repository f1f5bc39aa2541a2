"""Keep a collection (a folder) indexed: a background job that walks the folder, reads
only what changed since last time (size and mtime first, then the content hash), drops
what was removed, and reports progress; it can be paused, resumed and cancelled.

Faults are skipped with a reason, never raised: a file deleted or changed while read, a
symlink loop, a folder too deep, more files than the limit, a file too big or not text.
A folder that is not there (a disconnected drive) leaves the index as it was. Each file is
one transaction, so a cancel or a crash loses nothing already indexed.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from core import limits
from core.documents.chunk import DEFAULT_CHUNK_TOKENS, TokenCounter, approx_tokens, chunk_document
from core.documents.extract import DocumentError, extract, file_sha256, kind_of
from core.documents.index import DocumentIndex, blob_key

__all__ = ["IndexJob", "Progress", "index_collection", "walk"]

_SKIP_DIRS = {"node_modules", "__pycache__", ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".mypy_cache"}


@dataclass(frozen=True)
class Progress:
    """Where a collection's indexing stands (sent to the progress callback)."""
    root: str
    state: str = "scanning"  # scanning | indexing | paused | done | cancelled | unreachable | failed
    files_total: int = 0  # documents found by the scan (known once it ends)
    files_done: int = 0  # of those, looked at (read, unchanged, or skipped)
    files_read: int = 0  # of those, read and indexed anew
    bytes_read: int = 0
    removed: int = 0
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why)
    current: str = ""
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("done", "cancelled", "unreachable", "failed")

    @property
    def fraction(self) -> float:
        return self.files_done / self.files_total if self.files_total else 0.0


@dataclass
class _Found:
    files: list[tuple[str, int, int]] = field(default_factory=list)  # (path, size, mtime_ns)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True  # False: a limit stopped the scan (removed files are then kept)


def walk(root: str, found: _Found | None = None, *, max_files: int = limits.MAX_COLLECTION_FILES,
         cancel: threading.Event | None = None) -> _Found:
    """The documents under ``root``: links followed, each folder visited once (a symlink
    loop is said and skipped), hidden and tool folders left out."""
    found = found or _Found()
    top = os.stat(root)
    seen = {(top.st_dev, top.st_ino)}
    stack, visited = [(root, 0)], 0
    while stack:
        if cancel is not None and cancel.is_set():
            found.complete = False
            return found
        folder, depth = stack.pop()
        for entry, why in _entries(folder):
            if why:
                found.skipped.append((entry, why))
                found.complete = False
                continue
            visited += 1
            if visited > max_files:
                found.skipped.append((root, f"more than {max_files:,} files: the rest were not indexed"))
                found.complete = False
                return found
            _visit(entry, depth, seen, stack, found)
    return found


def _entries(folder: str) -> Iterator[tuple[os.DirEntry | str, str]]:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name, reverse=True)
    except OSError as e:
        yield folder, f"cannot list the folder: {e.strerror or e}"
        return
    for e in entries:
        yield e, ""


def _visit(entry: os.DirEntry, depth: int, seen: set, stack: list, found: _Found) -> None:
    name = entry.name
    try:
        is_dir = entry.is_dir()
        if is_dir:
            if name.startswith(".") or name in _SKIP_DIRS:
                return
            st = entry.stat()
            key = (st.st_dev, st.st_ino)
            if key in seen:
                if entry.is_symlink():
                    found.skipped.append((entry.path, "a link back to a folder already indexed (a symlink loop?)"))
                return
            if depth + 1 > limits.MAX_COLLECTION_DEPTH:
                found.skipped.append((entry.path, f"more than {limits.MAX_COLLECTION_DEPTH} folders deep"))
                return
            seen.add(key)
            stack.append((entry.path, depth + 1))
        elif entry.is_file():
            if name.startswith(".") or kind_of(name) is None:
                return
            st = entry.stat()
            found.files.append((entry.path, st.st_size, st.st_mtime_ns))
        elif entry.is_symlink():
            found.skipped.append((entry.path, "a broken link"))
    except OSError as e:  # deleted between the listing and the stat, or a link loop the OS refuses
        found.skipped.append((entry.path, f"cannot read it: {e.strerror or e}"))


class _Run:
    """One indexing pass over a collection (the body of :func:`index_collection`)."""

    def __init__(self, index: DocumentIndex, root: str, count_tokens: TokenCounter, max_tokens: int,
                 progress: Callable[[Progress], None] | None, resume: threading.Event | None,
                 cancel: threading.Event | None, every: float):
        self.ix, self.count, self.max_tokens = index, count_tokens, max_tokens
        self.report, self.resume, self.cancel = progress, resume, cancel
        # A collection already known is re-checked even when its folder is gone (kept as is).
        self.coll = index.collection(root) or index.add_collection(root)
        self.p = Progress(self.coll.root)
        self._last_report, self.every = 0.0, every

    def emit(self, force: bool = False, **changes) -> None:
        self.p = replace(self.p, **changes)
        now = time.monotonic()
        if self.report is not None and (force or now - self._last_report >= self.every):
            self._last_report = now
            self.report(self.p)

    def cancelled(self) -> bool:
        if self.resume is not None and not self.resume.is_set():
            self.emit(True, state="paused")
            while not self.resume.wait(0.1):
                if self.cancel is not None and self.cancel.is_set():
                    break
            self.emit(True, state="indexing")
        return self.cancel is not None and self.cancel.is_set()

    def run(self) -> Progress:
        root = self.coll.root
        if not os.path.isdir(root):
            return self.finish("unreachable", f"{root} is not reachable (a disconnected drive?): "
                                              "the index is kept as it was")
        self.ix.set_state(self.coll.id, "indexing")
        self.emit(True, state="scanning")
        try:
            found = walk(root, cancel=self.cancel)
        except OSError as e:
            return self.finish("unreachable", f"{root} cannot be read ({e.strerror or e}): the index is kept")
        known = self.ix.files(self.coll.id)
        self.emit(True, state="indexing", files_total=len(found.files), skipped=tuple(found.skipped))
        for path, size, mtime in found.files:
            if self.cancelled():
                return self.finish("cancelled", "cancelled: what was indexed is kept")
            self.one(path, size, mtime, known.get(path))
        if found.complete and os.path.isdir(root):
            self.drop_removed(known, {f[0] for f in found.files})
        return self.finish("done", "")

    def finish(self, state: str, message: str) -> Progress:
        with self.ix.tx() as c:  # the passages of files that changed or went: once, at the end
            self.ix.drop_orphans(c)
        self.ix.set_state(self.coll.id, state, message)
        self.emit(True, state=state, message=message, current="")
        return self.p

    def one(self, path: str, size: int, mtime: int, row) -> None:
        self.emit(current=path)
        if row is not None and row["size"] == size and row["mtime_ns"] == mtime:
            self.emit(files_done=self.p.files_done + 1)
            return
        new = None
        try:
            blob_id, new, reason = self.read(path, size, mtime)
        except FileNotFoundError:
            blob_id, reason = None, "deleted while indexing"
        except (DocumentError, OSError) as e:
            blob_id, reason = None, getattr(e, "reason", None) or str(e)
        if reason == "deleted while indexing":
            with self.ix.tx() as c:
                c.execute("DELETE FROM doc_files WHERE collection_id = ? AND path = ?", (self.coll.id, path))
        elif reason.startswith("changed while"):  # read again next time; its old passages stay meanwhile
            old = row["blob_id"] if row is not None else None
            self.store(path, size, -1, old, None, "ok" if old else "skipped", reason)
        else:
            self.store(path, size, mtime, blob_id, new, "skipped" if reason else "ok", reason)
        if reason:
            self.emit(skipped=self.p.skipped + ((path, reason),))
        self.emit(files_done=self.p.files_done + 1)

    def read(self, path: str, size: int, mtime: int) -> tuple[int | None, tuple | None, str]:
        """(blob id of the same content indexed before, or None and (document, chunks) read
        now; why it is skipped or "")."""
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        digest, n = file_sha256(path)
        blob = self.ix.blob_by_sha(blob_key(digest, self.count, self.max_tokens))
        new = None
        if blob is None:
            doc = extract(path)
            if doc.sha256 != digest:
                return None, None, "changed while being read: read again next time"
            new = (doc, chunk_document(doc, self.count, max_tokens=self.max_tokens))
            self.emit(files_read=self.p.files_read + 1, bytes_read=self.p.bytes_read + n)
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            return None, None, "changed while being read: read again next time"
        return (blob.id if blob else None), new, ""

    def store(self, path, size, mtime, blob_id, new, status, reason) -> None:
        """The file's row (and its new passages) in one transaction."""
        with self.ix.tx() as c:
            if new is not None:
                key = blob_key(new[0].sha256, self.count, self.max_tokens)
                blob_id = self.ix.insert_blob(c, new[0], new[1], self.max_tokens, False, key)
            c.execute("INSERT INTO doc_files (collection_id, path, size, mtime_ns, blob_id, status, reason, indexed_at)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (collection_id, path) DO UPDATE SET"
                      " size = excluded.size, mtime_ns = excluded.mtime_ns, blob_id = excluded.blob_id,"
                      " status = excluded.status, reason = excluded.reason, indexed_at = excluded.indexed_at",
                      (self.coll.id, path, size, mtime, blob_id, status, reason, time.time()))

    def drop_removed(self, known: dict, present: set[str]) -> None:
        gone = [p for p in known if p not in present]
        for i in range(0, len(gone), 500):
            part = gone[i:i + 500]
            with self.ix.tx() as c:
                c.execute(f"DELETE FROM doc_files WHERE collection_id = ? AND path IN ({','.join('?' * len(part))})",
                          (self.coll.id, *part))
        if gone:
            self.emit(True, removed=len(gone))


def index_collection(index: DocumentIndex, root: str | os.PathLike, *, count_tokens: TokenCounter = approx_tokens,
                     max_tokens: int = DEFAULT_CHUNK_TOKENS, progress: Callable[[Progress], None] | None = None,
                     resume: threading.Event | None = None, cancel: threading.Event | None = None,
                     every: float = 0.05) -> Progress:
    """Bring the collection at ``root`` up to date (made when new), in this thread; the
    final :class:`Progress` says what happened. ``resume`` cleared pauses between files,
    ``cancel`` set stops there; ``progress`` is called at most every ``every`` seconds
    (and at every change of state)."""
    return _Run(index, os.fspath(root), count_tokens, max_tokens, progress, resume, cancel, every).run()


class IndexJob:
    """:func:`index_collection` on a background thread, with pause / resume / cancel.
    ``progress`` is called on that thread: a GUI forwards it to its own thread."""

    def __init__(self, index: DocumentIndex, root: str | os.PathLike, *,
                 progress: Callable[[Progress], None] | None = None, count_tokens: TokenCounter = approx_tokens,
                 max_tokens: int = DEFAULT_CHUNK_TOKENS):
        self.resume_event, self.cancel_event = threading.Event(), threading.Event()
        self.resume_event.set()
        self.result: Progress | None = None
        self.error: str | None = None
        self._args = (index, root, count_tokens, max_tokens, progress)
        self._thread = threading.Thread(target=self._main, name="llamadesk-index", daemon=True)

    def start(self) -> "IndexJob":
        self._thread.start()
        return self

    def _main(self) -> None:
        index, root, count, max_tokens, progress = self._args
        try:
            self.result = index_collection(index, root, count_tokens=count, max_tokens=max_tokens,
                                           progress=progress, resume=self.resume_event, cancel=self.cancel_event)
        except Exception as e:  # noqa: BLE001 — the store failed (disk full...): said, not raised on a thread
            self.error = f"indexing {root} failed: {e}"
            self.result = Progress(os.fspath(root), state="failed", message=self.error)
            if progress is not None:
                progress(self.result)

    def pause(self) -> None:
        self.resume_event.clear()

    def resume(self) -> None:
        self.resume_event.set()

    def cancel(self) -> None:
        self.cancel_event.set()
        self.resume_event.set()

    def wait(self, timeout: float | None = None) -> Progress | None:
        self._thread.join(timeout)
        return self.result

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
