"""The settings panel's beam search: Beams and Length penalty, what beams turn off (and say
why), what comes back when they are off again, a server, persistence, presets."""
from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QScrollArea

from core.engine.constraint import Constraint
from gui.settings.panel import SamplingPanel

OFF_WITH_BEAMS = ("temperatureSpin", "temperatureSlider", "topPSpin", "topKSpin", "minPSpin", "repetitionPenaltySpin",
                  "seedSpin", "randomSeedCheck", "logitBiasEdit", "speculativeCombo", "constraintCombo")
ON_WITH_BEAMS = ("maxTokensSpin", "stopStrings", "systemPrompt", "chatFormatCombo", "numBeamsSpin", "lengthPenaltySpin")


def make(qtbot, ini) -> SamplingPanel:
    panel = SamplingPanel(settings=QSettings(ini, QSettings.IniFormat))
    qtbot.addWidget(panel)
    return panel


def enabled(panel, name) -> bool:
    return getattr(panel, name).isEnabled()


def test_beams_turn_sampling_off_with_a_visible_reason_and_give_it_back(qtbot, tmp_path):
    p = make(qtbot, str(tmp_path / "s.ini"))
    assert p.numBeamsSpin.text() == "off" and p.params().num_beams == 1
    assert not p.lengthPenaltySpin.isEnabled() and p.beamNotice.isHidden()
    # What beam search refuses, set first: a bias, prompt lookup, an output format, a fixed seed.
    p.from_dict({"logit_bias_text": ["dog=-inf"], "speculative": "lookup", "random_seed": False,
                 "constraint_kind": "json_object"})
    assert p.params().lookup and p.params().constraint is not None
    with qtbot.waitSignal(p.changed, timeout=1000):
        p.numBeamsSpin.setValue(3)
    p.lengthPenaltySpin.setValue(0.5)
    q = p.params()  # valid: what beams refuse is left out, not sent
    assert (q.num_beams, q.length_penalty, q.logit_bias_text, q.lookup, q.draft, q.constraint) == (3, 0.5, (), 0, "", None)
    assert [n for n in OFF_WITH_BEAMS if enabled(p, n)] == []
    assert [n for n in ON_WITH_BEAMS if not enabled(p, n)] == []
    assert not p.beamNotice.isHidden() and "3 beams" in p.beamNotice.text()
    assert "temperature" in p.beamNotice.text() and "output format" in p.beamNotice.text()
    assert "Beam search" in p.logitBiasEdit.toolTip() and "Beam search" in p.seedSpin.toolTip()
    # Beams off again: everything comes back as it was.
    with qtbot.waitSignal(p.changed, timeout=1000):
        p.numBeamsSpin.setValue(1)
    q = p.params()
    assert q.logit_bias_text == ("dog=-inf",) and q.lookup == 3 and q.constraint == Constraint("json_object", "")
    assert [n for n in OFF_WITH_BEAMS if not enabled(p, n)] == [] and p.beamNotice.isHidden()
    assert not p.lengthPenaltySpin.isEnabled() and "Beam search" not in p.seedSpin.toolTip()


def test_beams_persist_and_a_sampling_preset_turns_them_off(qtbot, tmp_path):
    ini = str(tmp_path / "s.ini")
    a = make(qtbot, ini)
    a.from_dict({"logit_bias_text": ["cat=+5"]})
    a.numBeamsSpin.setValue(4)
    a.lengthPenaltySpin.setValue(-0.5)
    assert a.current_preset() is None  # Custom
    a.store.settings.sync()
    b = make(qtbot, ini)
    assert (b.params().num_beams, b.params().length_penalty) == (4, -0.5)
    assert not b.logitBiasEdit.isEnabled() and not b._sampling_box.isEnabled()
    assert b.logitBiasEdit.text() == "cat=+5"  # kept while beams leave it out
    b.apply_preset("Creative")
    assert b.params().num_beams == 1 and b.params().logit_bias_text == ("cat=+5",)
    assert b.current_preset() == "Creative" and b.temperatureSpin.isEnabled()


def test_a_server_has_no_beam_search(qtbot, tmp_path):
    p = make(qtbot, str(tmp_path / "s.ini"))
    p.numBeamsSpin.setValue(2)
    caps = type("Caps", (), {"why": {}, "seed": True, "top_k": True, "min_p": True, "repetition_penalty": True,
                             "logit_bias": False})()
    p.set_capabilities(caps, "http://example:8000")
    assert not p.numBeamsSpin.isEnabled() and "engine only" in p.numBeamsSpin.toolTip()
    assert p.params().num_beams == 1 and p.temperatureSpin.isEnabled() and p.beamNotice.isHidden()
    assert not p.logitBiasEdit.isEnabled()  # the server's own lack still says so
    p.set_capabilities(None)
    assert p.numBeamsSpin.isEnabled() and p.params().num_beams == 2 and not p.temperatureSpin.isEnabled()


def test_screenshot_with_beams_fits_the_side_panel(qtbot, tmp_path):
    p = make(qtbot, str(tmp_path / "s.ini"))
    p.numBeamsSpin.setValue(3)
    p.show()
    qtbot.waitExposed(p)
    p.resize(300, p.sizeHint().height())
    qtbot.wait(20)
    assert p.minimumSizeHint().width() <= 300 and p.findChild(QScrollArea).widget().width() <= 300
    assert p.beamNotice.isVisible() and p.beamNotice.width() <= 300
    assert p.grab().save(str(tmp_path / "beams-panel.png"))
