"""The transcript: one :class:`~gui.chat.message.MessageWidget` per message, a live streaming reply.

While a reply streams, only the last message's body is re-rendered, at most once per
frame; the rest of the transcript is untouched. The view follows the bottom unless the
user has scrolled up. Clicking or hovering a token of a reply in token view shows it in
the view's :class:`TokenInspector`, whose alternatives can branch the reply.
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from gui.chat.message import MessageWidget
from gui.chat.tool_views import ToolCard, message_widget
from gui.widgets.tool_odds import tool_note

class ChatView(QScrollArea):
    """The transcript (objectName ``transcript``).

    Signals:
        actionRequested(str, int): a message action — "copy", "edit", "regenerate",
            "continue", "delete", "prev", "next" — and the message id.
        copied(str): text placed on the clipboard (a message or a code block).
        tokenViewChanged(bool): whether any message now shows its tokens (the window
            shows the inspector while one does).
        branchRequested(int, int, int, bool): from the inspector: reply id, token index,
            the alternative's token id, and whether to ban it (True) or continue with it.

    Attributes:
        inspector: the :class:`TokenInspector` tokens are shown in (the window places it;
            None: tokens can be viewed but not inspected).
        pinned: (message id, token index) of the clicked token, or None.
    """

    actionRequested = Signal(str, int)
    copied = Signal(str)
    tokenViewChanged = Signal(bool)
    branchRequested = Signal(int, int, int, bool)
    sourcesRequested = Signal(str, int, str)  # MessageWidget.sourcesRequested, from any message

    def __init__(self, *, inspector=None, parent=None):
        super().__init__(parent)
        self.inspector = inspector
        if inspector is not None:
            inspector.set_can_branch(True)
            inspector.branchRequested.connect(lambda m, i, t: self._branch(m, i, t, False))
            inspector.banRequested.connect(lambda m, i, t: self._branch(m, i, t, True))
        self.pinned: tuple[int, int] | None = None
        self._token_views: set[int] = set()  # message ids in token view, kept across re-renders
        self.heatmap = False  # the last heatmap choice, for the next token view opened
        self.setObjectName("transcript")
        self.setAccessibleName("transcript")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("transcriptInner")
        self._layout = QVBoxLayout(inner)
        self._layout.setContentsMargins(16, 12, 16, 12)
        self._layout.setSpacing(10)
        self.notice = QLabel()
        self.notice.setObjectName("contextNotice")
        self.notice.setWordWrap(True)
        self.notice.hide()
        self._layout.addWidget(self.notice)
        self.empty_hint = QLabel()
        self.empty_hint.setObjectName("emptyHint")
        self.empty_hint.setAlignment(Qt.AlignCenter)
        self.empty_hint.setWordWrap(True)
        self.empty_hint.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Expanding)
        self._layout.addWidget(self.empty_hint, 2)  # sits a third of the way down when alone
        self._layout.addStretch(1)
        self.setWidget(inner)
        self.widgets: list[MessageWidget] = []
        self.cards: dict[str, ToolCard] = {}  # approval cards by call id, after the messages
        self._stream: MessageWidget | None = None
        self._stream_text = ""
        self.renders = 0  # stream updates, for tests and benchmarks
        self._follow = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scroll)
        bar.rangeChanged.connect(self._on_range)
        self.set_empty_hint("Start a conversation: type below and press Ctrl+Enter.")

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt API)
        # Never narrower than the widest message's header row (role, versions, buttons):
        # a narrower column pushed the messages past its right edge, cutting text and
        # buttons, since the transcript has no sideways scrollbar.
        s = super().minimumSizeHint()
        need = max((w.minimumSizeHint().width() for w in self.widgets), default=0)
        if need:
            m = self._layout.contentsMargins()
            need += m.left() + m.right() + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth()
        return QSize(max(s.width(), need), s.height())

    # ---- scrolling
    def _on_scroll(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 8

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)

    @property
    def following(self) -> bool:
        return self._follow

    def scroll_to_bottom(self) -> None:
        self._follow = True
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    # ---- content
    def set_empty_hint(self, text: str) -> None:
        self.empty_hint.setText(text)
        self.empty_hint.setVisible(not self.widgets and bool(text))

    def set_notice(self, text: str | None) -> None:
        """A note above the transcript (e.g. older turns dropped from the context)."""
        self.notice.setText(text or "")
        self.notice.setVisible(bool(text))

    def set_messages(self, messages: list[dict]) -> None:
        """Show these messages (the current branch), replacing what is shown."""
        self._stream = None
        for call_id in list(self.cards):  # the branch anew: a card still waiting is shown again by its round
            self.remove_card(call_id)
        views, pinned = set(self._token_views), self.pinned
        for w in self.widgets:
            w.setParent(None)
            w.deleteLater()
        self.widgets = []
        self._token_views = set()
        self.pinned = None
        for m in messages:
            w = self._add(message_widget(m, parent=self.widget()))
            if w.msg_id in views:  # a re-render keeps the token views that were open
                w.heatmap_check.setChecked(self.heatmap)
                w.set_token_view(True)
        self.empty_hint.setVisible(not self.widgets and bool(self.empty_hint.text()))
        if pinned is not None and pinned[0] in self._token_views:
            self.inspect_token(*pinned)
        elif self.inspector is not None:
            self.inspector.clear()
        self.tokenViewChanged.emit(bool(self._token_views))
        self.scroll_to_bottom()

    can_generate = True
    can_continue = True

    def set_can_generate(self, on: bool) -> None:
        """Show Regenerate and Continue only while a model is loaded (they would do nothing)."""
        self.can_generate = on
        for w in self.widgets:
            w.set_can_generate(on)
        if self.inspector is not None:
            self.inspector.set_can_branch(on)
        self.updateGeometry()

    def set_can_continue(self, on: bool) -> None:
        """Offer Continue on replies that stopped early (False: replies come from a server)."""
        self.can_continue = on
        for w in self.widgets:
            w.set_can_generate(self.can_generate, on)
        self.updateGeometry()

    def _branch(self, msg_id: int, index: int, token_id: int, ban: bool) -> None:
        if self.can_generate and self._stream is None and self.widget_for(msg_id) is not None:
            self.branchRequested.emit(msg_id, index, token_id, ban)

    def append_message(self, message: dict) -> MessageWidget:
        """Show one more message at the end (the others stay as they are)."""
        w = self._add(message_widget(message, parent=self.widget()))
        self.scroll_to_bottom()
        return w

    def _add(self, w: MessageWidget) -> MessageWidget:
        w.set_can_generate(self.can_generate, self.can_continue)
        w.action.connect(self._on_action)
        w.codeCopied.connect(self.copied)
        w.tokenViewToggled.connect(lambda mid, on, w=w: self._token_view_toggled(w, on))
        w.tokenClicked.connect(self._token_clicked)
        w.sourcesRequested.connect(self.sourcesRequested)
        w.tokenHovered.connect(self._token_hovered)
        w.heatmap_check.toggled.connect(lambda on: setattr(self, "heatmap", on))
        self._layout.insertWidget(self._layout.count() - 1, w)
        self.widgets.append(w)
        self.empty_hint.hide()
        self.updateGeometry()  # the column's minimum width follows the messages' buttons
        return w

    def _on_action(self, name: str, msg_id: int) -> None:
        if name == "copy":
            w = self.widget_for(msg_id)
            if w is not None:
                QGuiApplication.clipboard().setText(w.message.get("text", ""))
                self.copied.emit(w.message.get("text", ""))
            return
        self.actionRequested.emit(name, msg_id)

    def widget_for(self, msg_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.msg_id == msg_id), None)

    # ---- token inspection
    def _token_view_toggled(self, w: MessageWidget, on: bool) -> None:
        if w.msg_id is None:
            return
        if on:
            self._token_views.add(w.msg_id)
            w.heatmap_check.setChecked(self.heatmap)
        else:
            self._token_views.discard(w.msg_id)
            if self.pinned is not None and self.pinned[0] == w.msg_id:
                self.pinned = None
                if self.inspector is not None:
                    self.inspector.clear()
        self.updateGeometry()
        self.tokenViewChanged.emit(bool(self._token_views))

    def show_tokens(self, msg_id: int, on: bool = True) -> bool:
        """Switch message ``msg_id`` to its token view (or back); False when it has none."""
        w = self.widget_for(msg_id)
        if w is None or (on and w.token_run is None):
            return False
        w.set_token_view(on)
        return w.token_mode == on

    def inspect_token(self, msg_id: int, index: int, *, pin: bool = True) -> bool:
        """Show token ``index`` of reply ``msg_id`` in the inspector; pinned: it stays
        highlighted and is shown again when the pointer leaves the other tokens."""
        w = self.widget_for(msg_id)
        rec = w.token(index) if w is not None and w.token_mode else None
        if rec is None:
            return False
        if self.inspector is not None:
            n = len(w.token_run.tokens)
            self.inspector.show_token(msg_id, index, rec, w.token_settings_label(),
                                      title=f"Reply · token {index + 1} of {n}")
            self.inspector.set_tool_odds(tool_note(w.message, index, rec.top))
        if pin:
            if self.pinned is not None and self.pinned[0] != msg_id:
                old = self.widget_for(self.pinned[0])
                if old is not None:
                    old.select_token(None)
            self.pinned = (msg_id, index)
            w.select_token(index)
        return True

    def _token_clicked(self, msg_id: int, index: int) -> None:
        if self.pinned == (msg_id, index):  # a second click unpins
            self.pinned = None
            w = self.widget_for(msg_id)
            if w is not None:
                w.select_token(None)
            return
        self.inspect_token(msg_id, index, pin=True)

    def _token_hovered(self, msg_id: int, index: int) -> None:
        if index >= 0:
            self.inspect_token(msg_id, index, pin=False)
        elif self.pinned is not None:
            self.inspect_token(*self.pinned, pin=False)

    # ---- streaming
    def begin_stream(self, message: dict | None = None) -> MessageWidget:
        """Add (or reuse, when continuing) the assistant message that is about to stream."""
        m = dict(message or {"id": None, "role": "assistant", "text": ""})
        self._stream_text = m.get("text", "")
        last = self.widgets[-1] if self.widgets else None
        if last is not None and m.get("id") is not None and last.msg_id == m["id"]:
            last.update_message(m, streaming=True)
            self._stream = last
        else:
            self._stream = self._add(MessageWidget(message=m, streaming=True, parent=self.widget()))
        return self._stream

    def append_stream(self, text: str) -> None:
        """Add streamed text to the streaming reply. Calls come at most once a frame (the
        bridge coalesces tokens), and each costs what the new text costs."""
        if self._stream is None or not text:
            return
        self._stream_text += text
        self.renders += 1
        self._stream.append_text(text)

    @property
    def stream_text(self) -> str:
        return self._stream_text

    def end_stream(self, message: dict) -> None:
        """The reply finished (or stopped): show its final text, id, versions and stats."""
        if self._stream is None:
            self._add(message_widget(message, parent=self.widget()))
            return
        if message.get("tool_calls"):  # the calls are listed under the text: the widget that shows them
            old, self._stream = self._stream, None
            i = self._layout.indexOf(old)
            self.widgets.remove(old)
            old.setParent(None)
            old.deleteLater()
            w = self._add(message_widget(message, parent=self.widget()))
            self._layout.insertWidget(i, w)
            return
        self._stream.update_message(message, streaming=False)
        self._stream = None
        self.updateGeometry()  # its buttons are back

    # ---- tool calls waiting for the user
    def add_card(self, card: dict) -> ToolCard:
        """An approval card at the end of the transcript (``cards`` by call id)."""
        self.remove_card(card["call_id"])
        w = ToolCard(card, parent=self.widget())
        self.cards[w.call_id] = w
        self._layout.insertWidget(self._layout.count() - 1, w)
        self.scroll_to_bottom()
        w.run_button.setFocus()
        return w

    def remove_card(self, call_id: str) -> None:
        w = self.cards.pop(call_id, None)
        if w is not None:
            w.setParent(None)
            w.deleteLater()

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def toPlainText(self) -> str:  # noqa: N802 (Qt-style, for automation)
        """Everything shown, as plain text (role line, then the text)."""
        parts = []
        for w in self.widgets:
            text = self._stream_text if w is self._stream else w.message.get("text", "")
            parts.append(f"{w.role_label.text()}:\n{text}")
        return "\n\n".join(parts)
