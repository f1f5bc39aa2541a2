"""The data and config folders are decided in one place (core.paths)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import paths
from core.history.store import History
from core.library.library import default_models_folder, state_path

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG rules are Linux's")


def test_data_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "d"))
    assert paths.data_dir() == tmp_path / "d"
    # Everything that keeps files there asks the same place.
    assert History.default_path() == tmp_path / "d" / "history.sqlite3"
    assert state_path() == tmp_path / "d" / "library.json"
    assert default_models_folder() == tmp_path / "d" / "models"


@linux
def test_data_and_config_dirs_follow_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    monkeypatch.delenv(paths.CONFIG_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert paths.data_dir() == tmp_path / "data" / "LlamaDesk"
    assert paths.config_dir() == tmp_path / "config" / "LlamaDesk"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")
    assert paths.data_dir() == Path.home() / ".local/share/LlamaDesk"
    assert paths.config_dir() == Path.home() / ".config/LlamaDesk"


def test_config_dir_follows_config_env_else_data_env(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.CONFIG_ENV, raising=False)
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "d"))
    assert paths.config_dir() == tmp_path / "d"  # one data folder isolates everything
    assert paths.settings_path() == tmp_path / "d" / "LlamaDesk.conf"
    monkeypatch.setenv(paths.CONFIG_ENV, str(tmp_path / "c"))
    assert paths.config_dir() == tmp_path / "c"
    assert paths.data_dir() == tmp_path / "d"


def test_the_suite_keeps_out_of_the_users_folders():
    """conftest points the app's folders, and Qt's, at a temporary folder of the run's."""
    home = Path.home().resolve()
    for folder in (paths.config_dir(), paths.data_dir(), Path(os.environ["XDG_CONFIG_HOME"])):
        assert not folder.resolve().is_relative_to(home / ".config"), folder
        assert not folder.resolve().is_relative_to(home / ".local"), folder
    pytest.importorskip("PySide6")
    from PySide6.QtCore import QSettings
    qt_default = Path(QSettings(paths.APP_NAME, paths.APP_NAME).fileName()).resolve()
    assert not qt_default.is_relative_to(home / ".config"), qt_default


@linux
def test_default_settings_file_is_where_qt_kept_the_apps_settings(tmp_path):
    """Without the variables, the settings file is the one Qt's QSettings(APP_NAME, APP_NAME)
    used on Linux, so settings written before config_dir() existed are read."""
    pytest.importorskip("PySide6")
    # A fresh process: Qt reads XDG_CONFIG_HOME once per process.
    code = ("from PySide6.QtCore import QSettings; from core import paths; "
            "print(QSettings(paths.APP_NAME, paths.APP_NAME).fileName()); print(paths.settings_path())")
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout.split("\n")
    assert Path(out[0]) == Path(out[1]) == tmp_path / "cfg" / "LlamaDesk" / "LlamaDesk.conf"
