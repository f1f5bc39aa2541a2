"""gui.settings.panel: linked controls, params, presets, QSettings persistence, names."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QScrollArea, QWidget

from core.engine.constraint import Constraint
from core.engine.settings import SamplingParams
from gui.settings.panel import SamplingPanel
from gui.settings.presets import BUILTIN_PRESETS
from gui.settings.text_items import format_stop_strings, parse_stop_strings
from tests.gui.ui_helpers import wheel

ROOT = Path(__file__).resolve().parents[3]
NAMES = ["temperatureSlider", "temperatureSpin", "topPSlider", "topPSpin", "topKSpin", "minPSpin",
         "repetitionPenaltySpin", "maxTokensSpin", "seedSpin", "randomSeedCheck", "stopStrings",
         "systemPrompt", "chatFormatCombo", "presetCombo", "savePresetButton", "deletePresetButton",
         "speculativeCombo", "lookupSpin", "draftPath", "draftBrowseButton"]


@pytest.fixture
def ini(tmp_path):
    return str(tmp_path / "s.ini")


def make(qtbot, ini) -> SamplingPanel:
    panel = SamplingPanel(settings=QSettings(ini, QSettings.IniFormat))
    qtbot.addWidget(panel)
    return panel


@pytest.fixture
def panel(qtbot, ini):
    return make(qtbot, ini)


def test_names_tooltips_and_defaults(panel):
    for name in NAMES:
        w = panel.findChild(QWidget, name)
        assert w is not None, name
        assert w.accessibleName() == name
        assert w.toolTip().strip(), f"{name} has no tooltip"
    assert "changed()" in SamplingPanel.__doc__
    # First run: the Balanced preset, a random seed, SamplingParams' default length.
    assert panel.current_preset() == "Balanced"
    p = panel.params()
    assert (p.temperature, p.top_p, p.seed, p.max_new_tokens) == (0.7, 0.9, None, 256)
    assert not panel.seedSpin.isEnabled()
    assert panel.topKSpin.value() == 0 and panel.topKSpin.text() == "off"
    assert panel.chat_format() == "auto"


def test_temperature_slider_and_spin_are_linked_both_ways(panel, qtbot):
    with qtbot.waitSignal(panel.changed, timeout=1000):
        panel.temperatureSlider.setValue(150)
    assert panel.temperatureSpin.value() == pytest.approx(1.5)
    assert panel.params().temperature == pytest.approx(1.5)

    panel.temperatureSlider.setFocus()
    qtbot.keyClick(panel.temperatureSlider, Qt.Key_Right)  # one step = 0.05
    assert panel.temperatureSlider.value() == 155
    assert panel.params().temperature == pytest.approx(1.55)
    qtbot.keyClick(panel.temperatureSlider, Qt.Key_Home)
    assert panel.params().temperature == 0.0 and panel.params().greedy

    panel.temperatureSpin.setValue(0.35)
    assert panel.temperatureSlider.value() == 35
    assert panel.params().temperature == pytest.approx(0.35)


def test_top_p_link_and_other_controls(panel, qtbot):
    panel.topPSlider.setValue(50)
    assert panel.topPSpin.value() == pytest.approx(0.5)
    panel.topPSpin.setValue(0.77)
    assert panel.topPSlider.value() == 77
    panel.topKSpin.setValue(40)
    panel.minPSpin.setValue(0.1)
    panel.repetitionPenaltySpin.setValue(1.15)
    panel.maxTokensSpin.setValue(1000)
    p = panel.params()
    assert (p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.max_new_tokens) == \
        (pytest.approx(0.77), 40, pytest.approx(0.1), pytest.approx(1.15), 1000)
    assert panel.current_preset() is None  # edited away from Balanced → Custom
    assert panel.presetCombo.currentText() == "Custom"
    p.validate()


def test_seed_random_and_fixed(panel, qtbot):
    assert panel.params().seed is None
    panel.randomSeedCheck.setChecked(False)
    assert panel.seedSpin.isEnabled()
    panel.seedSpin.setValue(1234)
    assert panel.params().seed == 1234
    assert panel.seedSpin.maximum() == 2**31 - 1
    panel.randomSeedCheck.click()
    assert panel.randomSeedCheck.isChecked() and not panel.seedSpin.isEnabled()
    assert panel.params().seed is None
    panel.use_seed(99)
    assert panel.params().seed == 99 and panel.seedSpin.isEnabled()


@pytest.mark.parametrize("text, stop", [
    ("", ()),
    ("###", ("###",)),
    ("###,  User: ", ("###", "User:")),
    (r"\nUser:, a\,b, c\\d", ("\nUser:", "a,b", "c\\d")),
    (r"\ x\ ,,\t", (" x ", "\t")),
])
def test_stop_strings_parse_and_format(text, stop):
    assert parse_stop_strings(text) == stop
    assert parse_stop_strings(format_stop_strings(stop)) == stop


def test_stop_strings_field(panel, qtbot):
    panel.stopStrings.setFocus()
    qtbot.keyClicks(panel.stopStrings, r"###, \nUser:")
    with qtbot.waitSignal(panel.changed, timeout=1000):
        qtbot.keyClick(panel.stopStrings, Qt.Key_Return)
    assert panel.params().stop == ("###", "\nUser:")


def test_params_round_trip_and_dict(panel, qtbot):
    p = SamplingParams(temperature=1.25, top_p=0.8, top_k=50, min_p=0.05, repetition_penalty=1.1,
                       seed=7, max_new_tokens=300, stop=("</s>", "\n\n"), num_beams=2,
                       length_penalty=0.9)
    with qtbot.waitSignal(panel.changed, timeout=1000):
        panel.set_params(p)
    assert panel.params() == p
    assert panel.temperatureSlider.value() == 125 and panel.topPSlider.value() == 80
    panel.set_params(SamplingParams(seed=None))
    assert panel.params().seed is None and panel.randomSeedCheck.isChecked()
    assert panel.seedSpin.value() == 7  # the fixed seed is kept for when random is unticked

    panel.set_system_prompt("Be brief.\nAnswer in French.")
    panel.chatFormatCombo.setCurrentIndex(panel.chatFormatCombo.findData("llama2"))
    assert panel.system_prompt() == "Be brief.\nAnswer in French."
    assert panel.chat_format() == "llama2"
    d = panel.to_dict()
    assert d["system_prompt"] == "Be brief.\nAnswer in French." and d["chat_format"] == "llama2"
    other_panel = SamplingPanel(settings=QSettings(str(Path(panel.store.settings.fileName()).with_name("o.ini")),
                                                   QSettings.IniFormat))
    qtbot.addWidget(other_panel)
    other_panel.from_dict(d)
    assert other_panel.to_dict() == d and other_panel.params() == panel.params()


def test_model_context_caps_max_tokens(panel):
    panel.maxTokensSpin.setValue(4000)
    panel.set_model_context(2048)
    assert panel.maxTokensSpin.maximum() == 2048 and panel.params().max_new_tokens == 2048
    panel.set_model_context(131072)  # the user's own choice comes back; never above 8192
    assert panel.maxTokensSpin.maximum() == 8192 and panel.params().max_new_tokens == 4000


def test_builtin_presets(panel, qtbot):
    for name, values in BUILTIN_PRESETS.items():
        panel.presetCombo.setCurrentIndex(panel.presetCombo.findText(name))
        p = panel.params()
        for k, v in values.items():
            assert getattr(p, k) == pytest.approx(v), (name, k)
        assert panel.current_preset() == name
        assert not panel.deletePresetButton.isEnabled()  # built-ins can't be deleted
    panel.apply_preset("Precise")
    assert panel.params().greedy
    assert panel.params().temperature == 0 and panel.temperatureSlider.value() == 0
    assert panel.delete_preset("Precise") is False
    assert set(BUILTIN_PRESETS) == {"Precise", "Balanced", "Creative"}
    assert BUILTIN_PRESETS["Creative"]["min_p"] == 0.05


def test_user_presets_save_load_delete(panel, qtbot, monkeypatch):
    asked = iter(["Balanced", "My  story mode"])  # a built-in name is refused, then re-asked
    prompts = []

    def fake_ask(suggested, message=""):
        prompts.append(message)
        return next(asked)

    monkeypatch.setattr(panel, "ask_preset_name", fake_ask)
    panel.temperatureSpin.setValue(1.3)
    panel.topKSpin.setValue(30)
    panel.set_system_prompt("Tell stories.")
    qtbot.mouseClick(panel.savePresetButton, Qt.LeftButton)
    assert "built in" in prompts[1]
    assert panel.current_preset() == "My story mode"
    assert panel.deletePresetButton.isEnabled()
    assert panel.preset_names() == ["Precise", "Balanced", "Creative", "My story mode"]

    panel.apply_preset("Precise")
    assert panel.params().temperature == 0
    assert panel.system_prompt() == "Tell stories."  # built-ins leave the prompt alone
    panel.set_system_prompt("other")
    panel.presetCombo.setCurrentIndex(panel.presetCombo.findText("My story mode"))
    assert panel.params().temperature == pytest.approx(1.3) and panel.params().top_k == 30
    assert panel.system_prompt() == "Tell stories."

    monkeypatch.setattr(panel, "ask_preset_name", lambda *a, **k: None)  # cancelled
    assert panel.save_preset() is None
    assert panel.preset_names()[-1] == "My story mode"

    qtbot.mouseClick(panel.deletePresetButton, Qt.LeftButton)
    assert "My story mode" not in panel.preset_names()
    assert panel.current_preset() is None and not panel.deletePresetButton.isEnabled()


def test_persistence_across_instances(qtbot, ini):
    a = make(qtbot, ini)
    a.set_params(SamplingParams(temperature=1.4, top_p=0.85, top_k=20, min_p=0.02,
                                repetition_penalty=1.2, seed=42, max_new_tokens=777,
                                stop=("END", "a,b")))
    a.set_system_prompt("Line one\nLine two, with comma")
    a.chatFormatCombo.setCurrentIndex(a.chatFormatCombo.findData("raw"))
    a.save_preset("Saved one")
    a.temperatureSlider.setValue(60)  # after saving: Custom
    want_params, want_dict = a.params(), a.to_dict()
    a.store.settings.sync()
    a.close()
    a.deleteLater()

    b = make(qtbot, ini)
    assert b.params() == want_params
    assert b.to_dict() == want_dict
    assert "Saved one" in b.preset_names() and b.current_preset() is None
    b.apply_preset("Saved one")
    assert b.params().temperature == pytest.approx(1.4)

    # The selected preset is remembered too.
    b.store.settings.sync()
    c = make(qtbot, ini)
    assert c.current_preset() == "Saved one"


def test_speculative_setting_gives_lookup_or_draft_and_persists(qtbot, ini):
    a = make(qtbot, ini)
    p = a.params()
    assert (p.lookup, p.draft) == (0, "") and not a.lookupSpin.isEnabled() and not a.draftPath.isEnabled()
    with qtbot.waitSignal(a.changed, timeout=1000):
        a.speculativeCombo.setCurrentIndex(a.speculativeCombo.findData("lookup"))
    assert a.lookupSpin.isEnabled() and (a.params().lookup, a.params().draft) == (3, "")
    a.lookupSpin.setValue(5)
    assert a.params().lookup == 5
    # A draft path typed while lookup is chosen does not make the settings invalid.
    a.draftPath.setText("/models/small.gguf")
    a.draftPath.editingFinished.emit()
    assert (a.params().lookup, a.params().draft) == (5, "")
    a.speculativeCombo.setCurrentIndex(a.speculativeCombo.findData("draft"))
    assert (a.params().lookup, a.params().draft) == (0, "/models/small.gguf")
    assert a.draftPath.isEnabled() and not a.lookupSpin.isEnabled()
    # The panel's state (mode, n and path kept while unused) survives a restart.
    want = a.to_dict()
    a.store.settings.sync()
    b = make(qtbot, ini)
    assert b.to_dict() == want and b.params() == a.params()
    # A reply's settings shown again choose the mode they used.
    b.set_params(SamplingParams(lookup=2))
    assert b.speculativeCombo.currentData() == "lookup" and b.params().lookup == 2
    b.set_params(SamplingParams())
    assert b.speculativeCombo.currentData() == "off" and b.lookupSpin.value() == 2


def test_bad_stored_values_are_ignored(qtbot, ini):
    s = QSettings(ini, QSettings.IniFormat)
    s.setValue("sampling/temperature", "not a number")
    s.setValue("sampling/top_p", "0.5")
    s.setValue("sampling/stop", "{broken json")
    s.setValue("sampling/lookup_n", "lots")
    s.setValue("sampling/speculative", "warp")
    s.setValue("presets/user", "[1, 2]")
    s.sync()
    p = make(qtbot, ini)
    assert p.params().top_p == 0.5
    p.params().validate()


def test_screenshot(panel, qtbot):
    panel.show()
    qtbot.waitExposed(panel)
    panel.resize(300, panel.sizeHint().height())  # after polish: the style's final metrics
    qtbot.wait(20)
    # The whole panel fits a 300 px side panel without clipping or a horizontal scroll.
    assert panel.minimumSizeHint().width() <= 300
    scroll = panel.findChild(QScrollArea)
    assert scroll.widget().width() <= 300
    assert not scroll.verticalScrollBar().isVisible()  # sizeHint covers the content
    out = ROOT / "artifacts"
    out.mkdir(exist_ok=True)
    assert panel.grab().save(str(out / "sampling_panel.png"))


def test_logit_bias_field_gives_text_biases_and_says_what_it_left_out(qtbot, ini):
    a = make(qtbot, ini)
    assert a.params().logit_bias_text == ()
    a.logitBiasEdit.setText(r"dragon=+5, Once=-inf, a\, b=2, oops, cat=+500")
    a.logitBiasEdit.editingFinished.emit()
    assert a.params().logit_bias_text == ("dragon=+5", "Once=-inf", "a, b=2")
    assert a.logitBiasNotice.isVisibleTo(a)
    assert "'oops'" in a.logitBiasNotice.text() and "'cat=+500'" in a.logitBiasNotice.text()
    want = a.params()
    a.store.settings.sync()
    b = make(qtbot, ini)  # kept across a restart
    assert b.params().logit_bias_text == want.logit_bias_text
    b.set_params(SamplingParams(logit_bias_text=("x=1",)))  # a reply's settings shown again
    assert b.logitBiasEdit.text() == "x=1" and not b.logitBiasNotice.isVisibleTo(b)
    b.set_capabilities(type("Caps", (), {"why": {}, "seed": True, "top_k": True, "min_p": True,
                                         "repetition_penalty": True})())
    assert not b.logitBiasEdit.isEnabled() and b.params().logit_bias_text == ()  # a server: its own ids


def test_constraint_setting_gives_params_checks_inline_and_persists(qtbot, ini):
    panel = make(qtbot, ini)
    assert panel.params().constraint is None and panel.constraintText.isHidden()
    schema = '{"type": "object", "properties": {"name": {"type": "string"}}}'
    panel.from_dict({"constraint": {"kind": "json_schema", "text": schema}})
    assert panel.params().constraint == Constraint("json_schema", schema)
    assert not panel.constraintText.isHidden() and panel.constraintNotice.isHidden()
    # A schema that cannot compile says so under the editor as it is typed (no dialog).
    panel.constraintText.setPlainText('{"type": "objectx"}')
    qtbot.waitUntil(lambda: not panel.constraintNotice.isHidden())
    assert "cannot be compiled" in panel.constraintNotice.text()
    panel.constraintText.setPlainText(schema)
    qtbot.waitUntil(lambda: panel.constraintNotice.isHidden())
    # Regex, then off: the text stays for later but the reply is unconstrained.
    panel.constraintCombo.setCurrentIndex(panel.constraintCombo.findData("regex"))
    panel.constraintText.setPlainText("[0-9]+")
    assert panel.params().constraint == Constraint("regex", "[0-9]+")
    panel.constraintCombo.setCurrentIndex(panel.constraintCombo.findData("json_object"))
    assert panel.params().constraint == Constraint("json_object") and panel.constraintText.isHidden()
    panel.constraintCombo.setCurrentIndex(panel.constraintCombo.findData("regex"))
    again = make(qtbot, ini)  # persisted as it changed
    assert again.params().constraint == Constraint("regex", "[0-9]+")
    panel.constraintCombo.setCurrentIndex(0)
    assert panel.params().constraint is None and panel.constraintText.toPlainText() == "[0-9]+"
    d = json.loads(json.dumps(panel.to_dict()))
    assert d["constraint"] is None and d["constraint_kind"] == "" and d["constraint_text"] == "[0-9]+"


def test_wheel_scrolls_the_panel_not_the_control_under_the_pointer(panel, qtbot):
    """Issue 22 #14: scrolling the panel over Speculative turned it from Off to Draft model."""
    panel.resize(300, 260)
    panel.show()
    qtbot.waitExposed(panel)
    bar = panel.findChild(QScrollArea, "samplingScroll").verticalScrollBar()
    assert bar.maximum() > 0
    controls = [panel.speculativeCombo, panel.constraintCombo, panel.chatFormatCombo, panel.topKSpin,
                panel.maxTokensSpin, panel.temperatureSlider, panel.temperatureSpin, panel.presetCombo]
    before = [(c.currentIndex() if hasattr(c, "currentIndex") else c.value()) for c in controls]
    for c in controls:
        start = bar.value()
        wheel(c, -1)
        assert bar.value() > start or bar.value() == bar.maximum(), c.objectName()
        bar.setValue(0)
    assert [(c.currentIndex() if hasattr(c, "currentIndex") else c.value()) for c in controls] == before
    assert panel.speculative.mode() == "off"
    # Focused (clicked or tabbed into), the control takes the wheel as before.
    panel.activateWindow()
    panel.speculativeCombo.setFocus()
    qtbot.waitUntil(panel.speculativeCombo.hasFocus, timeout=2000)
    wheel(panel.speculativeCombo, -1)
    assert panel.speculative.mode() == "lookup"
    assert panel.speculativeCombo.focusPolicy() == Qt.StrongFocus  # the wheel alone never focuses it
