"""Comparison lanes that differ in grounding: no documents, the files attached in the chat,
or a collection; how many passages are retrieved and how (BM25, dense, hybrid).

Each lane has a :class:`LaneDocuments` row. Lanes grounded alike share one request; a lane
grounded otherwise is a request of its own, its question replaced by the grounded prompt
made for it (:class:`LaneGrounder`, on a thread). The lane's label then says how it was
grounded ("5 of 40 passages used · BM25"), under the line that says where it parts from
the baseline: a lane with documents against one without shows where grounding changed
the answer.
"""
from __future__ import annotations

import asyncio
import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QWidget

from core.documents import MODES, DocumentError, default_budget, ground
from core.documents.embedders import DEFAULT_EMBEDDER, EMBEDDERS, load_embedder

NONE = "none"
ATTACHED = "attached"
MODE_NAMES = {"bm25": "BM25", "dense": "dense", "hybrid": "hybrid"}
EMBEDDER_NAMES = {"wordllama": "WordLlama", "bge-small": "bge-small"}
SHORT = {"wordllama": "WL", "bge-small": "bge"}
#: the lane's retrieval choices: (mode, embedding model) — BM25 needs none
CHOICES = [("bm25", "")] + [(m, e) for m in MODES if m != "bm25" for e in EMBEDDERS]


def _mode_name(mode: str, embedder: str = "") -> str:
    name = MODE_NAMES.get(mode, mode)
    return f"{name} · {EMBEDDER_NAMES.get(embedder, embedder)}" if mode != "bm25" and embedder else name

#: The app's attachments and collections lanes choose from (an object with ``files``, each
#: with ``path`` and ``state``, and ``index``: the chat's :class:`gui.chat.attachments.Attachments`).
#: Set by :func:`gui.compare.launch.compare_window_for`; None: only "No documents" is offered.
SOURCE = None


def spec_key(spec: dict | None) -> tuple:
    """What makes two lanes grounded alike (they can then share one request)."""
    if not spec or spec.get("documents", NONE) == NONE:
        return ()
    mode = spec.get("mode", "bm25")
    return (spec["documents"], int(spec.get("k") or 0), mode,
            spec.get("embedder") or DEFAULT_EMBEDDER if mode != "bm25" else "")


def describe(spec: dict | None, summary: str = "") -> str:
    """A lane's grounding in a few words: 'No documents' / 'notes (collection) · 5 passages
    · BM25: 5 of 40 passages used'."""
    if not spec_key(spec):
        return "No documents"
    d = spec["documents"]
    what = "Attached files" if d == ATTACHED else f"{os.path.basename(d.split(':', 1)[1].rstrip('/'))} (collection)"
    k = int(spec.get("k") or 0)
    mode = spec.get("mode", "bm25")
    how = _mode_name(mode, spec.get("embedder") or DEFAULT_EMBEDDER)
    head = f"{what} · {f'top {k}' if k else 'as many as fit'} · {how}"
    return f"{head}: {summary}" if summary else head


class LaneDocuments(QWidget):
    """Documents · passages · mode for one lane (objectName ``laneDocuments``)."""

    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("laneDocuments")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        label = QLabel("Documents")
        label.setMinimumWidth(label.sizeHint().width())  # the combos give way, never the word
        row.addWidget(label)
        self.source = QComboBox(self)
        self.source.setObjectName("laneDocumentsSource")
        self.source.setToolTip("What this lane's question is grounded in")
        # a long collection name must not widen the lane (it would clip a narrow window)
        self.source.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.source.setMinimumContentsLength(4)
        self.source.addItem("None", NONE)
        self.source.currentIndexChanged.connect(self._sync)
        row.addWidget(self.source, 1)
        self.k = QSpinBox(self)
        self.k.setObjectName("laneDocumentsK")
        self.k.setRange(0, 64)
        self.k.setSpecialValueText("fit")
        self.k.setPrefix("top ")
        self.k.setToolTip("Passages retrieved at most (fit: as many as the documents budget holds)")
        row.addWidget(self.k)
        self.mode = QComboBox(self)
        self.mode.setObjectName("laneDocumentsMode")
        for m, e in CHOICES:  # short in a narrow lane: the built-in model is the plain name
            self.mode.addItem(MODE_NAMES[m] if e in ("", DEFAULT_EMBEDDER) else f"{MODE_NAMES[m]} · {SHORT[e]}",
                              f"{m}:{e}")
            self.mode.setItemData(self.mode.count() - 1, _mode_name(m, e), Qt.ToolTipRole)
        self.mode.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.mode.setMinimumContentsLength(4)
        self.mode.setToolTip("Retrieval: BM25 (words), dense (an embedding model: WordLlama is built in), "
                             "or both fused")
        row.addWidget(self.mode)
        for w in (self.k, self.mode):
            w.valueChanged.connect(self.changed) if isinstance(w, QSpinBox) else w.currentIndexChanged.connect(
                self.changed)
        self.refresh()
        self._sync()

    def refresh(self) -> None:
        """Offer what is attached in the chat and the indexed collections now."""
        keep = self.source.currentData()
        self.source.blockSignals(True)
        self.source.clear()
        self.source.addItem("None", NONE)
        if SOURCE is not None:
            n = len(SOURCE.files)
            self.source.addItem(f"Attached files ({n})", ATTACHED)
            try:
                colls = SOURCE.index.collections()
            except DocumentError:
                colls = []
            for c in colls:
                self.source.addItem(f"{c.name} (collection)", f"collection:{c.root}")
        self.source.setCurrentIndex(max(0, self.source.findData(keep)))
        self.source.blockSignals(False)
        self._sync()

    def showEvent(self, e) -> None:  # noqa: N802 (Qt API)
        super().showEvent(e)
        self.refresh()

    def _sync(self, *_) -> None:
        on = self.source.currentData() != NONE
        self.k.setEnabled(on)
        self.mode.setEnabled(on)
        self.changed.emit()

    def spec(self) -> dict | None:
        """The lane's grounding (None: no documents)."""
        if self.source.currentData() in (None, NONE):
            return None
        mode, embedder = str(self.mode.currentData()).split(":", 1)
        return {"documents": self.source.currentData(), "k": self.k.value(), "mode": mode,
                **({"embedder": embedder} if embedder else {})}

    def set_spec(self, spec: dict | None) -> None:
        spec = spec or {}
        i = self.source.findData(spec.get("documents", NONE))
        if i < 0 and spec.get("documents", NONE) != NONE:  # not offered now (a saved lane's): offer it
            d = str(spec["documents"])
            name = f"{os.path.basename(d.split(':', 1)[1].rstrip('/'))} (collection)" if ":" in d else d
            self.source.addItem(name, d)
            i = self.source.count() - 1
        self.source.setCurrentIndex(max(0, i))
        self.k.setValue(int(spec.get("k") or 0))
        mode = spec.get("mode", "bm25")
        embedder = (spec.get("embedder") or DEFAULT_EMBEDDER) if mode != "bm25" else ""
        self.mode.setCurrentIndex(max(0, self.mode.findData(f"{mode}:{embedder}")))


async def grounded_messages(messages: list[dict], spec: dict, context: int, source=None) -> tuple[list[dict], str]:
    """``messages`` with the last user message grounded as ``spec`` says, and the summary
    ("5 of 40 passages used"). Raises DocumentError (nothing attached, no such collection)."""
    source = source if source is not None else SOURCE
    if source is None:
        raise DocumentError("documents are not available here")
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        raise DocumentError("a lane grounded in documents needs a question (a chat prompt)")
    d = spec["documents"]
    files = [a.path for a in source.files if a.state != "failed"] if d == ATTACHED else []
    colls = [d.split(":", 1)[1]] if d.startswith("collection:") else []
    if d == ATTACHED and not files:
        raise DocumentError("no readable file is attached in the chat: attach some there first")
    question = str(messages[last].get("content") or "")
    mode = spec.get("mode", "bm25")
    # dense and hybrid: an embedding model already on disk (nothing is downloaded here)
    name = spec.get("embedder") or DEFAULT_EMBEDDER
    embedder = await asyncio.to_thread(load_embedder, name) if mode != "bm25" else None
    g = await asyncio.to_thread(ground, question, source.index, attachments=files, collections=colls,
                                budget_tokens=default_budget(context or 4096), k=int(spec.get("k") or 0) or None,
                                count_tokens=source.count_tokens(), mode=mode, embedder=embedder)
    out = [dict(m) for m in messages]
    out[last]["content"] = g.prompt
    return out, g.summary
