"""The comparison's Sweep row: one setting and its values, to make one lane per value.

Self-contained (the settings that sweep, their names, ranges and help come from the
settings schema, :data:`core.engine.settings.SCHEMA`; it hints their values and adds a
draft model's file); the view parses the values against lane 1's settings
(:func:`core.engine.lanes.parse_sweep`) when "Make lanes" asks it to.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QLineEdit, QMessageBox, QPushButton

from core.engine.lanes import MAX_LANES, SWEEP_KEYS, draft_name
from core.engine.settings import SCHEMA

from gui import theme
from gui.settings import speculative
from gui.settings.widgets import guard_wheel

SWEEP_HINTS = {"temperature": "0.2, 0.7, 1.2   or a range   0.2:1.4:0.4",
               "seed": "1, 2, 3   or a range   1:8", "lookup": "0, 2, 4   (0 = off)",
               "draft": "off, /models/small.gguf, /models/tiny.gguf   (… adds a file)",
               "logit_bias_text": "girl=-inf, -5, 0, 5   or   girl=-10:10:5",
               "constraint": "on, off   (lane 1's output format)"}


def sweep_name(key: str) -> str:
    """How the row and the status line name a setting: the schema's label, in lower case."""
    return SCHEMA[key].label.lower()


def sweep_tip(key: str) -> str:
    """What a setting does and, for a number, the values it takes."""
    s = SCHEMA[key]
    return f"{s.label}: {s.range_text()}. {s.help}" if s.numeric else f"{s.label}: {s.help}"


def describe_sweep(key: str, values: list) -> str:
    """The status line after a sweep made its lanes: '3 lanes over temperature: 0.2, 0.6, 1'."""
    def shown(v) -> str:
        if key == "draft":
            return draft_name(v)
        return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)
    return f"{len(values)} lanes over {sweep_name(key)}: " + ", ".join(shown(v) for v in values)


def _button(text: str, name: str, tip: str) -> QPushButton:
    b = QPushButton(text)
    b.setObjectName(name)
    b.setAccessibleName(text)
    b.setToolTip(tip)
    return b


class SweepRow(QFrame):
    """The Sweep row (objectName ``sweepRow``): a setting (``param``), its values typed
    in ``values``, "Make lanes" (``apply_button``), "…" (``browse_button``, a draft model
    sweep only) and ``error``, where the view names bad values.

    Signals:
        applyRequested(): "Make lanes" was pressed, or Return in the values.
        undoRequested(): "Undo" was pressed (shown after a sweep, see :meth:`offer_undo`).
    """

    applyRequested = Signal()
    undoRequested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sweepRow")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.param = QComboBox()
        self.param.setObjectName("sweepParamCombo")
        self.param.setAccessibleName("Setting to sweep")
        for key in SWEEP_KEYS:
            self.param.addItem(sweep_name(key), key)
            self.param.setItemData(self.param.count() - 1, sweep_tip(key), Qt.ToolTipRole)
        self.param.currentIndexChanged.connect(self._param_chosen)
        self.values = QLineEdit()
        self.values.setObjectName("sweepValuesEdit")
        self.values.setAccessibleName("Sweep values")
        self.values.setPlaceholderText(SWEEP_HINTS["temperature"])
        self.values.setToolTip(sweep_tip("temperature"))
        self.values.returnPressed.connect(self.applyRequested.emit)
        self.apply_button = _button("Make lanes", "sweepApplyButton",
                                    "One lane per value, the rest copied from lane 1 (asks before "
                                    "replacing lanes that have results, branches or your edits)")
        self.apply_button.clicked.connect(self.applyRequested.emit)
        self.undo_button = _button("Undo", "sweepUndoButton", "Put back the lanes as they were before the sweep")
        self.undo_button.clicked.connect(self.undoRequested.emit)
        self.undo_button.hide()
        self.browse_button = _button("…", "sweepBrowseButton",
                                     "Add a draft model's file (or a model folder's) to the values")
        self.browse_button.setMaximumWidth(self.browse_button.fontMetrics().horizontalAdvance("…") + 24)
        self.browse_button.clicked.connect(self._add_model)
        self.browse_button.hide()
        self.error = QLabel()
        self.error.setObjectName("sweepError")
        self.error.setStyleSheet(f"color: {theme.colors()['error']};")
        row.addWidget(QLabel("Sweep"))
        row.addWidget(self.param)
        row.addWidget(self.values, 1)
        row.addWidget(self.browse_button)
        row.addWidget(self.apply_button)
        row.addWidget(self.undo_button)
        row.addWidget(self.error)
        guard_wheel(self)

    def key(self) -> str:
        """The setting chosen to sweep."""
        return self.param.currentData()

    def set_enabled(self, on: bool) -> None:
        """Off while the lanes run."""
        self.apply_button.setEnabled(on)
        self.browse_button.setEnabled(on)
        self.undo_button.setEnabled(on)

    def offer_undo(self, on: bool) -> None:
        self.undo_button.setVisible(on)

    def ask(self, at_stake: str, n_new: int, room: int) -> str:
        """Replace the lanes, add the sweep's ``n_new`` beside them (when ``room`` allows) or
        cancel: "replace", "add" or "cancel" (a modal box; tests replace this method)."""
        box = QMessageBox(QMessageBox.Question, "Make lanes",
                          f"The sweep makes {n_new} lanes. Replace {at_stake}, or add the new ones beside them?",
                          parent=self)
        fit = (f"only {room} more fit beside them" if room else "no more fit beside them") + f" ({MAX_LANES} at most)"
        box.setInformativeText("Undo puts the lanes back either way." if n_new <= room else
                               f"{fit[:1].upper()}{fit[1:]}: replace them, or sweep fewer values. Undo puts "
                               "the lanes back.")
        replace = box.addButton("Replace", QMessageBox.DestructiveRole)
        add = box.addButton("Add Beside", QMessageBox.AcceptRole)
        add.setEnabled(n_new <= room)
        box.addButton(QMessageBox.Cancel)
        box.setDefaultButton(add if n_new <= room else replace)
        box.exec()
        clicked = box.clickedButton()
        return "replace" if clicked == replace else "add" if clicked == add else "cancel"

    def _param_chosen(self, *_) -> None:
        key = self.key()
        self.values.setPlaceholderText(SWEEP_HINTS.get(key, SWEEP_HINTS["temperature"]))
        self.values.setToolTip(sweep_tip(key))
        self.browse_button.setVisible(key == "draft")
        self.error.setText("")

    def _add_model(self) -> None:
        """"…" of a draft model sweep: a chosen model's path joins the values."""
        path = speculative.choose_model_path(self, "Add a draft model to the sweep")
        if path:
            text = self.values.text().strip().rstrip(",")
            self.values.setText(f"{text}, {path}" if text else f"off, {path}")
