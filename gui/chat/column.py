"""The middle of the main window: the transcript (with the token inspector beside it),
the two notices above the prompt, and the prompt editor, and how they show what the
conversation controller says (:meth:`ChatColumn.attach`)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from gui.chat.attach_bar import AttachBar, FileDrops
from gui.chat.chat_view import ChatView
from gui.chat.prompt_editor import PromptEditor
from gui.chat.sources_panel import SourcesPanel
from gui.widgets.notice_bar import NoticeBar
from gui.widgets.token_inspector import TokenInspector

SIDE_BY_SIDE = 560  # px of the column from which the inspector stands beside the transcript


class ChatColumn(QWidget):
    """Transcript | inspector, then the notices, then the prompt: it lays them out and
    connects them to a :class:`~gui.chat.controller.ConversationController`; it decides nothing.

    Attributes:
        chat: the :class:`ChatView` transcript.
        inspector: the :class:`TokenInspector`, shown while a reply shows its tokens.
        send_notice: a message the store could not save (Retry sends it again).
        reply_notice: a server's reply that failed (Retry asks again).
        sources: the :class:`SourcesPanel` (a cited passage, where a reply span came from).
        prompt: the :class:`PromptEditor`.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        # The transcript and, while a reply shows its tokens, the token inspector beside it
        # (next to the tokens it explains, above the prompt).
        self.inspector = TokenInspector()
        self.inspector.hide()
        self.chat = ChatView(inspector=self.inspector)
        self.chat.tokenViewChanged.connect(self.inspector.setVisible)
        self.chat_splitter = QSplitter(Qt.Horizontal)
        self.chat_splitter.setObjectName("chatSplitter")
        self.chat_splitter.addWidget(self.chat)
        self.chat_splitter.addWidget(self.inspector)
        self.chat_splitter.setStretchFactor(0, 1)
        self.chat_splitter.setStretchFactor(1, 0)
        self.chat_splitter.setCollapsible(0, False)
        self.chat_splitter.setSizes([440, 260])
        lay.addWidget(self.chat_splitter, 1)
        # A cited passage, or where a span of a reply came from (hidden until asked).
        self.sources = SourcesPanel()
        lay.addWidget(self.sources)
        # A message the store could not save stays in the editor; this says why and sends it
        # again once the cause (a full disk, a read-only folder) is fixed.
        self.send_notice = NoticeBar(name="sendNotice", label_name="contextNotice", action="Retry",
                                     action_name="retrySendButton",
                                     action_tip="Save and send the message in the editor again")
        lay.addWidget(self.send_notice)
        # A reply from a server that failed (unreachable, refused, cut mid-reply): what
        # happened and what to do, with Retry; what streamed stays in the transcript.
        self.reply_notice = NoticeBar(name="replyNotice", label_name="replyNoticeText", action="Retry",
                                      action_name="retryReplyButton", selectable=True,
                                      action_tip="Ask the server for this reply again "
                                                 "(the partial reply stays as a version)")
        lay.addWidget(self.reply_notice)
        # Files for the next message: Attach, chips, and files dropped anywhere on the chat.
        self.attach_bar = AttachBar()
        lay.addWidget(self.attach_bar)
        self.prompt = PromptEditor()
        lay.addWidget(self.prompt)
        self.drops = FileDrops(self)
        self.setAcceptDrops(True)
        self.installEventFilter(self.drops)
        self.drops.dropped.connect(self.attach_bar.add)
        self.prompt.filesGiven.connect(self.attach_bar.add)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        # Too narrow for both side by side (an 800 px window): the inspector goes under the
        # transcript, so neither is squeezed below its width and the window still fits.
        want = Qt.Vertical if self.width() < SIDE_BY_SIDE else Qt.Horizontal
        if self.chat_splitter.orientation() != want:
            self.chat_splitter.setOrientation(want)

    def attach(self, chats) -> None:
        """Show what ``chats`` (a ConversationController) says, forward what the user asks."""
        conv, r = chats.conversation, chats.reply
        self.chats = chats
        conv.pathChanged.connect(self.show_transcript)
        conv.messageAdded.connect(self.chat.append_message)
        chats.editRequested.connect(self.prompt.begin_edit)
        chats.handBack.connect(self.hand_back)
        chats.problemChanged.connect(self.prompt.set_problem)
        chats.canContinueChanged.connect(self.chat.set_can_continue)
        self.prompt.editor.textChanged.connect(lambda: chats.draft_changed(self.prompt.text()))
        self.chat.actionRequested.connect(chats.message_action)
        self.chat.branchRequested.connect(chats.branch)
        self.attach_bar.attach(chats.attachments, chats.collections)
        src = chats.sources
        self.chat.sourcesRequested.connect(
            lambda kind, mid, arg: src.open_citation(mid, int(arg)) if kind == "cite" else src.where_from(mid, arg))
        src.passage.connect(self.sources.show_passage)
        src.ranking.connect(self.sources.show_ranking)
        src.working.connect(self.sources.show_busy)
        src.notice.connect(self.sources.show_notice)
        self.sources.passageRequested.connect(src.open_citation)
        r.started.connect(self._on_started)
        r.streamed.connect(self.chat.append_stream)
        r.notice.connect(self.chat.set_notice)
        r.finished.connect(lambda view: self.chat.end_stream(chats.finished_view(view)))
        t = chats.tool_round
        t.approvalNeeded.connect(self._ask)
        t.callRunning.connect(lambda call_id: self.chat.cards[call_id].set_running()
                              if call_id in self.chat.cards else None)
        t.callSettled.connect(self.chat.remove_card)
        t.resultAdded.connect(self.chat.append_message)
        t.notice.connect(self.chat.set_notice)

    def _ask(self, card: dict) -> None:
        """A tool call waits for the user: its card, whose answer goes to the round."""
        w = self.chat.add_card(card)
        t = self.chats.tool_round

        def decided(call_id: str, action: str, arguments, always: bool) -> None:
            if not t.decide(call_id, action, arguments=arguments, always=always) and t.problem:
                w.say(f"⚠ {t.problem}")
        w.decided.connect(decided)

    def show_transcript(self) -> None:
        """The branch on screen, anew."""
        self.chat.set_messages(self.chats.transcript())
        card = self.chats.tool_round.pending()
        if card is not None and card.get("reply_id") in {w.msg_id for w in self.chat.widgets}:
            self._ask(card)

    def hand_back(self, text: str, editing) -> None:
        """A refused message goes back to the editor (as the edit it was, if one)."""
        typed = self.prompt.text().strip()  # written since it was sent: kept, after it
        text = f"{text}\n\n{typed}" if typed else text
        if editing is not None:
            self.prompt.begin_edit(editing, text)
        else:
            self.prompt.set_text(text)

    def _on_started(self, view: dict) -> None:
        self.chat.set_notice(None)
        self.reply_notice.hide()
        self.chat.begin_stream(view)
        self.chat.scroll_to_bottom()
