"""Markdown for the transcript: rendering, and a message body that renders as it streams.

A reply is cut into blocks that render exactly as the whole text does
(:func:`block_bounds`); while it streams, each completed block is rendered once and the
block still being written is plain text (:class:`MessageBody`), so a frame costs what
the new text costs. Model and user text is never trusted as HTML.
"""
from __future__ import annotations

import html
import re

import markdown
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextOption, QTextTable
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QToolButton

from gui import theme
from gui.chat.grounded import link_citations

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


def render_markdown(text: str, first_code: int = 0, cite: frozenset[int] = frozenset()) -> tuple[str, list[str]]:
    """(HTML for a QTextBrowser, the raw text of each code block in order).

    Each code block becomes a shaded table with a "Copy code" link (``copy:K``, K counted
    from ``first_code``) on top; citations [n] of the numbers in ``cite`` link to ``cite:n``.
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
        # Two tables: the header is as wide as the text (so "Copy code" stays in view), the
        # code's own box grows with its longest line, which the body scrolls to sideways.
        box = f'width="100%" border="0" cellspacing="0" bgcolor="{c["code_bg"]}"'
        return (f'<table {box} cellpadding="4" style="margin-top: 4px;"><tr><td align="right">'
                f'<a href="copy:{k}" style="color:{c["muted"]}; text-decoration:none; font-size:small">'
                f'Copy code</a></td></tr></table>'
                f'<table {box} cellpadding="6" style="margin-bottom: 4px;"><tr><td style="padding-top: 0px;">'
                f'<pre style="margin:0">{inner}</pre></td></tr></table>')

    # A Markdown table gets rules between its cells (Qt draws none unless asked).
    body = body.replace("<table>", f'<table border="1" cellspacing="0" cellpadding="4" '
                                   f'style="border-collapse: collapse; border-color: {c["border"]}; '
                                   f'margin-top: 4px; margin-bottom: 4px;">')
    body = body.replace("<th>", f'<th bgcolor="{c["alt"]}">')
    body = _CODE_BLOCK.sub(block, body)
    body = body.replace("<code>", f'<code style="background:{c["code_bg"]}">')
    return link_citations(body, set(cite)), codes


class MessageBody(QTextBrowser):
    """A read-only Markdown body that is exactly as tall as its text (no own vertical
    scrollbar; a code line longer than the body scrolls it sideways).

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
        # Prose wraps; a code block keeps its lines, and the longest may need a scrollbar.
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        self.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.document().setDocumentMargin(2)
        self.codes: list[str] = []
        self.cite: frozenset[int] = frozenset()  # source numbers whose [n] link to their passage
        self.markdown_text = ""
        self.streaming = False
        self._rendered = 0  # streaming: chars of markdown_text shown as rendered blocks
        self._tail_at = 0  # streaming: where the plain-text tail starts in the document
        self._pieces = True  # streaming: the text can still be rendered block by block
        self.setMouseTracking(True)  # hover over a token's anchor (``highlighted``)
        self._pinned_copy: list[QToolButton] = []  # "Copy code" kept in view while scrolled sideways
        self.horizontalScrollBar().valueChanged.connect(self._pin_copy_buttons)

    @property
    def rendered(self) -> int:
        """While streaming: how many characters of the text show as rendered Markdown blocks
        (the rest is the plain-text tail still being written)."""
        return self._rendered

    def _style(self) -> None:
        c = theme.colors()
        self.document().setDefaultStyleSheet(f"a {{ color: {c['accent']}; }}")

    def set_markdown(self, text: str) -> None:
        """Render the whole text at once."""
        self.markdown_text, self.streaming = text, False
        body, self.codes = render_markdown(text, cite=self.cite)
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
        body, codes = render_markdown(text, first_code=len(self.codes), cite=self.cite)
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
        if doc.size().width() > width + 1:  # a long code line: room for the scrollbar under the text
            h += self.horizontalScrollBar().sizeHint().height()
        if h != self.height():
            self.setFixedHeight(h)
        self._pin_copy_buttons()

    def _pin_copy_buttons(self, *_) -> None:
        """Scrolled sideways to read a long code line, each code block's "Copy code" link
        has moved out of view with its header: a button at the body's right edge, over
        that header, stands in for it (and copies the same block)."""
        dx = self.horizontalScrollBar().value()
        heads = [t for t in self.document().rootFrame().childFrames() if isinstance(t, QTextTable)
                 and t.rows() == 1 and t.cellAt(0, 0).firstCursorPosition().block().text() == "Copy code"] \
            if dx > 0 and self.codes else []
        while len(self._pinned_copy) < len(heads):
            k = len(self._pinned_copy)
            b = QToolButton(self.viewport())
            b.setObjectName("pinnedCopyCode")
            b.setText("Copy code")
            b.setAutoRaise(True)
            b.setToolTip("Copy this code block")
            b.setStyleSheet(f"color: {theme.colors()['muted']}; background: {theme.colors()['code_bg']}; "
                            "font-size: small; border: none;")
            b.clicked.connect(lambda *_, k=k: self.anchorClicked.emit(QUrl(f"copy:{k}")))
            b.adjustSize()
            self._pinned_copy.append(b)
        layout = self.document().documentLayout()
        for k, b in enumerate(self._pinned_copy):
            rect = layout.frameBoundingRect(heads[k]) if k < len(heads) else None
            # Shown once the header's own link has (mostly) left the view, never both at once.
            show = rect is not None and rect.right() - dx < b.width() + 8
            if show:
                b.move(self.viewport().width() - b.width() - 4, int(rect.top() - self.verticalScrollBar().value()) + 1)
            b.setVisible(show)

    def resizeEvent(self, e):
        super().resizeEvent(e)
        self._fit()
