"""Beam search's controls (how many beams, the length penalty) and what they turn off.

Beam search keeps the likeliest sequences by their summed log-probability: the sampler's
settings (temperature, top-p, top-k, min-p, repetition penalty, seed) play no part, and
a logit bias, speculative decoding and an output format are refused with it
(:meth:`core.engine.settings.SamplingParams.validate`). With more than one beam the panel
disables those controls and the notice here says why.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QSignalBlocker, Signal
from PySide6.QtWidgets import QLabel, QWidget

from core.engine.settings import SCHEMA
from gui import theme
from gui.settings.widgets import named, spin_box

BEAMS, LENGTH_PENALTY = SCHEMA["num_beams"], SCHEMA["length_penalty"]
# What beam search leaves out, as the notice and the disabled controls' tooltips say it.
NOT_WITH_BEAMS = ("sampling (temperature, top-p, top-k, min-p, repetition penalty, seed), "
                  "logit bias, speculative decoding and the output format")


def beam_reason(n: int) -> str:
    """Why a control is off while ``n`` beams run."""
    return (f"Beam search ({n} beams) picks the likeliest replies, not sampled ones: "
            f"{NOT_WITH_BEAMS} do not apply. Set Beams to off to use them.")


class BeamControls(QObject):
    """The Beams spin box (1 shows "off"), the length penalty (enabled with beams) and the
    notice shown while beams are on.

    Signals:
        changed(): either value was edited (not when set by :meth:`apply`).
    """

    changed = Signal()

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.available = True
        self.why_not = ""
        self.beams = spin_box(BEAMS, "numBeamsSpin", parent)
        self.beams.setSpecialValueText("off")
        self.beams.setToolTip(BEAMS.help + " Each beam comes back as a version of the reply (‹ ›).")
        self.beams.setAccessibleDescription(self.beams.toolTip())
        self.length_penalty = spin_box(LENGTH_PENALTY, "lengthPenaltySpin", parent)
        self.length_penalty.setValue(LENGTH_PENALTY.default)
        self.notice = named(QLabel(parent), "beamNotice", "What beam search turns off.")
        self.notice.setWordWrap(True)
        self.notice.setStyleSheet(f"color: {theme.colors()['muted']};")
        self.notice.hide()
        self.beams.valueChanged.connect(self._edited)
        self.length_penalty.valueChanged.connect(self._edited)
        self.enable()

    @property
    def count(self) -> int:
        """The beams a reply runs with (1: sampling, also where beam search is not available)."""
        return self.beams.value() if self.available else 1

    @property
    def on(self) -> bool:
        return self.count > 1

    def values(self) -> dict:
        """num_beams and length_penalty for SamplingParams."""
        return {"num_beams": self.count, "length_penalty": round(self.length_penalty.value(), 4)}

    def apply(self, d: dict) -> None:
        """num_beams / length_penalty from a SamplingParams dict (keys present only). Emits nothing."""
        for key, w in (("num_beams", self.beams), ("length_penalty", self.length_penalty)):
            if d.get(key) is not None:
                with QSignalBlocker(w):
                    w.setValue(SCHEMA[key].kind(d[key]))
        self.enable()

    def enable(self, available: bool | None = None, why_not: str = "") -> None:
        """``available`` False: replies come from where beam search does not run (``why_not``)."""
        if available is not None:
            self.available, self.why_not = available, why_not
        self.beams.setEnabled(self.available)
        self.beams.setToolTip(self.beams.accessibleDescription() if self.available else self.why_not)
        self.length_penalty.setEnabled(self.on)
        self.notice.setText(beam_reason(self.count) if self.on else "")
        self.notice.setVisible(self.on)

    def _edited(self, *_) -> None:
        self.enable()
        self.changed.emit()
