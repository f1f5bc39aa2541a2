"""gui.settings.store: the app's one settings file lives in core.paths.config_dir()."""
from __future__ import annotations

from pathlib import Path

from core import paths
from gui.dialogs.model_dialog import RecentModels
from gui.dialogs.servers import SavedServers
from gui.settings.panel import SamplingPanel
from gui.settings.store import default_settings


def _keep_everything(qtbot, model: str, server: str, temperature: float) -> None:
    """What a user leaves behind in one data folder: a sampling value, a preset, a recent
    model and a saved server, each written through the app's default settings."""
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    panel.temperatureSpin.setValue(temperature)
    panel.save_preset(f"mine {temperature}")
    RecentModels(settings=default_settings()).add(model)
    SavedServers(default_settings()).save(server, "m", "sk-test")
    panel.store.settings.sync()


def _what_is_kept(qtbot) -> tuple:
    panel = SamplingPanel()
    qtbot.addWidget(panel)
    return (panel.temperatureSpin.value(), [n for n in panel.preset_names() if n.startswith("mine")],
            RecentModels(settings=default_settings()).paths(),
            [s["url"] for s in SavedServers(default_settings()).servers()])


def test_two_data_dirs_never_see_each_others_settings(qtbot, monkeypatch, tmp_path):
    monkeypatch.delenv(paths.CONFIG_ENV, raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv(paths.DATA_ENV, str(a))
    assert Path(default_settings().fileName()) == a / "LlamaDesk.conf"
    _keep_everything(qtbot, "/models/a.gguf", "http://a.example:8000/v1", 0.35)
    monkeypatch.setenv(paths.DATA_ENV, str(b))
    fresh = _what_is_kept(qtbot)
    assert fresh[1:] == ([], [], []) and fresh[0] != 0.35
    _keep_everything(qtbot, "/models/b.gguf", "http://b.example:8000/v1", 1.25)
    monkeypatch.setenv(paths.DATA_ENV, str(a))
    assert _what_is_kept(qtbot) == (0.35, ["mine 0.35"], ["/models/a.gguf"], ["http://a.example:8000/v1"])
    monkeypatch.setenv(paths.DATA_ENV, str(b))
    assert _what_is_kept(qtbot) == (1.25, ["mine 1.25"], ["/models/b.gguf"], ["http://b.example:8000/v1"])


def test_config_dir_overrides_the_data_dir_for_settings(qtbot, monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(paths.CONFIG_ENV, str(tmp_path / "cfg"))
    s = default_settings()
    s.setValue("ui/theme", "dark")
    s.sync()
    assert (tmp_path / "cfg" / "LlamaDesk.conf").is_file()
    assert not (tmp_path / "data").exists()
