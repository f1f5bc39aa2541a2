"""Named presets of the settings panel: the built-in ones, the user's own, the preset
chooser (combo, Save…, Delete) and whether settings still match a preset."""
from __future__ import annotations

import math

from PySide6.QtCore import QSignalBlocker
from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QPushButton, QSizePolicy, QVBoxLayout

from gui.settings.widgets import named

# Built-in presets set only the sampler; length, seed and prompt stay as the user has them.
# Each samples, so it turns beam search off (beams would leave its settings unused).
BUILTIN_PRESETS: dict[str, dict] = {
    "Precise": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0, "num_beams": 1},
    "Balanced": {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
                 "repetition_penalty": 1.0, "num_beams": 1},
    "Creative": {"temperature": 1.1, "top_p": 0.98, "top_k": 0, "min_p": 0.05,
                 "repetition_penalty": 1.0, "num_beams": 1},
}
DEFAULT_PRESET = "Balanced"
CUSTOM = "Custom"

# What a user preset captures (chat format is a property of the model, so it is left out).
USER_PRESET_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "num_beams", "length_penalty",
                    "max_new_tokens", "stop", "random_seed", "seed_value", "system_prompt")


def matches(current: dict, values: dict) -> bool:
    """Whether the settings ``current`` hold every one of ``values`` (floats to 1e-6)."""
    for k, v in values.items():
        c = current.get(k)
        if isinstance(v, float) or isinstance(c, float):
            if c is None or v is None or not math.isclose(float(c), float(v), abs_tol=1e-6):
                return False
        elif isinstance(v, (list, tuple)) and isinstance(c, (list, tuple)):
            if list(v) != list(c):
                return False
        elif c != v:
            return False
    return True


class PresetChooser(QGroupBox):
    """The "Preset" group: the combo ("Custom", the built-ins, then the user's presets,
    sorted) over its Save… and Delete buttons. The panel wires the signals: the combo's
    ``currentIndexChanged`` and the buttons' ``clicked``."""

    def __init__(self):
        super().__init__("Preset")
        self.combo = named(QComboBox(), "presetCombo", "Pick a named set of sampling settings.")
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(6)
        self.combo.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.save_button = named(QPushButton("Save…"), "savePresetButton",
                                 "Save the current settings as a named preset.")
        self.delete_button = named(QPushButton("Delete"), "deletePresetButton",
                                   "Delete the selected preset (built-in presets stay).")
        for b in (self.save_button, self.delete_button):
            # The style's 80 px button minimum would push a 300 px panel wider.
            b.setMinimumWidth(b.fontMetrics().horizontalAdvance(b.text()) + 16)
            b.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        # The title names the combo, so the row needs no label. The combo has the group's
        # whole width (a row shared with the buttons cut "Balanced (mine)" to "Balanced (n");
        # the buttons sit under it, right-aligned.
        v = QVBoxLayout(self)
        v.addWidget(self.combo)
        h = QHBoxLayout()
        h.addStretch(1)
        h.addWidget(self.save_button)
        h.addWidget(self.delete_button)
        v.addLayout(h)

    def current(self) -> str | None:
        """The selected preset's name; None for "Custom"."""
        data = self.combo.currentData()
        return data[1] if data else None

    def rebuild(self, user_names, select: str | None, deletable: bool) -> None:
        """Fill the combo with the built-ins and ``user_names``, then :meth:`select`."""
        with QSignalBlocker(self.combo):
            self.combo.clear()
            self.combo.addItem(CUSTOM, None)
            for n in BUILTIN_PRESETS:
                self.combo.addItem(n, ("builtin", n))
            names = sorted(user_names, key=str.casefold)
            if names:
                self.combo.insertSeparator(self.combo.count())
                for n in names:
                    self.combo.addItem(n, ("user", n))
        self.select(select, deletable)

    def select(self, name: str | None, deletable: bool) -> None:
        """Show ``name`` selected ("Custom" for None) without signals; Delete enabled only
        for a user's preset (``deletable``)."""
        idx = 0
        if name is not None:
            for i in range(self.combo.count()):
                data = self.combo.itemData(i)
                if data and data[1] == name:
                    idx = i
                    break
        with QSignalBlocker(self.combo):
            self.combo.setCurrentIndex(idx)
        self.delete_button.setEnabled(deletable)
