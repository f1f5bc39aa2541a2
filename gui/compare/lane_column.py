"""One comparison lane's column: its header and buttons, model, settings editors, the
summary of how it differs from the baseline, its text (one anchor per token) and stats.

The column holds a lane's editable state and shows what it is told; the view
(:mod:`gui.compare.view`) decides what lanes exist and runs them.
"""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFrame, QGridLayout, QHBoxLayout, QLabel, QLineEdit,
                               QSizePolicy, QSpinBox, QTextBrowser, QToolButton, QVBoxLayout)

from core.engine.constraint import Constraint, from_editor, syntax_error
from core.engine.lanes import MAX_LANES
from core.engine.settings import SCHEMA

from gui import theme
from gui.widgets.stats import format_stats
from gui.compare.grounding import LaneDocuments
from gui.compare.lanes import calls_label, divergence_label, lane_diff
from gui.compare.lane_tools import LaneTools
from gui.compare.models import LaneModel
from gui.settings.output_format import CONSTRAINT_HINTS, CONSTRAINT_KINDS
from gui.settings.speculative import SpeculativeControls
from gui.settings.beams import beam_reason
from gui.settings.widgets import guard_wheel
from gui.settings.text_items import bias_items, format_stop_strings
from gui.widgets.token_run import LaneRun, parse_anchor, render_lane_html

SEED_RANDOM = -1  # the seed spin's "random" value
OPEN_CHECKPOINT, CONNECT_SERVER = -1, -2  # the lane model combo's two actions

# The numeric settings a lane edits, in the order shown (three to a row; the seed has its
# own); their ranges, steps and help are the settings schema's.
FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens", "num_beams",
          "length_penalty", "seed")
SAMPLED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")  # what beam search leaves out


def _label(text: str, name: str, color: str | None = None) -> QLabel:
    """A word-wrapped label of the column (an inline notice when ``color`` is given)."""
    w = QLabel(text)
    w.setObjectName(name)
    w.setWordWrap(True)
    if color is not None:
        w.setStyleSheet(f"color: {theme.colors()[color]};")
        w.hide()
    return w


def _field(key: str) -> QSpinBox | QDoubleSpinBox:
    """One setting's spin box, as the settings schema declares it (the seed's also offers
    "random", below its range)."""
    setting = SCHEMA[key]
    lo, hi = setting.widget_range()
    if setting.kind is int:
        w = QSpinBox()
    else:
        w = QDoubleSpinBox()
        w.setDecimals(setting.decimals)
    w.setRange(SEED_RANDOM if key == "seed" else lo, hi)
    w.setSingleStep(setting.step)
    w.setToolTip(setting.help)
    w.setAccessibleName(f"Lane {setting.label.lower()}")
    w.setObjectName(f"lane_{key}")
    w.setButtonSymbols(QSpinBox.NoButtons)
    w.setKeyboardTracking(False)
    if key == "seed":
        w.setSpecialValueText("random")
    if key == "num_beams":
        w.setSpecialValueText("off")
    return w


class LaneColumn(QFrame):
    """One lane: header with its buttons, inline settings, divergence label, text, stats.

    Attributes:
        run: the lane's results (a :class:`LaneRun`), None before it ran.
        branch: a branch from another lane's token: {"src": LaneColumn | None, "from": its
            lane number then, "at": token index, "token_id": the forced token, "kept":
            LaneRun of the source's tokens before it; on a server also "prompt_ids" and
            "stop_ids"}; None for a lane of its own.
        model: the :class:`LaneModel` it runs on.

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
        self.branch: dict | None = None
        self.lane = 0
        self.model: LaneModel | None = None
        self._offered: list[LaneModel] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(4)
        self._header(lay)
        self._model_row(lay)
        self._fields_grid(lay)
        self._speculative_row(lay)
        self._constraint_row(lay)
        self._bias_row(lay)
        self.documents = LaneDocuments(self)  # what the lane's question is grounded in
        lay.addWidget(self.documents)
        self.tools = LaneTools(self)  # shown when the comparison offers tools (view.set_tools)
        self.tools.changed.connect(self.settingsChanged)
        lay.addWidget(self.tools)
        self._editable = (True, False)  # set_editable's: editable, seed locked
        self.set_settings(settings)
        for w in self.fields.values():
            w.valueChanged.connect(lambda *_: self.settingsChanged.emit())
        self.fields["num_beams"].valueChanged.connect(self._show_beams)
        self._text_area(lay)
        guard_wheel(self)  # the wheel scrolls, it does not edit the setting under the pointer

    # -- layout --------------------------------------------------------------------------

    def _tool(self, icon: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setIcon(theme.icon(icon))
        b.setIconSize(QSize(14, 14))
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def _header(self, lay: QVBoxLayout) -> None:
        """The lane's title, its move / duplicate / remove / adopt buttons, the branch note."""
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
        self.branch_label = _label("", "laneBranch", "accent")
        lay.addWidget(self.branch_label)

    def _model_row(self, lay: QVBoxLayout) -> None:
        """The lane's model combo and, under it, the lane's inline notice."""
        self.model_combo = QComboBox()
        self.model_combo.setObjectName("laneModelCombo")
        self.model_combo.setAccessibleName("Lane model")
        self.model_combo.setToolTip("The model this lane runs on: the loaded one, another checkpoint, "
                                    "or a model on a server")
        self.model_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.model_combo.setMinimumContentsLength(12)
        self.model_combo.activated.connect(self._model_activated)
        lay.addWidget(self.model_combo)
        self.notice = _label("", "laneNotice", "error")
        self.notice.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.notice)

    def _fields_grid(self, lay: QVBoxLayout) -> None:
        """The numeric settings, three to a row; the seed takes a row of its own."""
        grid = QGridLayout()
        grid.setHorizontalSpacing(4)
        grid.setVerticalSpacing(2)
        self.fields: dict[str, QSpinBox | QDoubleSpinBox] = {}
        for n, key in enumerate(FIELDS):
            w = self.fields[key] = _field(key)
            lab = QLabel(SCHEMA[key].short or key)
            lab.setToolTip(w.toolTip())
            lab.setBuddy(w)
            r, c = divmod(n, 3)
            if key == "seed":
                grid.addWidget(lab, r + 1, 0)
                grid.addWidget(w, r + 1, 1, 1, 5)
            else:
                grid.addWidget(lab, r, 2 * c)
                grid.addWidget(w, r, 2 * c + 1)
        for c in (1, 3, 5):
            grid.setColumnStretch(c, 1)
        lay.addLayout(grid)

    def _text_area(self, lay: QVBoxLayout) -> None:
        """The summary / divergence line, the lane's text and its stats."""
        self.divergence = _label("", "laneDivergence")
        lay.addWidget(self.divergence)
        self.browser = QTextBrowser()
        self.browser.setObjectName("laneText")
        self.browser.setOpenLinks(False)
        self.browser.setOpenExternalLinks(False)
        self.browser.setMouseTracking(True)
        self.browser.anchorClicked.connect(self._clicked)
        self.browser.highlighted.connect(self._hovered)
        lay.addWidget(self.browser, 1)
        self.stats = _label("", "laneStats")
        self.stats.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.stats)

    # -- model ---------------------------------------------------------------------------

    def set_models(self, models: list[LaneModel], current: LaneModel | None) -> None:
        """Offer ``models`` (plus "Other checkpoint…" and "Model on a server…"); show ``current``."""
        self._offered = list(models)
        self.model = current
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for m in models:
            self.model_combo.addItem(m.label(), m.kind)
            self.model_combo.setItemData(self.model_combo.count() - 1, m.tip(), Qt.ToolTipRole)
        if current is not None and current not in models:  # a saved lane's model that is not open
            self.model_combo.addItem(current.label() + " (not open)", current.kind)
        self.model_combo.insertSeparator(self.model_combo.count())
        self.model_combo.addItem("Other checkpoint…", OPEN_CHECKPOINT)
        self.model_combo.addItem("Model on a server…", CONNECT_SERVER)
        if current is not None:
            at = models.index(current) if current in models else len(models)
            self.model_combo.setCurrentIndex(at)
            self.model_combo.setToolTip(current.tip())
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
        self.bias_notice = _label("", "laneBiasNotice", "error")
        lay.addWidget(self.bias_notice)
        self._last_bias = ""
        self.bias_edit.editingFinished.connect(self._bias_edited)

    def logit_bias(self) -> list[str]:
        """The lane's well-formed TEXT=BIAS items."""
        return list(bias_items(self.bias_edit.text())[0])

    def add_bias(self, item: str) -> None:
        """Append a TEXT=BIAS item to the lane's bias, as if typed there."""
        self.bias_edit.setText(format_stop_strings([*self.logit_bias(), item]))
        self._bias_edited()

    def _bias_edited(self) -> None:
        bad = bias_items(self.bias_edit.text())[1]
        self.bias_notice.setText("Left out: " + "; ".join(bad) if bad else "")
        self.bias_notice.setVisible(bool(bad))
        if self.bias_edit.text() != self._last_bias:
            self._last_bias = self.bias_edit.text()
            self.settingsChanged.emit()

    def constraint(self) -> dict | None:
        c = from_editor(self.constraint_kind.currentData(), self.constraint_text.text())
        return None if c is None else c.to_dict()

    def _show_constraint(self) -> None:
        kind = self.constraint_kind.currentData()
        self.constraint_text.setVisible(bool(kind) and kind != "json_object")
        self.constraint_text.setPlaceholderText(self._hints.get(kind, ""))

    def _constraint_edited(self, *_) -> None:
        self._show_constraint()
        c = self.constraint()
        msg = syntax_error(Constraint(**c)) if c is not None else ""
        self.show_notice(msg[:1].upper() + msg[1:])
        self.settingsChanged.emit()

    def settings(self) -> dict:
        """The lane's settings; with beams, what beam search refuses (format, bias, speculative)
        is left out (the fields keep it for when beams are off)."""
        if self.fields["num_beams"].value() > 1:
            d = {"constraint": None, "logit_bias_text": [], "lookup": 0, "draft": ""}
        else:
            d = {"constraint": self.constraint(), "logit_bias_text": self.logit_bias(), **self.speculative.values()}
        d.update(self.tools.values())
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
        self.tools.apply(d)
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
        self._show_beams()

    def _show_beams(self, *_) -> None:
        """With beams, the sampler's fields are off (their tooltips say why) and the length
        penalty on; a locked seed follows lane 1's; nothing is editable during a run."""
        on, seed_locked = self._editable
        n = self.fields["num_beams"].value()
        why = beam_reason(n) if n > 1 else ""
        for key, w in self.fields.items():
            off = (why and key in SAMPLED) or (key == "length_penalty" and not why)
            w.setEnabled(on and not off and not (key == "seed" and seed_locked and self.lane > 0))
            if key in SAMPLED:
                w.setToolTip(why or SCHEMA[key].help)
        for w in (self.constraint_kind, self.constraint_text, self.bias_edit):
            w.setEnabled(on and not why)
        self.speculative.enable(on and not why)

    def set_index(self, columns: list["LaneColumn"], baseline: bool) -> None:
        """Show this lane's place among ``columns`` (the view's lanes, this one among them)."""
        lane, count = columns.index(self), len(columns)
        self.lane = lane
        self.setObjectName(f"compareLane{lane}")
        self.setAccessibleName(f"Lane {lane + 1}")
        self.title.setText(f"Lane {lane + 1}" + ("  · baseline" if baseline else ""))
        self.branch_label.setText(f"Branched from lane {self.branch_source(columns)} at token "
                                  f"{self.branch['at'] + 1}" if self.branch else "")
        self.branch_label.setVisible(bool(self.branch))
        self.left_button.setEnabled(lane > 0)
        self.right_button.setEnabled(lane < count - 1)
        self.remove_button.setEnabled(count > 1)
        self.dup_button.setEnabled(count < MAX_LANES)

    def branch_source(self, columns: list["LaneColumn"]) -> int:
        """The number of the lane this one branched from: its number among ``columns``
        while it is there, else as it was when this lane branched."""
        return columns.index(self.branch["src"]) + 1 if self.branch.get("src") in columns else self.branch["from"]

    def set_editable(self, on: bool, seed_locked: bool) -> None:
        self.model_combo.setEnabled(on)
        self.tools.setEnabled(on)
        self._editable = (on, seed_locked)
        self._show_beams()
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

    def show_unrun(self, summary: str, colors: dict) -> None:
        """A lane without results: "Not run yet", and ``summary`` (how its settings differ
        from the baseline's) over it."""
        self.browser.setHtml(f'<p style="color: {colors["muted"]};">Not run yet.</p>')
        self.divergence.setText(summary)
        self.stats.setText("")

    def show_run(self, columns: list["LaneColumn"], *, baseline: bool, base: LaneRun | None, match: bool | None,
                 colors: dict, heatmap: bool, selected: int | None, following: bool) -> None:
        """Draw the lane's results: the line over them (the baseline, or where they part
        from ``base``, the baseline's run, compared by ids when ``match``, else by text; a
        branch's source), the text (``selected``: the token pinned in the inspector;
        ``following``: keep the end in view while it streams) and the stats."""
        run = self.run
        diff, label = None, ""
        if baseline:
            label = "Baseline: the other lanes are compared with this one."
        elif base is not None and not (run.error and not run.tokens):  # one that never started: nothing to compare
            diff = lane_diff(base, run, match)
            label = divergence_label(run, base, diff, match, colors)
            calls = calls_label(run, base, colors)
            label += f"<br>{calls}" if calls else ""
        if self.branch:
            label += (("<br>" if label else "") + f"<span style='color: {colors['accent']}; font-weight: 600;'>"
                      f"Branch</span> at token {self.branch['at'] + 1}: the tokens before it are "
                      f"lane {self.branch_source(columns)}'s, this token was forced")
        if run.grounding or self.documents.spec() is not None:
            label += ("<br>" if label else "") + f"<span style='color: {colors['muted']};'>Grounding: " \
                f"{html.escape(run.grounding or 'not grounded (documents chosen after this run)')}</span>"
        self.divergence.setText(label)
        self.set_html(render_lane_html(self.lane, run, diff=diff, heatmap=heatmap, selected=selected, colors=colors,
                                       branch_at=self.branch["at"] if self.branch else None), follow=following)
        st = run.stats()
        self.stats.setText(format_stats({"stats": st, "stop_reason": st.get("stop_reason") or "…",
                                         "seed": (run.params or {}).get("seed")}))
