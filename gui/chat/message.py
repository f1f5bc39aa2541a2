"""One message of the transcript: header (role, versions, actions), body, stats footer.

Messages are plain dicts (built by :mod:`gui.chat.conversation`):
``{"id", "role", "text", "stats", "stop_reason", "seed", "version": (i, n), "error",
"incomplete"}`` (an output format cut short, said in the footer), ``"note"`` (what the
run that just ended says about it, on the footer until the message is shown anew),
plus ``"settings"`` and, for replies generated with token inspection, ``"tokens"``: the
token record kept in the message meta (:meth:`gui.widgets.token_run.LaneRun.token_record`,
optionally with ``"offset"``: leading characters of the text no token covers).

A reply with token records has an "Inspect tokens" toggle that swaps its Markdown body
for the comparison window's token rendering (one ``tok:I`` anchor per token, optional
heatmap).
"""
from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QCheckBox, QFrame, QHBoxLayout, QLabel, QMenu, QToolButton, QVBoxLayout, QWidget

from core.engine.lanes import settings_label

from gui import theme
from gui.chat.markdown import MessageBody
from gui.widgets.token_run import LaneRun, lane_colors, parse_token_index, render_lane_html
from gui.widgets.stats import format_stats

# How a reply ended when it can be carried on: the token limit, Stop, or a crash mid-reply.
CONTINUABLE = ("length", "cancelled", "incomplete")


class MessageWidget(QFrame):
    """One message: header (role, versions, actions), Markdown body, stats footer.

    Signals:
        action(str, int): a button or link was used — name ("copy", "edit",
            "regenerate", "continue", "delete", "prev", "next") and the message id.
        codeCopied(str): a code block's text was copied.
        tokenClicked(int, int), tokenHovered(int, int): message id and token index in
            the token view (hover: index -1 when the pointer leaves the tokens).
        tokenViewToggled(int, bool): the body switched to tokens (True) or Markdown.
        sourcesRequested(str, int, str): a grounded reply's citation was clicked ("cite",
            the id, the number) or "Where did this come from?" asked ("where", the id, the
            selected text, or the whole reply when nothing is selected).
    """

    action = Signal(str, int)
    codeCopied = Signal(str)
    tokenClicked = Signal(int, int)
    tokenHovered = Signal(int, int)
    tokenViewToggled = Signal(int, bool)
    sourcesRequested = Signal(str, int, str)

    def __init__(self, *, message: dict, streaming: bool = False, parent=None):
        super().__init__(parent)
        self.setObjectName("message")
        self.message = dict(message)
        self.streaming = streaming
        self._run: LaneRun | None = None  # token_run, once built
        self._run_failed = False
        self.token_offset = 0
        self._token_source = None  # the record token_run is built from (rebuilt when it changes)
        self.token_mode = False
        self.selected_token: int | None = None
        self.setProperty("role", message.get("role", "assistant"))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        lay.setSpacing(2)
        lay.addLayout(self._build_header(message.get("role", "assistant")))
        lay.addWidget(self._build_token_bar())
        self.body = MessageBody(parent=self)
        self.body.anchorClicked.connect(self._anchor)
        self.body.highlighted.connect(self._hovered)
        self.body.setContextMenuPolicy(Qt.CustomContextMenu)
        self.body.customContextMenuRequested.connect(self._context_menu)
        self.chips = QLabel(self)  # a grounded question's files and how they were read
        self.chips.setObjectName("documentChips")
        self.chips.setWordWrap(True)
        self.chips.hide()
        lay.addWidget(self.chips)
        lay.addWidget(self.body)
        self.footer = QLabel()
        self.footer.setObjectName("messageFooter")
        self.footer.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # A long stats line wraps: unwrapped, its width became the message's minimum and
        # pushed the message past a narrow transcript (text and buttons cut at the edge).
        self.footer.setWordWrap(True)
        lay.addWidget(self.footer)
        self.update_message(message, streaming=streaming)

    def _build_header(self, role: str) -> QHBoxLayout:
        """Role, the version switcher, the token view toggle and the message's buttons."""
        head = QHBoxLayout()
        head.setSpacing(2)
        self.role_label = QLabel({"user": "You", "assistant": "Assistant", "system": "System"}.get(role, role))
        self.role_label.setObjectName("roleLabel")
        head.addWidget(self.role_label)
        self.prev_button = self._button("prev", "Previous version")
        self.version_label = QLabel()
        self.version_label.setObjectName("versionLabel")
        self.next_button = self._button("next", "Next version")
        for w in (self.prev_button, self.version_label, self.next_button):
            head.addWidget(w)
        head.addStretch(1)
        # Token view toggle: only replies recorded with probabilities show it.
        self.inspect_button = QToolButton(self)
        self.inspect_button.setObjectName("inspectTokensButton")
        self.inspect_button.setIcon(theme.icon("inspect"))
        self.inspect_button.setIconSize(QSize(16, 16))
        self.inspect_button.setCheckable(True)
        self.inspect_button.setToolTip("Inspect tokens: each token's probability and the alternatives")
        self.inspect_button.setAccessibleName("Inspect tokens")
        self.inspect_button.setAutoRaise(True)
        # The theme draws message buttons flat; a pressed toggle needs to look pressed.
        self.inspect_button.setStyleSheet(f"QToolButton:checked {{ background: {theme.colors()['alt']}; "
                                          f"border: 1px solid {theme.colors()['border']}; }}")
        self.inspect_button.toggled.connect(self.set_token_view)
        self.inspect_button.hide()
        head.addWidget(self.inspect_button)
        self.buttons = {}
        names = [("copy", "Copy message")]
        if role == "user":
            names.append(("edit", "Edit and resend"))
        else:
            names += [("regenerate", "Regenerate reply"), ("continue", "Continue reply")]
        names.append(("delete", "Delete message"))
        if role == "assistant":  # shown for replies to grounded questions (update_message)
            self.where_button = self._button("where", "Where did this come from? (select part of the reply first)")
            self.where_button.clicked.disconnect()
            self.where_button.clicked.connect(self._ask_where)
            self.where_button.hide()
            head.addWidget(self.where_button)
        for name, tip in names:
            self.buttons[name] = self._button(name, tip)
            head.addWidget(self.buttons[name])
        return head

    def _build_token_bar(self) -> QWidget:
        """The token view's bar: heatmap switch and how to use it (hidden in Markdown view)."""
        self.token_bar = QWidget(self)
        self.token_bar.setObjectName("tokenBar")
        tb = QHBoxLayout(self.token_bar)
        tb.setContentsMargins(0, 0, 0, 2)
        tb.setSpacing(10)
        self.heatmap_check = QCheckBox("Heatmap", self.token_bar)
        self.heatmap_check.setObjectName("tokenHeatmapCheck")
        self.heatmap_check.setToolTip("Shade each token by how surprising it was (1 − p): the darker, "
                                      "the less likely the model found it")
        self.heatmap_check.toggled.connect(lambda *_: self._render_tokens())
        self.token_hint = QLabel("Click a token to pin it · hover to peek", self.token_bar)
        self.token_hint.setObjectName("tokenHint")
        # Wrapping keeps the hint from widening the message past a narrow transcript.
        self.token_hint.setWordWrap(True)
        self.token_hint.setStyleSheet(f"color: {theme.colors()['muted']};")
        tb.addWidget(self.heatmap_check)
        tb.addWidget(self.token_hint, 1)
        self.token_bar.hide()
        return self.token_bar

    def _button(self, name: str, tip: str) -> QToolButton:
        b = QToolButton(self)
        b.setObjectName(f"{name}Button")
        b.setIcon(theme.icon(name))
        b.setIconSize(QSize(16, 16))
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(lambda: self.action.emit(name, int(self.message.get("id") or 0)))
        return b

    can_generate = True  # a model is loaded: Regenerate and Continue can do something
    can_continue = True  # replies come from the local model (a server cannot carry one on)

    def set_can_generate(self, on: bool, can_continue: bool | None = None) -> None:
        self.can_generate = on
        if can_continue is not None:
            self.can_continue = can_continue
        self._show_buttons()

    def _show_buttons(self) -> None:
        for name, b in self.buttons.items():
            b.setVisible(not self.streaming and (self.can_generate or name not in ("regenerate", "continue")))
        if "continue" in self.buttons and not (self.can_continue and self.message.get("stop_reason") in CONTINUABLE):
            self.buttons["continue"].setVisible(False)

    @property
    def msg_id(self) -> int | None:
        return self.message.get("id")

    def update_message(self, message: dict, *, streaming: bool = False) -> None:
        self.message = dict(message)
        self.streaming = streaming
        i, n = message.get("version") or (1, 1)
        multi = n > 1
        self.version_label.setText(f"{i}/{n}")
        for w in (self.prev_button, self.version_label, self.next_button):
            w.setVisible(multi)
        self.prev_button.setEnabled(i > 1 and not streaming)
        self.next_button.setEnabled(i < n and not streaming)
        self._show_buttons()
        self._show_documents(message, streaming)
        self._load_tokens(message.get("tokens"))
        has_tokens = self.has_token_record and not streaming
        self.inspect_button.setVisible(has_tokens)
        if not has_tokens and self.token_mode:
            # Streaming (a continuation) or records gone: Markdown until there is a final record.
            self.inspect_button.setChecked(False)
        self.set_text(message.get("text", ""))
        if message.get("error"):
            self.footer.setText(f"⚠ {message['error']}")
        elif streaming:
            self.footer.setText("generating…")
        elif message.get("incomplete"):  # an output format cut short: said on the reply
            self.footer.setText(f"⚠ {message['incomplete']} · {format_stats(message)}")
        elif message.get("note"):  # what the run that just ended says about it (beams already there)
            self.footer.setText(f"{message['note']}\n{format_stats(message)}")
        else:
            self.footer.setText(format_stats(message))
        self.footer.setVisible(bool(self.footer.text()))

    def _show_documents(self, message: dict, streaming: bool) -> None:
        chips = message.get("documents") or []
        c = theme.colors()
        self.chips.setText(" ".join(f'<span style="background:{c["alt"]}; color:{c["text"]}">&nbsp;{html.escape(t)}'
                                    f'&nbsp;</span>' for t in chips))
        self.chips.setVisible(bool(chips))
        self.body.cite = frozenset(message.get("sources") or ())
        if hasattr(self, "where_button"):
            self.where_button.setVisible(bool(self.body.cite) and not streaming)

    def _ask_where(self) -> None:
        sel = self.body.textCursor().selectedText()
        self.sourcesRequested.emit("where", int(self.message.get("id") or 0), sel or self.message.get("text", ""))

    def _context_menu(self, pos) -> None:
        menu = self.body.createStandardContextMenu(pos)
        if self.body.cite and not self.streaming:
            act = menu.addAction("Where did this come from?")
            act.setObjectName("whereFromAction")
            act.triggered.connect(self._ask_where)
        menu.exec(self.body.mapToGlobal(pos))
        menu.deleteLater()

    def set_text(self, text: str) -> None:
        self.message["text"] = text
        if self.token_mode:
            self._render_tokens()
        elif self.streaming:
            self.body.begin_stream(text)
        elif self.body.streaming and self.body.cite:  # blocks streamed before had no links
            self.body.set_markdown(text)
        elif self.body.streaming:
            self.body.finish_stream(text)
        else:
            self.body.set_markdown(text)

    def append_text(self, delta: str) -> None:
        """Streamed text for the end of the (streaming) reply; only the end is re-rendered."""
        self.message["text"] = self.message.get("text", "") + delta
        self.body.append_stream(delta)

    # ---- token view
    @property
    def has_token_record(self) -> bool:
        """The reply was recorded with its tokens (the toggle shows)."""
        rec = self._token_source
        return isinstance(rec, dict) and bool(rec.get("tokens")) and not self._run_failed

    @property
    def token_run(self) -> LaneRun | None:
        """The reply's token records, read the first time they are needed: a 4,000-token
        record with its alternatives takes ~100 ms to read, which a reply's end (the
        record just saved) need not spend before anyone opens its token view."""
        if self._run is None and self.has_token_record:
            try:
                run = LaneRun.from_dict(self._token_source)
                self.token_offset = max(0, int(self._token_source.get("offset") or 0))
            except (TypeError, ValueError, KeyError, IndexError):  # a damaged record: no token view
                self._run_failed = True
                self.inspect_button.hide()
                return None
            run.text = self.message.get("text", "")[self.token_offset:]
            self._run = run
        return self._run

    def _load_tokens(self, record: dict | None) -> None:
        if record is self._token_source:
            if self._run is not None:
                self._run.text = self.message.get("text", "")[self.token_offset:]
            return
        self._token_source = record
        self._run, self._run_failed = None, False
        self.token_offset = 0

    def token(self, index: int):
        """The record of token ``index`` (token_id, text, piece, logprob, top), or None."""
        if self.token_run is not None and 0 <= index < len(self.token_run.tokens):
            return self.token_run.tokens[index]
        return None

    def set_token_view(self, on: bool) -> None:
        """Show the body as tokens (True) or as Markdown; only for a finished reply with records."""
        on = bool(on) and self.token_run is not None and not self.streaming
        if self.inspect_button.isChecked() != on:
            self.inspect_button.setChecked(on)  # re-enters here through toggled
            return
        if on == self.token_mode:
            return
        self.token_mode = on
        if not on:
            self.selected_token = None
        self.token_bar.setVisible(on)
        self.set_text(self.message.get("text", ""))
        self.tokenViewToggled.emit(int(self.message.get("id") or 0), on)

    def select_token(self, index: int | None) -> None:
        """Highlight token ``index`` (None: none) in the token view."""
        if index != self.selected_token:
            self.selected_token = index
            if self.token_mode:
                self._render_tokens()

    def _render_tokens(self) -> None:
        if not self.token_mode or self.token_run is None:
            return
        c = theme.colors()
        # Shades are mixed over the reply's own background, not the window's.
        colors = {**lane_colors(c, theme.is_dark()), "base": c["assistant_bg"]}
        # Text from before recording (a continued reply) stays readable, just not inspectable.
        lead = self.message.get("text", "")[:self.token_offset]
        self.body.set_token_html(render_lane_html(None, self.token_run, heatmap=self.heatmap_check.isChecked(),
                                                  selected=self.selected_token, colors=colors, lead=lead))

    def token_settings_label(self) -> str:
        """The reply's sampling settings, as the inspector shows them."""
        return settings_label(self.message.get("settings") or {})

    def _hovered(self, url) -> None:
        if not self.token_mode:
            return
        i = parse_token_index(url.toString() if isinstance(url, QUrl) else str(url))
        self.tokenHovered.emit(int(self.message.get("id") or 0), -1 if i is None else i)

    def _anchor(self, url: QUrl) -> None:
        s = url.toString()
        i = parse_token_index(s) if self.token_mode else None
        if i is not None:
            self.tokenClicked.emit(int(self.message.get("id") or 0), i)
        elif s.startswith("cite:") and s[5:].isdigit():
            self.sourcesRequested.emit("cite", int(self.message.get("id") or 0), s[5:])
        elif s.startswith("copy:"):
            k = int(s[5:])
            if 0 <= k < len(self.body.codes):
                QGuiApplication.clipboard().setText(self.body.codes[k])
                self.codeCopied.emit(self.body.codes[k])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)
