"""The data and config folders are decided in one place (core.paths)."""
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
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert paths.data_dir() == tmp_path / "data" / "LlamaDesk"
    assert paths.config_dir() == tmp_path / "config" / "LlamaDesk"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")
    assert paths.data_dir() == Path.home() / ".local/share/LlamaDesk"
    assert paths.config_dir() == Path.home() / ".config/LlamaDesk"


@linux
def test_config_dir_is_where_qt_keeps_the_apps_settings(tmp_path):
    pytest.importorskip("PySide6")
    # A fresh process: Qt reads XDG_CONFIG_HOME once per process.
    code = ("from PySide6.QtCore import QSettings; from core import paths; "
            "print(QSettings(paths.APP_NAME, paths.APP_NAME).fileName()); print(paths.config_dir())")
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout.split("\n")
    assert Path(out[0]).parent == Path(out[1]) == tmp_path / "cfg" / "LlamaDesk"
