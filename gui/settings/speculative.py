"""Speculative decoding's controls (mode, lookup's n, draft model), shared by the
settings panel and each comparison lane, and the model file chooser they use."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QSignalBlocker, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLineEdit, QPushButton, QWidget

from core.engine.settings import SCHEMA
from gui.settings.widgets import spin_box

SPECULATIVE_MODES = (("off", "Off"), ("lookup", "Prompt lookup"), ("draft", "Draft model"))
DEFAULT_LOOKUP = 3
MODEL_FILES = "Models (*.gguf *.safetensors *.json *.pth *.model);;All files (*)"
LOOKUP = SCHEMA["lookup"]


def choose_model_path(parent: QWidget, title: str, start: str = "") -> str | None:
    """A model the user picks in a file dialog: a .gguf file, or a model folder named by
    any of its files (config.json, a .safetensors or .pth shard, tokenizer.model)."""
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
        # Its range starts at 1: "off" is the mode combo's.
        self.lookup = spin_box(LOOKUP, "lookupSpin", parent)
        self.lookup.setValue(DEFAULT_LOOKUP)
        self.draft = QLineEdit(parent)
        self.draft.setToolTip(SCHEMA["draft"].help)
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
                self.lookup.setValue(_clamped_n(d["lookup_n"]))
        if "draft_path" in d:
            self._set_draft(d["draft_path"])
        if "lookup" in d or "draft" in d:
            if d.get("draft"):
                mode = "draft"
                self._set_draft(d["draft"])
            elif d.get("lookup"):
                mode = "lookup"
                with QSignalBlocker(self.lookup):
                    self.lookup.setValue(_clamped_n(d["lookup"]))
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


def _clamped_n(value) -> int:
    """A saved or requested lookup n inside the control's range."""
    lo, hi = LOOKUP.widget_range()
    return max(lo, min(hi, int(value)))
