"""What the next message is grounded in: attached files and chosen collections (no widgets).

Files are read and indexed in the background as soon as they are attached (a thread per
file; the documents index is shared and locks itself), so a file that cannot be read
(encrypted, binary, too big, a PDF bomb) says why on its chip at once, and sending only
retrieves. Sending grounds the question in a background thread too
(:func:`core.documents.ground`): the UI never waits on a document.
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from core.documents import MODES, DocumentError, DocumentIndex, approx_tokens, ground, kind_of
from core.documents.embedders import DEFAULT_EMBEDDER, EMBEDDERS, load_embedder
from core.errors import one_line

from gui.chat import attached_resources, grounded
from gui.chat.attached_resources import AttachedResource


#: The documents budget's choices: a share of the model's context (the first is the default,
#: core.documents.default_budget's half).
SHARES = (("Half the context", 0.5), ("A quarter of the context", 0.25), ("Three quarters of the context", 0.75))
#: Most passages retrieved for a message (None: as many as the budget holds).
TOP_K = (None, 3, 5, 10, 20)
#: where the retrieval choices are kept between runs (one JSON object in the app's settings)
SETTINGS_KEY = "documents/retrieval"


@dataclass
class Attached:
    """One attached file: ``state`` reading | ready | failed, with what to say on its chip."""
    path: str
    state: str = "reading"
    detail: str = ""

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/\\")) or self.path


class Attachments(QObject):
    """The files and collections the next message is sent with.

    Args:
        index_path: the history store the documents index lives in (":memory:" in tests).
        counter: () -> the model's token counter now, or None (no local model): passages and
            the budget are counted with it, as the CLI counts them; the word estimate without.

    Attributes:
        files: the attached files, in the order attached.
        collections: roots of the collections to search.
        mode: retrieval mode (bm25 | dense | hybrid) and ``k``: most passages (None: as many
            as fit); ``share``: the documents budget, a share of the context (half by default);
            ``embedder``: the embedding model of dense and hybrid (core.documents.embedders).

    Signals:
        changed(): files or collections changed (a chip's state too).
        notice(str): a path that cannot be attached, and why.
    """

    changed = Signal()
    notice = Signal(str)

    def __init__(self, *, index_path=None, counter=None, parent=None):
        super().__init__(parent)
        self.index_path = index_path
        self.counter = counter or (lambda: None)
        self._index: DocumentIndex | None = None
        self.files: list[Attached] = []
        self.resources: list[AttachedResource] = []  # MCP resources, read as they are attached
        self.collections: list[str] = []
        self.mode, self.k, self.share, self.embedder = "bm25", None, SHARES[0][1], DEFAULT_EMBEDDER
        self._settings = None
        self._reads: set[asyncio.Future] = set()

    @property
    def index(self) -> DocumentIndex:
        if self._index is None:
            self._index = DocumentIndex(self.index_path)
        return self._index

    def count_tokens(self):
        """The token counter documents are sized with now (the loaded model's, else the estimate)."""
        return self.counter() or approx_tokens

    @property
    def pending(self) -> bool:
        """Whether the next message is grounded (something attached or chosen)."""
        return bool(self.files or self.collections or self.resources)

    def add_paths(self, paths) -> int:
        """Attach files (a quick look only: reading happens in the background); returns how
        many were added. A folder, a missing path or a kind this app does not read is
        refused with a notice."""
        added, refused = 0, []
        for p in paths:
            p = os.fspath(p)
            name = os.path.basename(p.rstrip("/\\")) or p
            if os.path.isdir(p):
                refused.append(f"{name} is a folder: add it as a collection (Documents → Collections…)")
            elif not os.path.isfile(p):
                refused.append(f"{name} is not there (moved, or on a drive that is not connected)")
            elif kind_of(p) is None:
                refused.append(f"{name} is not a document this app reads (text, Markdown, source code, "
                               "PDF, .docx, HTML)")
            elif any(a.path == p for a in self.files):
                continue
            else:
                self.files.append(Attached(p))
                self._read(self.files[-1])
                added += 1
        if refused:
            self.notice.emit("; ".join(refused))
        if added:
            self.changed.emit()
        return added

    def _read(self, item: Attached) -> None:
        """Index ``item`` on a thread; its chip then says how many passages or why not."""
        async def read() -> None:
            try:
                blob, _doc = await asyncio.to_thread(self.index.attach, item.path, self.count_tokens())
                item.state, item.detail = "ready", f"{blob.chunks} passage{'s' if blob.chunks != 1 else ''}"
            except DocumentError as e:
                item.state, item.detail = "failed", e.reason if hasattr(e, "reason") else str(e)
            except (OSError, MemoryError) as e:
                item.state, item.detail = "failed", f"could not be read ({type(e).__name__})"
            self.changed.emit()
        fut = asyncio.ensure_future(read())
        self._reads.add(fut)
        fut.add_done_callback(self._reads.discard)

    def add_resource(self, resource, read) -> None:
        """Attach an MCP resource (``core.tools.mcp_shapes.McpResource``); ``read(resource)``
        is a coroutine giving its ResourceText (the server's read, on a thread). Its chip says
        "reading…", then its size or why it could not be read."""
        if any(r.uri == resource.uri and r.server == resource.server for r in self.resources):
            return
        item = AttachedResource(resource.server, resource.uri, resource.name or resource.uri)
        self.resources.append(item)

        async def fetch() -> None:
            try:
                got = await read(resource)
                item.text, item.truncated, item.state = got.text, bool(got.truncated), "ready"
                item.detail = f"{len(got.text):,} characters" + (", cut" if got.truncated else "")
            except Exception as e:  # noqa: BLE001 — McpError, a server gone or slow: said on its chip
                item.state, item.detail = "failed", one_line(e)
            self.changed.emit()
        fut = asyncio.ensure_future(fetch())
        self._reads.add(fut)
        fut.add_done_callback(self._reads.discard)
        self.changed.emit()

    def remove(self, path: str) -> None:
        n = len(self.files) + len(self.collections) + len(self.resources)
        self.files = [a for a in self.files if a.path != path]
        self.collections = [c for c in self.collections if c != path]
        self.resources = [r for r in self.resources if r.uri != path]
        if len(self.files) + len(self.collections) + len(self.resources) != n:
            self.changed.emit()

    def configure(self, *, mode: str | None = None, k=..., share: float | None = None,
                  embedder: str | None = None) -> None:
        """How the next message retrieves: ``mode`` (bm25 | dense | hybrid), ``k`` (most
        passages; None: as many as fit), ``share`` (the documents budget, of the context),
        ``embedder`` (the embedding model dense and hybrid use)."""
        if mode is not None:
            self.mode = mode
        if k is not ...:
            self.k = k
        if share is not None:
            self.share = share
        if embedder is not None:
            self.embedder = embedder
        self._keep()

    def use_settings(self, settings) -> None:
        """Keep the retrieval choices in ``settings`` (the app's QSettings): read back now
        (a value this version does not offer is left at its default), written when changed."""
        try:
            saved = json.loads(str(settings.value(SETTINGS_KEY, "") or "{}"))
        except ValueError:
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
        if saved.get("mode") in MODES:
            self.mode = saved["mode"]
        if saved.get("k", "") in TOP_K:
            self.k = saved["k"]
        if saved.get("share") in [v for _, v in SHARES]:
            self.share = saved["share"]
        if saved.get("embedder") in EMBEDDERS:
            self.embedder = saved["embedder"]
        self._settings = settings

    def _keep(self) -> None:
        if self._settings is not None:
            self._settings.setValue(SETTINGS_KEY, json.dumps(
                {"mode": self.mode, "k": self.k, "share": self.share, "embedder": self.embedder}))

    def set_collections(self, roots) -> None:
        self.collections = list(dict.fromkeys(os.fspath(r) for r in roots))
        self.changed.emit()

    def clear(self) -> None:
        """After a send: the next message starts with nothing attached."""
        if self.pending:
            self.files, self.collections, self.resources = [], [], []
            self.changed.emit()

    async def ground(self, question: str, context_length: int) -> dict:
        """The documents record to store with ``question`` (:mod:`gui.chat.grounded`), the
        grounding made on a thread), with the attached resources' text. Raises DocumentError
        when nothing can be read."""
        extra = await self._resources_meta()
        if not self.files and not self.collections:
            return extra
        usable = [a.path for a in self.files if a.state != "failed"]
        if not usable and not self.collections:
            raise DocumentError("none of the attached files can be read: " +
                                "; ".join(f"{a.name}: {a.detail}" for a in self.files))
        budget = max(1, int((context_length or 4096) * self.share))
        # dense and hybrid: an embedding model already on disk (nothing is downloaded), loaded once
        embedder = await asyncio.to_thread(load_embedder, self.embedder) if self.mode != "bm25" else None
        g = await asyncio.to_thread(ground, question, self.index, attachments=usable, collections=list(self.collections),
                                    budget_tokens=budget, count_tokens=self.count_tokens(), k=self.k, mode=self.mode,
                                    embedder=embedder)
        return {grounded.META_KEY: {"attachments": usable, "collections": list(self.collections),
                                    "grounding": g.to_meta()}, **extra}

    async def _resources_meta(self) -> dict:
        """The resources read (waiting for reads under way), as stored with the message."""
        if not self.resources:
            return {}
        while any(r.state == "reading" for r in self.resources) and self._reads:
            await asyncio.wait(set(self._reads))
        ready = [r.record() for r in self.resources if r.state == "ready"]
        if not ready and not self.files and not self.collections:
            raise DocumentError("none of the attached resources could be read: " +
                                "; ".join(f"{r.name}: {r.detail}" for r in self.resources))
        return {attached_resources.KEY: ready} if ready else {}

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
