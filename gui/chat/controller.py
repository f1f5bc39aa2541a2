"""What the user does to a conversation, decided in one place.

:class:`ConversationController` owns the conversation tree on screen
(:class:`~gui.chat.conversation.ConversationModel`) and the reply being generated
(:class:`~gui.chat.reply.ReplyController`), and applies the rules of a chat: send,
regenerate, continue, edit and resend, branch from a token, retry a failed server reply,
delete with undo, switch versions, and keep each chat's unsent draft. The view shows what
it says and forwards what the user asks; it never decides what a conversation becomes.
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, QTimer, Signal

from core.documents import DocumentError
from core.engine.constraint import syntax_error
from core.history.records import HistoryError, Message
from core.history.store import History
from core.prompt.prompting import reply_reserve
from core.tools.parse import check_arguments
from core.worker.protocol import GenerateRequest

from gui.bridge import BridgeError

from gui.chat.attachments import Attachments
from gui.chat.chat_tools import ChatTools
from gui.chat.checks import draft_problem
from gui.chat.conversation import ConversationModel
from gui.chat.reply import ReplyController
from gui.chat.sources import SourcesController
from gui.chat.tool_round import ToolRound
from gui.dialogs.collections import CollectionsController

INSPECT_TOP = 5  # alternatives recorded per token of a chat reply (the worker's ``inspect``)
COUNT_DELAY_MS = 400  # a long message is counted once typing pauses
# Tokens the chat format wraps a system prompt and a message in, at most (headers, BOS).
FORMAT_TOKENS = 64


class ConversationController(QObject):
    """The open conversation and the rules for changing it.

    Args:
        bridge: the :class:`gui.bridge.Bridge` replies are generated through.
        history: the message store.
        models: the :class:`gui.model_controller.ModelController` replies come from
            (``info``, ``backend`` and its ``modelChanged`` / ``backendChanged``).
        settings: the reply's settings (``params()``, ``system_prompt()``,
            ``chat_format()``: the sampling panel).

    Attributes:
        conversation: the :class:`ConversationModel` (the tree and the branch on screen).
        reply: the :class:`ReplyController` (its signals stream the reply to the view).
        record_probs: new replies keep each token's alternatives (View → Record Token
            Probabilities, where the backend can give them).
        undo_ms: how long a deleted message can be brought back.

    Signals:
        status(str, int): a line for the status bar (a refusal, a restore) and its ms.
        error(str, str): a title and message for an error dialog.
        editRequested(int, str): the user message to edit in the prompt editor, its text.
        retryOffered(str, str): a server's reply failed: what to say and the failure's kind
            (:meth:`retry` asks again).
        undoOffered(str): a message was deleted ("Message deleted"); :meth:`undo_delete`
            brings it back until :attr:`undo_ms` pass.
        undoEnded(): undo is no longer offered.
        problemChanged(str): why Send cannot be used now ("" when it can): settings that
            cannot be sent (an output format that does not compile, a draft model that is
            not there) or the worker's refusal of the last attempt (until the text, the
            settings or the model change).
        handBack(str, object): a refused message's text goes back to the editor, and the
            message it was an edit of (or None).
        canContinueChanged(bool): whether Continue is offered (a server cannot carry on a reply).
        busyChanged(bool): a reply or a round of tool calls started, or both ended.
    """

    status = Signal(str, int)
    error = Signal(str, str)
    editRequested = Signal(int, str)
    retryOffered = Signal(str, str)
    undoOffered = Signal(str)
    undoEnded = Signal()
    problemChanged = Signal(str)
    handBack = Signal(str, object)
    canContinueChanged = Signal(bool)
    busyChanged = Signal(bool)

    undo_ms = 8000

    def __init__(self, *, bridge, history: History, models, settings, parent=None):
        super().__init__(parent)
        self.models = models
        self.conversation = ConversationModel(history=history, parent=self)
        self.reply = ReplyController(bridge=bridge, conversation=self.conversation, settings=settings, parent=self)
        # documents are counted in the local model's tokens (a server's model: the word estimate)
        self.attachments = Attachments(index_path=history.path, parent=self, counter=lambda: None if getattr(
            models, "backend", None) is not None else getattr(bridge, "token_counter", None))
        self._grounding: asyncio.Task | None = None
        self.collections = CollectionsController(lambda: self.attachments.index, parent=self)
        self.sources = SourcesController(bridge=bridge, conversation=self.conversation, settings=settings,
                                         models=models, parent=self)
        self.reply.busyChanged.connect(lambda busy: busy and self.sources.cancel())  # a reply goes first
        # Tools (issue 25): what the open chat offers each reply, and the calls a reply makes.
        self.tools = ChatTools(conversation=self.conversation, parent=self)
        self.tool_round = ToolRound(conversation=self.conversation, tools=self.tools, prefs=self.tools,
                                    check=check_arguments, parent=self)
        self.reply.tools = self.tools.tools
        self.reply.finished.connect(self.tool_round.on_reply)
        self.tool_round.continueWith.connect(self._after_tools)
        self.reply.busyChanged.connect(lambda b: self.busyChanged.emit(b or self.tool_round.busy))
        self.tool_round.busyChanged.connect(lambda b: self.busyChanged.emit(b or self.reply.busy))
        self.record_probs = False
        self._retry_parent: int | None = None  # the message a failed server reply answered
        self._drafts: dict[int | None, str] = {}  # unsent prompt text per conversation (None: a new chat)
        self._undo_snapshot: dict | None = None
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.timeout.connect(self.drop_undo)
        self._refusal = ""  # the worker's reason for refusing the last attempt
        self._draft = ""  # the editor's text, checked against the context as it changes
        self._too_long = ""  # why the draft does not fit in the context ("" when it does)
        self._count_timer = QTimer(self, singleShot=True, interval=COUNT_DELAY_MS)
        self._count_timer.timeout.connect(self._count_draft)
        self._syntax: tuple = (None, "")  # the last output format checked and its error
        self.settings = settings
        self.reply.interrupted.connect(self._on_interrupted)
        self.reply.refused.connect(self._on_refused)
        models.modelChanged.connect(self._on_model)
        models.backendChanged.connect(self._on_backend)
        if hasattr(settings, "changed"):  # the sampling panel says when a setting changes
            settings.changed.connect(self.clear_refusal)

    @property
    def busy(self) -> bool:
        return self.reply.busy or self.tool_round.busy

    def _after_tools(self, tool_msg_id: int) -> None:
        """Every call of a reply has its result: the reply goes on from the last one."""
        if not self.regenerate(tool_msg_id):
            self.status.emit("The tool results are saved; the reply could not go on "
                             "(load a model, or fix the settings, then Regenerate)", 8000)

    @property
    def can_generate(self) -> bool:
        return self.models.info is not None

    def _on_model(self, info: dict | None) -> None:
        if info is not None:
            self.reply.context_length = int(info.get("context_length") or 0)
            self.reply.model_id = info.get("name")
        self.clear_refusal()

    def _on_backend(self, remote) -> None:
        self.reply.backend = remote
        self.canContinueChanged.emit(self.can_continue)
        self.clear_refusal()

    @property
    def can_continue(self) -> bool:
        """Continue is offered: replies come from the local model (OpenAI's API has no way
        to ask a server to carry on a reply, so a server's replies are not offered it)."""
        return self.models.backend is None

    # ---- what can be checked before sending
    def problem(self) -> str:
        """Why a message cannot be sent now, checked before anything is stored ("" when it
        can): :meth:`settings_problem`, the worker's refusal of the same attempt, or a
        draft longer than the context."""
        return self.settings_problem() or self._refusal or self._too_long

    def settings_problem(self) -> str:
        """Why no reply can be asked for with the settings as they are ("" when one can):
        settings that do not validate, an output format that does not compile, a draft
        model that is missing, unreadable or of another vocabulary."""
        try:
            p = self.settings.params().validate()
        except Exception as e:  # noqa: BLE001 — any invalid setting is a reason to give
            return f"Invalid settings: {e}"
        if p.constraint is not None:
            if self._syntax[0] != p.constraint:  # compiled once per text, not per keystroke
                self._syntax = (p.constraint, syntax_error(p.constraint))
            if self._syntax[1]:
                return f"Output format: {self._syntax[1]}"
        if p.draft and self.models.backend is None:
            return draft_problem(p.draft, self.models.info)
        return ""

    def clear_refusal(self, *_) -> None:
        """The text, the settings or the model changed: check again from scratch."""
        self._refusal = ""
        self._count_timer.start()
        self.problemChanged.emit(self.problem())

    def draft_changed(self, text: str) -> None:
        """The editor's text changed: it is checked against the context once typing pauses."""
        self._draft = text
        self.clear_refusal()

    def _count_draft(self) -> None:
        """Whether the draft (with the system prompt) fits the prompt a reply leaves room for,
        counted by the worker with the model's tokenizer; only a text with more bytes than
        that room is counted (a token is at least a byte), so typing costs nothing."""
        text, info, count = self._draft, self.models.info or {}, getattr(self.reply.bridge, "count", None)
        ctx = int(info.get("context_length") or 0)
        try:
            params, system = self.settings.params().validate(), self.settings.system_prompt()
        except Exception:  # noqa: BLE001 — invalid settings are the reason given already
            return
        room = ctx - reply_reserve(ctx, params.max_new_tokens) if ctx else 0
        if self.models.backend is not None or count is None or not room or not text.strip() \
                or len((system + text).encode("utf-8")) + FORMAT_TOKENS < room:
            self._set_too_long("")
            return
        msgs = ([{"role": "system", "content": system}] if system.strip() else []) + [{"role": "user", "content": text}]
        request = GenerateRequest(messages=msgs, params=params, chat_format=self.settings.chat_format())

        async def run() -> None:
            try:
                await count(request)
                why = ""
            except BridgeError as e:  # build_prompt's reason: how many tokens, how many fit
                why = "" if e.cancelled else str(e)
            if text == self._draft:  # still the text that was counted
                self._set_too_long(why)
        asyncio.ensure_future(run())

    def _set_too_long(self, why: str) -> None:
        why = why[:1].upper() + why[1:]
        if why != self._too_long:
            self._too_long = why
            self.problemChanged.emit(self.problem())

    def _on_refused(self, reason: str, text: str, editing) -> None:
        if text:
            self.handBack.emit(text, editing)  # before the reason: the editor's change clears it
        self._refusal = reason[:1].upper() + reason[1:]
        self.problemChanged.emit(self.problem())

    def _prepare(self) -> bool:
        """Whether a reply can start now (a model, settings that can be sent: else the
        reason is said under the prompt); sets how many alternatives it records."""
        if not self.can_generate:
            return False
        if self.tool_round.busy:  # a call waits for its card or runs: its round ends first
            self.status.emit("A tool call is waiting: run or deny it, or Stop", 5000)
            return False
        reason = self.settings_problem()
        if reason:
            self.problemChanged.emit(self.problem())
            return False
        self.reply.inspect = INSPECT_TOP if self.record_probs else 0
        return True

    # ---- replies
    def send(self, text: str, *, editing: int | None = None) -> bool:
        """A new turn (or the resend of edited message ``editing`` beside the old one);
        refused, with nothing stored, while :meth:`problem` has a reason."""
        reason = self.problem() if self.can_generate else ""
        if reason:
            self.problemChanged.emit(reason)
            return False
        if self.attachments.pending and text.strip():
            return self._send_grounded(text, editing)
        return self._prepare() and self.reply.send(text, editing=editing)

    def _send_grounded(self, text: str, editing: int | None) -> bool:
        """Send ``text`` grounded in what is attached, once it is read (on a thread; the
        editor is free meanwhile). A failure hands the text back and says why."""
        if (self._grounding is not None and not self._grounding.done()) or self.busy or not self._prepare():
            return False

        async def run() -> None:
            self.status.emit("Reading the attached documents…", 0)
            try:
                meta = await self.attachments.ground(text, self.reply.context_length)
            except DocumentError as e:
                self.status.emit("", 1)
                self.attachments.notice.emit(str(e))
                self.handBack.emit(text, editing)
                return
            self.status.emit("", 1)
            if self.reply.send(text, editing=editing, meta=meta):
                self.attachments.clear()
            else:
                self.handBack.emit(text, editing)
        self._grounding = asyncio.ensure_future(run())
        return True

    def regenerate(self, msg_id: int | None = None) -> bool:
        """A new version of a reply (default: the last one); the old versions stay."""
        return self._prepare() and self.reply.regenerate(msg_id)

    def continue_reply(self, msg_id: int | None = None) -> bool:
        """Carry on a reply that stopped on length or Stop (default: the last message); an
        earlier reply is carried on as a new version of itself."""
        if not self.can_continue:  # not offered; a shortcut still says why, in a few words
            self.status.emit("Continue needs the local model", 5000)
            return False
        return self._prepare() and self.reply.continue_reply(msg_id)

    def branch(self, msg_id: int, index: int, token_id: int, ban: bool = False) -> bool:
        """A new version of reply ``msg_id`` from its token ``index``: with ``token_id`` there
        instead, or (``ban``) with ``token_id`` banned from there on."""
        if self.models.backend is not None:
            self.status.emit("Branching needs the local model", 5000)
            return False
        return self._prepare() and self.reply.branch(msg_id, index, token_id, ban=ban)

    def _on_interrupted(self, message: str, kind: str, parent_id: int) -> None:
        self._retry_parent = parent_id
        self.retryOffered.emit(message, kind)

    @property
    def can_retry(self) -> bool:
        """A server's reply failed and no other reply runs: :meth:`retry` would ask again."""
        return self._retry_parent is not None and not self.busy

    def retry(self) -> bool:
        """Ask again for the server reply that failed (a new version beside any partial one)."""
        if not self.can_retry:
            return False
        self.reply.inspect = INSPECT_TOP if self.record_probs else 0
        try:
            return self.reply.regenerate(self._retry_parent)
        except HistoryError as e:  # the message was deleted meanwhile
            self.status.emit(f"Could not retry: {e}", 6000)
            return False

    def stop(self) -> None:
        """Stop the running reply or tool calls; what streamed or ran so far is kept."""
        self.tool_round.stop()
        if self.reply.busy:
            self.reply.stop()

    def close(self) -> None:
        """The window is closing: save what streamed and stop (indexing too)."""
        self.tool_round.stop()
        self.reply.abandon()
        self.collections.close()

    # ---- messages
    def message_action(self, name: str, msg_id: int) -> None:
        """A message's button: "prev", "next", "edit", "regenerate", "continue", "delete"."""
        if name in ("regenerate", "continue"):
            (self.regenerate if name == "regenerate" else self.continue_reply)(msg_id)
        elif self.busy:  # the branch on screen is the streaming reply's until it ends
            return
        elif name in ("prev", "next"):
            self.conversation.switch_version(msg_id, -1 if name == "prev" else 1)
        elif name == "edit":
            self.editRequested.emit(msg_id, self.conversation.message(msg_id).text)
        elif name == "delete":
            self.delete_message(msg_id)

    def delete_message(self, msg_id: int) -> None:
        """Delete a message and the messages below it; nothing is asked, Undo is offered."""
        snapshot = self.conversation.delete_message(msg_id)
        self._undo_snapshot = snapshot
        n = len(snapshot["rows"])
        self.undoOffered.emit("Message deleted" if n == 1 else f"Message and {n - 1} below it deleted")
        self._undo_timer.start(self.undo_ms)

    def drop_undo(self) -> None:
        self._undo_snapshot = None
        self._undo_timer.stop()
        self.undoEnded.emit()

    def undo_delete(self) -> None:
        """Put back the message deleted last (while its Undo is offered)."""
        snapshot = self._undo_snapshot
        self.drop_undo()
        if snapshot is None:
            return
        try:
            self.conversation.restore(snapshot)
        except HistoryError as e:
            self.status.emit(f"Could not undo: {e}", 6000)
            return
        self.status.emit("Message restored", 3000)

    def last_reply(self) -> Message | None:
        return next((m for m in reversed(self.conversation.path()) if m.role == "assistant"), None)

    def transcript(self) -> list[dict]:
        """The branch on screen as the transcript shows it, replies with their token records."""
        return with_tokens(self.conversation.view_messages(), {m.id: m.meta for m in self.conversation.path()})

    def finished_view(self, view: dict) -> dict:
        """A finished reply's view with its token record (read from the store if missing)."""
        if view.get("id") is None or "tokens" in view:
            return view
        return with_tokens([view], {view["id"]: self.conversation.message(view["id"]).meta})[0]

    # ---- conversations
    def open(self, conv_id: int | None, *, draft: str = "", editing: bool = False) -> str | None:
        """Open conversation ``conv_id`` (None: a new chat), stopping a running reply.

        ``draft`` is the editor's unsent text (``editing``: it is a message being edited,
        not a draft): it stays with the chat it was typed in. Returns what the editor
        should hold now (that chat's own draft), or None when it stays as it is.
        Raises HistoryError when the conversation is gone.
        """
        self.stop()
        before = self.conversation.conv_id
        if conv_id is None:
            self.conversation.new()
        else:
            self.conversation.open(conv_id)
        after = self.conversation.conv_id
        if after == before and not editing:
            return None
        if draft.strip() and not editing:
            self._drafts[before] = draft
        else:
            self._drafts.pop(before, None)
        return self._drafts.pop(after, "")

    def delete_conversation(self, conv_id: int) -> None:
        if conv_id == self.conversation.conv_id:
            self.stop()
        self.conversation.delete_conversation(conv_id)


def with_tokens(views: list[dict], metas: dict) -> list[dict]:
    """Attach each reply's stored token record (meta "tokens") to its view dict."""
    for v in views:
        rec = (metas.get(v.get("id")) or {}).get("tokens")
        if v.get("role") == "assistant" and isinstance(rec, dict):
            v["tokens"] = rec
    return views
