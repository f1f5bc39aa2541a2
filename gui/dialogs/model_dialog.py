"""Choosing and loading a model: file dialogs, recent models, device/dtype, progress, info.

One dialog (:class:`OpenModelDialog`, via :func:`ask_model`) accepts a .gguf file or a model
folder; the main window calls it through its own ``ask_model_path`` method, so tests of the
window replace one method instead of driving the dialog.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch  # gui/app.py has loaded it before any window (its import cost is paid there)
from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QProgressBar, QPushButton, QWidget)

from core.checkpoints.common import DTYPE_CHOICES
from gui.widgets.stats import decode_label

RECENT_KEY = "models/recent"
LAST_KEY = "models/last"
DEVICE_KEY = "models/device"
DTYPE_KEY = "models/dtype"
COMPILE_KEY = "models/compile"
RECENT_MAX = 8
DTYPES = DTYPE_CHOICES  # auto, float32, bfloat16, float16, int8, int4 (quantized at load)


MODEL_FILES = ("*.gguf", "params.json", "config.json")  # what marks a model (folder)


def model_choice(path: str) -> str | None:
    """What opening ``path`` opens: a .gguf file itself; a model folder; for another file
    (params.json, a shard), the folder holding it. None for a path that is none of these."""
    p = Path(path)
    if p.is_file():
        return str(p) if p.suffix.lower() == ".gguf" else model_choice(str(p.parent))
    if p.is_dir() and ((p / "params.json").exists() or (p / "config.json").exists()
                       or any(p.glob("*.gguf"))):
        return str(p)
    return None


class OpenModelDialog(QFileDialog):
    """"Open Model": one dialog for a .gguf file or a model folder (Meta or Hugging Face).

    Qt's file dialogs choose either files or folders; this one lists both and, on Open,
    takes a selected model folder (or a file inside one) instead of stepping into it.
    """

    def __init__(self, parent=None, start: str = ""):
        super().__init__(parent, "Open Model", start)
        self.setObjectName("openModelDialog")
        self.setOption(QFileDialog.DontUseNativeDialog)  # native dialogs pick files or folders, not both
        self.setFileMode(QFileDialog.ExistingFile)
        self.setNameFilters(["Models (*.gguf params.json config.json)", "All files (*)"])
        self.setLabelText(QFileDialog.FileName, "Model:")
        self.setLabelText(QFileDialog.Accept, "Open")
        self.chosen: str | None = None

    def accept(self) -> None:
        sel = self.selectedFiles()
        path = sel[0] if sel else self.directory().absolutePath()
        choice = model_choice(path)
        if choice is None and Path(path).is_dir() and path != self.directory().absolutePath():
            self.setDirectory(path)  # an ordinary folder: step into it, as a file dialog does
            return
        if choice is None:
            choice = model_choice(self.directory().absolutePath())
        if choice is None:
            return  # nothing to open here (yet)
        self.chosen = choice
        QDialog.accept(self)


def ask_model(parent=None, start: str = "") -> str | None:
    """A .gguf file or model folder chosen by the user, or None (a modal dialog)."""
    dlg = OpenModelDialog(parent, start)
    return dlg.chosen if dlg.exec() == QDialog.Accepted else None


def looks_like_model(path: str) -> bool:
    """Whether a dropped path is worth trying: a folder or a .gguf file."""
    p = Path(path)
    return p.is_dir() or (p.is_file() and p.suffix.lower() == ".gguf")


def available_devices() -> list[str]:
    """'auto' plus the devices this machine has (cpu always; cuda, mps when present)."""
    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


class RecentModels:
    """The Recent Models list in QSettings (most recent first, at most RECENT_MAX)."""

    def __init__(self, *, settings: QSettings):
        self.settings = settings

    def paths(self) -> list[str]:
        v = self.settings.value(RECENT_KEY, [])
        if isinstance(v, str):
            v = [v]
        return [str(p) for p in (v or [])]

    def add(self, path: str) -> None:
        path = os.path.abspath(path)
        items = [path] + [p for p in self.paths() if p != path]
        self.settings.setValue(RECENT_KEY, items[:RECENT_MAX])
        self.settings.setValue(LAST_KEY, path)

    def remove(self, path: str) -> None:
        self.settings.setValue(RECENT_KEY, [p for p in self.paths() if p != path])

    def clear(self) -> None:
        self.settings.setValue(RECENT_KEY, [])

    def last(self) -> str | None:
        v = self.settings.value(LAST_KEY, "")
        return str(v) if v else None

    def forget_last(self) -> None:
        self.settings.remove(LAST_KEY)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def human_count(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(int(n))


def info_rows(info: dict) -> list[tuple[str, str]]:
    """The model facts shown to the user, as (label, value)."""
    rows = [("Name", str(info.get("name", "?"))), ("Format", str(info.get("format", "?")))]
    if "parameters" in info:
        rows.append(("Parameters", f"{human_count(info['parameters'])} ({info['parameters']:,})"))
    for key, label in (("context_length", "Context length"), ("dtype", "Data type"),
                       ("dtype_reason", "Why this data type"), ("device", "Device"),
                       ("threads", "Threads"), ("kernels", "CPU kernels"), ("decode", "Decode")):
        if key in info:
            rows.append((label, str(info[key])))
    if "memory_bytes" in info:
        rows.append(("Memory", human_bytes(info["memory_bytes"])))
    for key, label in (("n_layers", "Layers"), ("n_heads", "Heads"), ("n_kv_heads", "KV heads"),
                       ("vocab_size", "Vocabulary"), ("chat_format", "Chat format"), ("path", "Path")):
        if key in info:
            rows.append((label, str(info[key])))
    return rows


def info_summary(info: dict) -> str:
    """One line for the status bar: name · params · context · dtype · device · memory."""
    parts = [str(info.get("name", "model"))]
    if "parameters" in info:
        parts.append(f"{human_count(info['parameters'])} params")
    if "context_length" in info:
        parts.append(f"ctx {info['context_length']}")
    for k in ("dtype", "device"):
        if k in info:
            parts.append(str(info[k]))
    if decode_label(info.get("decode", "")):
        parts.append(decode_label(info["decode"]))
    if "memory_bytes" in info:
        parts.append(human_bytes(info["memory_bytes"]))
    return " · ".join(parts)


class ModelInfoDialog(QDialog):
    """Read-only facts about the loaded model (show it with ``open()``)."""

    def __init__(self, *, info: dict, parent=None):
        super().__init__(parent)
        self.setObjectName("modelInfoDialog")
        self.setWindowTitle("Model Info")
        form = QFormLayout(self)
        for label, value in info_rows(info):
            v = QLabel(value)
            v.setTextInteractionFlags(Qt.TextSelectableByMouse)
            v.setWordWrap(True)
            form.addRow(label + ":", v)
        box = QDialogButtonBox(QDialogButtonBox.Close)
        box.rejected.connect(self.reject)
        box.accepted.connect(self.accept)
        form.addRow(box)


class LoadProgress(QWidget):
    """Load progress for the status bar: stage text, a bar, a Cancel button.

    Signals:
        cancelRequested(): the user wants the load stopped.
    """

    cancelRequested = Signal()

    def __init__(self, *, parent=None):
        super().__init__(parent)
        self.setObjectName("loadProgress")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.stage = QLabel()
        self.stage.setObjectName("loadStage")
        self.bar = QProgressBar()
        self.bar.setObjectName("loadBar")
        self.bar.setRange(0, 1000)
        self.bar.setMaximumWidth(180)
        self.bar.setTextVisible(False)
        self.cancel = QPushButton("Cancel")
        self.cancel.setObjectName("loadCancelButton")
        self.cancel.setAccessibleName("Cancel loading")
        self.cancel.clicked.connect(self.cancelRequested)
        lay.addWidget(self.stage)
        lay.addWidget(self.bar)
        lay.addWidget(self.cancel)
        self.hide()

    def start(self, name: str) -> None:
        self.stage.setText(f"Loading {name}…")
        self.bar.setValue(0)
        self.show()

    def update_progress(self, fraction: float, stage: str) -> None:
        self.bar.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
        if stage:
            self.stage.setText(stage)

    def finish(self) -> None:
        self.hide()
