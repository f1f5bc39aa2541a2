"""Side-by-side comparison of sampler settings: lanes that stream together.

One prompt (or the open conversation as context) runs under 1–8 lanes of settings in
one batched request (``bridge.compare``); each lane is a column that streams live, shows
its numbers (tokens, tokens/s, stop reason, mean log-prob, perplexity, distinct-n), and
renders every token as an anchor so it can be inspected, diffed against a baseline lane
and shaded by probability. Comparisons are saved in the history with the seeds really
used, reopen from the "Saved" menu, re-run exactly and export to Markdown and JSON.

The view never touches torch: all numbers come from the worker's events.
"""
from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFrame, QGridLayout,
                               QHBoxLayout, QLabel, QLineEdit, QMenu, QPlainTextEdit, QPushButton,
                               QScrollArea, QSizePolicy, QSpinBox, QSplitter, QTextBrowser, QToolButton,
                               QVBoxLayout, QWidget)

from core.history import export as chat_export
from core.engine.lanes import (LANE_KEYS, MAX_LANES, SWEEP_KEYS, draft_name, parse_sweep, settings_label,
                          sweep_lanes, text_diff, token_diff)
from core.errors import LlamaDeskError
from core.engine.engine import Done, Prefilled
from core.engine.sampling import SamplingParams
from core.worker.worker import CompareRequest, Error, Prompted

from gui import theme
from gui.bridge import Chunk
from gui.chat.chat_view import format_stats
from gui.compare.lanes import LaneModel, LaneRun, lane_colors, parse_anchor, render_lane_html, tokenizers_match
from gui.widgets.token_inspector import TokenInspector

DEFAULT_INSPECT = 5
SWEEP_NAMES = {"lookup": "prompt lookup (speculative)", "draft": "draft model (speculative)",
               "logit_bias_text": "logit bias", "constraint": "output format"}
SWEEP_HINTS = {"temperature": "0.2, 0.7, 1.2   or a range   0.2:1.4:0.4",
               "seed": "1, 2, 3   or a range   1:8", "lookup": "0, 2, 4   (0 = off)",
               "draft": "off, /models/small.gguf, /models/tiny.gguf   (… adds a file)",
               "logit_bias_text": "girl=-inf, -5, 0, 5   or   girl=-10:10:5",
               "constraint": "on, off   (lane 1's output format)"}
SEED_RANDOM = -1  # the seed spin's "random" value
OPEN_CHECKPOINT, CONNECT_SERVER = -1, -2  # the lane model combo's two actions


def _model_tip(m: LaneModel) -> str:
    where = {"loaded": "the model loaded in the app", "checkpoint": m.path or m.key,
             "server": m.server}.get(m.kind, "")
    tok = f"tokenizer {m.tokenizer}" if m.tokenizer else "tokenizer not known"
    return f"{m.name} — {where} · {tok}"

# key: (label, tooltip, minimum, maximum, step, decimals or None for ints)
FIELDS = {
    "temperature": ("T", "Temperature (0 = greedy)", 0.0, 2.0, 0.05, 2),
    "top_p": ("top-p", "Top-p (1 = off)", 0.01, 1.0, 0.05, 2),
    "top_k": ("top-k", "Top-k (0 = off)", 0, 1000, 1, None),
    "min_p": ("min-p", "Min-p (0 = off)", 0.0, 0.99, 0.01, 2),
    "repetition_penalty": ("rep", "Repetition penalty (1 = off)", 0.5, 2.0, 0.05, 2),
    "max_new_tokens": ("max", "Most new tokens", 1, 8192, 16, None),
    "seed": ("seed", "Seed (random: a new one each run; the one used is saved)", SEED_RANDOM, 2**31 - 1, 1, None),
}


class LaneColumn(QFrame):
    """One lane: header with its buttons, inline settings, divergence label, text, stats.

    Signals:
        moveRequested(int): -1 left, +1 right.
        duplicateRequested(), removeRequested(), adoptRequested(): header buttons.
        settingsChanged(): a setting was edited.
        tokenHovered(int, int): lane, token index (-1, -1 when the pointer leaves a token).
        tokenClicked(int, int): lane, token index.
        modelChosen(int): an index into the models offered by :meth:`set_models`, or
            OPEN_CHECKPOINT / CONNECT_SERVER for the combo's last two entries.
    """

    moveRequested = Signal(int)
    modelChosen = Signal(int)
    duplicateRequested = Signal()
    removeRequested = Signal()
    adoptRequested = Signal()
    settingsChanged = Signal()
    tokenHovered = Signal(int, int)
    tokenClicked = Signal(int, int)

    def __init__(self, *, settings: dict, parent=None):
        super().__init__(parent)
        self.setFrameShape(QFrame.StyledPanel)
        self.setMinimumWidth(300)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self.run: LaneRun | None = None
        # A branch from another lane's token: {"src": LaneColumn | None, "from": its lane
        # number then, "at": token index, "token_id": the forced token, "kept": LaneRun of
        # the source's tokens before it}.
        self.branch: dict | None = None
        self.lane = 0
        self.model: LaneModel | None = None
        self._offered: list[LaneModel] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(4)

        head = QHBoxLayout()
        head.setSpacing(2)
        self.title = QLabel()
        self.title.setObjectName("laneTitle")
        self.title.setStyleSheet("font-weight: 600;")
        head.addWidget(self.title)
        head.addStretch(1)
        self.left_button = self._tool("prev", "Move this lane left", lambda: self.moveRequested.emit(-1))
        self.right_button = self._tool("next", "Move this lane right", lambda: self.moveRequested.emit(1))
        self.dup_button = self._tool("copy", "Duplicate this lane", self.duplicateRequested.emit)
        self.remove_button = self._tool("delete", "Remove this lane", self.removeRequested.emit)
        self.adopt_button = QToolButton()
        self.adopt_button.setText("Adopt")
        self.adopt_button.setObjectName("adoptButton")
        self.adopt_button.setToolTip("Append this lane's reply to the chat as the assistant's answer")
        self.adopt_button.clicked.connect(self.adoptRequested.emit)
        for b in (self.left_button, self.right_button, self.dup_button, self.remove_button, self.adopt_button):
            head.addWidget(b)
        lay.addLayout(head)
        self.branch_label = QLabel()
        self.branch_label.setObjectName("laneBranch")
        self.branch_label.setWordWrap(True)
        self.branch_label.setStyleSheet(f"color: {theme.colors()['accent']};")
        self.branch_label.hide()
        lay.addWidget(self.branch_label)

        self.model_combo = QComboBox()
        self.model_combo.setObjectName("laneModelCombo")
        self.model_combo.setAccessibleName("Lane model")
        self.model_combo.setToolTip("The model this lane runs on: the loaded one, another checkpoint, "
                                    "or a model on a server")
        self.model_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.model_combo.setMinimumContentsLength(12)
        self.model_combo.activated.connect(self._model_activated)
        lay.addWidget(self.model_combo)
        self.notice = QLabel()
        self.notice.setObjectName("laneNotice")
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.notice.setStyleSheet(f"color: {theme.colors()['error']};")
        self.notice.hide()
        lay.addWidget(self.notice)

        grid = QGridLayout()
        grid.setHorizontalSpacing(4)
        grid.setVerticalSpacing(2)
        self.fields: dict[str, QSpinBox | QDoubleSpinBox] = {}
        order = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens", "seed"]
        for n, key in enumerate(order):
            label, tip, lo, hi, step, dec = FIELDS[key]
            if dec is None:
                w = QSpinBox()
            else:
                w = QDoubleSpinBox()
                w.setDecimals(dec)
            w.setRange(lo, hi)
            w.setSingleStep(step)
            w.setToolTip(tip)
            w.setAccessibleName(tip)
            w.setObjectName(f"lane_{key}")
            w.setButtonSymbols(QSpinBox.NoButtons)
            w.setKeyboardTracking(False)
            if key == "seed":
                w.setSpecialValueText("random")
            lab = QLabel(label)
            lab.setToolTip(tip)
            lab.setBuddy(w)
            r, c = divmod(n, 3)
            if key == "seed":
                grid.addWidget(lab, 2, 0)
                grid.addWidget(w, 2, 1, 1, 5)
            else:
                grid.addWidget(lab, r, 2 * c)
                grid.addWidget(w, r, 2 * c + 1)
            self.fields[key] = w
        for c in (1, 3, 5):
            grid.setColumnStretch(c, 1)
        lay.addLayout(grid)
        self._speculative_row(lay)
        self._constraint_row(lay)
        self._bias_row(lay)
        self.set_settings(settings)
        for w in self.fields.values():
            w.valueChanged.connect(lambda *_: self.settingsChanged.emit())

        self.divergence = QLabel()
        self.divergence.setObjectName("laneDivergence")
        self.divergence.setWordWrap(True)
        lay.addWidget(self.divergence)

        self.browser = QTextBrowser()
        self.browser.setObjectName("laneText")
        self.browser.setOpenLinks(False)
        self.browser.setOpenExternalLinks(False)
        self.browser.setMouseTracking(True)
        self.browser.anchorClicked.connect(self._clicked)
        self.browser.highlighted.connect(self._hovered)
        lay.addWidget(self.browser, 1)

        self.stats = QLabel()
        self.stats.setObjectName("laneStats")
        self.stats.setWordWrap(True)
        self.stats.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.stats)

    def _tool(self, icon: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setIcon(theme.icon(icon))
        b.setIconSize(QSize(14, 14))
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    # -- model ---------------------------------------------------------------------------

    def set_models(self, models: list[LaneModel], current: LaneModel | None) -> None:
        """Offer ``models`` (plus "Other checkpoint…" and "Model on a server…"); show ``current``."""
        self._offered = list(models)
        self.model = current
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for m in models:
            self.model_combo.addItem(m.label(), m.kind)
            self.model_combo.setItemData(self.model_combo.count() - 1, _model_tip(m), Qt.ToolTipRole)
        if current is not None and current not in models:  # a saved lane's model that is not open
            self.model_combo.addItem(current.label() + " (not open)", current.kind)
        self.model_combo.insertSeparator(self.model_combo.count())
        self.model_combo.addItem("Other checkpoint…", OPEN_CHECKPOINT)
        self.model_combo.addItem("Model on a server…", CONNECT_SERVER)
        if current is not None:
            at = models.index(current) if current in models else len(models)
            self.model_combo.setCurrentIndex(at)
            self.model_combo.setToolTip(_model_tip(current))
        self.model_combo.blockSignals(False)

    def _model_activated(self, index: int) -> None:
        data = self.model_combo.itemData(index)
        if data in (OPEN_CHECKPOINT, CONNECT_SERVER):
            self.modelChosen.emit(data)
        elif index < len(self._offered) and self._offered[index] is not self.model:
            self.modelChosen.emit(index)

    def show_notice(self, text: str) -> None:
        """An inline message under the lane's model (a failed run or model; "" hides it)."""
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    # -- settings ------------------------------------------------------------------------

    def _speculative_row(self, lay) -> None:
        """Speculative decoding, as in the sampling panel (its controls and logic): off,
        prompt lookup with its n beside the mode, or a draft model, whose path and "…"
        take the line under it. Only one mode at a time: lookup and a draft never meet."""
        from gui.settings.panel import SpeculativeControls
        sc = self.speculative = SpeculativeControls(self, hide_unused=True)
        names = {sc.combo: ("lane_speculative", "Lane speculative decoding"),
                 sc.lookup: ("lane_lookup", "Lane prompt lookup n"),
                 sc.draft: ("lane_draft", "Lane draft model"),
                 sc.browse_button: ("lane_draft_browse", "Choose the lane's draft model")}
        for w, (name, acc) in names.items():
            w.setObjectName(name)
            w.setAccessibleName(acc)
        sc.combo.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        sc.lookup.setButtonSymbols(QSpinBox.NoButtons)
        sc.lookup.setPrefix("n ")
        row = QHBoxLayout()
        lab = QLabel("speculative")
        lab.setToolTip(sc.combo.toolTip())
        lab.setBuddy(sc.combo)
        row.addWidget(lab)
        row.addWidget(sc.combo)
        row.addWidget(sc.lookup)
        row.addStretch(1)
        lay.addLayout(row)
        lay.addWidget(sc.draft_row)  # the whole width: a model's path is long
        sc.changed.connect(self._speculative_edited)

    def _speculative_edited(self) -> None:
        # A draft model path that names nothing is said at once (Run would refuse the lane).
        path = self.speculative.values()["draft"]
        gone = bool(path) and not Path(path).expanduser().exists()
        if gone:
            self.show_notice(f"Draft model not found: {path}")
        elif self.notice.text().startswith("Draft model not found"):
            self.show_notice("")
        self.settingsChanged.emit()

    def _constraint_row(self, lay) -> None:
        """The lane's output format: a kind and its text (a JSON schema, regex or grammar
        pasted on one line), checked as typed; problems show in the lane's notice."""
        from gui.settings.panel import CONSTRAINT_HINTS, CONSTRAINT_KINDS
        row = QHBoxLayout()
        self.constraint_kind = QComboBox()
        self.constraint_kind.setObjectName("lane_constraint_kind")
        self.constraint_kind.setAccessibleName("Lane output format")
        self.constraint_kind.setToolTip("Hold this lane's reply to a JSON schema, a regular expression or a grammar")
        for key, label in CONSTRAINT_KINDS:
            self.constraint_kind.addItem(label, key)
        self.constraint_kind.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.constraint_kind.setMinimumContentsLength(8)
        self.constraint_text = QLineEdit()
        self.constraint_text.setObjectName("lane_constraint_text")
        self.constraint_text.setAccessibleName("Lane output format text")
        self._hints = CONSTRAINT_HINTS
        lab = QLabel("format")
        lab.setBuddy(self.constraint_kind)
        row.addWidget(lab)
        row.addWidget(self.constraint_kind)
        row.addWidget(self.constraint_text, 1)
        lay.addLayout(row)
        self.constraint_kind.currentIndexChanged.connect(self._constraint_edited)
        self.constraint_text.editingFinished.connect(self._constraint_edited)
        self._show_constraint()

    def _bias_row(self, lay) -> None:
        """The lane's logit bias: TEXT=BIAS items as in the sampling panel's field (malformed
        ones are left out and named in the line under it)."""
        row = QHBoxLayout()
        self.bias_edit = QLineEdit()
        self.bias_edit.setObjectName("lane_logit_bias")
        tip = ("Favour or ban words in this lane: TEXT=BIAS, comma-separated (\\, for a comma in TEXT). BIAS is "
               "added to the logits of TEXT's tokens before the filters: -100 to 100, or -inf for never.")
        self.bias_edit.setToolTip(tip)
        self.bias_edit.setAccessibleName("Lane logit bias")
        self.bias_edit.setPlaceholderText("e.g. dragon=+5, Once=-inf")
        self.bias_edit.setClearButtonEnabled(True)
        lab = QLabel("bias")
        lab.setToolTip(tip)
        lab.setBuddy(self.bias_edit)
        row.addWidget(lab)
        row.addWidget(self.bias_edit, 1)
        lay.addLayout(row)
        self.bias_notice = QLabel()
        self.bias_notice.setObjectName("laneBiasNotice")
        self.bias_notice.setWordWrap(True)
        self.bias_notice.setStyleSheet(f"color: {theme.colors()['error']};")
        self.bias_notice.hide()
        lay.addWidget(self.bias_notice)
        self._last_bias = ""
        self.bias_edit.editingFinished.connect(self._bias_edited)

    def logit_bias(self) -> list[str]:
        """The lane's well-formed TEXT=BIAS items."""
        from gui.settings.panel import bias_items
        return list(bias_items(self.bias_edit.text())[0])

    def _bias_edited(self) -> None:
        from gui.settings.panel import bias_items
        bad = bias_items(self.bias_edit.text())[1]
        self.bias_notice.setText("Left out: " + "; ".join(bad) if bad else "")
        self.bias_notice.setVisible(bool(bad))
        if self.bias_edit.text() != self._last_bias:
            self._last_bias = self.bias_edit.text()
            self.settingsChanged.emit()

    def constraint(self) -> dict | None:
        from core.engine.constrain import from_editor
        c = from_editor(self.constraint_kind.currentData(), self.constraint_text.text())
        return None if c is None else c.to_dict()

    def _show_constraint(self) -> None:
        kind = self.constraint_kind.currentData()
        self.constraint_text.setVisible(bool(kind) and kind != "json_object")
        self.constraint_text.setPlaceholderText(self._hints.get(kind, ""))

    def _constraint_edited(self, *_) -> None:
        from core.engine.constrain import Constraint, syntax_error
        self._show_constraint()
        c = self.constraint()
        msg = syntax_error(Constraint(**c)) if c is not None else ""
        self.show_notice(msg[:1].upper() + msg[1:])
        self.settingsChanged.emit()

    def settings(self) -> dict:
        d = {"constraint": self.constraint(), "logit_bias_text": self.logit_bias(), **self.speculative.values()}
        for key, w in self.fields.items():
            v = w.value()
            if key == "seed":
                v = None if v == SEED_RANDOM else int(v)
            elif isinstance(w, QSpinBox):
                v = int(v)
            else:
                v = round(float(v), 4)
            d[key] = v
        return d

    def set_settings(self, d: dict) -> None:
        if "constraint" in d:
            c = d["constraint"] if isinstance(d["constraint"], dict) else {}
            for w in (self.constraint_kind, self.constraint_text):
                w.blockSignals(True)
            self.constraint_kind.setCurrentIndex(max(0, self.constraint_kind.findData(c.get("kind", ""))))
            self.constraint_text.setText(str(c.get("text") or ""))
            for w in (self.constraint_kind, self.constraint_text):
                w.blockSignals(False)
            self._show_constraint()
        spec = {k: d[k] for k in ("lookup", "draft") if k in d}
        if not isinstance(spec.get("lookup", 0), int) or isinstance(spec.get("lookup"), bool):
            spec["lookup"] = 0  # saved data is data: a lookup is a whole number or nothing
        if spec:
            if spec.get("lookup") and "draft" not in spec:
                spec["draft"] = ""  # lookup named alone: it replaces a draft model
            self.speculative.apply({**self.speculative.values(), **spec})  # a draft wins over lookup
        if "logit_bias_text" in d:
            from gui.settings.panel import format_stop_strings
            self._last_bias = format_stop_strings([str(x) for x in d["logit_bias_text"] or ()])
            self.bias_edit.setText(self._last_bias)
            self.bias_notice.hide()
        for key, w in self.fields.items():
            if key not in d:
                continue
            v = d[key]
            if key == "seed":
                v = SEED_RANDOM if v is None else int(v) % (2**31)
            w.blockSignals(True)
            w.setValue(v)
            w.blockSignals(False)

    def set_index(self, lane: int, count: int, baseline: bool) -> None:
        self.lane = lane
        self.setObjectName(f"compareLane{lane}")
        self.setAccessibleName(f"Lane {lane + 1}")
        self.title.setText(f"Lane {lane + 1}" + ("  · baseline" if baseline else ""))
        self.branch_label.setText(self.branch_note().strip(" ·").capitalize())
        self.branch_label.setVisible(bool(self.branch))
        self.left_button.setEnabled(lane > 0)
        self.right_button.setEnabled(lane < count - 1)
        self.remove_button.setEnabled(count > 1)
        self.dup_button.setEnabled(count < MAX_LANES)

    def branch_note(self) -> str:
        """' · branched from lane N at token I' for a branch (N: its source's number now
        while that lane is here, else as it was)."""
        if not self.branch:
            return ""
        return f"  · branched from lane {self.branch_source()} at token {self.branch['at'] + 1}"

    def branch_source(self) -> int:
        """The number of the lane this one branched from (as it was, once that lane is gone)."""
        cols = self.columns_now()
        return cols.index(self.branch["src"]) + 1 if self.branch.get("src") in cols else self.branch["from"]

    def columns_now(self) -> list:
        return []  # the view sets this to its lane list

    def set_editable(self, on: bool, seed_locked: bool) -> None:
        self.model_combo.setEnabled(on)
        self.constraint_kind.setEnabled(on)
        self.constraint_text.setEnabled(on)
        self.bias_edit.setEnabled(on)
        self.speculative.enable(on)
        for key, w in self.fields.items():
            w.setEnabled(on and not (key == "seed" and seed_locked and self.lane > 0))
        for b in (self.left_button, self.right_button, self.dup_button, self.remove_button):
            b.setVisible(on)
        self.adopt_button.setEnabled(on and self.run is not None and self.run.finished and bool(self.run.text))

    # -- tokens --------------------------------------------------------------------------

    def _clicked(self, url: QUrl) -> None:
        hit = parse_anchor(url.toString())
        if hit is not None:
            self.tokenClicked.emit(*hit)

    def _hovered(self, url) -> None:
        hit = parse_anchor(url.toString() if isinstance(url, QUrl) else str(url))
        self.tokenHovered.emit(*(hit or (-1, -1)))

    def set_html(self, html: str, follow: bool) -> None:
        bar = self.browser.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        keep = bar.value()
        self.browser.setHtml(html)
        bar.setValue(bar.maximum() if (follow and at_end) else keep)


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


class CompareView(QWidget):
    """The comparison window (objectName ``compareView``).

    Signals:
        adoptRequested(str, dict): a lane's reply should join the chat (text, and a dict
            with settings, seed, stats, stop_reason, lane); emitted by :meth:`adopt`
            after it wrote the reply through ``conversation`` when one was given.

    Args:
        bridge: the :class:`gui.bridge.Bridge` (its ``compare`` and ``cancel``).
        history: the :class:`core.history.store.History` comparisons are saved in.
        prompt: the prompt text to start with.
        messages: the conversation so far, offered as context (chat mode).
        lanes: settings of the starting lanes (SamplingParams or dicts); default one lane.
        mode: "chat" or "completion"; chat_format: the override sent with the request.
        conversation: a :class:`gui.chat.conversation.ConversationModel` that "Adopt" writes to.
        token_text: id -> text, to name the inspector's alternatives (the loaded model's
            tokenizer; lanes on other tokenizers use the names their tokens carry).
        inspect: alternatives recorded per token (the worker's ``inspect``).
        models: the models lanes can run on (:class:`LaneModel`); default the loaded one.
        lane_models: each starting lane's model (default the first of ``models``).
        server_dialog: ``factory(parent) -> dialog`` whose ``connected(RemoteModel)`` signal gives
            a connected server's model ("Model on a server…"); None: that entry says how.
    """

    adoptRequested = Signal(str, dict)

    def __init__(self, *, bridge, history, prompt: str = "", messages: list[dict] | None = None,
                 lanes: list | None = None, mode: str = "chat", chat_format: str = "auto",
                 conversation=None, token_text: Callable[[int], str | None] | None = None,
                 inspect: int = DEFAULT_INSPECT, models: list[LaneModel] | None = None,
                 lane_models: list[LaneModel] | None = None, server_dialog: Callable[[], object] | None = None,
                 parent=None):
        super().__init__(parent)
        self.setObjectName("compareView")
        self.setAccessibleName("Compare sampling settings")
        self.setWindowTitle("Compare settings and models — LlamaDesk")
        self.bridge = bridge
        self.history = history
        self.conversation = conversation
        self.inspect = int(inspect)
        self.chat_format = chat_format
        self.context: list[dict] = list(messages or [])
        first = (lanes or [None])[0]
        first = first.to_dict() if isinstance(first, SamplingParams) else dict(first or {})
        self.stop_strings: tuple[str, ...] = tuple(first.get("stop") or ())  # shared by every lane
        self.columns: list[LaneColumn] = []
        self.baseline = 0
        self.selected: tuple[int, int] | None = None
        self.saved_id: int | None = None
        self.last_prompt: dict | None = None  # the prompt of the shown results
        self._task: asyncio.Task | None = None
        self._streams: list = []
        self._stop_asked = False
        self._running_columns: list[LaneColumn] = []
        self.renders = 0  # how many times lanes were re-rendered (tests check throttling)
        self._token_text = token_text
        self._hold_tasks: set[asyncio.Task] = set()
        self._names: dict[str, dict[int, str]] = {}  # tokenizer -> id -> piece seen in its lanes
        self.server_dialog = server_dialog
        self.models: list[LaneModel] = list(models) if models else [self._loaded_model_from(
            getattr(bridge, "model_info", None))]
        loaded_signal = getattr(bridge, "modelLoaded", None)
        if loaded_signal is not None:
            loaded_signal.connect(self._main_model_changed)
        self._build(prompt, mode, token_text)
        for i, s in enumerate(lanes or [SamplingParams()]):
            model = lane_models[i] if lane_models and i < len(lane_models) else None
            self.add_lane(s.to_dict() if isinstance(s, SamplingParams) else dict(s), model=model)
        self._refresh()
        self.resize(1280, 760)

    # ------------------------------------------------------------------ layout
    def _button(self, text: str, name: str, tip: str, slot, icon: str | None = None) -> QPushButton:
        b = QPushButton(text)
        b.setObjectName(name)
        b.setAccessibleName(text.replace("&", "") or tip)
        b.setToolTip(tip)
        if icon:
            b.setIcon(theme.icon(icon))
        b.clicked.connect(slot)
        return b

    def _build(self, prompt: str, mode: str, token_text) -> None:
        root = QVBoxLayout(self)
        root.setContentsMargins(8, 8, 8, 6)
        root.setSpacing(6)

        top = QHBoxLayout()
        self.prompt_edit = QPlainTextEdit(prompt)
        self.prompt_edit.setObjectName("comparePrompt")
        self.prompt_edit.setAccessibleName("Comparison prompt")
        self.prompt_edit.setPlaceholderText("The prompt every lane answers…")
        self.prompt_edit.setFixedHeight(64)
        top.addWidget(self.prompt_edit, 1)
        side = QVBoxLayout()
        self.mode_combo = QComboBox()
        self.mode_combo.setObjectName("compareModeCombo")
        self.mode_combo.setAccessibleName("Prompt mode")
        self.mode_combo.addItem("Chat", "chat")
        self.mode_combo.addItem("Completion", "completion")
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(mode)))
        self.mode_combo.setToolTip("Chat: the prompt is a user turn in the model's chat format. "
                                   "Completion: the model continues the text.")
        self.context_check = QCheckBox(f"Conversation as context ({len(self.context)} messages)")
        self.context_check.setObjectName("compareContextCheck")
        self.context_check.setEnabled(bool(self.context))
        self.context_check.setChecked(bool(self.context))
        self.context_check.setToolTip("Send the open conversation before the prompt (chat mode)")
        self.context_check.setVisible(bool(self.context))
        side.addWidget(self.mode_combo)
        side.addWidget(self.context_check)
        side.addStretch(1)
        top.addLayout(side)
        root.addLayout(top)

        bar = QHBoxLayout()
        bar.setSpacing(6)
        self.run_button = self._button("Run", "compareRunButton", "Run every lane (Ctrl+Enter)", self.run, "send")
        self.stop_button = self._button("Stop", "compareStopButton", "Stop all lanes (Esc)", self.stop, "stop")
        self.rerun_button = self._button("Re-run", "compareRerunButton",
                                         "Run again with exactly the settings and seeds of the results shown",
                                         lambda: self.run(again=True), "regenerate")
        self.reseed_button = self._button("New seeds", "compareNewSeedsButton",
                                          "Run again with a fresh seed for every lane (one shared seed when locked)",
                                          lambda: self.run(new_seeds=True))
        self.add_button = self._button("Add lane", "addLaneButton", "Add a lane (a copy of the last one)",
                                       lambda: self.add_lane(), "new")
        self.sweep_button = self._button("Sweep…", "sweepButton",
                                         "Make one lane per value of one setting", self._toggle_sweep)
        self.sweep_button.setCheckable(True)
        self.seed_lock = QCheckBox("Same seed")
        self.seed_lock.setObjectName("seedLockCheck")
        self.seed_lock.setToolTip("Give every lane lane 1's seed, so only the other settings differ")
        self.seed_lock.toggled.connect(self._seed_lock_toggled)
        self.baseline_combo = QComboBox()
        self.baseline_combo.setObjectName("baselineCombo")
        self.baseline_combo.setAccessibleName("Baseline lane")
        self.baseline_combo.setToolTip("The lane the others are compared with")
        self.baseline_combo.currentIndexChanged.connect(self._baseline_chosen)
        self.heatmap_check = QCheckBox("Heatmap")
        self.heatmap_check.setObjectName("heatmapCheck")
        self.heatmap_check.setToolTip("Shade each token by how surprising it was (1 − p): "
                                      "the darker, the less likely the pick")
        self.heatmap_check.toggled.connect(lambda *_: self.render(all_lanes=True))
        self.save_button = self._button("Save", "compareSaveButton", "Save this comparison in the history",
                                        lambda: self.save())
        self.saved_button = QToolButton()
        self.saved_button.setText("Saved")
        self.saved_button.setObjectName("compareSavedButton")
        self.saved_button.setToolTip("Reopen a saved comparison")
        self.saved_button.setPopupMode(QToolButton.InstantPopup)
        self.saved_menu = QMenu(self.saved_button)
        self.saved_menu.aboutToShow.connect(self._fill_saved_menu)
        self.saved_button.setMenu(self.saved_menu)
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setObjectName("compareExportButton")
        self.export_button.setIcon(theme.icon("export"))
        self.export_button.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.export_button.setPopupMode(QToolButton.InstantPopup)
        m = QMenu(self.export_button)
        m.addAction("Markdown…", lambda: self.export("md"))
        m.addAction("JSON…", lambda: self.export("json"))
        self.export_button.setMenu(m)
        for w in (self.run_button, self.stop_button, self.rerun_button, self.reseed_button):
            bar.addWidget(w)
        bar.addSpacing(12)
        for w in (self.add_button, self.sweep_button, self.seed_lock):
            bar.addWidget(w)
        bar.addSpacing(12)
        base_label = QLabel("Baseline")
        base_label.setBuddy(self.baseline_combo)
        bar.addWidget(base_label)
        bar.addWidget(self.baseline_combo)
        bar.addWidget(self.heatmap_check)
        bar.addStretch(1)
        for w in (self.save_button, self.saved_button, self.export_button):
            bar.addWidget(w)
        root.addLayout(bar)

        self.sweep_row = QFrame()
        self.sweep_row.setObjectName("sweepRow")
        srow = QHBoxLayout(self.sweep_row)
        srow.setContentsMargins(0, 0, 0, 0)
        self.sweep_param = QComboBox()
        self.sweep_param.setObjectName("sweepParamCombo")
        self.sweep_param.setAccessibleName("Setting to sweep")
        for key in SWEEP_KEYS:
            self.sweep_param.addItem(SWEEP_NAMES.get(key, key.replace("_", " ")), key)
        self.sweep_param.currentIndexChanged.connect(self._sweep_param_chosen)
        self.sweep_values = QLineEdit()
        self.sweep_values.setObjectName("sweepValuesEdit")
        self.sweep_values.setAccessibleName("Sweep values")
        self.sweep_values.setPlaceholderText(SWEEP_HINTS["temperature"])
        self.sweep_values.returnPressed.connect(self.apply_sweep)
        self.sweep_apply = self._button("Make lanes", "sweepApplyButton",
                                        "Replace the lanes: one per value, the rest copied from lane 1",
                                        self.apply_sweep)
        self.sweep_browse = self._button("…", "sweepBrowseButton", "Add a draft model's file (or a model folder's) "
                                         "to the values", self._sweep_add_model)
        self.sweep_browse.setMaximumWidth(self.sweep_browse.fontMetrics().horizontalAdvance("…") + 24)
        self.sweep_browse.hide()
        self.sweep_error = QLabel()
        self.sweep_error.setObjectName("sweepError")
        self.sweep_error.setStyleSheet(f"color: {theme.colors()['error']};")
        srow.addWidget(QLabel("Sweep"))
        srow.addWidget(self.sweep_param)
        srow.addWidget(self.sweep_values, 1)
        srow.addWidget(self.sweep_browse)
        srow.addWidget(self.sweep_apply)
        srow.addWidget(self.sweep_error)
        self.sweep_row.setVisible(False)
        root.addWidget(self.sweep_row)

        self.splitter = QSplitter(Qt.Horizontal)
        self.scroll = QScrollArea()
        self.scroll.setObjectName("compareLanes")
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        self.lanes_host = QWidget()
        self.lanes_layout = QHBoxLayout(self.lanes_host)
        self.lanes_layout.setContentsMargins(0, 0, 0, 0)
        self.lanes_layout.setSpacing(6)
        self.scroll.setWidget(self.lanes_host)
        self.inspector = TokenInspector(token_text=token_text)
        self.inspector.ban_label = "Ban “{}” in this lane"
        self.inspector.ban_button.setToolTip("Add TEXT=-inf for the chosen token to this lane's logit bias "
                                             "(it takes effect at the next Run)")
        self.inspector.branch_button.setToolTip("A new lane with this lane's settings: its tokens up to here, "
                                                "then the chosen alternative, and the model carries on")
        self.inspector.set_can_branch(True)
        self.inspector.branchRequested.connect(lambda lane, i, tok: self.branch_lane(lane, i, tok))
        self.inspector.banRequested.connect(lambda lane, i, tok: self.ban_in_lane(lane, i, tok))
        self.splitter.addWidget(self.scroll)
        self.splitter.addWidget(self.inspector)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        self.splitter.setSizes([1000, 270])
        root.addWidget(self.splitter, 1)

        self.status = QLabel("Set up the lanes and press Run.")
        self.status.setObjectName("compareStatus")
        self.status.setWordWrap(True)
        root.addWidget(self.status)

        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.run)
        QShortcut(QKeySequence("Ctrl+Enter"), self, activated=self.run)
        QShortcut(QKeySequence("Esc"), self, activated=self.stop)

    # ------------------------------------------------------------------ lanes
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def lane_count(self) -> int:
        return len(self.columns)

    def add_lane(self, settings: dict | None = None, at: int | None = None,
                 model: LaneModel | None = None) -> LaneColumn | None:
        """Add a lane (default: a copy of the last lane's settings and model); None when full or running."""
        if len(self.columns) >= MAX_LANES or self.running:
            return None
        if model is None:
            model = self.columns[-1].model if self.columns and settings is None else self.models[0]
        if settings is None:
            settings = self.columns[-1].settings() if self.columns else SamplingParams().to_dict()
        full = {**SamplingParams().to_dict(), **settings}  # unset keys: the sampler's defaults
        col = LaneColumn(settings={k: v for k, v in full.items() if k in LANE_KEYS})
        col.columns_now = lambda: self.columns
        col.moveRequested.connect(lambda step, c=col: self.move_lane(self.columns.index(c), step))
        col.duplicateRequested.connect(lambda c=col: self.duplicate_lane(self.columns.index(c)))
        col.removeRequested.connect(lambda c=col: self.remove_lane(self.columns.index(c)))
        col.adoptRequested.connect(lambda c=col: self.adopt(self.columns.index(c)))
        col.settingsChanged.connect(lambda c=col: self._settings_edited(c))
        col.tokenHovered.connect(self._token_hovered)
        col.tokenClicked.connect(self._token_clicked)
        col.modelChosen.connect(lambda index, c=col: self._model_chosen(c, index))
        col.set_models(self.models, model)
        at = len(self.columns) if at is None else at
        self.columns.insert(at, col)
        self._relayout()
        return col

    def duplicate_lane(self, i: int) -> None:
        self.add_lane(self.columns[i].settings(), at=i + 1, model=self.columns[i].model)

    def remove_lane(self, i: int) -> None:
        if len(self.columns) <= 1 or self.running:
            return
        col = self.columns.pop(i)
        col.setParent(None)
        col.deleteLater()
        if self.baseline == i:
            self.baseline = 0
        elif self.baseline > i:
            self.baseline -= 1
        self.selected = None
        self.inspector.clear()
        self._relayout()

    def move_lane(self, i: int, step: int) -> None:
        j = i + step
        if self.running or not (0 <= i < len(self.columns) and 0 <= j < len(self.columns)):
            return
        self.columns[i], self.columns[j] = self.columns[j], self.columns[i]
        if self.baseline in (i, j):
            self.baseline = j if self.baseline == i else i
        self.selected = None
        self._relayout()

    def set_lanes(self, settings: list[dict], models: list[LaneModel] | None = None) -> None:
        """Replace all lanes (settings and models; results are cleared). Without ``models``
        every lane keeps the first lane's model."""
        if self.running:
            return
        for col in self.columns:
            col.setParent(None)
            col.deleteLater()
        keep = self.columns[0].model if self.columns else self.models[0]
        self.columns = []
        self.baseline = 0
        self.selected = None
        self.inspector.clear()
        for i, s in enumerate(settings[:MAX_LANES]):
            self.add_lane(s, model=models[i] if models and i < len(models) else keep)
        self._relayout()

    def lane_settings(self) -> list[dict]:
        """Every lane's settings as shown (seeds None where "random")."""
        out = [{**c.settings(), "stop": list(self.stop_strings)} for c in self.columns]
        if self.seed_lock.isChecked() and out:
            out = [{**s, "seed": out[0]["seed"]} for s in out]
        return out

    # ------------------------------------------------------------------ models
    @staticmethod
    def _loaded_model_from(info: dict | None) -> LaneModel:
        info = info or {}
        return LaneModel("loaded", str(info.get("name") or "Loaded model"), tokenizer=info.get("tokenizer"),
                         path=str(info.get("path") or ""), dummy_prefix=bool(info.get("dummy_prefix")))

    def _main_model_changed(self, info: dict) -> None:
        """The app loaded another model: lanes on "the loaded model" now run on it."""
        fresh = self._loaded_model_from(info)
        for m in self.models:
            if m.kind == "loaded":
                m.name, m.tokenizer, m.path, m.dummy_prefix = fresh.name, fresh.tokenizer, fresh.path, fresh.dummy_prefix
        self._offer_models()

    def _offer_models(self) -> None:
        for col in self.columns:
            col.set_models(self.models, col.model)

    def model_of(self, lane: int) -> LaneModel:
        return self.columns[lane].model or self.models[0]

    def set_lane_model(self, lane: int, model: LaneModel) -> None:
        """Run ``lane`` on ``model`` (added to the models offered); its old results go."""
        if self.running:
            return
        if model not in self.models:
            self.models.append(model)
        col = self.columns[lane]
        if col.model is not model:
            col.run = None
            self.selected = None
        col.model = model
        col.show_notice("")
        self._offer_models()
        self._refresh()
        self.render(all_lanes=True)

    def add_server(self, remote) -> LaneModel:
        """A connected :class:`core.remote.client.RemoteModel` as a lane model (once per server and model)."""
        for m in self.models:
            if m.kind == "server" and m.remote is not None and m.remote.url == remote.url and m.name == remote.model:
                m.remote = remote
                m.tokenizer = remote.tokenizer_fingerprint
                return m
        m = LaneModel("server", str(remote.model), remote=remote, tokenizer=remote.tokenizer_fingerprint)
        self.models.append(m)
        self._offer_models()
        return m

    def _model_chosen(self, col: LaneColumn, index: int) -> None:
        lane = self.columns.index(col)
        if index == OPEN_CHECKPOINT:
            col.set_models(self.models, col.model)  # the combo shows the lane's model until one opens
            path = self.ask_checkpoint_path()
            if path:
                self.open_checkpoint(lane, path)
        elif index == CONNECT_SERVER:
            col.set_models(self.models, col.model)
            self.connect_server(lane)
        elif 0 <= index < len(self.models):
            self.set_lane_model(lane, self.models[index])

    def ask_checkpoint_path(self) -> str | None:
        """Which checkpoint a lane should run on (a file dialog; tests replace this)."""
        from gui.settings.panel import choose_model_path
        return choose_model_path(self, "Open a checkpoint for this lane")

    def open_checkpoint(self, lane: int, path: str) -> asyncio.Task | None:
        """Load ``path`` beside the app's model (memory checked as for a load) and run
        ``lane`` on it; a failure is shown in the lane. Returns the task."""
        if self.running or not 0 <= lane < len(self.columns):
            return None
        col = self.columns[lane]
        loaded = next((m for m in self.models if m.kind == "loaded"), None)
        if loaded is not None and loaded.path and _same_path(loaded.path, path):
            self.set_lane_model(lane, loaded)  # that is the loaded model: no second copy
            return None
        known = next((m for m in self.models if m.kind == "checkpoint" and m.key and _same_path(m.key, path)), None)
        if known is not None:
            self.set_lane_model(lane, known)
            return None

        async def hold() -> None:
            from gui.bridge import BridgeError
            name = Path(path).name
            col.show_notice("")
            self.status.setText(f"Opening {name} for lane {self.columns.index(col) + 1}…")
            try:
                info = await self.bridge.hold(path)
            except BridgeError as e:
                if col in self.columns:
                    col.show_notice(f"Could not open {name}: {e}")
                self.status.setText(f"Could not open {name}.")
                return
            model = self._held_model(info)
            if col in self.columns:
                self.set_lane_model(self.columns.index(col), model)
            self.status.setText(f"Lane {self.columns.index(col) + 1 if col in self.columns else '?'} "
                                f"runs on {model.name}" + ("" if loaded is None or tokenizers_match(model, loaded)
                                                          else " (another tokenizer: compared by text)") + ".")
        task = asyncio.ensure_future(hold())
        self._hold_tasks.add(task)
        task.add_done_callback(self._hold_tasks.discard)
        return task

    def _held_model(self, info: dict) -> LaneModel:
        for m in self.models:
            if m.kind == "checkpoint" and (m.key == info["key"] or (not m.key and _same_path(m.path, info["key"]))):
                m.key, m.tokenizer, m.name = info["key"], info.get("tokenizer"), str(info.get("name") or m.name)
                m.dummy_prefix = bool(info.get("dummy_prefix"))
                return m
        m = LaneModel("checkpoint", str(info.get("name") or Path(info["key"]).name), key=info["key"],
                      tokenizer=info.get("tokenizer"), path=str(info.get("path") or info["key"]),
                      dummy_prefix=bool(info.get("dummy_prefix")))
        self.models.append(m)
        return m

    def connect_server(self, lane: int):
        """"Model on a server…": the app's Connect to Server dialog; the model it connects
        becomes this lane's. Without one, the lane says where to connect."""
        col = self.columns[lane]
        if self.server_dialog is None:
            col.show_notice("Connect to a server first (Model → Connect to Server…), then choose it here.")
            return None
        dlg = self.server_dialog(self)

        def connected(remote) -> None:
            if col in self.columns:
                self.set_lane_model(self.columns.index(col), self.add_server(remote))
        dlg.connected.connect(connected)
        dlg.open()  # window-modal, never a nested event loop
        return dlg

    def _relayout(self) -> None:
        while self.lanes_layout.count():
            self.lanes_layout.takeAt(0)
        for i, col in enumerate(self.columns):
            self.lanes_layout.addWidget(col, 1)
            # Result runs keep their lane numbers in anchors: re-render under the new index.
        self._refresh()
        self.render(all_lanes=True)

    def _refresh(self) -> None:
        """Names, titles, enabled states and the baseline list after any change."""
        n = len(self.columns)
        self.baseline = min(self.baseline, max(n - 1, 0))
        self.baseline_combo.blockSignals(True)
        self.baseline_combo.clear()
        for i in range(n):
            self.baseline_combo.addItem(f"Lane {i + 1}", i)
        self.baseline_combo.setCurrentIndex(self.baseline)
        self.baseline_combo.blockSignals(False)
        running = self.running
        locked = self.seed_lock.isChecked()
        if locked and self.columns:
            seed = self.columns[0].settings()["seed"]
            for col in self.columns[1:]:
                col.set_settings({"seed": seed})
        for i, col in enumerate(self.columns):
            col.set_index(i, n, i == self.baseline)
            col.set_editable(not running, locked)
        has_results = any(c.run is not None for c in self.columns)
        self.run_button.setEnabled(not running and n > 0)
        self.stop_button.setEnabled(running)
        self.rerun_button.setEnabled(not running and has_results)
        self.reseed_button.setEnabled(not running and n > 0)
        self.add_button.setEnabled(not running and n < MAX_LANES)
        self.sweep_button.setEnabled(not running)
        self.sweep_apply.setEnabled(not running)
        self.sweep_browse.setEnabled(not running)
        self.save_button.setEnabled(not running and has_results)
        self.export_button.setEnabled(not running and has_results)
        self.seed_lock.setEnabled(not running)

    def _settings_edited(self, col: LaneColumn) -> None:
        if self.seed_lock.isChecked() and self.columns and col is self.columns[0]:
            self._refresh()
        base = self.columns[self.baseline].settings() if self.columns else None
        for i, c in enumerate(self.columns):  # an edit of the baseline changes every summary
            if c.run is None:
                c.divergence.setText(self._summary(i, c, base))

    def _summary(self, i: int, col: LaneColumn, base_settings: dict | None) -> str:
        """A lane without results: how its settings differ from the baseline's ('T 2')."""
        return settings_label(col.settings(), base_settings) if i != self.baseline else ""

    def _seed_lock_toggled(self, on: bool) -> None:
        if on and self.columns and self.columns[0].settings()["seed"] is None:
            # A lock on "random" would give each lane its own draw: pick the shared seed now.
            self.columns[0].set_settings({"seed": random.randrange(2**31)})
        self._refresh()

    def _baseline_chosen(self, index: int) -> None:
        if index >= 0:
            self.baseline = index
            self._refresh()
            self.render(all_lanes=True)

    def _sweep_param_chosen(self, *_) -> None:
        key = self.sweep_param.currentData()
        self.sweep_values.setPlaceholderText(SWEEP_HINTS.get(key, SWEEP_HINTS["temperature"]))
        self.sweep_browse.setVisible(key == "draft")
        self.sweep_error.setText("")

    def _sweep_add_model(self) -> None:
        """"…" of a draft model sweep: a chosen model's path joins the values."""
        from gui.settings.panel import choose_model_path
        path = choose_model_path(self, "Add a draft model to the sweep")
        if path:
            text = self.sweep_values.text().strip().rstrip(",")
            self.sweep_values.setText(f"{text}, {path}" if text else f"off, {path}")

    def _toggle_sweep(self, on: bool) -> None:
        self.sweep_row.setVisible(on)
        if on:
            self.sweep_values.setFocus()

    def apply_sweep(self, param: str | None = None, values: str | None = None) -> bool:
        """Replace the lanes with one per value of ``param`` (default: the sweep row's)."""
        if self.running:
            return False
        param = param or self.sweep_param.currentData()
        text = self.sweep_values.text() if values is None else values
        try:
            vals = parse_sweep(text, param)
        except LlamaDeskError as e:
            self.sweep_error.setText(str(e))
            return False
        self.sweep_error.setText("")
        base = self.lane_settings()[0] if self.columns else SamplingParams().to_dict()
        if param == "seed" and self.seed_lock.isChecked():
            self.seed_lock.setChecked(False)  # a seed sweep needs different seeds
        try:
            lanes = sweep_lanes(base, param, vals)
        except LlamaDeskError as e:
            self.sweep_error.setText(str(e))
            return False
        self.set_lanes(lanes)

        def shown(v) -> str:
            if param == "draft":
                return draft_name(v)
            return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)
        self.status.setText(f"{len(vals)} lanes over {SWEEP_NAMES.get(param, param.replace('_', ' '))}: "
                            + ", ".join(shown(v) for v in vals))
        return True

    # ------------------------------------------------------------------ running
    def _prompt_dict(self) -> dict:
        mode = self.mode_combo.currentData()
        d = {"text": self.prompt_edit.toPlainText(), "mode": mode, "chat_format": self.chat_format}
        if mode == "chat":
            msgs = list(self.context) if self.context_check.isChecked() else []
            if d["text"].strip():
                msgs.append({"role": "user", "content": d["text"]})
            d["messages"] = msgs
        return d

    def run(self, *, again: bool = False, new_seeds: bool = False,
            only: list[LaneColumn] | None = None) -> asyncio.Task | None:
        """Start the comparison; ``again`` re-runs the shown results' exact settings,
        ``new_seeds`` draws fresh seeds first; ``only``: run just these lanes (the others
        keep their results). Returns the task (None if not started)."""
        if self.running:
            return None
        if again and all(c.run is not None and c.run.params for c in self.columns):
            for col in self.columns:
                col.set_settings(col.run.params)
        if new_seeds:
            shared = random.randrange(2**31)
            for col in self.columns:
                col.set_settings({"seed": shared if self.seed_lock.isChecked() else random.randrange(2**31)})
        prompt = self._prompt_dict()
        if not prompt["text"].strip() and not prompt.get("messages"):
            self.status.setText("Write a prompt first.")
            return None
        try:
            params = [SamplingParams.from_dict(s).validate() for s in self.lane_settings()]
        except LlamaDeskError as e:
            self.status.setText(f"Settings: {e}")
            return None
        targets = [i for i, c in enumerate(self.columns) if only is None or c in only]
        # LlamaDesk's own serve takes a bias by text and speculation (extension fields, split
        # and run by its engine); another server has neither, nor a tokenizer known here.
        remote = [i for i in targets if self.model_of(i).kind == "server"
                  and not (self.model_of(i).remote is not None and self.model_of(i).remote.is_llamadesk)]
        remote_bias = [i for i in remote if params[i].logit_bias_text]
        for i in remote_bias:
            self.columns[i].show_notice("A logit bias by text needs the model's tokenizer, and this server's is not "
                                        "known here (LlamaDesk's serve takes it): clear the lane's bias or run it "
                                        "on a local model.")
        remote_spec = [i for i in remote if params[i].speculative and i not in remote_bias]
        for i in remote_spec:
            self.columns[i].show_notice("Prompt lookup and draft models run in LlamaDesk's engine (here or in its "
                                        "serve); this server decodes on its own: set the lane's speculative "
                                        "decoding to Off, or run it on a local model.")
        if remote_bias or remote_spec:
            self.status.setText("Settings: " + " · ".join(
                f"lane {', '.join(str(i + 1) for i in lanes)} {what} on a server"
                for lanes, what in ((remote_bias, "sets a logit bias"), (remote_spec, "drafts (speculative)"))
                if lanes))
            return None
        # Lanes on one model run as one request (one prefill, one batch); each model's
        # request runs beside the others' (servers in parallel with the local worker). A
        # branched lane is a request of its own: its kept tokens end the prompt (the KV
        # cache still holds them) and its chosen token is forced.
        cols = [self.columns[i] for i in targets]
        params = [params[i] for i in targets]
        groups: dict[tuple, list[int]] = {}
        for k, col in enumerate(cols):
            groups.setdefault(("branch", id(col)) if col.branch else self.model_of(targets[k]).group, []).append(k)
        plan = []
        for idx in groups.values():
            b = cols[idx[0]].branch
            extra = {"reply_prefix": b["kept"].ids, "forced": [b["token_id"]],
                     "prompt_ids": b.get("prompt_ids", []), "stop_ids": b.get("stop_ids", [])} if b else {}
            plan.append((self.model_of(targets[idx[0]]), idx, extra))
        base = CompareRequest(messages=prompt.get("messages", []), mode=prompt["mode"], prompt=prompt["text"],
                              chat_format=self.chat_format, inspect=self.inspect)
        for col in cols:
            col.run = LaneRun.branch_of(col.branch["kept"], col.branch["at"]) if col.branch else LaneRun()
            col.show_notice("")
        if only is None or self.last_prompt is None:
            self.last_prompt = prompt
        self.saved_id = None
        self.selected = None
        self.inspector.clear()
        self._running_columns = cols
        self._stop_asked = False
        self._task = asyncio.ensure_future(self._run(base, plan, params))
        self._refresh()
        self.render(all_lanes=True)
        models = len(plan)
        self.status.setText(f"Running {len(params)} lanes" + (f" on {models} models" if models > 1 else "") + "…")
        return self._task

    async def _run(self, base: CompareRequest, plan: list[tuple[LaneModel, list[int], dict]],
                   params: list[SamplingParams]) -> None:
        from dataclasses import replace
        cols = self._running_columns
        failed: list[str] = []
        try:
            jobs = []
            for model, idx, extra in plan:
                request = replace(base, lanes=[params[i] for i in idx], model="", **extra)
                jobs.append(self._run_group(model, idx, request, cols, failed))
            await asyncio.gather(*jobs)
        finally:
            self._streams = []
            self._task = None
            self.render(all_lanes=True)
            self._refresh()
        if failed:
            self.status.setText("Error: " + " · ".join(failed))
        else:
            self.status.setText("Done · " + " · ".join(
                f"lane {self.columns.index(c) + 1}: {c.run.stop_reason or '?'}"
                for c in cols if c.run is not None and c in self.columns))

    async def _run_group(self, model: LaneModel, idx: list[int], request: CompareRequest,
                         cols: list[LaneColumn], failed: list[str], split: bool = True,
                         hint: str = " — press Run to try again.") -> None:
        """One model's lanes (``idx``): its request's events go to those columns.

        A lane's draft model is loaded (and checked) when its request starts, and one that
        fails fails the whole request: so a request whose lanes name different draft models
        that fails before anything streamed is run again split by draft model (``split``),
        and only the lanes of the draft model at fault fail."""
        from dataclasses import replace

        from gui.bridge import BridgeError

        def fail(message: str, lanes: list[int] | None = None, hint: str = hint) -> None:
            # Lanes of this model that finished before the failure keep their results.
            hit = lanes if lanes is not None else [i for i in idx if not cols[i].run.finished] or idx
            where = ", ".join(str(self.columns.index(cols[i]) + 1 if cols[i] in self.columns else "?") for i in hit)
            failed.append(f"lane{'s' if len(hit) > 1 else ''} {where} ({model.name}): {message}")
            for i in hit:
                cols[i].run.fail(message)
                cols[i].show_notice(message + hint)

        if model.kind == "server" and model.remote is None:
            fail(f"not connected to {model.record().get('server') or 'its server'}: choose the lane's model again")
            return
        if model.kind != "server":  # a draft model that is not there: its lanes fail, the others run
            gone = [k for k, q in enumerate(request.lanes) if q.draft and not Path(q.draft).expanduser().exists()]
            for k in gone:
                fail(f"draft model not found: {request.lanes[k].draft}", [idx[k]],
                     " — choose another one (…) or turn speculative decoding off.")
            if gone:
                keep = [k for k in range(len(idx)) if k not in gone]
                if not keep:
                    return
                idx, request = [idx[k] for k in keep], replace(request, lanes=[request.lanes[k] for k in keep])
        if model.kind == "checkpoint" and not model.key:  # a saved comparison's checkpoint: open it again
            try:
                self._held_model(await self.bridge.hold(model.path))
            except BridgeError as e:
                fail(f"could not open {model.path}: {e}")
                return
            if self._stop_asked:  # Stop came while it opened: these lanes never start
                for i in idx:
                    cols[i].run.stop_reason = "cancelled"
                return
        if model.kind == "checkpoint":
            request.model = model.key
        drafts = list(dict.fromkeys(q.draft for q in request.lanes))  # "" first when a lane has none
        drafts.sort(key=bool)
        split = split and len(drafts) > 1
        names = self._names_for(model)
        dropped = 0
        streamed = False
        error: Error | None = None
        stream = self.bridge.compare(request, backend=model.remote) if model.kind == "server" \
            else self.bridge.compare(request)
        self._streams.append(stream)
        async for ev in stream:
            match ev:
                case Chunk() if 0 <= ev.lane < len(idx):
                    streamed = True
                    cols[idx[ev.lane]].run.add(ev.tokens)
                    for t in ev.tokens:
                        names.setdefault(int(t.token_id), t.piece)
                case Done() if 0 <= ev.lane < len(idx):
                    streamed = True
                    cols[idx[ev.lane]].run.finish(ev)
                case Prompted():
                    dropped = ev.dropped_messages
                case Prefilled():
                    streamed = True
                    self.status.setText(f"Prompt: {ev.prompt_tokens} tokens"
                                        + (f" on {model.name}" if len(self._streams) > 1 else "")
                                        + (f" ({dropped} oldest messages left out to fit)" if dropped else "")
                                        + " · generating…")
                case Error() if not ev.cancelled:
                    error = ev
                    if not (split and not streamed):
                        message = ev.message
                        if ev.kind:
                            from core.remote.runner import describe_error
                            message = describe_error(ev.kind, ev.message)
                        fail(message)
            # The bridge delivers a frame's events together: render once they are in.
            if not stream.pending:
                self.render()
        if error is not None and split and not streamed and not self._stop_asked:
            # Lanes without a draft model first: when they run, the fault is a draft model's.
            for d in drafts:
                part = [k for k, q in enumerate(request.lanes) if q.draft == d]
                await self._run_group(model, [idx[k] for k in part],
                                      replace(request, lanes=[request.lanes[k] for k in part]), cols, failed,
                                      split=False, hint=" — choose another draft model (…) or turn "
                                      "speculative decoding off." if d else hint)

    def stop(self) -> None:
        if self.running:
            self._stop_asked = True
            for stream in list(self._streams):
                stream.cancel()
            self.status.setText("Stopping…")

    # ------------------------------------------------------------------ rendering
    def render(self, all_lanes: bool = True) -> None:
        """Re-render the lanes' HTML, divergence labels and stats (while streaming, once
        per batch of events the bridge delivers: at most once a frame)."""
        self.renders += 1
        colors = lane_colors(theme.colors(), theme.is_dark())
        base = self.columns[self.baseline].run if self.columns and self.baseline < len(self.columns) else None
        base_model = self.model_of(self.baseline) if self.columns else None
        base_settings = self.columns[self.baseline].settings() if self.columns else None
        heat = self.heatmap_check.isChecked()
        for i, col in enumerate(self.columns):
            run = col.run
            if run is None:
                col.browser.setHtml(f'<p style="color: {colors["muted"]};">Not run yet.</p>')
                col.divergence.setText(self._summary(i, col, base_settings))
                col.stats.setText("")
                continue
            diff = None
            label = ""
            if i == self.baseline:
                label = "Baseline: the other lanes are compared with this one."
            elif run.error and not run.tokens:
                label = ""  # it never started: its notice says why, there is nothing to compare
            elif base is not None:
                match = tokenizers_match(base_model, self.model_of(i))
                diff = self._diff(base, run, match)
                both_done = run.finished and base.finished
                if diff.divergence is None:
                    label = ("Identical to the baseline" if match else "Same text as the baseline") if both_done \
                        else ("Same as the baseline so far" if match else "Same text as the baseline so far")
                else:
                    label = (f"<span style='color: {colors['mark']}; font-weight: 600;'>Diverges at token "
                             f"{diff.divergence + 1}</span> · {diff.changed_count} of {len(run.tokens)} tokens differ")
                if not match:
                    why = "different tokenizers" if match is False else "tokenizer not known"
                    label += (f"<br><span style='color: {colors['muted']};'>{why}: divergence and diff by text "
                              "only</span>")
            if col.branch:
                label += (("<br>" if label else "") + f"<span style='color: {colors['accent']}; font-weight: 600;'>"
                          f"Branch</span> at token {col.branch['at'] + 1}: the tokens before it are "
                          f"lane {col.branch_source()}'s, this token was forced")
            col.divergence.setText(label)
            sel = self.selected[1] if self.selected and self.selected[0] == i else None
            col.set_html(render_lane_html(i, run, diff=diff, heatmap=heat, selected=sel, colors=colors,
                                          branch_at=col.branch["at"] if col.branch else None),
                         follow=self.running)
            st = run.stats()
            col.stats.setText(format_stats({"stats": st, "stop_reason": st.get("stop_reason") or "…",
                                            "seed": (run.params or {}).get("seed")}))
            col.set_editable(not self.running, self.seed_lock.isChecked())

    def _diff(self, base: LaneRun, run: LaneRun, match: bool | None):
        """``run`` against the baseline: by token ids under one tokenizer, else by text
        (aligned once both are finished; until then only where they part). A diff is
        computed again only when either side changed."""
        key = (id(base), len(base.tokens), len(run.tokens), len(base.text), len(run.text),
               base.finished, run.finished, match)
        hit = run.diff_cache
        if hit is not None and hit[0] == key and hit[2] is base:
            return hit[1]
        if match:
            diff = token_diff(base.ids, run.ids)
        else:
            diff = text_diff(base.text, [t.text for t in run.tokens], align=base.finished and run.finished)
        run.diff_cache = (key, diff, base)
        return diff

    # ------------------------------------------------------------------ inspector
    def _names_for(self, model: LaneModel) -> dict[int, str]:
        """id -> piece learned from the tokens of lanes on ``model``'s tokenizer."""
        return self._names.setdefault(model.tokenizer or repr(model.group), {})

    def token(self, lane: int, index: int):
        if 0 <= lane < len(self.columns):
            run = self.columns[lane].run
            if run is not None and 0 <= index < len(run.tokens):
                return run.tokens[index]
        return None

    def inspect_token(self, lane: int, index: int, *, pin: bool = True) -> bool:
        """Show token ``index`` of ``lane`` in the inspector (pinned: highlighted too)."""
        rec = self.token(lane, index)
        if rec is None:
            return False
        run = self.columns[lane].run
        settings = run.params or self.columns[lane].settings()
        model = self.model_of(lane)
        # Name alternatives in this lane's own vocabulary: the loaded model's tokenizer only
        # for lanes that share it, else the pieces this lane's tokens carried.
        names = self._names_for(model)
        names.update({int(k): v for k, v in ((rec.top or {}).get("pieces") or {}).items()})
        self.inspector.known = names
        loaded = next((m for m in self.models if m.kind == "loaded"), None)
        self.inspector.token_text = self._token_text if loaded is not None and tokenizers_match(model, loaded) else None
        label = settings_label(settings)
        if len({self.model_of(i).group for i in range(len(self.columns))}) > 1:
            label = f"{model.label()} · {label}"
        self.inspector.show_token(lane, index, rec, label)
        if pin:
            self.selected = (lane, index)
            self.render(all_lanes=True)
        return True

    def branch_lane(self, lane: int, index: int, token_id: int) -> asyncio.Task | None:
        """"Continue with X": a new lane with ``lane``'s settings (the seed it used) that
        keeps its tokens before ``index``, takes ``token_id`` there and carries on. Runs
        it at once (the other lanes keep their results); returns the task."""
        col = self.columns[lane] if 0 <= lane < len(self.columns) else None
        run = col.run if col is not None else None
        why = ""
        if self.running:
            why = "wait for the lanes to finish"
        elif run is None or not run.finished or not 0 <= index < len(run.tokens) or token_id < 0:
            why = "this lane has no finished token there"
        elif len(self.columns) >= MAX_LANES:
            why = f"a comparison has at most {MAX_LANES} lanes: remove one first"
        elif self.model_of(lane).kind == "server":
            remote = self.model_of(lane).remote
            if remote is None or not remote.is_llamadesk:
                why = ("this lane's server cannot continue a reply from a token (LlamaDesk's serve can; "
                       "OpenAI's API has no way to force one)")
            elif not run.prompt_ids:
                why = "the server did not report this lane's prompt as token ids: run the lane again, then branch"
        if why:
            self.status.setText(f"Cannot branch: {why}.")
            return None
        settings = {k: v for k, v in (run.params or col.settings()).items() if k in LANE_KEYS}
        new = self.add_lane(settings, model=self.model_of(lane))
        new.branch = {"src": col, "from": lane + 1, "at": index, "token_id": int(token_id),
                      "kept": LaneRun.branch_of(run, index)}
        if self.model_of(lane).kind == "server":  # the server is sent its own prompt ids, then the kept tokens
            new.branch["prompt_ids"] = list(run.prompt_ids)
            new.branch["stop_ids"] = [run.stop_token] if run.stop_token is not None else []
        self._refresh()
        task = self.run(only=[new])
        name = self.inspector.text_of(int(token_id))
        self.status.setText(f"Lane {len(self.columns)}: lane {lane + 1} up to token {index + 1}, then “{name}”…")
        return task

    def ban_in_lane(self, lane: int, index: int, token_id: int) -> bool:
        """"Ban X": add TEXT=-inf for the token to ``lane``'s logit bias (its text as the
        lane's tokenizer would encode it alone); it applies from the next Run."""
        from gui.settings.panel import format_stop_strings
        if self.running or not 0 <= lane < len(self.columns) or token_id < 0:
            return False
        col = self.columns[lane]
        rec = self.token(lane, index)
        piece = ((rec.top or {}).get("pieces") or {}).get(int(token_id)) if rec is not None else None
        piece = piece if piece is not None else self._names_for(self.model_of(lane)).get(int(token_id))
        if self.model_of(lane).dummy_prefix and piece and piece.startswith(" ") and piece.strip():
            piece = piece[1:]  # SentencePiece adds the word-start space itself
        if not piece or not piece.strip():
            self.status.setText("Cannot ban that token by text (it is only space or has no text).")
            return False
        items = [*col.logit_bias(), f"{piece}=-inf"]
        col.bias_edit.setText(format_stop_strings(items))
        col._bias_edited()
        self.status.setText(f"Lane {lane + 1} now bans “{piece}” (press Run to see it).")
        return True

    def _token_clicked(self, lane: int, index: int) -> None:
        if self.selected == (lane, index):
            self.selected = None
            self.render(all_lanes=True)
            return
        self.inspect_token(lane, index, pin=True)

    def _token_hovered(self, lane: int, index: int) -> None:
        if lane >= 0:
            self.inspect_token(lane, index, pin=False)
        elif self.selected is not None:
            self.inspect_token(*self.selected, pin=False)

    # ------------------------------------------------------------------ keeping it
    def comparison_data(self) -> tuple[dict, list[dict]]:
        prompt = dict(self.last_prompt or self._prompt_dict())
        lanes = []
        for i, col in enumerate(self.columns):
            model = self.model_of(i)
            if col.run is not None:
                lanes.append(col.run.to_dict({**col.settings(), "stop": list(self.stop_strings)}, model))
            else:
                s = {**col.settings(), "stop": list(self.stop_strings)}
                lanes.append({"settings": s, "seed": s.get("seed"), "text": "", "tokens": [], "logprobs": [],
                              "model": model.record(), "model_id": model.name})
            if col.branch:  # its kept tokens are its first ``at`` tokens
                b = col.branch
                lanes[-1]["branch"] = {"from_lane": col.branch_source(), "at": b["at"], "token_id": b["token_id"],
                                       "kept_tokens": b["kept"].ids}
                for key in ("prompt_ids", "stop_ids"):  # a branch on a server: what Run sends it again
                    if key in b:
                        lanes[-1]["branch"][key] = list(b[key])
        prompt["inspect"] = self.inspect
        return prompt, lanes

    def save(self, title: str | None = None) -> int | None:
        """Save the shown results (settings with the seeds used); returns the conversation id."""
        if self.running or not any(c.run is not None for c in self.columns):
            return None
        if self.saved_id is not None and title is None:
            return self.saved_id
        prompt, lanes = self.comparison_data()
        if title is None:
            first = " ".join((prompt.get("text") or "comparison").split())
            title = f"Compare: {first[:40]}" + ("…" if len(first) > 40 else "")
        conv = self.history.save_comparison(title, prompt, lanes)
        self.saved_id = conv.id
        self.status.setText(f"Saved as “{title}”.")
        return conv.id

    def saved_comparisons(self) -> list:
        return self.history.conversations(kind="comparison")

    def _fill_saved_menu(self) -> None:
        self.saved_menu.clear()
        convs = self.saved_comparisons()
        if not convs:
            self.saved_menu.addAction("No saved comparisons").setEnabled(False)
        for conv in convs[:30]:
            self.saved_menu.addAction(conv.title, lambda cid=conv.id: self.open_comparison(cid))

    def open_comparison(self, conv_id: int) -> None:
        """Show a saved comparison: its prompt, lanes (settings and seeds used) and results."""
        if self.running:
            return
        data = self.history.comparison(conv_id)
        prompt = data.get("prompt") or {}
        lanes = data.get("lanes") or []
        self.prompt_edit.setPlainText(str(prompt.get("text", "")))
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(prompt.get("mode", "chat"))))
        self.chat_format = prompt.get("chat_format", self.chat_format)
        text = prompt.get("text", "")
        msgs = list(prompt.get("messages") or [])
        if msgs and text.strip() and msgs[-1].get("content") == text and msgs[-1].get("role") == "user":
            msgs = msgs[:-1]
        self.context = msgs
        self.context_check.setText(f"Conversation as context ({len(msgs)} messages)")
        self.context_check.setEnabled(bool(msgs))
        self.context_check.setChecked(bool(msgs))
        self.context_check.setVisible(bool(msgs))
        self.seed_lock.blockSignals(True)
        self.seed_lock.setChecked(False)
        self.seed_lock.blockSignals(False)
        settings = [dict(l.get("settings") or {}) for l in lanes]
        self.stop_strings = tuple((settings[0] if settings else {}).get("stop") or ())
        self.set_lanes(settings, [self._model_from_record(l.get("model")) for l in lanes])
        for col, lane in zip(self.columns, lanes):
            col.run = LaneRun.from_dict(lane) if lane.get("tokens") or lane.get("text") else None
            if col.run is not None:
                for t in col.run.tokens:
                    self.inspector.learn(t.token_id, t.piece)
            col.branch = self._branch_from_record(lane, col.run)
        self.last_prompt = dict(prompt)
        self.saved_id = conv_id
        self._refresh()
        self.render(all_lanes=True)
        self.status.setText(f"Opened “{self.history.conversation(conv_id).title}” — Run repeats it exactly.")

    def _branch_from_record(self, lane: dict, run: LaneRun | None) -> dict | None:
        """A saved lane's branch (data, checked: whole numbers, and its kept tokens must be
        the start of its own tokens); None when it was not one or does not hold together."""
        b = lane.get("branch")
        if not isinstance(b, dict) or run is None:
            return None
        at, tok, src = b.get("at"), b.get("token_id"), b.get("from_lane")
        kept = b.get("kept_tokens")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (at, tok, src)) \
                or not 0 <= at < len(run.tokens) or not isinstance(kept, list) or kept != run.ids[:at]:
            return None
        out = {"src": self.columns[src - 1] if 1 <= src <= len(self.columns) else None, "from": src,
               "at": at, "token_id": tok, "kept": LaneRun.branch_of(run, at)}
        for key in ("prompt_ids", "stop_ids"):  # a branch on a server
            ids = b.get(key)
            if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                out[key] = ids
        return out

    def _model_from_record(self, rec) -> LaneModel:
        """The open model a saved lane ran on, or a stand-in that says what to open (a
        checkpoint is opened again at Run; a server must be connected again)."""
        loaded = next((m for m in self.models if m.kind == "loaded"), self.models[0])
        if not isinstance(rec, dict) or not rec.get("kind"):
            return loaded  # saved before lanes had models: the loaded one
        # A saved (or imported) record is data, not trusted: strings only, nothing opened or
        # connected until the user runs the lane.
        def text(key: str) -> str:
            v = rec.get(key)
            return v if isinstance(v, str) else ""
        name, kind, path, tok = text("name") or "?", text("kind"), text("path"), text("tokenizer") or None
        if kind == "server":
            for m in self.models:
                if m.kind == "server" and m.server == text("server") and m.name == name:
                    return m
            return LaneModel("server", name, tokenizer=tok, path=text("server"))
        for m in self.models:
            if m.name == name and (not path or not m.path or _same_path(m.path, path)) and m.kind != "server":
                return m
        if path:
            m = LaneModel("checkpoint", name, tokenizer=tok, path=path)
            self.models.append(m)
            return m
        return loaded

    def ask_export_path(self, kind: str) -> str | None:
        """Where to export (a file dialog; tests replace this)."""
        filt = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export comparison", f"comparison.{kind}", filt)
        return path or None

    def export(self, kind: str, path: str | None = None) -> str | None:
        """Save (if needed) and write the comparison as Markdown ("md") or JSON ("json")."""
        conv_id = self.save()
        if conv_id is None:
            return None
        path = path or self.ask_export_path(kind)
        if not path:
            return None
        if kind == "md":
            Path(path).write_text(chat_export.export_markdown(self.history, conv_id), encoding="utf-8")
        else:
            Path(path).write_text(json.dumps(chat_export.export_json(self.history, conv_id), ensure_ascii=False, indent=1),
                                  encoding="utf-8")
        self.status.setText(f"Exported to {path}")
        return path

    # ------------------------------------------------------------------ adopt
    def adopt(self, lane: int) -> dict | None:
        """Put lane's reply into the chat: through ``conversation`` when given (the prompt
        as a user message first, unless the reply answers the conversation's last
        message), then ``adoptRequested``. Returns the info dict."""
        if not 0 <= lane < len(self.columns):
            return None
        run = self.columns[lane].run
        if run is None or not run.finished or not run.text:
            return None
        settings = dict(run.params or self.columns[lane].settings())
        info = {"settings": settings, "seed": settings.get("seed"), "stats": run.stats(),
                "stop_reason": run.stop_reason, "lane": lane}
        conv = self.conversation
        if conv is not None:
            prompt = self.last_prompt or self._prompt_dict()
            text = (prompt.get("text") or "").strip()
            if text:
                parent = conv.add_user(prompt["text"]).id
            else:
                parent = conv.leaf_id()
            model = self.model_of(lane)
            msg = conv.add_reply(parent, run.text, settings=settings, seed=settings.get("seed"),
                                 stats=info["stats"], stop_reason=run.stop_reason, model_id=model.name,
                                 meta={"adopted_from_comparison": self.saved_id, "lane": lane,
                                       "model": model.record()})
            conv.pathChanged.emit()
            info["message_id"] = msg.id
        self.status.setText(f"Lane {lane + 1}'s reply was added to the chat.")
        self.adoptRequested.emit(run.text, info)
        return info

    def closeEvent(self, event) -> None:
        self.stop()
        release = getattr(self.bridge, "release", None)
        for m in self.models:  # checkpoints held for this window's lanes
            if m.kind == "checkpoint" and m.key and release is not None:
                release(m.key)
                m.key = ""
        super().closeEvent(event)


def _server_dialog_factory(window):
    """The app's Connect to Server dialog for "Model on a server…" (None without one)."""
    try:
        from gui.dialogs.server_dialog import ServerDialog
    except ImportError:
        return None
    saved = getattr(window, "servers", None)
    if saved is None:
        return None
    return lambda parent: ServerDialog(saved=saved, parent=parent)


def open_compare(window) -> CompareView:
    """Open (or raise) the compare window for a :class:`gui.main_window.MainWindow`.

    Seeds it with the prompt editor's text (or, when that is empty, the open conversation
    as context), the sampling panel's settings as the first lane, and the panel's chat
    format; "Adopt" writes through the window's conversation model, and clears the
    prompt editor when the adopted prompt came from it.
    """
    view = getattr(window, "_compare_view", None)
    if view is not None and not view.isHidden():
        view.raise_()
        view.activateWindow()
        return view
    panel = window.panel
    text = window.prompt.text()
    system = panel.system_prompt()
    conv = window.conversation
    context = conv.request_messages(system) if conv.conv_id is not None else (
        [{"role": "system", "content": system}] if system.strip() else [])
    view = CompareView(bridge=window.bridge, history=window.history, prompt=text, messages=context,
                       lanes=[panel.params()], mode="chat", chat_format=panel.chat_format(),
                       conversation=conv, server_dialog=_server_dialog_factory(window), parent=window)
    backend = getattr(window, "backend", None)
    if backend is not None:  # replies come from a server: so does the first lane
        view.set_lane_model(0, view.add_server(backend))
    view.setWindowFlag(Qt.Window, True)  # its own window, closed with the main one
    view.setAttribute(Qt.WA_DeleteOnClose, True)

    def adopted(_text: str, _info: dict) -> None:
        prompt = (view.last_prompt or {}).get("text", "")
        if prompt.strip() and window.prompt.text().strip() == prompt.strip():
            window.prompt.clear()

    view.adoptRequested.connect(adopted)
    view.destroyed.connect(lambda *_: setattr(window, "_compare_view", None))
    window._compare_view = view
    view.show()
    return view
