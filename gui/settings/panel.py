"""The settings side panel: sampling, length and stopping, speed, output format, system
prompt, chat format, named presets. Everything persists in QSettings as it changes.

The numeric controls are built from the settings schema (:mod:`gui.settings.widgets`);
the speculative controls, the output format editor, the preset chooser and the store are
modules of their own, composed here."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSettings, QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (QAbstractSpinBox, QCheckBox, QComboBox, QFrame, QInputDialog, QLabel, QLineEdit,
                               QPlainTextEdit, QScrollArea, QSizePolicy, QVBoxLayout, QWidget)

from core.engine.constraint import Constraint
from core.engine.settings import SCHEMA, SamplingParams
from core.prompt.chat_format import FORMAT_NAMES
from gui import theme
from gui.settings.beams import BeamControls, beam_reason
from gui.settings.output_format import OutputFormatEditor
from gui.settings.presets import (BUILTIN_PRESETS, CUSTOM, DEFAULT_PRESET, USER_PRESET_KEYS, PresetChooser,
                                  matches)
from gui.settings.speculative import SpeculativeControls
from gui.settings.store import PanelStore, default_settings
from gui.settings.text_items import bias_items, format_stop_strings, parse_stop_strings
from gui.settings.widgets import add_row, form, form_with_notice, guard_wheel, named, slider_pair, spin_box

CHAT_FORMATS = (("auto", "Auto"), ("llama3", "Llama 3"), ("llama2", "Llama 2"),
                ("raw", "Raw completion"))
assert tuple(k for k, _ in CHAT_FORMATS) == tuple(FORMAT_NAMES)

# Why a control has no server counterpart (where the capability probe has nothing to say).
_NOT_REMOTE = {"logit_bias": "a bias by text needs the model's tokenizer, and a server's is not known here"}
SEED_MAX = SCHEMA["seed"].widget_range()[1]
MAX_TOKENS_CEILING = SCHEMA["max_new_tokens"].widget_range()[1]


class SamplingPanel(QWidget):
    """Generation settings for the next reply, with named presets.

    Signals:
        changed(): any setting changed — by the user, a preset, or ``set_*``/``from_dict``.

    Read the settings with :meth:`params` (a validated ``core.engine.settings.SamplingParams``;
    seed None when "random seed" is ticked), :meth:`system_prompt` and :meth:`chat_format`.
    Everything is saved to QSettings (groups "sampling" and "presets", :attr:`store`) as it
    changes and restored when the panel is built. :meth:`ask_preset_name` is the name prompt
    used by "Save preset"; replace it on the instance in tests.
    """

    changed = Signal()

    def __init__(self, *, settings: QSettings | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("samplingPanel")
        self.store = PanelStore(settings if settings is not None else default_settings(), self)
        self._loading = 0  # >0 while widgets are set programmatically
        self._wanted_max_tokens = SamplingParams().max_new_tokens
        self._user_presets: dict[str, dict] = {}
        self._last_stop = self._last_bias = ""  # editingFinished fires without edits too
        self.caps = None  # a server's core.remote.client.Capabilities while replies come from one
        self._server = ""
        self._build()
        self._wire()
        self._restore()

    # ------------------------------------------------------------------ building

    def _build(self) -> None:
        self.presets = PresetChooser()
        self.presetCombo = self.presets.combo
        self.savePresetButton = self.presets.save_button
        self.deletePresetButton = self.presets.delete_button
        self._sampling_box, self._speed_box = self._build_sampling(), self._build_speed()
        self._format_box = self._build_output_format()
        sections = (self.presets, self._sampling_box, self._build_beams(), self._build_length(), self._speed_box,
                    self._format_box)
        conversation = self._build_conversation()
        # Scrollable, so a short window still reaches every control.
        inner = QWidget()
        v = QVBoxLayout(inner)
        v.setContentsMargins(6, 6, 6, 6)
        for box in sections:
            v.addWidget(box)
        v.addWidget(conversation, 1)
        guard_wheel(inner)  # the wheel scrolls the panel, not the control under the pointer
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

    def _build_sampling(self) -> QWidget:
        box, f = form("Sampling")
        self.temperatureSlider, self.temperatureSpin, row = slider_pair(
            SCHEMA["temperature"], "temperatureSlider", "temperatureSpin", self._edited)
        add_row(f, "&Temperature", row, self.temperatureSpin)
        # top_p's range is open at 0, so the slider starts a step above: 0.01 already means "top token".
        self.topPSlider, self.topPSpin, row = slider_pair(SCHEMA["top_p"], "topPSlider", "topPSpin", self._edited)
        add_row(f, "Top-&p", row, self.topPSpin)
        self.topKSpin = spin_box(SCHEMA["top_k"], "topKSpin")
        self.topKSpin.setSpecialValueText("off")
        add_row(f, "Top-&k", self.topKSpin)
        self.minPSpin = spin_box(SCHEMA["min_p"], "minPSpin")
        add_row(f, "&Min-p", self.minPSpin)
        self.repetitionPenaltySpin = spin_box(SCHEMA["repetition_penalty"], "repetitionPenaltySpin")
        self.repetitionPenaltySpin.setValue(SCHEMA["repetition_penalty"].default)
        add_row(f, "&Repetition penalty", self.repetitionPenaltySpin)
        return box

    def _build_beams(self) -> QWidget:
        """Beam search: the likeliest replies instead of sampled ones, each a version of the reply."""
        self.beams = BeamControls(self)
        self.numBeamsSpin, self.lengthPenaltySpin = self.beams.beams, self.beams.length_penalty
        self.beamNotice = self.beams.notice
        box, f = form_with_notice("Beam search", self.beamNotice)
        add_row(f, "Be&ams", self.numBeamsSpin)
        add_row(f, "&Length penalty", self.lengthPenaltySpin)
        return box

    def _build_length(self) -> QWidget:
        box, f = form("Length && stopping")
        self.maxTokensSpin = spin_box(SCHEMA["max_new_tokens"], "maxTokensSpin")
        self.maxTokensSpin.setValue(self._wanted_max_tokens)
        self.maxTokensSpin.setMinimumWidth(self.maxTokensSpin.fontMetrics().horizontalAdvance("0" * 6) + 32)
        add_row(f, "Max new &tokens", self.maxTokensSpin)
        self.seedSpin = spin_box(SCHEMA["seed"], "seedSpin")
        self.seedSpin.setButtonSymbols(QAbstractSpinBox.NoButtons)
        # The range's widest text (2147483647) would make the box wider than the panel.
        self.seedSpin.setMinimumWidth(self.seedSpin.fontMetrics().horizontalAdvance("0" * 8) + 16)
        self.randomSeedCheck = named(QCheckBox("&Random seed for each reply"), "randomSeedCheck",
                                     "Draw a new seed for every reply (the seed used is shown with it).")
        add_row(f, "S&eed", self.seedSpin)
        f.addRow(self.randomSeedCheck)
        self.stopStrings = named(
            QLineEdit(), "stopStrings",
            "Stop the reply when it produces one of these: comma-separated, \\n for a newline, \\, for a comma.")
        self.stopStrings.setPlaceholderText(r"e.g. ###, \nUser:")
        self.stopStrings.setClearButtonEnabled(True)
        add_row(f, "&Stop at", self.stopStrings)
        self.logitBiasEdit = named(QLineEdit(), "logitBiasEdit",
                                   SCHEMA["logit_bias_text"].help + " Comma-separated (\\, for a comma in TEXT).")
        self.logitBiasEdit.setPlaceholderText("e.g. dragon=+5, Once=-inf")
        self.logitBiasEdit.setClearButtonEnabled(True)
        add_row(f, "Logit &bias", self.logitBiasEdit)
        self.logitBiasNotice = QLabel()
        self.logitBiasNotice.setObjectName("logitBiasNotice")
        self.logitBiasNotice.setWordWrap(True)
        self.logitBiasNotice.setStyleSheet(f"color: {theme.colors()['error']};")
        self.logitBiasNotice.hide()
        f.addRow(self.logitBiasNotice)
        return box

    def _build_speed(self) -> QWidget:
        """Speculative decoding: the reply is the same, only faster or not."""
        box, f = form("Speed")
        self.speculative = sc = SpeculativeControls(self)
        self.speculativeCombo = named(sc.combo, "speculativeCombo", sc.combo.toolTip())
        add_row(f, "Spec&ulative", self.speculativeCombo)
        self.lookupSpin = named(sc.lookup, "lookupSpin", sc.lookup.toolTip())
        add_row(f, "Lookup &n", self.lookupSpin)
        self.draftPath = named(sc.draft, "draftPath", sc.draft.toolTip())
        self.draftBrowseButton = named(sc.browse_button, "draftBrowseButton", sc.browse_button.toolTip())
        add_row(f, "&Draft model", sc.draft_row, self.draftPath)
        return box

    def _build_output_format(self) -> QWidget:
        """A JSON schema, regex or grammar, checked as it is typed."""
        box, f = form("Output format")
        self.outputFormat = OutputFormatEditor(self)
        self.outputFormat.add_to(f)
        self.constraintCombo = self.outputFormat.combo
        self.constraintText = self.outputFormat.text
        self.constraintNotice = self.outputFormat.notice
        return box

    def _build_conversation(self) -> QWidget:
        box, f = form("Conversation")
        self.chatFormatCombo = named(QComboBox(), "chatFormatCombo",
                                     "How messages are wrapped for the model; Auto reads it from the model.")
        for key, label in CHAT_FORMATS:
            self.chatFormatCombo.addItem(label, key)
        add_row(f, "Chat &format", self.chatFormatCombo)
        self.systemPrompt = named(QPlainTextEdit(), "systemPrompt",
                                  "Instructions sent before the conversation in every request.")
        self.systemPrompt.setPlaceholderText("You are a helpful assistant.")
        self.systemPrompt.setTabChangesFocus(True)
        self.systemPrompt.setMinimumHeight(self.systemPrompt.fontMetrics().lineSpacing() * 4 + 12)
        self.systemPrompt.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        label = QLabel("S&ystem prompt")
        label.setBuddy(self.systemPrompt)
        label.setToolTip(self.systemPrompt.toolTip())
        f.addRow(label)
        f.addRow(self.systemPrompt)
        return box

    def _wire(self) -> None:
        for spin in (self.topKSpin, self.minPSpin, self.repetitionPenaltySpin, self.seedSpin):
            spin.valueChanged.connect(self._edited)
        self.maxTokensSpin.valueChanged.connect(self._max_tokens_edited)
        self.randomSeedCheck.toggled.connect(self._random_toggled)
        self.stopStrings.editingFinished.connect(self._stop_edited)
        self.logitBiasEdit.editingFinished.connect(self._bias_edited)
        self.systemPrompt.textChanged.connect(self._edited)
        self.chatFormatCombo.currentIndexChanged.connect(self._edited)
        self.speculative.changed.connect(self._edited)
        self.outputFormat.changed.connect(self._edited)
        self.beams.changed.connect(self._beams_changed)
        self.presetCombo.currentIndexChanged.connect(self._preset_chosen)
        # clicked(bool) would arrive as the name argument; drop it.
        self.savePresetButton.clicked.connect(lambda: self.save_preset())
        self.deletePresetButton.clicked.connect(lambda: self.delete_preset())

    def sizeHint(self):  # noqa: D102 - the content's natural size, without the scroll area's guess
        s = self._inner.sizeHint()
        return s.expandedTo(self.minimumSizeHint())

    # ------------------------------------------------------------------ public API

    def control(self, name: str) -> QWidget | None:
        """The spin box that sets the schema's setting ``name`` (None: not shown here)."""
        return {"temperature": self.temperatureSpin, "top_p": self.topPSpin, "top_k": self.topKSpin,
                "min_p": self.minPSpin, "repetition_penalty": self.repetitionPenaltySpin,
                "max_new_tokens": self.maxTokensSpin, "seed": self.seedSpin, "lookup": self.lookupSpin,
                "num_beams": self.numBeamsSpin, "length_penalty": self.lengthPenaltySpin}.get(name)

    def params(self) -> SamplingParams:
        """The settings for the next reply (seed None when a random seed is wanted).

        A control the connected server lacks (see :meth:`set_capabilities`) gives its off
        value, so a reply's recorded settings are the ones the server really applied. With beams
        on, what beam search refuses (logit bias, speculative decoding, output format) is off."""
        beams = self.beams.on
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
            **self.beams.values(),
            logit_bias_text=bias_items(self.logitBiasEdit.text())[0] if has("logit_bias") and not beams else (),
            **(self.speculative.values() if self.caps is None and not beams else {}),
            constraint=None if beams else self.constraint(),
        ).validate()

    def constraint(self) -> Constraint | None:
        """The chosen output constraint; None when off or its text is empty."""
        return self.outputFormat.constraint()

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
        self.caps, self._server = caps, server
        where = server or "the server"
        self.beams.enable(caps is None, "" if caps is None else
                          f"Not available with {where}: beam search runs in this app's engine only.")
        self._enable_controls()
        self.chatFormatCombo.setEnabled(caps is None)
        self.chatFormatCombo.setToolTip(
            self.chatFormatCombo.accessibleDescription() if caps is None
            else f"Not available with {where}: the server wraps messages in its own chat template.")
        self.speculative.enable(caps is None)  # speculative decoding happens in this app's engine only
        self.speculativeCombo.setToolTip(
            self.speculativeCombo.accessibleDescription() if caps is None
            else f"Not available with {where}: speculative decoding runs in this app's engine; "
                 "how the server decodes is the server's own setting.")

    def _enable_controls(self) -> None:
        """Each control on unless the server lacks it or beam search leaves it out; its
        tooltip says which. Beam search turns whole sections off (sampling, speed, output
        format): a section's own controls keep their state for when it comes back."""
        caps, where = self.caps, self._server or "the server"
        beams = beam_reason(self.beams.count) if self.beams.on else ""
        controls = {"seed": (self.seedSpin, self.randomSeedCheck), "top_k": (self.topKSpin,),
                    "min_p": (self.minPSpin,), "repetition_penalty": (self.repetitionPenaltySpin,),
                    "logit_bias": (self.logitBiasEdit,)}
        for field_name, widgets in controls.items():
            lacking = caps is not None and not getattr(caps, field_name, False)
            why = (caps.why.get(field_name) or _NOT_REMOTE.get(field_name)
                   or f"{where} does not support {field_name}") if lacking else ""
            for w in widgets:
                w.setEnabled(not lacking and not (beams and field_name in ("seed", "logit_bias")))
                w.setToolTip(f"Not available with {where}: {why}." if lacking else
                             beams if beams and field_name in ("seed", "logit_bias") else w.accessibleDescription())
        if self.randomSeedCheck.isChecked():
            self.seedSpin.setEnabled(False)
        for box in (self._sampling_box, self._speed_box, self._format_box):
            box.setEnabled(not beams)
            box.setToolTip(beams)

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
        d["logit_bias_text"] = list(bias_items(self.logitBiasEdit.text())[0])  # kept while beams leave it out
        d.update(random_seed=self.randomSeedCheck.isChecked(), seed_value=self.seedSpin.value(),
                 max_new_tokens=self._wanted_max_tokens,
                 system_prompt=self.system_prompt(), chat_format=self.chat_format(),
                 **self.speculative.state(), **self.outputFormat.state())
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
        return self.presets.current()

    def apply_preset(self, name: str) -> None:
        """Load a built-in or user preset by name."""
        values = self._preset_values(name)
        if values is None:
            raise KeyError(f"no preset named {name!r}")
        self._apply(values)
        self._select_preset(name)
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
        self.presets.rebuild(self._user_presets, name, deletable=True)
        self._persist()
        return name

    def delete_preset(self, name: str | None = None) -> bool:
        """Delete a user preset (the selected one by default); built-ins cannot be deleted."""
        name = name or self.current_preset()
        if name not in self._user_presets:
            return False
        del self._user_presets[name]
        self.presets.rebuild(self._user_presets, None, deletable=False)
        self._persist()
        return True

    def _preset_values(self, name: str) -> dict | None:
        if name in BUILTIN_PRESETS:
            return BUILTIN_PRESETS[name]
        return self._user_presets.get(name)

    def _select_preset(self, name: str | None) -> None:
        self.presets.select(name, deletable=name in self._user_presets)

    def _preset_chosen(self, index: int) -> None:
        data = self.presetCombo.itemData(index)
        if data is None:  # "Custom": nothing to load
            self.deletePresetButton.setEnabled(False)
            self._persist()
            return
        self.apply_preset(data[1])

    # ------------------------------------------------------------------ applying values

    def _apply(self, d: dict) -> None:
        """Set widgets from the keys present in ``d`` without per-widget signals."""
        self._loading += 1
        try:
            self._apply_numbers(d)
            self.beams.apply(d)
            self._apply_seed(d)  # after the beams: what they turn off follows both
            self._apply_texts(d)
            self.speculative.apply(d)
            self.outputFormat.apply(d)
        finally:
            self._loading -= 1

    def _apply_numbers(self, d: dict) -> None:
        if "temperature" in d:
            _set_value(self.temperatureSpin, float(d["temperature"]))
            _set_value(self.temperatureSlider, round(self.temperatureSpin.value() * 100))
        if "top_p" in d:
            _set_value(self.topPSpin, float(d["top_p"]))
            _set_value(self.topPSlider, round(self.topPSpin.value() * 100))
        if "top_k" in d:
            _set_value(self.topKSpin, int(d["top_k"]))
        if "min_p" in d:
            _set_value(self.minPSpin, float(d["min_p"]))
        if "repetition_penalty" in d:
            _set_value(self.repetitionPenaltySpin, float(d["repetition_penalty"]))
        if "max_new_tokens" in d:
            self._wanted_max_tokens = max(1, min(MAX_TOKENS_CEILING, int(d["max_new_tokens"])))
            _set_value(self.maxTokensSpin, self._wanted_max_tokens)

    def _apply_seed(self, d: dict) -> None:
        if "seed_value" in d:
            _set_value(self.seedSpin, max(0, min(SEED_MAX, int(d["seed_value"]))))
        random_seed = d.get("random_seed")
        if "seed" in d:
            if d["seed"] is not None:
                _set_value(self.seedSpin, max(0, min(SEED_MAX, int(d["seed"]))))
            if random_seed is None:
                random_seed = d["seed"] is None
        if random_seed is not None:
            with QSignalBlocker(self.randomSeedCheck):
                self.randomSeedCheck.setChecked(bool(random_seed))
        self._enable_controls()

    def _apply_texts(self, d: dict) -> None:
        if "stop" in d:
            self._last_stop = format_stop_strings(tuple(d["stop"] or ()))
            with QSignalBlocker(self.stopStrings):
                self.stopStrings.setText(self._last_stop)
        if "logit_bias_text" in d:
            self._last_bias = format_stop_strings(tuple(d["logit_bias_text"] or ()))
            with QSignalBlocker(self.logitBiasEdit):
                self.logitBiasEdit.setText(self._last_bias)
            self.logitBiasNotice.hide()
        if "system_prompt" in d:
            with QSignalBlocker(self.systemPrompt):
                self.systemPrompt.setPlainText(str(d["system_prompt"] or ""))
        if "chat_format" in d:
            i = self.chatFormatCombo.findData(d["chat_format"])
            with QSignalBlocker(self.chatFormatCombo):
                self.chatFormatCombo.setCurrentIndex(max(i, 0))

    # ------------------------------------------------------------------ edits

    def _after_change(self) -> None:
        # A setting that no longer matches the selected preset turns the combo to "Custom".
        name = self.current_preset()
        if name is not None:
            values = self._preset_values(name)
            if values is None or not matches(self.to_dict(), values):
                self._select_preset(None)
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
        self._enable_controls()
        self._edited()

    def _beams_changed(self) -> None:
        self._enable_controls()
        self._edited()

    def _stop_edited(self) -> None:
        # editingFinished also fires on focus loss without a change; only real edits count.
        if self.stopStrings.text() != self._last_stop:
            self._last_stop = self.stopStrings.text()
            self._edited()

    def _bias_edited(self) -> None:
        _, bad = bias_items(self.logitBiasEdit.text())
        self.logitBiasNotice.setText("Left out: " + "; ".join(bad) if bad else "")
        self.logitBiasNotice.setVisible(bool(bad))
        if self.logitBiasEdit.text() != self._last_bias:
            self._last_bias = self.logitBiasEdit.text()
            self._edited()

    # ------------------------------------------------------------------ persistence

    def _persist(self) -> None:
        self.store.save(self.to_dict(), self._user_presets, self.current_preset())

    def _restore(self) -> None:
        stored, self._user_presets, selected = self.store.load()
        self.presets.rebuild(self._user_presets, None, deletable=False)
        if stored is None:  # first run: a sensible preset
            self._apply(BUILTIN_PRESETS[DEFAULT_PRESET])
            self._apply({"random_seed": True})
            selected = DEFAULT_PRESET
        else:
            self._apply(stored)
        values = self._preset_values(selected) if selected else None
        if values is not None and matches(self.to_dict(), values):
            self._select_preset(selected)
        self._persist()


def _set_value(w, value) -> None:
    """Set a control's value without its valueChanged."""
    with QSignalBlocker(w):
        w.setValue(value)
