"""Under the transcript: a cited passage, highlighted, or a reply span's passages ranked by
the attention the model paid them (:class:`~gui.chat.sources.SourcesController` says what)."""
from __future__ import annotations

import html

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QTextBrowser, QToolButton, QVBoxLayout

from gui import theme

BAR_PX = 160  # width of a full (100 %) share bar


class SourcesPanel(QFrame):
    """A passage or a ranking, with a close button (objectName ``sourcesPanel``).

    Signals:
        passageRequested(int, int): a ranked passage was clicked: the reply id, its number.
    """

    passageRequested = Signal(int, int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sourcesPanel")
        self.setFrameShape(QFrame.StyledPanel)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 6)
        head = QHBoxLayout()
        self.title = QLabel()
        self.title.setObjectName("sourcesTitle")
        self.title.setWordWrap(True)
        self.title.linkActivated.connect(self._title_link)
        head.addWidget(self.title, 1)
        self.close_button = QToolButton(self)
        self.close_button.setObjectName("sourcesCloseButton")
        self.close_button.setText("✕")
        self.close_button.setToolTip("Close")
        self.close_button.setAccessibleName("Close sources")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.hide)
        head.addWidget(self.close_button)
        lay.addLayout(head)
        self.body = QTextBrowser(self)
        self.body.setObjectName("sourcesBody")
        self.body.setOpenLinks(False)
        self.body.anchorClicked.connect(self._anchor)
        self.body.setMinimumHeight(90)
        self.body.setMaximumHeight(220)
        lay.addWidget(self.body)
        self.reply_id = 0
        self.rows: list[dict] = []
        self.none = 0.0
        self._busy = False  # the title says what is being measured
        self.hide()

    def show_busy(self, text: str) -> None:
        """``text``: what is being measured; "" when it ended without an answer (cancelled)."""
        if not text:
            if self._busy:
                self.hide()
            self._busy = False
            return
        self._busy = True
        self.title.setText(text)
        self.body.setHtml("")
        self.show()

    def show_notice(self, text: str) -> None:
        self._busy = False
        self.title.setText(f"⚠ {html.escape(text)}")
        self.body.hide()
        self.show()

    def show_passage(self, src: dict) -> None:
        """Source ``src`` (number, where, text, source, highlight): its text, the span marked."""
        self._busy = False
        c = theme.colors()
        text = src.get("text", "")
        a, b = src.get("highlight") or (0, 0)
        marked = (html.escape(text[:a]) + f'<span style="background:{c["alt"]}">' + html.escape(text[a:b])
                  + "</span>" + html.escape(text[b:])).replace("\n", "<br>")
        path = str(src.get("source") or "")
        link = f' · <a href="file:{html.escape(path)}">open file</a>' if path.startswith("/") else ""
        if self.rows and src.get("reply_id") == self.reply_id:
            link += ' · <a href="back:">back to the ranking</a>'
        self.title.setText(f"<b>[{int(src.get('number', 0))}]</b> {html.escape(src.get('where', ''))}{link}")
        self.body.setHtml(f'<div style="white-space:pre-wrap">{marked}</div>')
        self.body.show()
        self.show()

    def show_ranking(self, reply_id: int, rows: list[dict], none: float) -> None:
        """The span's passages by attention share, then what went to no passage."""
        self._busy = False
        self.reply_id, self.rows, self.none = reply_id, rows, none
        c = theme.colors()
        self.title.setText("<b>Where did this come from?</b> Attention the model paid to each source "
                           "while writing the selection (all layers and heads)")

        def row(label: str, share: float, href: str = "") -> str:
            bar = max(1, round(BAR_PX * share))
            name = f'<a href="{href}">{label}</a>' if href else label
            return (f'<tr><td>{name}</td><td width="{BAR_PX}"><table cellspacing="0" cellpadding="0"><tr>'
                    f'<td width="{bar}" height="10" bgcolor="{c["accent"]}"></td></tr></table></td>'
                    f'<td align="right">{share:.0%}</td></tr>')
        body = "".join(row(f'[{r["number"]}] {html.escape(r["where"])}', r["share"], f'cite:{r["number"]}')
                       for r in rows)
        body += row("<i>no passage</i> (instructions, question, the reply so far)", none)
        self.body.setHtml(f'<table cellspacing="4">{body}</table>')
        self.body.show()
        self.show()

    def _anchor(self, url: QUrl) -> None:
        s = url.toString()
        if s.startswith("cite:") and s[5:].isdigit():
            self.passageRequested.emit(self.reply_id, int(s[5:]))

    def _title_link(self, link: str) -> None:
        if link.startswith("file:"):
            QDesktopServices.openUrl(QUrl.fromLocalFile(link[5:]))
        elif link == "back:":
            self.show_ranking(self.reply_id, self.rows, self.none)
