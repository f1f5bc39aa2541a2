"""One chat reply's life, from request to saved message.

:class:`ReplyController` turns send / regenerate / continue / edit-and-resend into a
request, streams it through the bridge, and writes the result (finished, stopped or
failed) to the conversation store. It owns no widget: it says what happens through
signals, and ``MainWindow`` connects those to the transcript, the status bar and dialogs.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from PySide6.QtCore import QObject, Signal

from core.engine.events import Done, Prefilled
from core.remote.runner import describe_error, public_url
from core.history.partial import PartialReply
from core.history.records import HistoryError, Message
from core.history.tool_messages import stored_calls
from core.tools.parse import looks_like_call
from core.worker.protocol import Error, GenerateRequest, Prompted

from gui.bridge import Chunk
from gui.widgets.token_run import LaneRun
from gui.chat.beam_versions import repeats_note, store_beams
from gui.chat.conversation import ConversationModel


# What a reply held to an output format says when it ended before the format was complete.
UNFINISHED = {"length": "incomplete: stopped at the token limit", "cancelled": "incomplete: stopped"}
CUT_CALL = "incomplete: the tool call was cut short, so no tool was called"


def cut_call(done) -> bool:
    """A reply that ran out of tokens or context after it began a call: the engine makes no
    call of it, and its half '{"name": ...' alone would not say so."""
    if done.stop_reason not in ("length", "context"):
        return False
    return done.params.tool_choice not in ("auto", "none") or looks_like_call(done.text)


# A reply's meta keys that describe how its last run ended (a continuation replaces them).
RUN_END_META = ("error", "cut", "incomplete")


@dataclass
class ReplyState:
    """What one reply has so far. ``continue_of`` is the reply being continued (its text is
    ``prefix``); a branch is a new version that starts with ``prefix``, the text of an
    earlier version's first tokens, whose token records are ``prefix_record``; ``run``
    records tokens for the inspector when ``inspect`` > 0."""
    parent_id: int
    settings: dict
    inspect: int = 0
    continue_of: Message | None = None
    prefix: str = ""
    text: str = ""
    tokens: int = 0
    prompted: Prompted | None = None
    prefilled: Prefilled | None = None
    done: Done | None = None
    error: str | None = None
    error_kind: str = ""  # a remote request's failure kind (core.remote.client.RemoteError.kind)
    server: str | None = None  # the server's URL for a remote reply (never its key)
    saved: bool = False
    run: LaneRun | None = field(default=None, repr=False)
    # A new reply is written to the store as it grows (a crash loses at most a moment of it).
    partial: PartialReply | None = field(default=None, repr=False)
    prefix_record: dict | None = field(default=None, repr=False)
    # A continuation saved as a new version carries on this reply (its stats add up).
    extends: Message | None = field(default=None, repr=False)
    conv_id: int | None = None
    # The branch shown before a regenerate / continue / branch replaced it on screen: a
    # reply that produced nothing puts it back, so no version is ever hidden (issue 22).
    restore_leaf: int | None = None
    # The user message this reply's send stored, and the editor's edit it resent: a turn
    # refused before any text goes back to the editor and is not kept (issue 22).
    user: Message | None = field(default=None, repr=False)
    editing: int | None = None
    tools: list = field(default_factory=list, repr=False)  # offered to the model: Done's calls' sources


class ReplyController(QObject):
    """Runs at most one reply at a time for a conversation.

    Args:
        bridge: the :class:`gui.bridge.Bridge` (or anything with ``generate(request)``
            returning an async iterator with ``cancel()``).
        conversation: the conversation on screen.
        settings: where the reply's settings come from: ``params()``, ``system_prompt()``,
            ``chat_format()`` (the sampling panel).

    Signals:
        busyChanged(bool): a reply started or ended.
        started(dict): a reply began; the dict is the message to stream into.
        streamed(str): text to append to the streaming message.
        contextUsed(int, int): tokens in use and the model's context length.
        rateChanged(str): a short live line (tokens, tokens/s) for the status bar.
        notice(str): something to tell about this reply (turns left out to fit).
        finished(dict): the reply is saved; the dict is the stored message's view.
        failed(str, str): a title and message for an error dialog (a branch cannot be
            made); a reply's own failure never opens one. A reply the store could not save
            ends as ``finished`` with no id, its text, and the reason as its error.
        refused(str, str, object): a local reply produced nothing (the worker refused it:
            a prompt longer than the context, an unusable draft model or output format,
            or invalid settings): the reason, the refused new message's text handed back
            to the editor ("" when none was sent) and the message id it was an edit of
            (or None). Nothing of it is kept and the branch on screen is as it was.
        interrupted(str, str, int): a reply from a server failed (refused, unreachable, timed
            out, 401, 429, cut mid-reply): the message to show inline with a Retry, the
            failure's kind, and the id of the message to answer again (what was streamed is
            kept, marked as cut; no dialog).
        saveFailed(str): the user's message could not be saved (full disk, read-only
            folder): nothing was sent, the text stays in the editor, and sending it again
            retries.
        textRepaired(str): the message was saved with invalid characters (lone
            surrogates, undecodable bytes) replaced by U+FFFD; the str says so.
    """

    busyChanged = Signal(bool)
    started = Signal(dict)
    streamed = Signal(str)
    contextUsed = Signal(int, int)
    rateChanged = Signal(str)
    notice = Signal(str)
    finished = Signal(dict)
    failed = Signal(str, str)
    refused = Signal(str, str, object)
    interrupted = Signal(str, str, int)
    saveFailed = Signal(str)
    textRepaired = Signal(str)

    def __init__(self, *, bridge, conversation: ConversationModel, settings, parent=None):
        super().__init__(parent)
        self.bridge = bridge
        self.conversation = conversation
        self.settings = settings
        self.inspect = 0  # alternatives to record per token (0: none)
        # Where replies come from: None for the local model, or a connected
        # core.remote.client.RemoteModel (bridge.generate(..., backend=...)).
        self.backend = None
        self.model_id: str | None = None
        self.context_length = 0
        self.tools = None  # () -> the tools the open chat offers (gui.chat.chat_tools.ChatTools.tools)
        self.state: ReplyState | None = None
        self._stream = None
        self._task: asyncio.Task | None = None

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    # ------------------------------------------------------------------ starting

    def send(self, text: str, *, editing: int | None = None, meta: dict | None = None) -> bool:
        """A new user turn (or the resend of edited message ``editing``, beside the old
        one; ``meta``: its documents) and its reply. False when nothing was started."""
        if self.busy or not text.strip():
            return False
        params = self._params()
        if params is None:
            return False
        before = self.conversation.leaf_id()
        try:
            if editing is not None:
                user = self.conversation.add_user(text, parent_id=self.conversation.message(editing).parent_id,
                                                  meta=meta)
            else:
                user = self.conversation.add_user(text, meta=meta)
        except HistoryError as e:
            self.saveFailed.emit(f"Could not save the message, so it was not sent: {e}")
            return False
        if (user.meta or {}).get("text_repaired"):
            self.textRepaired.emit("Part of the message was not valid text (broken clipboard data or "
                                   "bytes from a file); it was replaced with \ufffd before sending.")
        started = self._start(parent_id=user.id, params=params, restore_leaf=before)
        if started:
            self.state.user, self.state.editing = user, editing
        return started

    def regenerate(self, msg_id: int | None = None) -> bool:
        """A new version of a reply (default: the last message); the old versions stay.
        On a user message without a reply, answers it."""
        if self.busy:
            return False
        path = self.conversation.path()
        target = self.conversation.message(msg_id) if msg_id is not None else (path[-1] if path else None)
        if target is None:
            return False
        parent = target.parent_id if target.role == "assistant" else target.id
        if parent is None:
            return False
        return self._start(parent_id=parent, restore_leaf=self._show_branch_at(parent))

    def continue_reply(self, msg_id: int | None = None) -> bool:
        """Carry on a reply that stopped (on length, or Stop); default: the last message.

        The reply at the end of its branch is extended in place. An earlier reply (one
        with messages below it, which answered its text as it is) is carried on as a new
        version of itself, streamed where it stands: its old text and the turns below it
        stay reachable with ‹ ›, and nothing stored is overwritten."""
        if self.busy:
            return False
        path = self.conversation.path()
        target = self.conversation.message(msg_id) if msg_id is not None else (path[-1] if path else None)
        if target is None or target.role != "assistant":
            return False
        if not self.conversation.history.children(target.id):
            return self._start(parent_id=target.parent_id, continue_of=target)
        record = (target.meta or {}).get("tokens")
        return self._start(parent_id=target.parent_id, restore_leaf=self._show_branch_at(target.parent_id),
                           branch=(target.text, [], target.text, record if isinstance(record, dict) else None),
                           extends=target)

    def _show_branch_at(self, parent: int) -> int | None:
        """Show the branch ending at ``parent`` (a new reply to it follows); returns the
        leaf shown before, which a reply that produces nothing puts back."""
        before = self.conversation.leaf_id()
        self.conversation.show_branch_at(parent)
        return before

    def _params(self, ban: int | None = None):
        """The validated settings of the next reply (the seed drawn now, so even a reply cut
        short by quitting records it), or None after saying why they cannot be used."""
        try:
            params = self.settings.params().validate().resolved()
            if ban is not None:
                params = replace(params, logit_bias={**params.logit_bias, ban: float("-inf")}).validate()
        except Exception as e:  # noqa: BLE001 — any invalid setting: said inline, nothing sent
            self.refused.emit(f"invalid sampling settings: {e}", "", None)
            return None
        return params

    def _after_results(self, params, parent_id: int, tools: list):
        """A reply that goes on from tool results may answer: "required" or a named tool
        forces the call the user's turn asks for, and held to it after the results the model
        would call again each round until the loop guard (OpenAI's clients send "auto" on
        the request after the results, for the same reason)."""
        if not tools or params.tool_choice in ("auto", "none"):
            return params
        try:
            after_tool = self.conversation.history.message(parent_id).role == "tool"
        except HistoryError:
            return params
        return replace(params, tool_choice="auto") if after_tool else params

    def branch(self, msg_id: int, index: int, token_id: int, *, ban: bool = False) -> bool:
        """A new version of reply ``msg_id`` that keeps its first ``index`` tokens and then
        takes ``token_id`` (one of the alternatives the inspector showed) and carries on;
        ``ban``: never ``token_id`` in the new version instead (a logit bias of -inf), so
        the model chooses again at ``index``. The kept tokens are the end of the prompt,
        so the worker reuses them from its KV cache. Needs the reply's token records."""
        if self.busy:
            return False
        try:
            target = self.conversation.message(msg_id)
        except HistoryError as e:
            self.failed.emit("Could not branch the reply", str(e))
            return False
        rec = (target.meta or {}).get("tokens") if target is not None else None
        ids = list((rec or {}).get("tokens") or [])
        if target is None or target.role != "assistant" or target.parent_id is None or not 0 <= index < len(ids):
            self.failed.emit("Could not branch the reply", "this reply has no recorded token there "
                             "(turn on Record Token Probabilities and regenerate it)")
            return False
        off = int(rec.get("offset") or 0)
        texts = list(rec.get("token_texts") or [])
        prefix = target.text[:off] + "".join(texts[:index])
        kept = {k: list(rec.get(k) or [])[:index] for k in ("tokens", "token_texts", "pieces", "logprobs", "top")}
        kept = {**kept, **({"offset": off} if off else {})}
        server: tuple[list[int], list[int]] = ([], [])
        if self.backend is not None:  # the server is sent its own prompt ids, then the kept tokens
            prompt_ids = rec.get("prompt_ids")
            if off or not isinstance(prompt_ids, list) or not prompt_ids:
                self.failed.emit("Could not branch the reply", "the server did not report this reply's prompt as "
                                 "token ids (a reply from another server, or from before this version): "
                                 "regenerate it on this server, then branch")
                return False
            stop = rec.get("stop_token")
            server = ([int(t) for t in prompt_ids], [int(stop)] if isinstance(stop, int) else [])
            kept["prompt_ids"] = server[0]
            if server[1]:
                kept["stop_token"] = server[1][0]
        before = self._show_branch_at(target.parent_id)
        return self._start(parent_id=target.parent_id, branch=(target.text[:off], ids[:index], prefix, kept),
                           restore_leaf=before,
                           forced=[] if ban else [int(token_id)], ban=int(token_id) if ban else None,
                           inspect=max(self.inspect, int(rec.get("inspect") or 0)) or 5, server=server)

    def _start(self, *, parent_id: int, continue_of: Message | None = None, branch: tuple | None = None,
               forced: list[int] = (), ban: int | None = None, inspect: int | None = None,
               server: tuple[list[int], list[int]] = ([], []), params=None, restore_leaf: int | None = None,
               extends: Message | None = None) -> bool:
        inspect = self.inspect if inspect is None else inspect
        params = params if params is not None else self._params(ban)
        if params is None:
            if restore_leaf is not None:
                self.conversation.restore_leaf(self.conversation.conv_id, restore_leaf, parent_id)
            return False
        lead, reply_prefix, prefix_text, prefix_record = branch or ("", [], "", None)
        tools = list(self.tools()) if self.tools is not None else []
        params = self._after_results(params, parent_id, tools)
        request = GenerateRequest(tools=tools,
            messages=self.conversation.request_messages(self.settings.system_prompt(), upto=parent_id),
            params=params, chat_format=self.settings.chat_format(),
            continue_reply=continue_of.text if continue_of is not None else lead, inspect=inspect,
            reply_prefix=list(reply_prefix), forced=list(forced), prompt_ids=list(server[0]),
            stop_ids=list(server[1]))
        if continue_of is not None:
            view = self.conversation.view_message(continue_of)
        else:
            n = len(self.conversation.history.children(parent_id)) + 1
            view = {"id": None, "role": "assistant", "text": prefix_text, "version": (n, n)}
        partial = None if continue_of is not None else PartialReply(
            self.conversation.history, self.conversation.conv_id, parent_id, settings=params.to_dict(),
            seed=params.seed, model_id=self.model_id)
        if partial is not None and prefix_text:
            partial.append(prefix_text)
        self.state = ReplyState(parent_id, params.to_dict(), inspect, continue_of, view["text"],
                                run=LaneRun() if inspect else None, partial=partial, prefix_record=prefix_record,
                                extends=extends, conv_id=self.conversation.conv_id, restore_leaf=restore_leaf,
                                tools=tools)
        if self.backend is not None:
            self.state.server = public_url(self.backend.url)
        self._stream = (self.bridge.generate(request) if self.backend is None
                        else self.bridge.generate(request, backend=self.backend))
        self._task = asyncio.ensure_future(self._follow(self.state, self._stream))
        self.started.emit(view)
        self.busyChanged.emit(True)
        return True

    # ------------------------------------------------------------------ streaming

    async def _follow(self, st: ReplyState, stream) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async for ev in stream:
                match ev:
                    case Chunk():
                        st.text += ev.text
                        if st.partial is not None:
                            st.partial.append(ev.text)
                        st.tokens += len(ev.tokens)
                        if st.run is not None:
                            st.run.add(ev.tokens)
                        self.streamed.emit(ev.text)
                        used = (st.prefilled.prompt_tokens if st.prefilled else 0) + st.tokens
                        self.contextUsed.emit(used, self.context_length)
                        dt = loop.time() - t0
                        self.rateChanged.emit(f"{st.tokens} tokens · {st.tokens / dt:.1f} tok/s" if dt > 0 else "")
                    case Prompted():
                        st.prompted = ev
                        self.context_length = ev.context_length or self.context_length
                        if ev.dropped_messages:
                            self.notice.emit(
                                f"This conversation no longer fits in the model's context ({self.context_length} "
                                f"tokens): the {ev.dropped_messages} oldest message(s) were left out of this reply "
                                "(the system prompt was kept).")
                    case Prefilled():
                        st.prefilled = ev
                        self.contextUsed.emit(ev.prompt_tokens, self.context_length)
                    case Done():
                        st.done = ev
                    case Error():
                        st.error = None if ev.cancelled else ev.message
                        st.error_kind = ev.kind
        except asyncio.CancelledError:
            self.save(st, cancelled=True)
            raise
        except Exception as e:  # a bridge failure: show it, keep what streamed
            st.error = str(e)
        self.save(st)

    def stop(self) -> None:
        """Stop the running reply; what streamed so far is kept and saved."""
        if self.busy and self._stream is not None:
            self._stream.cancel()

    def abandon(self) -> None:
        """The window is closing: save what streamed, stop the reply and its task."""
        if self.state is not None and not self.state.saved:
            self.save(self.state, cancelled=True, quiet=True)
        if self.busy:
            self._stream.cancel()
            self._task.cancel()

    # ------------------------------------------------------------------ saving

    def save(self, st: ReplyState, *, cancelled: bool = False, quiet: bool = False) -> None:
        """Write the reply (finished, stopped or failed) to the store, once."""
        if st.saved:
            return
        st.saved = True
        done = st.done
        text = done.text if done is not None else st.text
        stop_reason = done.stop_reason if done is not None else ("error" if st.error and not cancelled else "cancelled")
        params = done.params.to_dict() if done is not None else st.settings
        stats = done.stats.to_dict() if done is not None else {"generated_tokens": st.tokens}
        meta = self._meta(st)
        if self.state is st:
            self.state = None
        self.busyChanged.emit(False)
        if not text and st.error:
            # Nothing came back: no empty reply (nor a copy of a continued one) is kept, and a
            # reply that was to be continued in place stays as it was.
            self._nothing_came_back(st, quiet)
            return
        note = ""
        try:
            m = self._store(st, text, params=params, stats=stats, stop_reason=stop_reason, meta=meta)
            if done is not None and len(done.beams) > 1 and self._fresh(st):  # the other beams: versions
                m, repeats = store_beams(self.conversation, m, done, model_id=self.model_id)
                note = repeats_note(repeats, len(done.beams)) if repeats else ""
        except HistoryError as e:  # a full disk, a read-only folder: the text stays on screen
            if not quiet:
                self.finished.emit({"id": None, "role": "assistant", "text": st.prefix + text,
                                    "error": f"this reply could not be saved: {e}"})
            return
        if quiet:
            return
        self._emit_finished(m, note)
        if st.error:
            self._report(st)

    def _nothing_came_back(self, st: ReplyState, quiet: bool) -> None:
        """A reply failed before any text of its own: the store and the screen go back to
        how they were (the branch shown before, the versions that exist), and the failure
        is said once. A server's failure offers Retry (``interrupted``); a local one is a
        refusal: a new message goes back to the editor unsaved (``refused``)."""
        conv = self.conversation
        try:
            if st.partial is not None and st.partial.msg_id is not None:  # only a branch's copied prefix
                conv.history.delete_message(st.partial.msg_id)
            handed = self._take_back(st) if not st.error_kind else ""
            restored = st.restore_leaf is not None and conv.restore_leaf(st.conv_id, st.restore_leaf, st.parent_id)
        except HistoryError as e:
            handed, restored = "", False
            st.error = f"{st.error} ({e})"
        if quiet:
            return
        if st.continue_of is not None:  # the reply it was to carry on stands as it was
            self._show_stored(st.continue_of.id)
        if not st.error_kind:
            self.refused.emit(st.error, handed, st.editing if handed else None)
            return
        if not restored:  # a new turn to a server: no empty reply under the message; the notice says why
            conv.pathChanged.emit()
        self.interrupted.emit(st.error, st.error_kind, st.parent_id)

    def _show_stored(self, msg_id: int) -> None:
        try:
            m = self.conversation.message(msg_id)
        except HistoryError:  # deleted meanwhile: the transcript shows the branch anew
            self.conversation.pathChanged.emit()
            return
        self._emit_finished(m)

    def _emit_finished(self, m: Message, note: str = "") -> None:
        """Show ``m`` as the reply that finished; ``note``: what this run alone says on it
        (shown on its footer now, not stored)."""
        view = self.conversation.view_message(m)
        if note:
            view["note"] = note
        if isinstance((m.meta or {}).get("tokens"), dict):  # read once, here: the window need not again
            view["tokens"] = m.meta["tokens"]
        self.finished.emit(view)

    def _take_back(self, st: ReplyState) -> str:
        """Remove the user message a refused send stored (and the chat it started);
        returns its text for the editor ("" when there is none to take back)."""
        conv, user = self.conversation, st.user
        if user is None or conv.history.children(user.id):
            return ""
        if user.parent_id is None and len(conv.history.siblings(user.id)) == 1:
            conv.delete_conversation(user.conversation_id)  # the chat this message started
        else:
            conv.delete_message(user.id)
        return user.text

    @staticmethod
    def _meta(st: ReplyState) -> dict:
        """What the stored reply's meta says beside its text: dropped turns, the server,
        the error (a server's, reworded for a reader into ``st.error``; a cut reply is
        marked), and the token record."""
        done = st.done
        meta: dict = {}
        if st.prompted is not None and st.prompted.dropped_messages:
            meta["dropped_messages"] = st.prompted.dropped_messages
        if st.server:
            meta["server"] = st.server
        if st.tools:  # what the model could call (the inspector's tool odds, an export's reader)
            meta["tools"] = [t.name for t in st.tools]
        if st.error_kind and st.error:
            st.error = describe_error(st.error_kind, st.error)
            if st.error_kind == "cut":
                meta["cut"] = True  # the text is what arrived before the connection broke
        if st.error:
            meta["error"] = st.error
        if done is not None and done.params.constraint is not None and done.stop_reason in UNFINISHED:
            # The output format holds only for a whole reply: a cut one does not match it yet.
            meta["incomplete"] = UNFINISHED[done.stop_reason]
        elif done is not None and st.tools and cut_call(done):
            meta["incomplete"] = CUT_CALL
        record = token_record(st)
        if record is not None:
            if done is not None and getattr(done, "prompt_ids", None):
                # A server's reply: its prompt as the server tokenized it and the token that
                # ended it (a chat's end of turn), what a branch of it sends the server back.
                record["prompt_ids"] = [int(t) for t in done.prompt_ids]
                if done.stop_token is not None:
                    record["stop_token"] = int(done.stop_token)
                elif isinstance(st.prefix_record, dict) and st.prefix_record.get("stop_token") is not None:
                    record["stop_token"] = int(st.prefix_record["stop_token"])
            meta["tokens"] = record
        return meta

    @staticmethod
    def _fresh(st: ReplyState) -> bool:
        """A reply of its own: not carrying on (or branching from) the text of another."""
        return st.continue_of is None and st.extends is None and not st.prefix

    def _store(self, st: ReplyState, text: str, *, params: dict, stats: dict, stop_reason: str, meta: dict) -> Message:
        """Write the reply: onto the reply it continues, as the growing partial reply's end,
        or as a new message."""
        seed = params.get("seed")
        done_calls = st.done.tool_calls if st.done is not None else []
        calls = stored_calls(done_calls, {t.name: t.source for t in st.tools}) if done_calls else None
        carried = st.continue_of or st.extends
        if carried is not None:  # one reply in two runs: its counts add up
            merged = dict(carried.stats or {})
            merged["generated_tokens"] = int(merged.get("generated_tokens", 0)) + int(stats.get("generated_tokens", 0))
            for k in ("ttft_s", "decode_tok_s", "prompt_tokens", "cached_tokens"):
                if k in stats:
                    merged[k] = stats[k]
            stats = merged
        if st.continue_of is not None:
            old = st.continue_of
            # What the earlier run's end said (cut, failed, incomplete) no longer holds.
            kept = {k: v for k, v in (old.meta or {}).items() if k not in RUN_END_META}
            return self.conversation.update_reply(old.id, text=st.prefix + text, stats=stats, stop_reason=stop_reason,
                                                  settings=params, seed=seed, meta={**kept, **meta}, tool_calls=calls)
        if st.partial is not None:  # a new reply (a branch's starts with its prefix)
            m = st.partial.finish(st.prefix + text, settings=params, seed=seed, stats=stats,
                                  stop_reason=stop_reason, meta=meta, tool_calls=calls)
            self.conversation.listChanged.emit()
            return m
        return self.conversation.add_reply(st.parent_id, text, settings=params, seed=seed, model_id=self.model_id,
                                           stats=stats, stop_reason=stop_reason, meta=meta, tool_calls=calls)

    def _report(self, st: ReplyState) -> None:
        # A local failure after some text is said on the reply itself (its footer), once.
        if st.error_kind:  # a server's failure: inline, with Retry
            self.interrupted.emit(st.error, st.error_kind, st.parent_id)


def token_record(st: ReplyState) -> dict | None:
    """The reply's tokens as stored in its meta (see LaneRun.token_record), or None.

    A continuation extends the earlier part's record when that record covers the text
    before it; otherwise the record starts after that text (``offset``: characters no
    token covers), so the new part is still inspectable.
    """
    run = st.run
    if run is None or not run.tokens:
        return None
    rec = {**run.token_record(), "inspect": st.inspect}
    old = st.continue_of
    if old is None and st.prefix_record is None:
        return rec
    prev = st.prefix_record if old is None else (old.meta or {}).get("tokens")
    if isinstance(prev, dict) and prev.get("tokens"):
        off = int(prev.get("offset") or 0)
        if st.prefix[off:] == "".join(prev.get("token_texts") or []):
            n = len(prev["tokens"])
            fill = {"top": [None] * n, "pieces": prev.get("token_texts"), "logprobs": [0.0] * n}
            merged = {k: list(prev.get(k) or fill.get(k) or []) + rec[k]
                      for k in ("tokens", "token_texts", "pieces", "logprobs", "top")}
            return {**merged, "inspect": rec["inspect"], **({"offset": off} if off else {})}
    if st.prefix:
        rec["offset"] = len(st.prefix)
    return rec
