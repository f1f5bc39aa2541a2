"""Controls built from the settings schema (:data:`core.engine.settings.SCHEMA`): a
setting's spin box or slider has its declared range, step, decimals and help text, so
the panel offers exactly what validation accepts. Plus the panel's form helpers."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QObject, QSignalBlocker, Qt
from PySide6.QtWidgets import (QAbstractSpinBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout,
                               QLabel, QSlider, QSpinBox, QVBoxLayout, QWidget)

from core.engine.settings import Setting


def named(w: QWidget, name: str, tip: str) -> QWidget:
    """``w`` with a stable objectName (tests, accessibility tools) and its tooltip."""
    w.setObjectName(name)
    w.setAccessibleName(name)
    w.setAccessibleDescription(tip)
    w.setToolTip(tip)
    return w


class _WheelNeedsFocus(QObject):
    """Passes a wheel event on to the parents (the scroll area around the control) unless
    the control has the keyboard focus: scrolling a panel must not change whatever spin
    box, combo box or slider happens to pass under the pointer."""

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt API)
        if event.type() == QEvent.Wheel and isinstance(obj, QWidget) and not obj.hasFocus():
            event.ignore()  # not accepted: QApplication offers it to the parent next
            return True
        return False


_WHEEL_GUARD = _WheelNeedsFocus()
WHEEL_GUARDED = (QAbstractSpinBox, QComboBox, QSlider)


def guard_wheel(root: QWidget) -> None:
    """Every spin box, combo box and slider under ``root`` (and ``root`` itself) takes the
    mouse wheel only once focused (a click or Tab focuses it; the wheel no longer does)."""
    for w in [root, *root.findChildren(QWidget)]:
        if isinstance(w, WHEEL_GUARDED) and not w.property("wheelGuarded"):
            w.setProperty("wheelGuarded", True)
            if w.focusPolicy() == Qt.WheelFocus:
                w.setFocusPolicy(Qt.StrongFocus)
            w.installEventFilter(_WHEEL_GUARD)


def spin_box(setting: Setting, name: str, parent: QWidget | None = None) -> QSpinBox | QDoubleSpinBox:
    """A spin box over ``setting``'s control range (:meth:`Setting.widget_range`), its step,
    decimals and help."""
    if setting.kind is int:
        s = QSpinBox(parent)
    else:
        s = QDoubleSpinBox(parent)
        s.setDecimals(setting.decimals)
    s.setRange(*setting.widget_range())
    s.setSingleStep(setting.step)
    s.setKeyboardTracking(False)  # typing "0.75" must not fire at "0." and "0.7"
    s.setAccelerated(True)
    named(s, name, setting.help)
    return s


def slider_pair(setting: Setting, slider_name: str, spin_name: str,
                edited: Callable[[], None]) -> tuple[QSlider, QDoubleSpinBox, QWidget]:
    """A slider and a spin box over ``setting``, each following the other, side by side in
    the returned row; ``edited()`` runs after either changed. The slider counts in the
    setting's smallest decimal (0.01 for two decimals)."""
    scale = 10 ** setting.decimals
    lo, hi = setting.widget_range()
    slider = QSlider(Qt.Horizontal)
    slider.setRange(round(lo * scale), round(hi * scale))
    slider.setSingleStep(round(setting.step * scale))
    slider.setPageStep(round(setting.step * scale * 4))
    slider.setMinimumWidth(60)
    named(slider, slider_name, setting.help)
    spin = spin_box(setting, spin_name)

    def from_slider(v: int) -> None:
        with QSignalBlocker(spin):
            spin.setValue(v / scale)
        edited()

    def from_spin(v: float) -> None:
        with QSignalBlocker(slider):
            slider.setValue(round(v * scale))
        edited()

    slider.valueChanged.connect(from_slider)
    spin.valueChanged.connect(from_spin)
    row = QWidget()
    h = QHBoxLayout(row)
    h.setContentsMargins(0, 0, 0, 0)
    h.addWidget(slider, 1)
    h.addWidget(spin)
    return slider, spin, row


def form(title: str) -> tuple[QGroupBox, QFormLayout]:
    """A titled group holding a form whose long rows wrap (the panel is narrow)."""
    box = QGroupBox(title)
    return box, form_layout(box)


def form_with_notice(title: str, notice: QLabel) -> tuple[QGroupBox, QFormLayout]:
    """:func:`form`, with a word-wrapped ``notice`` under the form: a form whose rows wrap
    gives a wrapped label the height for another width (clipped); a box layout does not."""
    box = QGroupBox(title)
    rows = QWidget()
    f = form_layout(rows)
    f.setContentsMargins(0, 0, 0, 0)
    v = QVBoxLayout(box)
    v.addWidget(rows)
    v.addWidget(notice)
    return box, f


def form_layout(parent: QWidget) -> QFormLayout:
    """``parent``'s form layout, its long rows wrapping."""
    f = QFormLayout(parent)
    f.setRowWrapPolicy(QFormLayout.WrapLongRows)
    f.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
    f.setLabelAlignment(Qt.AlignLeft | Qt.AlignVCenter)
    return f


def add_row(f: QFormLayout, text: str, field: QWidget, buddy: QWidget | None = None) -> None:
    """A labelled row; the label's mnemonic focuses ``buddy`` (the field by default)."""
    label = QLabel(text)
    label.setBuddy(buddy or field)
    label.setToolTip((buddy or field).toolTip())
    # Some platforms render a few px wider than the metrics say; don't clip the last letter.
    label.setMinimumWidth(label.sizeHint().width() + label.fontMetrics().averageCharWidth())
    f.addRow(label, field)
