"""The transcript: one framed widget per message, Markdown bodies, a live streaming reply.

Each message is a :class:`MessageWidget` (role, version switcher "‹ 2/3 ›", action
buttons, a Markdown body, a stats footer). While a reply streams, only the last
message's body is re-rendered, at most once per frame; the rest of the transcript is
untouched. The view follows the bottom unless the user has scrolled up.

Messages given to the view are plain dicts (built by :mod:`gui.chat.conversation`):
``{"id", "role", "text", "stats", "stop_reason", "seed", "version": (i, n), "error"}``,
plus ``"settings"`` and, for replies generated with token inspection, ``"tokens"``: the
token record kept in the message meta (:meth:`gui.widgets.token_run.LaneRun.token_record`,
optionally with ``"offset"``: leading characters of the text no token covers).

A reply with token records has an "Inspect tokens" toggle that swaps its Markdown body
for the comparison window's token rendering (one ``tok:I`` anchor per token, optional
heatmap); clicking or hovering a token shows it in the view's :class:`TokenInspector`.
"""
from __future__ import annotations

import math

import html
import re

import markdown
from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import (QDesktopServices, QGuiApplication, QTextBlockFormat, QTextCharFormat, QTextCursor,
                           QTextDocument, QTextOption)
from PySide6.QtWidgets import (QCheckBox, QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy,
                               QTextBrowser, QToolButton, QVBoxLayout, QWidget)

from core.engine.lanes import draft_name, settings_label

from gui import theme
from gui.widgets.token_run import LaneRun, lane_colors, parse_token_index, render_lane_html

_CODE_BLOCK = re.compile(r'(?:<div class="codehilite"[^>]*>\s*)?<pre[^>]*>(.*?)</pre>(?:\s*</div>)?', re.S)


_MARKDOWN: dict[str, markdown.Markdown] = {}


def _markdown() -> markdown.Markdown:
    # Building a converter costs ~10 ms (extensions, pygments): one per theme, reset per use.
    style = theme.colors()["pygments"]
    md = _MARKDOWN.get(style)
    if md is not None:
        return md.reset()
    md = _MARKDOWN[style] = markdown.Markdown(
        extensions=["fenced_code", "codehilite", "tables", "sane_lists"],
        extension_configs={"codehilite": {"noclasses": True, "guess_lang": False,
                                          "pygments_style": theme.colors()["pygments"]}})
    # Model and user text is never trusted as HTML: raw tags are shown as text.
    for reg, name in ((md.preprocessors, "html_block"), (md.inlinePatterns, "html")):
        if name in reg:
            reg.deregister(name)
    return md


# An opening code fence as python-markdown's fenced_code reads one (column 0; an optional
# language or {attributes}); the same fence alone on a line closes it.
_FENCE = re.compile(r"""(`{3,}|~{3,})[ ]*(\{[^\n]*\}|(\.?[\w#.+-]*[ ]*)?(hl_lines=("|').*?\5[ ]*)?)""")
# A reference-style link definition ("[id]: url") changes links anywhere in the text, so a
# text that has one is never rendered in pieces.
_REF_DEF = re.compile(r"^ {0,3}\[[^\]\n]*\]:", re.M)
# A block starting with one of these after a blank line may continue the block before it
# (indented code or list content, a loose list, a blockquote): never a place to cut.
_CONTINUES = " \t-*+>0123456789"
# Qt ends a document that ends in a thematic break with an empty block that a following
# setHtml fills: no cut right after one.
_RULE = re.compile(r" {0,3}([-*_])( *\1){2,} *")


def _open_fence(text: str, start: int = 0, fence: str | None = None) -> str | None:
    """The fence still open at the end of ``text[start:]`` (``fence``: open at ``start``)."""
    for line in text[start:].splitlines():
        if fence is None:
            m = _FENCE.fullmatch(line)
            fence = m.group(1) if m else None
        elif line.rstrip(" ") == fence:
            fence = None
    return fence


def close_open_fence(text: str) -> str:
    """Close a code fence left open mid-stream so the partial reply renders as code."""
    fence = _open_fence(text)
    return text + "\n" + fence if fence else text


def block_bounds(text: str, start: int = 0):
    """Yield each place in ``text[start:]`` (``start`` being one) where Markdown can be cut
    into pieces that render exactly as the whole does: after a blank line outside a code
    fence, once the next block has begun with a character that cannot continue the block
    before it. Each place depends only on the text before it and one character after, so
    a place found while the text streams stays one when the text is complete."""
    fence, pos, blank, ruled = None, start, False, False
    while pos < len(text):
        nl = text.find("\n", pos)
        line = text[pos:] if nl < 0 else text[pos:nl]
        if fence is None and blank and not ruled and line and line[0] not in _CONTINUES:
            yield pos
        if nl < 0:
            return
        if fence is None:
            m = _FENCE.fullmatch(line)
            if m:
                fence = m.group(1)
            blank = not line.strip(" \t")
            if not blank:
                ruled = bool(_RULE.fullmatch(line))
        elif line.rstrip(" ") == fence:
            fence = None
        pos = nl + 1


def closed_blocks_end(text: str, start: int = 0) -> int:
    """Where the complete Markdown blocks of ``text[start:]`` end (``start`` being such an
    end, see :func:`block_bounds`); what follows is the block still being written."""
    end = start
    for end in block_bounds(text, start):
        pass
    return end


def render_markdown(text: str, first_code: int = 0) -> tuple[str, list[str]]:
    """(HTML for a QTextBrowser, the raw text of each code block in order).

    Each code block becomes a shaded table with a "Copy code" link (``copy:K``, K counted
    from ``first_code``) on top.
    """
    c = theme.colors()
    body = _markdown().convert(close_open_fence(text))
    codes: list[str] = []

    def block(m: re.Match) -> str:
        inner = m.group(1)
        inner = re.sub(r"^(<span></span>)?<code[^>]*>", "", inner)
        inner = re.sub(r"</code>$", "", inner).rstrip("\n")
        codes.append(html.unescape(re.sub(r"<[^>]+>", "", inner)))
        k = first_code + len(codes) - 1
        return (f'<table width="100%" border="0" cellspacing="0" cellpadding="6" bgcolor="{c["code_bg"]}" '
                f'style="border: 1px solid {c["border"]}; margin-top: 4px; margin-bottom: 4px;">'
                f'<tr><td align="right" style="padding-bottom: 0px;"><a href="copy:{k}" '
                f'style="color:{c["muted"]}; text-decoration:none; font-size:small">Copy code</a></td></tr>'
                f'<tr><td style="padding-top: 0px;"><pre style="margin:0">{inner}</pre></td></tr></table>')

    body = _CODE_BLOCK.sub(block, body)
    body = body.replace("<code>", f'<code style="background:{c["code_bg"]}">')
    return body, codes


class MessageBody(QTextBrowser):
    """A read-only Markdown body that is exactly as tall as its text (no own scrollbar).

    While a reply streams, only its end changes: each complete Markdown block is rendered
    once and appended in its final form, and the block still being written is plain text
    that grows by appending (:meth:`append_stream`), so a frame costs the same at token
    4,000 as at 100. :meth:`finish_stream` renders only what is left, so the final
    document equals :meth:`set_markdown` of the whole text at a fraction of its cost.
    """

    def __init__(self, *, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.document().setDocumentMargin(2)
        self.codes: list[str] = []
        self.markdown_text = ""
        self.streaming = False
        self._rendered = 0  # streaming: chars of markdown_text shown as rendered blocks
        self._tail_at = 0  # streaming: where the plain-text tail starts in the document
        self._pieces = True  # streaming: the text can still be rendered block by block
        self.setMouseTracking(True)  # hover over a token's anchor (``highlighted``)

    def _style(self) -> None:
        c = theme.colors()
        self.document().setDefaultStyleSheet(f"a {{ color: {c['accent']}; }}")

    def set_markdown(self, text: str) -> None:
        """Render the whole text at once."""
        self.markdown_text, self.streaming = text, False
        body, self.codes = render_markdown(text)
        self._style()
        self.setHtml(body)
        self._fit()

    def begin_stream(self, text: str = "") -> None:
        """Start showing a reply that will grow by :meth:`append_stream`."""
        self.markdown_text, self.codes, self._rendered, self._tail_at = "", [], 0, 0
        self.streaming, self._pieces = True, True
        self._style()
        self.clear()
        self.append_stream(text)

    def append_stream(self, delta: str) -> None:
        """Add streamed text: blocks it completes are rendered as Markdown, the rest is
        appended as plain text."""
        if not delta:
            return
        line_start = self.markdown_text.rfind("\n") + 1
        self.markdown_text += delta
        text = self.markdown_text
        if self._pieces and _REF_DEF.search(text, line_start):
            self._pieces = False  # rendered once, in full, by finish_stream
        bounds = list(block_bounds(text, self._rendered)) if self._pieces else []
        if bounds:
            self._drop_tail()
            for end in bounds:
                self._append_block(text[self._rendered:end])
                self._rendered = end
            self._show_tail(text[self._rendered:])
        else:
            cur = QTextCursor(self.document())
            cur.movePosition(QTextCursor.End)
            cur.insertText(delta, QTextCharFormat())
        self._fit()

    def finish_stream(self, text: str) -> None:
        """Show the final text of a streamed reply, rendered as :meth:`set_markdown` would
        render it; only the blocks not yet rendered in their final form are rendered."""
        done = self._rendered
        if (not self.streaming or not self._pieces or _REF_DEF.search(text)
                or not text.startswith(self.markdown_text[:done])
                or (len(text) > done and done and text[done] in _CONTINUES)):
            self.set_markdown(text)
            return
        self._drop_tail()
        for end in [*block_bounds(text, done), len(text)]:
            if end > self._rendered:
                self._append_block(text[self._rendered:end])
                self._rendered = end
        self.markdown_text, self.streaming = text, False
        self._fit()

    def _append_block(self, text: str) -> None:
        """Append rendered Markdown at the end of the document, as if it had been part of
        one setHtml: a fragment inserted at a block's end merges its first block into that
        block and loses its format, so the fragment is cut from a document where a dummy
        paragraph comes first, starting at its first real block's separator."""
        body, codes = render_markdown(text, first_code=len(self.codes))
        self.codes += codes
        doc = self.document()
        if doc.isEmpty():
            doc.setHtml(body)
            return
        part = QTextDocument()
        part.setDefaultStyleSheet(doc.defaultStyleSheet())
        part.setHtml("<p>x</p>" + body)
        sel = QTextCursor(part)
        sel.setPosition(1)
        sel.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
        cur = QTextCursor(doc)
        cur.movePosition(QTextCursor.End)
        cur.insertFragment(sel.selection())

    def _show_tail(self, text: str) -> None:
        doc = self.document()
        cur = QTextCursor(doc)
        cur.movePosition(QTextCursor.End)
        self._tail_at = cur.position()
        if not doc.isEmpty():
            cur.insertBlock(QTextBlockFormat(), QTextCharFormat())
        cur.insertText(text, QTextCharFormat())

    def _drop_tail(self) -> None:
        cur = QTextCursor(self.document())
        cur.setPosition(self._tail_at)
        cur.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
        cur.removeSelectedText()

    def set_token_html(self, body: str) -> None:
        """Show pre-rendered token HTML (no Markdown, no code blocks)."""
        self.codes, self.streaming = [], False
        self.setHtml(body)
        self._fit()

    def _fit(self) -> None:
        doc = self.document()
        width = max(self.viewport().width(), 50)
        if doc.textWidth() != width:  # setting it, even unchanged, lays out the whole text again
            doc.setTextWidth(width)
        h = int(doc.size().height()) + 2 * self.frameWidth() + 2
        if h != self.height():
            self.setFixedHeight(h)

    def resizeEvent(self, e):
        super().resizeEvent(e)
        self._fit()


def format_stats(m: dict) -> str:
    """A reply's facts on one line: tokens, time to first token, tokens/s, stop reason, seed.

    ``m`` is a stored message (or one shaped like it: "stats", "stop_reason", "seed"). A
    compare lane's stats (core.engine.lanes.lane_stats) also carry mean log-prob, perplexity and
    distinct-n: those go on two more lines.
    """
    s = m.get("stats") or {}
    parts = []
    tokens = s.get("generated_tokens", s.get("tokens"))
    if tokens is not None:
        parts.append(f"{tokens} tokens")
    if s.get("ttft_s"):
        parts.append(f"TTFT {s['ttft_s'] * 1000:.0f} ms")
    rate = s.get("decode_tok_s") or s.get("tokens_per_s")
    if rate:
        parts.append(f"{rate:.1f} tok/s")
    if s.get("decode"):  # which compiled path decoded it (only when compiling was asked for)
        from gui.dialogs.model_dialog import decode_label
        parts.append(decode_label(s["decode"]))
    if s.get("cached_tokens") and s.get("prompt_tokens"):  # the prompt's start came from the KV cache
        parts.append(f"{s['cached_tokens']}/{s['prompt_tokens']} prompt tokens cached")
    if m.get("stop_reason"):
        parts.append(f"stop: {m['stop_reason']}")
    if m.get("seed") is not None:
        parts.append(f"seed {m['seed']}")
    lines = [" · ".join(parts)]
    sp = s.get("speculative")
    if sp and sp.get("kind") in ("lookup", "draft"):
        how = f"lookup {sp.get('lookup')}" if sp["kind"] == "lookup" else \
            f"draft {draft_name(sp['draft'])}" if isinstance(sp.get("draft"), str) and sp["draft"] else "draft model"
        line = f"speculative ({how}): {sp.get('acceptance', 0.0) * 100:.0f}% of {sp.get('drafted', 0)} drafted accepted"
        if sp.get("mean_draft"):
            line += f", {sp['mean_draft']:.1f} a step"
        if sp.get("speedup"):
            line += f" · ≈{sp['speedup']:.2f}× plain"
        lines.append(line)
    if "perplexity" in s:
        def num(v, fmt):
            return "–" if v is None else format(v, fmt)
        ppl = "∞" if s["perplexity"] == math.inf else num(s["perplexity"], ".2f")
        lines.append(f"mean log p {num(s.get('mean_logprob'), '.3f')} · perplexity {ppl}")
        lines.append(f"distinct-1 {num(s.get('distinct_1'), '.2f')} · distinct-2 {num(s.get('distinct_2'), '.2f')}")
    return "\n".join(lines)


class MessageWidget(QFrame):
    """One message: header (role, versions, actions), Markdown body, stats footer.

    Signals:
        action(str, int): a button or link was used — name ("copy", "edit",
            "regenerate", "continue", "delete", "prev", "next") and the message id.
        codeCopied(str): a code block's text was copied.
        tokenClicked(int, int), tokenHovered(int, int): message id and token index in
            the token view (hover: index -1 when the pointer leaves the tokens).
        tokenViewToggled(int, bool): the body switched to tokens (True) or Markdown.
    """

    action = Signal(str, int)
    codeCopied = Signal(str)
    tokenClicked = Signal(int, int)
    tokenHovered = Signal(int, int)
    tokenViewToggled = Signal(int, bool)

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

        head = QHBoxLayout()
        head.setSpacing(2)
        role = message.get("role", "assistant")
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
        for name, tip in names:
            self.buttons[name] = self._button(name, tip)
            head.addWidget(self.buttons[name])
        lay.addLayout(head)

        # The token view's bar: heatmap switch and how to use it (hidden in Markdown view).
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
        lay.addWidget(self.token_bar)

        self.body = MessageBody(parent=self)
        self.body.anchorClicked.connect(self._anchor)
        self.body.highlighted.connect(self._hovered)
        lay.addWidget(self.body)
        self.footer = QLabel()
        self.footer.setObjectName("messageFooter")
        self.footer.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # A long stats line wraps: unwrapped, its width became the message's minimum and
        # pushed the message past a narrow transcript (text and buttons cut at the edge).
        self.footer.setWordWrap(True)
        lay.addWidget(self.footer)
        self.update_message(message, streaming=streaming)

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

    def set_can_generate(self, on: bool) -> None:
        self.can_generate = on
        self._show_buttons()

    def _show_buttons(self) -> None:
        for name, b in self.buttons.items():
            b.setVisible(not self.streaming and (self.can_generate or name not in ("regenerate", "continue")))
        if "continue" in self.buttons and self.message.get("stop_reason") not in ("length", "incomplete"):
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
        else:
            self.footer.setText(format_stats(message))
        self.footer.setVisible(bool(self.footer.text()))

    def set_text(self, text: str) -> None:
        self.message["text"] = text
        if self.token_mode:
            self._render_tokens()
        elif self.streaming:
            self.body.begin_stream(text)
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
        elif s.startswith("copy:"):
            k = int(s[5:])
            if 0 <= k < len(self.body.codes):
                QGuiApplication.clipboard().setText(self.body.codes[k])
                self.codeCopied.emit(self.body.codes[k])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)


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
        views, pinned = set(self._token_views), self.pinned
        for w in self.widgets:
            w.setParent(None)
            w.deleteLater()
        self.widgets = []
        self._token_views = set()
        self.pinned = None
        for m in messages:
            w = self._add(MessageWidget(message=m, parent=self.widget()))
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

    def set_can_generate(self, on: bool) -> None:
        """Show Regenerate and Continue only while a model is loaded (they would do nothing)."""
        self.can_generate = on
        for w in self.widgets:
            w.set_can_generate(on)
        if self.inspector is not None:
            self.inspector.set_can_branch(on)
        self.updateGeometry()

    def _branch(self, msg_id: int, index: int, token_id: int, ban: bool) -> None:
        if self.can_generate and self._stream is None and self.widget_for(msg_id) is not None:
            self.branchRequested.emit(msg_id, index, token_id, ban)

    def append_message(self, message: dict) -> MessageWidget:
        """Show one more message at the end (the others stay as they are)."""
        w = self._add(MessageWidget(message=message, parent=self.widget()))
        self.scroll_to_bottom()
        return w

    def _add(self, w: MessageWidget) -> MessageWidget:
        w.set_can_generate(self.can_generate)
        w.action.connect(self._on_action)
        w.codeCopied.connect(self.copied)
        w.tokenViewToggled.connect(lambda mid, on, w=w: self._token_view_toggled(w, on))
        w.tokenClicked.connect(self._token_clicked)
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
            self._add(MessageWidget(message=message, parent=self.widget()))
            return
        self._stream.update_message(message, streaming=False)
        self._stream = None
        self.updateGeometry()  # its buttons are back

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
