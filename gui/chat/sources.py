"""The sources of a grounded reply: its citations and "where did this come from?".

:class:`SourcesController` answers two questions about a reply whose question was grounded
in documents (:mod:`gui.chat.grounded`): what passage a citation [n] stands for, and which
passages the model attended to while it wrote a span of the reply (the worker computes it:
:mod:`core.worker.attribute`). It owns no widget; the column shows what it says.
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, Signal

from core.worker.protocol import AttributeRequest

from gui.bridge import BridgeError
from gui.chat import grounded
from gui.chat.conversation import ConversationModel


class SourcesController(QObject):
    """Citations and attention attribution for the conversation's grounded replies.

    Signals:
        passage(dict): a source to show: ``number``, ``where``, ``text``, ``source`` (path),
            ``highlight`` ((start, end) of ``text`` to mark, or None).
        ranking(int, list, float): a reply id, its span's passages ranked by attention share
            (dicts: number, where, share) and the share that went to no passage.
        working(str): what is being computed ("" when done).
        notice(str): why a question cannot be answered (said inline, never a dialog).
    """

    passage = Signal(dict)
    ranking = Signal(int, list, float)
    working = Signal(str)
    notice = Signal(str)

    def __init__(self, *, bridge, conversation: ConversationModel, settings, models=None, parent=None):
        super().__init__(parent)
        self.bridge, self.conversation, self.settings, self.models = bridge, conversation, settings, models
        self._task: asyncio.Task | None = None

    def grounding_for(self, reply_id: int) -> dict | None:
        """The grounding of the question reply ``reply_id`` answers, or None."""
        reply = self.conversation.message(reply_id)
        if reply is None or reply.parent_id is None:
            return None
        return grounded.grounding_of(self.conversation.message(reply.parent_id).meta)

    def open_citation(self, reply_id: int, number: int) -> bool:
        """Show source ``number`` of reply ``reply_id``'s grounding."""
        g = self.grounding_for(reply_id)
        src = grounded.source(g, number) if g else None
        if src is None:
            self.notice.emit(f"[{number}] is not one of this reply's sources")
            return False
        self.passage.emit({**src, "where": grounded.where(src), "highlight": (0, len(src["text"])),
                           "reply_id": reply_id})
        return True

    def where_from(self, reply_id: int, selection: str) -> bool:
        """Rank the reply's sources by the attention paid to them while it wrote ``selection``."""
        reply = self.conversation.message(reply_id)
        g = self.grounding_for(reply_id)
        if reply is None or g is None:
            self.notice.emit("This reply was not grounded in documents: there are no passages to rank")
            return False
        if self.models is not None and getattr(self.models, "backend", None) is not None:
            self.notice.emit("Where a reply came from needs the local model (a server does not show its attention)")
            return False
        span = grounded.locate(selection, reply.text)
        if span is None:
            self.notice.emit("Select some text of the reply first")
            return False
        sources = list(g.get("sources") or [])
        request = AttributeRequest(
            messages=self.conversation.request_messages(self.settings.system_prompt(), upto=reply.parent_id),
            chat_format=self.settings.chat_format(), reply=reply.text, span=span,
            passages=[tuple(int(x) for x in s.get("span") or (0, 0)) for s in sources], source_message=-1)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.working.emit("Measuring where this came from…")
        self._task = asyncio.ensure_future(self._run(reply_id, request, sources))
        return True

    async def _run(self, reply_id: int, request: AttributeRequest, sources: list[dict]) -> None:
        try:
            res = await self.bridge.attribute(request)
        except asyncio.CancelledError:  # a new reply needs the worker: this can wait
            self.working.emit("")
            raise
        except BridgeError as e:
            self.working.emit("")
            if not e.cancelled:
                self.notice.emit(f"Could not measure where this came from: {e}")
            return
        self.working.emit("")
        rows = [{"number": int(s.get("number", i + 1)), "where": grounded.where(s), "share": float(sh)}
                for i, (s, sh) in enumerate(zip(sources, res.shares))]
        rows.sort(key=lambda r: -r["share"])
        self.ranking.emit(reply_id, rows, float(res.none))

    def cancel(self) -> None:
        """Stop measuring (a reply needs the worker): the worker drops the request too."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self.working.emit("")
