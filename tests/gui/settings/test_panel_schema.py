"""The settings panel's controls are built from the schema: each numeric setting's spin
box has the declared control range, step, decimals and help, and every value it can
hold is one SamplingParams accepts. The comparison's Sweep row offers the schema's
sweepable settings, named and explained by their declarations."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QDoubleSpinBox

from core.engine.settings import NUMBERS, SCHEMA, SETTINGS, SamplingParams
from gui.compare.sweep_row import SweepRow
from gui.settings.panel import SamplingPanel

SHOWN = [s for s in NUMBERS if s.panel]


@pytest.fixture
def panel(qtbot, tmp_path):
    p = SamplingPanel(settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(p)
    return p


def test_every_number_has_a_control(panel):
    assert {s.name for s in NUMBERS if not s.panel} == set()
    assert all(panel.control(s.name) is not None for s in NUMBERS)


@pytest.mark.parametrize("s", SHOWN, ids=lambda s: s.name)
def test_each_control_offers_exactly_the_declared_range(panel, s):
    w = panel.control(s.name)
    lo, hi = s.widget_range()
    assert (w.minimum(), w.maximum()) == (pytest.approx(lo), pytest.approx(hi))
    assert w.singleStep() == pytest.approx(s.step)
    assert isinstance(w, QDoubleSpinBox) == (s.kind is float)
    if s.kind is float:
        assert w.decimals() == s.decimals
    assert s.help in w.accessibleDescription()
    for v in (lo, hi):  # both ends are settings SamplingParams takes
        SamplingParams(**{s.name: s.kind(v)}).validate()
    # and the control holds nothing outside them
    if s.kind is float or hi + s.step < 2**31:  # a spin box holds 32-bit ints
        w.setValue(hi + 10 * s.step)
        assert w.value() == pytest.approx(hi)
    w.setValue(lo - 10 * s.step)
    assert w.value() == pytest.approx(lo)


def test_the_sweep_row_offers_the_schemas_sweepable_settings_with_their_ranges(qtbot):
    row = SweepRow()
    qtbot.addWidget(row)
    keys = [row.param.itemData(i) for i in range(row.param.count())]
    assert set(keys) == {s.name for s in SETTINGS if s.sweep}
    for i, key in enumerate(keys):
        s = SCHEMA[key]
        assert row.param.itemText(i) == s.label.lower()
        tip = row.param.itemData(i, Qt.ToolTipRole)
        assert s.help in tip and (not s.numeric or s.range_text() in tip)
        row.param.setCurrentIndex(i)
        assert row.values.toolTip() == tip
