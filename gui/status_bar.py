"""The main window's status bar: the model, a load's progress, the context used, Undo, stats.

Every text in it is one line that ends in "…" when the bar is too narrow
(:class:`ElidedLabel`), so its widgets never draw over each other.
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStatusBar

from gui.dialogs.model_dialog import LoadProgress, info_rows, info_summary
from gui.widgets.notice_bar import NoticeBar

COMPILING = "compiling (first reply only)…"


class ElidedLabel(QLabel):
    """A one-line status text that ends in "…" when the bar is narrower than it, so status bar
    widgets never draw over each other; ``text()`` is still the whole text. Lines of a
    several-line text are joined by " · " (the bar stays one line high); with ``tip_elided``
    the whole text is its tooltip whenever it is cut or joined. ``keep``: a start of the
    text never cut (a model's name), however narrow the bar."""

    def __init__(self, parent=None, *, tip_elided: bool = False):
        super().__init__(parent)
        self._full = ""
        self.keep = ""
        self.tip_elided = tip_elided
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text
        self._elide()
        self.updateGeometry()

    def text(self) -> str:
        return self._full

    def _line(self) -> str:
        return " · ".join(line for line in self._full.splitlines() if line.strip())

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.fontMetrics().horizontalAdvance(self._line()) + 8, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        least = self.fontMetrics().horizontalAdvance(self.keep + "…") + 8 if self.keep else 60
        return QSize(min(self.sizeHint().width(), least), super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        line = self._line()
        shown = self.fontMetrics().elidedText(line, Qt.ElideRight, max(self.contentsRect().width(), 0))
        QLabel.setText(self, shown)
        if self.tip_elided:
            self.setToolTip(self._full if shown != self._full else "")


class MainStatusBar(QStatusBar):
    """Model | load progress | context | "Message deleted · Undo" | stats.

    Attributes:
        model_status, stats_label: :class:`ElidedLabel` (objectNames ``modelStatus``,
            ``statsLabel``).
        load_progress: the :class:`LoadProgress` of a model load (its Cancel).
        context_bar: tokens in use of the model's context (objectName ``contextBar``).
        undo_notice: the :class:`NoticeBar` offering Undo after a deletion.
        context_used: the tokens the bar shows in use.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model_status = ElidedLabel()
        self.model_status.setObjectName("modelStatus")
        self.model_status.setAccessibleName("modelStatus")
        self.addWidget(self.model_status, 1)
        self.load_progress = LoadProgress()
        self.addWidget(self.load_progress)
        self.context_bar = QProgressBar()
        self.context_bar.setObjectName("contextBar")
        self.context_bar.setAccessibleName("Context used")
        self.context_bar.setMinimumWidth(120)
        self.context_bar.setMaximumWidth(190)
        self.context_bar.setRange(0, 1)
        self.context_bar.setValue(0)
        self.addPermanentWidget(self.context_bar)
        # "Message deleted · Undo", shown for a few seconds after a message is deleted.
        self.undo_notice = NoticeBar(name="undoNotice", action="Undo", action_name="undoDeleteButton",
                                     dismissible=False, wrap=False, margins=(0, 0, 0, 0))
        self.addPermanentWidget(self.undo_notice)
        self.stats_label = ElidedLabel(tip_elided=True)
        self.stats_label.setObjectName("statsLabel")
        self.stats_label.setAccessibleName("statsLabel")
        self.addPermanentWidget(self.stats_label)
        self.context_used = 0
        self._compiling, self._rates = False, 0  # the reply's compiling note; live updates so far
        self.show_context(0, 0)

    def begin_reply(self, compiling: bool) -> None:
        """A reply starts; ``compiling``: its first decode step compiles first (Compile
        Decoding's first reply: minutes on a CPU), which the stats line says until it is over."""
        self._compiling, self._rates = compiling, 0
        self.stats_label.setText(COMPILING if compiling else "")

    def show_rate(self, text: str) -> None:
        """The live reply line (tokens, speed). The first update is the prompt's token, which
        comes before the compiled step: the compiling note stays until a later one."""
        self._rates += 1
        if self._rates > 1:
            self._compiling = False
        note = COMPILING if self._compiling else ""
        self.stats_label.setText(" · ".join(t for t in (note, text) if t))

    def show_context(self, used: int, total: int) -> None:
        """The context bar: ``used`` of ``total`` tokens (total 0: no model)."""
        self.context_used = used
        self.context_bar.setRange(0, max(total, 1))
        self.context_bar.setValue(min(used, max(total, 1)))
        self.context_bar.setFormat(f"{used} / {total} tokens" if total else "context —")
        self.context_bar.setToolTip(f"Context: {used} of {total} tokens used" if total else "No model loaded")
        self.context_bar.setTextVisible(True)

    def show_model(self, info: dict | None) -> None:
        """What the model replies come from is (a server's, a local model's summary), or none."""
        self.model_status.keep = (info or {}).get("name") or ""  # cut the details, never the name
        if info is None:
            self.model_status.setText("No model loaded")
            self.model_status.setToolTip("")
        elif info.get("server"):
            ctx = info.get("context_length")
            self.model_status.setText(f"{info['name']} on {info['server']}" + (f" · ctx {ctx}" if ctx else ""))
            self.model_status.setToolTip(f"Replies come from the server {info['server']} (model {info['name']}). "
                                         f"The server lacks: {info.get('server_lacks', 'unknown')}. "
                                         "Model → Use Local Model switches back.")
        else:
            self.model_status.setText(info_summary(info))
            self.model_status.setToolTip("\n".join(f"{k}: {v}" for k, v in info_rows(info)))
