"""The settings side panel: sampling, length and stopping, system prompt, chat format,
named presets. Everything persists in QSettings as it changes."""
from __future__ import annotations

import json
import math
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QSettings, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QAbstractSpinBox, QCheckBox, QComboBox, QDoubleSpinBox,
                               QFormLayout, QFrame, QGroupBox, QHBoxLayout, QInputDialog,
                               QLabel, QLineEdit, QPlainTextEdit, QPushButton, QScrollArea,
                               QSizePolicy, QSlider, QSpinBox, QVBoxLayout, QWidget)

from core.prompt.chat_format import FORMAT_NAMES
from core.engine.constraint import Constraint, from_editor, syntax_error
from core.errors import SettingsError
from core.engine.settings import MAX_LOOKUP, SamplingParams, parse_logit_bias

from gui import theme

SEED_MAX = 2**31 - 1
MAX_TOKENS_CEILING = 8192

CHAT_FORMATS = (("auto", "Auto"), ("llama3", "Llama 3"), ("llama2", "Llama 2"),
                ("raw", "Raw completion"))
assert tuple(k for k, _ in CHAT_FORMATS) == tuple(FORMAT_NAMES)

# Built-in presets set only the sampler; length, seed and prompt stay as the user has them.
BUILTIN_PRESETS: dict[str, dict] = {
    "Precise": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0},
    "Balanced": {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
                 "repetition_penalty": 1.0},
    "Creative": {"temperature": 1.1, "top_p": 0.98, "top_k": 0, "min_p": 0.05,
                 "repetition_penalty": 1.0},
}
DEFAULT_PRESET = "Balanced"

# Why a control has no server counterpart (where the capability probe has nothing to say).
_NOT_REMOTE = {"logit_bias": "a bias by text needs the model's tokenizer, and a server's is not known here"}
SPECULATIVE_MODES = (("off", "Off"), ("lookup", "Prompt lookup"), ("draft", "Draft model"))
CONSTRAINT_KINDS = (("", "Off"), ("json_schema", "JSON schema"), ("json_object", "Any JSON object"),
                    ("regex", "Regular expression"), ("grammar", "Grammar (GBNF or Lark)"))
CONSTRAINT_HINTS = {"json_schema": '{"type": "object", "properties": {"name": {"type": "string"}}}',
                    "regex": r"[A-Z][a-z]+ is [0-9]{1,3}",
                    "grammar": 'root ::= "yes" | "no"'}
DEFAULT_LOOKUP = 3
CUSTOM = "Custom"

# What a user preset captures (chat format is a property of the model, so it is left out).
USER_PRESET_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                    "max_new_tokens", "stop", "random_seed", "seed_value", "system_prompt")


# --------------------------------------------------------------------------- stop strings

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", ",": ",", " ": " "}


def parse_stop_strings(text: str) -> tuple[str, ...]:
    """'###, \\nUser:, a\\,b' → ('###', '\\nUser:', 'a,b'). Items are comma-separated;
    backslash escapes \\n, \\t, \\\\, \\, and '\\ ' (a space kept at an item's edge);
    unescaped spaces around items are trimmed and empty items dropped."""
    items: list[str] = []
    chars: list[tuple[str, bool]] = []  # (char, escaped)

    def flush():
        # Trim only unescaped whitespace at the ends.
        lo, hi = 0, len(chars)
        while lo < hi and not chars[lo][1] and chars[lo][0].isspace():
            lo += 1
        while hi > lo and not chars[hi - 1][1] and chars[hi - 1][0].isspace():
            hi -= 1
        s = "".join(c for c, _ in chars[lo:hi])
        if s:
            items.append(s)
        chars.clear()

    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            chars.append((_ESCAPES[text[i + 1]], True))
            i += 2
            continue
        if ch in ",\n":
            flush()
        else:
            chars.append((ch, False))
        i += 1
    flush()
    return tuple(items)


def format_stop_strings(stop: tuple[str, ...] | list[str]) -> str:
    """Inverse of :func:`parse_stop_strings`."""
    out = []
    for s in stop:
        e = s.replace("\\", "\\\\").replace(",", "\\,").replace("\n", "\\n").replace("\t", "\\t")
        if e.startswith(" "):
            e = "\\" + e
        if e.endswith(" ") and not e.endswith("\\ "):
            e = e[:-1] + "\\ "
        out.append(e)
    return ", ".join(out)


def bias_items(text: str) -> tuple[tuple[str, ...], list[str]]:
    """A logit bias field's text ('dragon=+5, Once=-inf', commas as in Stop at): its
    well-formed TEXT=BIAS items, and a reason for each other one (they are left out)."""
    good, bad = [], []
    for spec in parse_stop_strings(text):
        try:
            parse_logit_bias(spec, lambda text: [0])
            good.append(spec)
        except SettingsError as e:
            bad.append(str(e))
    return tuple(good), bad


# --------------------------------------------------------------------------- speculative decoding

MODEL_FILES = "Models (*.gguf *.safetensors *.json *.pth *.model);;All files (*)"


def choose_model_path(parent: QWidget, title: str, start: str = "") -> str | None:
    """A model the user picks in a file dialog: a .gguf file, or a model folder named by
    any of its files (config.json, a .safetensors or .pth shard, tokenizer.model)."""
    from pathlib import Path

    from PySide6.QtWidgets import QFileDialog
    path, _ = QFileDialog.getOpenFileName(parent, title, start, MODEL_FILES)
    if path and not path.endswith(".gguf"):
        path = str(Path(path).parent)
    return path or None


class SpeculativeControls(QObject):
    """Speculative decoding's controls and their logic: a mode (off, prompt lookup, draft
    model), lookup's n, and the draft model's path with a "…" chooser. The sampling panel
    and each comparison lane lay the widgets out their own way. One mode is chosen, so
    lookup and a draft model are never both on (SamplingParams refuses that).

    Signals:
        changed(): the mode, n or the path was edited (not when set by :meth:`apply`).

    ``hide_unused``: the field the mode does not use is hidden (a lane, where room is
    short) instead of disabled (the panel, which shows both).
    """

    changed = Signal()

    def __init__(self, parent: QWidget, *, hide_unused: bool = False):
        super().__init__(parent)
        self.hide_unused = hide_unused
        self.available = True
        self.combo = QComboBox(parent)
        self.combo.setToolTip("Speculative decoding: draft tokens cheaply and check them in one pass. The reply is "
                              "the same as without; it comes faster when the drafts are often right.")
        for key, label in SPECULATIVE_MODES:
            self.combo.addItem(label, key)
        self.lookup = QSpinBox(parent)
        self.lookup.setToolTip("Prompt lookup: draft what followed the last n tokens earlier in the text "
                               "(editing, quoting).")
        self.lookup.setRange(1, MAX_LOOKUP)
        self.lookup.setValue(DEFAULT_LOOKUP)
        self.lookup.setKeyboardTracking(False)
        self.draft = QLineEdit(parent)
        self.draft.setToolTip("A smaller model with the same tokenizer (a .gguf file or a model folder) that "
                              "drafts for the model.")
        self.draft.setPlaceholderText("draft model: .gguf or folder")
        self.draft.setClearButtonEnabled(True)
        self.browse_button = QPushButton("…", parent)
        self.browse_button.setToolTip("Choose the draft model: a .gguf file, or any file of a model folder.")
        self.browse_button.setMaximumWidth(self.browse_button.fontMetrics().horizontalAdvance("…") + 24)
        self.draft_row = QWidget(parent)  # the path and its "…", side by side
        row = QHBoxLayout(self.draft_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.draft, 1)
        row.addWidget(self.browse_button)
        for w in (self.combo, self.lookup, self.draft, self.browse_button):
            w.setAccessibleDescription(w.toolTip())
        self._last_draft = ""
        self.combo.currentIndexChanged.connect(self._mode_changed)
        self.lookup.valueChanged.connect(lambda *_: self.changed.emit())
        self.draft.editingFinished.connect(self._draft_edited)
        self.browse_button.clicked.connect(self.browse)
        self.enable()

    def mode(self) -> str:
        """"off", "lookup" or "draft"."""
        return self.combo.currentData()

    def values(self) -> dict:
        """lookup/draft for SamplingParams: only the chosen mode's (a draft with no path is off)."""
        mode = self.mode()
        return {"lookup": self.lookup.value() if mode == "lookup" else 0,
                "draft": self.draft.text().strip() if mode == "draft" else ""}

    def state(self) -> dict:
        """The mode, n and path as shown (values kept while their mode is off)."""
        return {"speculative": self.mode(), "lookup_n": self.lookup.value(), "draft_path": self.draft.text().strip()}

    def apply(self, d: dict) -> None:
        """lookup/draft (a SamplingParams dict) choose the mode; speculative, lookup_n and
        draft_path (:meth:`state`) restore it exactly. A draft wins over lookup (a saved
        lane may hold both). Emits nothing."""
        mode = None
        if "lookup_n" in d:
            with QSignalBlocker(self.lookup):
                self.lookup.setValue(max(1, min(MAX_LOOKUP, int(d["lookup_n"]))))
        if "draft_path" in d:
            self._set_draft(d["draft_path"])
        if "lookup" in d or "draft" in d:
            if d.get("draft"):
                mode = "draft"
                self._set_draft(d["draft"])
            elif d.get("lookup"):
                mode = "lookup"
                with QSignalBlocker(self.lookup):
                    self.lookup.setValue(max(1, min(MAX_LOOKUP, int(d["lookup"]))))
            else:
                mode = "off"
        if d.get("speculative") in {k for k, _ in SPECULATIVE_MODES}:
            mode = d["speculative"]
        if mode is not None:
            with QSignalBlocker(self.combo):
                self.combo.setCurrentIndex(max(0, self.combo.findData(mode)))
        self.enable()

    def _set_draft(self, path) -> None:
        with QSignalBlocker(self.draft):
            self.draft.setText(path if isinstance(path, str) else "")  # saved data: a path or nothing
        self._last_draft = self.draft.text()
        self._show_path()

    def _show_path(self) -> None:
        # A narrow field shows the path's end: its tooltip has all of it.
        path = self.draft.text().strip()
        self.draft.setToolTip(f"{path}\n\n{self.draft.accessibleDescription()}" if path
                              else self.draft.accessibleDescription())

    def enable(self, available: bool | None = None) -> None:
        """Enable (or show) what the mode uses; ``available`` False: speculative decoding
        cannot run here (a server decodes on its own), everything off."""
        if available is not None:
            self.available = available
        mode, on = self.mode(), self.available
        self.combo.setEnabled(on)
        self.lookup.setEnabled(on and mode == "lookup")
        self.draft.setEnabled(on and mode == "draft")
        self.browse_button.setEnabled(on and mode == "draft")
        if self.hide_unused:
            self.lookup.setVisible(mode == "lookup")
            self.draft_row.setVisible(mode == "draft")

    def _mode_changed(self, *_) -> None:
        self.enable()
        self.changed.emit()

    def _draft_edited(self) -> None:
        if self.draft.text() != self._last_draft:
            self._last_draft = self.draft.text()
            self._show_path()
            self.changed.emit()

    def browse(self) -> None:
        """"…": choose the draft model's file (or folder), which turns the mode to draft."""
        path = choose_model_path(self.parent(), "Choose a draft model", self.draft.text())
        if path:
            self.apply({"speculative": "draft", "draft_path": path})
            self.changed.emit()


# --------------------------------------------------------------------------- panel

class SamplingPanel(QWidget):
    """Generation settings for the next reply, with named presets.

    Signals:
        changed(): any setting changed — by the user, a preset, or ``set_*``/``from_dict``.

    Read the settings with :meth:`params` (a validated ``core.engine.sampling.SamplingParams``;
    seed None when "random seed" is ticked), :meth:`system_prompt` and :meth:`chat_format`.
    Everything is saved to QSettings (groups "sampling" and "presets") as it changes and
    restored when the panel is built. :meth:`ask_preset_name` is the name prompt used by
    "Save preset"; replace it on the instance in tests.
    """

    changed = Signal()

    def __init__(self, *, settings: QSettings | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("samplingPanel")
        if settings is None:
            app = QCoreApplication.instance()
            named = app is not None and (app.organizationName() or app.applicationName())
            settings = QSettings() if named else QSettings("LlamaDesk", "LlamaDesk")
        self._settings = settings
        self._loading = 0  # >0 while widgets are set programmatically
        self._hidden = {"num_beams": 1, "length_penalty": 1.0}  # kept, not shown
        self._wanted_max_tokens = SamplingParams().max_new_tokens
        self._user_presets: dict[str, dict] = {}
        self.caps = None  # a server's core.remote.client.Capabilities while replies come from one
        # Values reach QSettings at once (shared in-process); the disk sync is batched so a
        # slider drag does not write the file on every step.
        self._sync_timer = QTimer(self, singleShot=True, interval=400)
        self._sync_timer.timeout.connect(self._settings.sync)

        self._build()
        self._restore()

    # ------------------------------------------------------------------ building

    def _name(self, w: QWidget, name: str, tip: str) -> QWidget:
        w.setObjectName(name)
        w.setAccessibleName(name)
        w.setAccessibleDescription(tip)
        w.setToolTip(tip)
        return w

    def _double_spin(self, name: str, lo: float, hi: float, step: float, tip: str,
                     decimals: int = 2) -> QDoubleSpinBox:
        s = QDoubleSpinBox()
        s.setRange(lo, hi)
        s.setSingleStep(step)
        s.setDecimals(decimals)
        s.setKeyboardTracking(False)  # typing "0.75" must not fire at "0." and "0.7"
        s.setAccelerated(True)
        self._name(s, name, tip)
        return s

    def _slider_pair(self, slider_name: str, spin_name: str, lo: float, hi: float, scale: int,
                     step: float, tip: str) -> tuple[QSlider, QDoubleSpinBox, QWidget]:
        slider = QSlider(Qt.Horizontal)
        slider.setRange(round(lo * scale), round(hi * scale))
        slider.setSingleStep(round(step * scale))
        slider.setPageStep(round(step * scale * 4))
        slider.setMinimumWidth(60)
        self._name(slider, slider_name, tip)
        spin = self._double_spin(spin_name, lo, hi, step, tip)

        def from_slider(v: int) -> None:
            with QSignalBlocker(spin):
                spin.setValue(v / scale)
            self._edited()

        def from_spin(v: float) -> None:
            with QSignalBlocker(slider):
                slider.setValue(round(v * scale))
            self._edited()

        slider.valueChanged.connect(from_slider)
        spin.valueChanged.connect(from_spin)
        row = QWidget()
        h = QHBoxLayout(row)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(slider, 1)
        h.addWidget(spin)
        return slider, spin, row

    def _form(self, title: str) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        form = QFormLayout(box)
        form.setRowWrapPolicy(QFormLayout.WrapLongRows)
        form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignLeft | Qt.AlignVCenter)
        return box, form

    def _row(self, form: QFormLayout, text: str, field: QWidget, buddy: QWidget | None = None) -> None:
        label = QLabel(text)
        label.setBuddy(buddy or field)
        label.setToolTip((buddy or field).toolTip())
        # Some platforms render a few px wider than the metrics say; don't clip the last letter.
        label.setMinimumWidth(label.sizeHint().width() + label.fontMetrics().averageCharWidth())
        form.addRow(label, field)

    def _build(self) -> None:
        # --- presets row
        self.presetCombo = self._name(QComboBox(), "presetCombo",
                                      "Pick a named set of sampling settings.")
        self.presetCombo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.presetCombo.setMinimumContentsLength(6)
        self.presetCombo.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.savePresetButton = self._name(QPushButton("Save…"), "savePresetButton",
                                           "Save the current settings as a named preset.")
        self.deletePresetButton = self._name(QPushButton("Delete"), "deletePresetButton",
                                             "Delete the selected preset (built-in presets stay).")
        for b in (self.savePresetButton, self.deletePresetButton):
            # The style's 80 px button minimum would push a 300 px panel wider.
            b.setMinimumWidth(b.fontMetrics().horizontalAdvance(b.text()) + 16)
            b.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        # A group of its own: the title names the combo, so the row needs no label.
        # The combo has the group's whole width (a row shared with the buttons cut
        # "Balanced (mine)" to "Balanced (n"); the buttons sit under it, right-aligned.
        presets = QGroupBox("Preset")
        pv = QVBoxLayout(presets)
        pv.addWidget(self.presetCombo)
        ph = QHBoxLayout()
        ph.addStretch(1)
        ph.addWidget(self.savePresetButton)
        ph.addWidget(self.deletePresetButton)
        pv.addLayout(ph)

        # --- sampling
        sampling, f = self._form("Sampling")
        self.temperatureSlider, self.temperatureSpin, row = self._slider_pair(
            "temperatureSlider", "temperatureSpin", 0.0, 2.0, 100, 0.05,
            "Randomness of the reply: 0 always picks the likeliest token, higher is more varied.")
        self._row(f, "&Temperature", row, self.temperatureSpin)
        # top_p must stay above 0 (SamplingParams.validate); 0.01 already means "top token".
        self.topPSlider, self.topPSpin, row = self._slider_pair(
            "topPSlider", "topPSpin", 0.01, 1.0, 100, 0.01,
            "Nucleus sampling: keep the likeliest tokens that together reach this probability (1 = off).")
        self._row(f, "Top-&p", row, self.topPSpin)
        self.topKSpin = self._name(QSpinBox(), "topKSpin",
                                   "Keep only the k likeliest tokens at each step (off = no limit).")
        self.topKSpin.setRange(0, 1000)
        self.topKSpin.setSpecialValueText("off")
        self.topKSpin.setKeyboardTracking(False)
        self._row(f, "Top-&k", self.topKSpin)
        self.minPSpin = self._double_spin(
            "minPSpin", 0.0, 0.99, 0.01,
            "Drop tokens less likely than this fraction of the top token's probability (0 = off).")
        self._row(f, "&Min-p", self.minPSpin)
        self.repetitionPenaltySpin = self._double_spin(
            "repetitionPenaltySpin", 0.5, 2.0, 0.05,
            "Above 1 discourages repeating tokens already in the text; 1 = off.")
        self.repetitionPenaltySpin.setValue(1.0)
        self._row(f, "&Repetition penalty", self.repetitionPenaltySpin)

        # --- length & stopping
        length, f = self._form("Length && stopping")
        self.maxTokensSpin = self._name(QSpinBox(), "maxTokensSpin",
                                        "The most tokens one reply may have.")
        self.maxTokensSpin.setRange(1, MAX_TOKENS_CEILING)
        self.maxTokensSpin.setValue(self._wanted_max_tokens)
        self.maxTokensSpin.setSingleStep(32)
        self.maxTokensSpin.setKeyboardTracking(False)
        self.maxTokensSpin.setAccelerated(True)
        self.maxTokensSpin.setMinimumWidth(self.maxTokensSpin.fontMetrics().horizontalAdvance("0" * 6) + 32)
        self._row(f, "Max new &tokens", self.maxTokensSpin)
        self.seedSpin = self._name(QSpinBox(), "seedSpin",
                                   "The random seed; the same seed and settings give the same reply.")
        self.seedSpin.setRange(0, SEED_MAX)
        self.seedSpin.setKeyboardTracking(False)
        self.seedSpin.setButtonSymbols(QAbstractSpinBox.NoButtons)
        # The range's widest text (2147483647) would make the box wider than the panel.
        self.seedSpin.setMinimumWidth(self.seedSpin.fontMetrics().horizontalAdvance("0" * 8) + 16)
        self.randomSeedCheck = self._name(QCheckBox("&Random seed for each reply"), "randomSeedCheck",
                                          "Draw a new seed for every reply (the seed used is shown with it).")
        self._row(f, "S&eed", self.seedSpin)
        f.addRow(self.randomSeedCheck)
        self.stopStrings = self._name(
            QLineEdit(), "stopStrings",
            "Stop the reply when it produces one of these: comma-separated, \\n for a newline, \\, for a comma.")
        self.stopStrings.setPlaceholderText(r"e.g. ###, \nUser:")
        self.stopStrings.setClearButtonEnabled(True)
        self._row(f, "&Stop at", self.stopStrings)
        self.logitBiasEdit = self._name(
            QLineEdit(), "logitBiasEdit",
            "Favour or ban words: TEXT=BIAS, comma-separated (\\, for a comma in TEXT). BIAS is added to "
            "the logits of TEXT's tokens before the filters: -100 to 100, or -inf for never.")
        self.logitBiasEdit.setPlaceholderText("e.g. dragon=+5, Once=-inf")
        self.logitBiasEdit.setClearButtonEnabled(True)
        self._row(f, "Logit &bias", self.logitBiasEdit)
        self.logitBiasNotice = QLabel()
        self.logitBiasNotice.setObjectName("logitBiasNotice")
        self.logitBiasNotice.setWordWrap(True)
        self.logitBiasNotice.setStyleSheet(f"color: {theme.colors()['error']};")
        self.logitBiasNotice.hide()
        f.addRow(self.logitBiasNotice)

        # --- speed: speculative decoding (the reply is the same, only faster or not)
        speed, f = self._form("Speed")
        self.speculative = SpeculativeControls(self)
        sc = self.speculative
        self.speculativeCombo = self._name(sc.combo, "speculativeCombo", sc.combo.toolTip())
        self._row(f, "Spec&ulative", self.speculativeCombo)
        self.lookupSpin = self._name(sc.lookup, "lookupSpin", sc.lookup.toolTip())
        self._row(f, "Lookup &n", self.lookupSpin)
        self.draftPath = self._name(sc.draft, "draftPath", sc.draft.toolTip())
        self.draftBrowseButton = self._name(sc.browse_button, "draftBrowseButton", sc.browse_button.toolTip())
        self._row(f, "&Draft model", sc.draft_row, self.draftPath)

        # --- output constraint: JSON schema, regex or grammar (checked as it is typed)
        constraint, f = self._form("Output format")
        self.constraintCombo = self._name(
            QComboBox(), "constraintCombo",
            "Hold the reply to a JSON schema, a regular expression or a grammar: tokens that would "
            "break it are never sampled.")
        for key, label in CONSTRAINT_KINDS:
            self.constraintCombo.addItem(label, key)
        # Sized by a short text, not "Grammar (GBNF or Lark)": a wider row would wrap the form.
        self.constraintCombo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.constraintCombo.setMinimumContentsLength(8)
        self._row(f, "Constrain &to", self.constraintCombo)
        self.constraintText = self._name(QPlainTextEdit(), "constraintText",
                                         "The JSON schema, regular expression or grammar the reply must match.")
        self.constraintText.setTabChangesFocus(True)
        self.constraintText.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.constraintText.setMinimumHeight(self.constraintText.fontMetrics().lineSpacing() * 4 + 12)
        f.addRow(self.constraintText)
        self.constraintNotice = self._name(QLabel(), "constraintNotice",
                                           "Why the constraint cannot be used as written.")
        self.constraintNotice.setWordWrap(True)
        self.constraintNotice.setStyleSheet("color: #b3261e;")
        self.constraintNotice.hide()
        f.addRow(self.constraintNotice)
        self._constraint_timer = QTimer(self)
        self._constraint_timer.setSingleShot(True)
        self._constraint_timer.setInterval(300)  # check once typing pauses
        self._constraint_timer.timeout.connect(self._check_constraint)

        # --- conversation
        conv, f = self._form("Conversation")
        self.chatFormatCombo = self._name(QComboBox(), "chatFormatCombo",
                                          "How messages are wrapped for the model; Auto reads it from the model.")
        for key, label in CHAT_FORMATS:
            self.chatFormatCombo.addItem(label, key)
        self._row(f, "Chat &format", self.chatFormatCombo)
        self.systemPrompt = self._name(QPlainTextEdit(), "systemPrompt",
                                       "Instructions sent before the conversation in every request.")
        self.systemPrompt.setPlaceholderText("You are a helpful assistant.")
        self.systemPrompt.setTabChangesFocus(True)
        fm = self.systemPrompt.fontMetrics()
        self.systemPrompt.setMinimumHeight(fm.lineSpacing() * 4 + 12)
        self.systemPrompt.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        sp_label = QLabel("S&ystem prompt")
        sp_label.setBuddy(self.systemPrompt)
        sp_label.setToolTip(self.systemPrompt.toolTip())
        f.addRow(sp_label)
        f.addRow(self.systemPrompt)

        # --- assemble, scrollable so a short window still reaches every control
        inner = QWidget()
        v = QVBoxLayout(inner)
        v.setContentsMargins(6, 6, 6, 6)
        v.addWidget(presets)
        v.addWidget(sampling)
        v.addWidget(length)
        v.addWidget(speed)
        v.addWidget(constraint)
        v.addWidget(conv, 1)
        scroll = QScrollArea()
        scroll.setObjectName("samplingScroll")
        scroll.setWidget(inner)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._inner = inner
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        self.setMinimumWidth(220)

        # --- wiring
        self.topKSpin.valueChanged.connect(self._edited)
        self.minPSpin.valueChanged.connect(self._edited)
        self.repetitionPenaltySpin.valueChanged.connect(self._edited)
        self.maxTokensSpin.valueChanged.connect(self._max_tokens_edited)
        self.seedSpin.valueChanged.connect(self._edited)
        self.randomSeedCheck.toggled.connect(self._random_toggled)
        self.stopStrings.editingFinished.connect(self._stop_edited)
        self.logitBiasEdit.editingFinished.connect(self._bias_edited)
        self._last_bias = ""
        self.systemPrompt.textChanged.connect(self._edited)
        self.chatFormatCombo.currentIndexChanged.connect(self._edited)
        self.speculative.changed.connect(self._edited)
        self.constraintCombo.currentIndexChanged.connect(self._constraint_changed)
        self.constraintText.textChanged.connect(self._constraint_changed)
        self._enable_constraint()
        self.presetCombo.currentIndexChanged.connect(self._preset_chosen)
        # clicked(bool) would arrive as the name argument; drop it.
        self.savePresetButton.clicked.connect(lambda: self.save_preset())
        self.deletePresetButton.clicked.connect(lambda: self.delete_preset())
        self._last_stop = ""

    def sizeHint(self):  # noqa: D102 - the content's natural size, without the scroll area's guess
        s = self._inner.sizeHint()
        return s.expandedTo(self.minimumSizeHint())

    # ------------------------------------------------------------------ public API

    def params(self) -> SamplingParams:
        """The settings for the next reply (seed None when a random seed is wanted).

        A control the connected server lacks (see :meth:`set_capabilities`) gives its off
        value, so a reply's recorded settings are the ones the server really applied."""
        has = (lambda f: True) if self.caps is None else (lambda f: getattr(self.caps, f, False))
        return SamplingParams(
            temperature=round(self.temperatureSpin.value(), 4),
            top_p=round(self.topPSpin.value(), 4),
            top_k=self.topKSpin.value() if has("top_k") else 0,
            min_p=round(self.minPSpin.value(), 4) if has("min_p") else 0.0,
            repetition_penalty=round(self.repetitionPenaltySpin.value(), 4) if has("repetition_penalty") else 1.0,
            seed=None if self.randomSeedCheck.isChecked() or not has("seed") else self.seedSpin.value(),
            max_new_tokens=self.maxTokensSpin.value(),
            stop=parse_stop_strings(self.stopStrings.text()),
            num_beams=self._hidden["num_beams"],
            length_penalty=self._hidden["length_penalty"],
            logit_bias_text=self._bias_specs()[0] if has("logit_bias") else (),
            **(self.speculative.values() if self.caps is None else {}),
            constraint=self.constraint(),
        ).validate()

    def _bias_specs(self) -> tuple[tuple[str, ...], list[str]]:
        return bias_items(self.logitBiasEdit.text())

    def _bias_edited(self) -> None:
        _, bad = self._bias_specs()
        self.logitBiasNotice.setText("Left out: " + "; ".join(bad) if bad else "")
        self.logitBiasNotice.setVisible(bool(bad))
        if self.logitBiasEdit.text() != self._last_bias:
            self._last_bias = self.logitBiasEdit.text()
            self._edited()

    def constraint(self) -> Constraint | None:
        """The chosen output constraint; None when off or its text is empty."""
        return from_editor(self.constraintCombo.currentData(), self.constraintText.toPlainText())

    def set_params(self, p: SamplingParams) -> None:
        """Show ``p`` (seed None ticks "random seed")."""
        d = p.to_dict()
        d["random_seed"] = p.seed is None
        if p.seed is None:
            d.pop("seed")
        self.from_dict(d)

    def system_prompt(self) -> str:
        return self.systemPrompt.toPlainText()

    def set_system_prompt(self, text: str) -> None:
        self.from_dict({"system_prompt": text})

    def chat_format(self) -> str:
        """"auto", "llama3", "llama2" or "raw"."""
        return self.chatFormatCombo.currentData()

    def set_chat_format(self, name: str) -> None:
        self.from_dict({"chat_format": name})

    def use_seed(self, seed: int) -> None:
        """Fix the seed (e.g. to reproduce a reply): untick random and show ``seed``."""
        self.from_dict({"random_seed": False, "seed_value": int(seed)})

    def set_capabilities(self, caps=None, server: str = "") -> None:
        """Replies come from a server with these :class:`core.remote.client.Capabilities` (None: the
        local model, everything on). Each control the server lacks is disabled, its tooltip
        saying why (the probe's finding); the chat format is the server's own template."""
        self.caps = caps
        where = server or "the server"
        controls = {"seed": (self.seedSpin, self.randomSeedCheck), "top_k": (self.topKSpin,),
                    "min_p": (self.minPSpin,), "repetition_penalty": (self.repetitionPenaltySpin,),
                    "logit_bias": (self.logitBiasEdit,)}
        for field_name, widgets in controls.items():
            lacking = caps is not None and not getattr(caps, field_name, False)
            for w in widgets:
                w.setEnabled(not lacking)
                tip = w.accessibleDescription()
                if lacking:
                    why = caps.why.get(field_name) or _NOT_REMOTE.get(field_name) or \
                        f"{where} does not support {field_name}"
                    tip = f"Not available with {where}: {why}."
                w.setToolTip(tip)
        self.chatFormatCombo.setEnabled(caps is None)
        self.chatFormatCombo.setToolTip(
            self.chatFormatCombo.accessibleDescription() if caps is None
            else f"Not available with {where}: the server wraps messages in its own chat template.")
        self.speculative.enable(caps is None)  # speculative decoding happens in this app's engine only
        self.speculativeCombo.setToolTip(
            self.speculativeCombo.accessibleDescription() if caps is None
            else f"Not available with {where}: speculative decoding runs in this app's engine; "
                 "how the server decodes is the server's own setting.")

    def set_model_context(self, n_ctx: int) -> None:
        """Cap max new tokens at the model's context length; the user's own choice comes
        back when a model with a longer context is loaded."""
        cap = max(1, min(MAX_TOKENS_CEILING, int(n_ctx)))
        before = self.maxTokensSpin.value()
        self._loading += 1
        try:
            with QSignalBlocker(self.maxTokensSpin):
                self.maxTokensSpin.setMaximum(cap)
                self.maxTokensSpin.setValue(min(self._wanted_max_tokens, cap))
        finally:
            self._loading -= 1
        if self.maxTokensSpin.value() != before:
            self.changed.emit()

    def to_dict(self) -> dict:
        """Everything the panel holds, JSON-ready; :meth:`from_dict` reads it back."""
        d = self.params().to_dict()
        d.update(random_seed=self.randomSeedCheck.isChecked(), seed_value=self.seedSpin.value(),
                 max_new_tokens=self._wanted_max_tokens,
                 system_prompt=self.system_prompt(), chat_format=self.chat_format(),
                 **self.speculative.state(),
                 constraint_kind=self.constraintCombo.currentData(), constraint_text=self.constraintText.toPlainText())
        return d

    def from_dict(self, d: dict) -> None:
        """Apply the keys present in ``d`` (a partial dict changes only those settings).
        "seed": an int fixes the seed, None makes it random, unless "random_seed" says."""
        self._apply(d)
        self._after_change()

    # ------------------------------------------------------------------ presets

    def preset_names(self) -> list[str]:
        """Built-in names first, then the user's, sorted."""
        return list(BUILTIN_PRESETS) + sorted(self._user_presets, key=str.casefold)

    def current_preset(self) -> str | None:
        """The selected preset's name; None when the settings match no preset ("Custom")."""
        data = self.presetCombo.currentData()
        return data[1] if data else None

    def apply_preset(self, name: str) -> None:
        """Load a built-in or user preset by name."""
        values = self._preset_values(name)
        if values is None:
            raise KeyError(f"no preset named {name!r}")
        self._apply(values)
        self._select_preset_item(name)
        self._after_change()

    def ask_preset_name(self, suggested: str, message: str = "") -> str | None:
        """Ask the user for a preset name; None when cancelled. Tests replace this."""
        label = (message + "\n\n" if message else "") + "Preset name:"
        text, ok = QInputDialog.getText(self, "Save preset", label, QLineEdit.Normal, suggested)
        return text if ok else None

    def save_preset(self, name: str | None = None) -> str | None:
        """Save the current settings as a user preset (asking for a name unless given).
        Returns the name saved under, or None if cancelled."""
        suggested = self.current_preset() if self.current_preset() in self._user_presets else ""
        message = ""
        for _ in range(10):  # re-ask on a reserved name; bounded so a stuck prompt can't hang
            if name is None:
                name = self.ask_preset_name(suggested or "", message)
            if name is None:
                return None
            name = " ".join(name.split())
            if not name:
                return None
            if name in BUILTIN_PRESETS or name == CUSTOM:
                message = f"“{name}” is built in; choose another name."
                suggested, name = name + " (mine)", None
                continue
            break
        else:
            return None
        d = self.to_dict()
        self._user_presets[name] = {k: d[k] for k in USER_PRESET_KEYS}
        self._rebuild_preset_combo(select=name)
        self._persist()
        return name

    def delete_preset(self, name: str | None = None) -> bool:
        """Delete a user preset (the selected one by default); built-ins cannot be deleted."""
        name = name or self.current_preset()
        if name not in self._user_presets:
            return False
        del self._user_presets[name]
        self._rebuild_preset_combo(select=None)
        self._persist()
        return True

    # ------------------------------------------------------------------ internals

    def _preset_values(self, name: str) -> dict | None:
        if name in BUILTIN_PRESETS:
            return BUILTIN_PRESETS[name]
        return self._user_presets.get(name)

    def _rebuild_preset_combo(self, select: str | None) -> None:
        combo = self.presetCombo
        with QSignalBlocker(combo):
            combo.clear()
            combo.addItem(CUSTOM, None)
            for n in BUILTIN_PRESETS:
                combo.addItem(n, ("builtin", n))
            if self._user_presets:
                combo.insertSeparator(combo.count())
                for n in sorted(self._user_presets, key=str.casefold):
                    combo.addItem(n, ("user", n))
        self._select_preset_item(select)

    def _select_preset_item(self, name: str | None) -> None:
        combo = self.presetCombo
        idx = 0
        if name is not None:
            for i in range(combo.count()):
                data = combo.itemData(i)
                if data and data[1] == name:
                    idx = i
                    break
        with QSignalBlocker(combo):
            combo.setCurrentIndex(idx)
        self.deletePresetButton.setEnabled(name in self._user_presets)

    def _matches(self, values: dict) -> bool:
        cur = self.to_dict()
        for k, v in values.items():
            c = cur.get(k)
            if isinstance(v, float) or isinstance(c, float):
                if c is None or v is None or not math.isclose(float(c), float(v), abs_tol=1e-6):
                    return False
            elif isinstance(v, (list, tuple)) and isinstance(c, (list, tuple)):
                if list(v) != list(c):
                    return False
            elif c != v:
                return False
        return True

    def _preset_chosen(self, index: int) -> None:
        data = self.presetCombo.itemData(index)
        if data is None:  # "Custom": nothing to load
            self.deletePresetButton.setEnabled(False)
            self._persist()
            return
        self.apply_preset(data[1])

    def _apply(self, d: dict) -> None:
        """Set widgets from the keys present in ``d`` without per-widget signals."""
        self._loading += 1
        try:
            def setv(w, v):
                with QSignalBlocker(w):
                    w.setValue(v)

            if "temperature" in d:
                setv(self.temperatureSpin, float(d["temperature"]))
                setv(self.temperatureSlider, round(self.temperatureSpin.value() * 100))
            if "top_p" in d:
                setv(self.topPSpin, float(d["top_p"]))
                setv(self.topPSlider, round(self.topPSpin.value() * 100))
            if "top_k" in d:
                setv(self.topKSpin, int(d["top_k"]))
            if "min_p" in d:
                setv(self.minPSpin, float(d["min_p"]))
            if "repetition_penalty" in d:
                setv(self.repetitionPenaltySpin, float(d["repetition_penalty"]))
            if "max_new_tokens" in d:
                self._wanted_max_tokens = max(1, min(MAX_TOKENS_CEILING, int(d["max_new_tokens"])))
                setv(self.maxTokensSpin, self._wanted_max_tokens)
            if "seed_value" in d:
                setv(self.seedSpin, max(0, min(SEED_MAX, int(d["seed_value"]))))
            random_seed = d.get("random_seed")
            if "seed" in d:
                if d["seed"] is not None:
                    setv(self.seedSpin, max(0, min(SEED_MAX, int(d["seed"]))))
                if random_seed is None:
                    random_seed = d["seed"] is None
            if random_seed is not None:
                with QSignalBlocker(self.randomSeedCheck):
                    self.randomSeedCheck.setChecked(bool(random_seed))
            self.seedSpin.setEnabled(not self.randomSeedCheck.isChecked())
            if "stop" in d:
                text = format_stop_strings(tuple(d["stop"] or ()))
                with QSignalBlocker(self.stopStrings):
                    self.stopStrings.setText(text)
                self._last_stop = text
            if "logit_bias_text" in d:
                text = format_stop_strings(tuple(d["logit_bias_text"] or ()))
                with QSignalBlocker(self.logitBiasEdit):
                    self.logitBiasEdit.setText(text)
                self._last_bias = text
                self.logitBiasNotice.hide()
            if "system_prompt" in d:
                with QSignalBlocker(self.systemPrompt):
                    self.systemPrompt.setPlainText(str(d["system_prompt"] or ""))
            if "chat_format" in d:
                i = self.chatFormatCombo.findData(d["chat_format"])
                with QSignalBlocker(self.chatFormatCombo):
                    self.chatFormatCombo.setCurrentIndex(max(i, 0))
            for k in self._hidden:
                if k in d:
                    self._hidden[k] = type(self._hidden[k])(d[k])
            self.speculative.apply(d)
            self._apply_constraint(d)
        finally:
            self._loading -= 1

    def _apply_constraint(self, d: dict) -> None:
        """constraint (a SamplingParams dict: {kind, text} or None), or the panel's own
        constraint_kind / constraint_text (the text is kept while the kind is Off)."""
        kind = text = None
        if "constraint" in d:
            c = d["constraint"]
            kind, text = (c.get("kind", ""), c.get("text", "")) if isinstance(c, dict) else ("", None)
        if "constraint_kind" in d:
            kind = str(d["constraint_kind"] or "")
        if "constraint_text" in d:
            text = str(d["constraint_text"] or "")
        if text is not None and (kind != "json_object" or not text) and text != self.constraintText.toPlainText():
            with QSignalBlocker(self.constraintText):
                self.constraintText.setPlainText(text)
        if kind is not None:
            with QSignalBlocker(self.constraintCombo):
                self.constraintCombo.setCurrentIndex(max(0, self.constraintCombo.findData(kind)))
        self._enable_constraint()
        self._check_constraint()

    def _enable_constraint(self) -> None:
        kind = self.constraintCombo.currentData()
        # The editor shows only where there is text to write: the panel stays short when off.
        self.constraintText.setVisible(bool(kind) and kind != "json_object")
        self.constraintText.setPlaceholderText(CONSTRAINT_HINTS.get(kind, ""))

    def _constraint_changed(self, *_: Any) -> None:
        self._enable_constraint()
        self._constraint_timer.start()
        self._edited()

    def _check_constraint(self) -> None:
        """Show why the constraint as written cannot be used (inline, under the editor)."""
        c = self.constraint()
        msg = syntax_error(c) if c is not None else ""
        self.constraintNotice.setText(msg[:1].upper() + msg[1:])
        self.constraintNotice.setVisible(bool(msg))
    def _after_change(self) -> None:
        # A setting that no longer matches the selected preset turns the combo to "Custom".
        name = self.current_preset()
        if name is not None:
            values = self._preset_values(name)
            if values is None or not self._matches(values):
                self._select_preset_item(None)
        self._persist()
        self.changed.emit()

    def _edited(self, *_: Any) -> None:
        if self._loading:
            return
        self._after_change()

    def _max_tokens_edited(self, value: int) -> None:
        if self._loading:
            return
        self._wanted_max_tokens = value
        self._after_change()

    def _random_toggled(self, checked: bool) -> None:
        self.seedSpin.setEnabled(not checked)
        self._edited()

    def _stop_edited(self) -> None:
        # editingFinished also fires on focus loss without a change; only real edits count.
        if self.stopStrings.text() != self._last_stop:
            self._last_stop = self.stopStrings.text()
            self._edited()

    # ------------------------------------------------------------------ persistence

    def _persist(self) -> None:
        s = self._settings
        d = self.to_dict()
        s.beginGroup("sampling")
        for k, v in d.items():
            s.setValue(k, json.dumps(v) if isinstance(v, (list, tuple, dict)) else
                       ("" if v is None else v))
        s.endGroup()
        s.beginGroup("presets")
        # One JSON value: preset names may hold '/' or other characters QSettings keys can't.
        s.setValue("user", json.dumps(self._user_presets, ensure_ascii=False))
        s.setValue("selected", self.current_preset() or "")
        s.endGroup()
        self._sync_timer.start()

    def _restore(self) -> None:
        s = self._settings
        s.beginGroup("presets")
        try:
            user = json.loads(s.value("user", "{}") or "{}")
            self._user_presets = {str(k): dict(v) for k, v in user.items() if isinstance(v, dict)}
        except (ValueError, TypeError, AttributeError):
            self._user_presets = {}
        selected = s.value("selected", None)
        s.endGroup()

        s.beginGroup("sampling")
        stored = {k: s.value(k) for k in s.childKeys()}
        s.endGroup()
        self._rebuild_preset_combo(select=None)
        if not stored:  # first run: a sensible preset
            self._apply(BUILTIN_PRESETS[DEFAULT_PRESET])
            self._apply({"random_seed": True})
            selected = DEFAULT_PRESET
        else:
            self._apply(_coerce_stored(stored))
        if selected and self._preset_values(selected) is not None \
                and self._matches(self._preset_values(selected)):
            self._select_preset_item(selected)
        self._persist()


def _coerce_stored(stored: dict) -> dict:
    """QSettings (INI) hands back strings; turn each known key into its type, skipping junk."""
    kinds = {"temperature": float, "top_p": float, "min_p": float, "repetition_penalty": float,
             "length_penalty": float, "top_k": int, "max_new_tokens": int, "num_beams": int,
             "seed_value": int, "random_seed": bool, "stop": list, "system_prompt": str,
             "chat_format": str, "speculative": str, "lookup_n": int, "draft_path": str,
             "logit_bias_text": list, "constraint_kind": str, "constraint_text": str}
    out: dict = {}
    for k, kind in kinds.items():
        if k not in stored or stored[k] is None:
            continue
        v = stored[k]
        try:
            if kind is bool:
                out[k] = v if isinstance(v, bool) else str(v).lower() in ("true", "1", "yes")
            elif kind is list:
                items = json.loads(v) if isinstance(v, str) else list(v)
                out[k] = [str(x) for x in items if str(x)]
            elif kind is str:
                out[k] = str(v)
            else:
                x = kind(float(v)) if kind is int else kind(v)
                if isinstance(x, float) and not math.isfinite(x):
                    continue
                out[k] = x
        except (ValueError, TypeError):
            continue
    return out
