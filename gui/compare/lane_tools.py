"""A comparison lane's tools row: its tool_choice (auto / none / required / one tool / off)
and whether its calls are held to their schemas. Shown only when the comparison offers
tools (a comparison opened from a chat that has some)."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QWidget

from core.engine.settings import SCHEMA
from core.prompt.tool_format import OFF

WORDS = (("auto", "auto"), ("none", "none (no calls)"), ("required", "required"))
OFF_LABEL = "off (not in the prompt)"


class LaneTools(QWidget):
    """tool_choice and tool_constraint for one lane (objectName ``laneTools``)."""

    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("laneTools")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        label = QLabel("tools")
        row.addWidget(label)
        self.choice = QComboBox(self)
        self.choice.setObjectName("lane_tool_choice")
        self.choice.setAccessibleName("Lane tool choice")
        self.choice.setToolTip(SCHEMA["tool_choice"].help + " Off: this lane's prompt declares no tools at all, "
                               "so it answers as the model would without them.")
        self.choice.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.choice.setMinimumContentsLength(8)
        label.setBuddy(self.choice)
        row.addWidget(self.choice, 1)
        self.held = QCheckBox("held", self)
        self.held.setObjectName("lane_tool_constraint")
        self.held.setAccessibleName("Lane constrained calls")
        self.held.setToolTip(SCHEMA["tool_constraint"].help)
        self.held.setChecked(True)
        row.addWidget(self.held)
        self._names: list[str] = []
        self.set_tools([])
        self.choice.currentIndexChanged.connect(self._edited)
        self.held.toggled.connect(self.changed)

    def set_tools(self, names: list[str]) -> None:
        """Offer these tools by name (none: the row hides; the lane keeps its choice)."""
        keep = self.choice.currentData() or "auto"
        self._names = list(names)
        self.choice.blockSignals(True)
        self.choice.clear()
        for value, text in WORDS:
            self.choice.addItem(text, value)
        for name in self._names:
            self.choice.addItem(name, name)
        self.choice.addItem(OFF_LABEL, OFF)
        self.choice.blockSignals(False)
        self._show(keep)
        self.setVisible(bool(self._names))

    def _show(self, value: str) -> None:
        at = self.choice.findData(value)
        if at < 0:  # a saved lane's tool the chat no longer has: kept, and said
            self.choice.addItem(f"{value} (not offered)", value)
            at = self.choice.count() - 1
        self.choice.blockSignals(True)
        self.choice.setCurrentIndex(at)
        self.choice.blockSignals(False)
        self.held.setEnabled(value not in ("none", OFF))

    def _edited(self, *_) -> None:
        self.held.setEnabled(self.choice.currentData() not in ("none", OFF))
        self.changed.emit()

    def values(self) -> dict:
        return {"tool_choice": self.choice.currentData() or "auto", "tool_constraint": self.held.isChecked()}

    def apply(self, d: dict) -> None:
        if isinstance(d.get("tool_choice"), str) and d["tool_choice"]:
            self._show(d["tool_choice"])
        if isinstance(d.get("tool_constraint"), bool):
            self.held.blockSignals(True)
            self.held.setChecked(d["tool_constraint"])
            self.held.blockSignals(False)
