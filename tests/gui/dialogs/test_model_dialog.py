"""Open Model…: one dialog for a .gguf file or a model folder, behind Ctrl+O."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QDialog, QDialogButtonBox

from gui.dialogs.model_dialog import OpenModelDialog, info_rows, model_choice


@pytest.fixture
def models(tmp_path):
    (tmp_path / "story.gguf").write_bytes(b"GGUF")
    meta = tmp_path / "meta-model"
    meta.mkdir()
    (meta / "params.json").write_text("{}")
    (meta / "consolidated.00.pth").write_bytes(b"")
    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (tmp_path / "photos").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    return tmp_path


def test_model_choice(models):
    assert model_choice(str(models / "story.gguf")) == str(models / "story.gguf")
    assert model_choice(str(models / "meta-model")) == str(models / "meta-model")
    assert model_choice(str(models / "meta-model" / "params.json")) == str(models / "meta-model")
    assert model_choice(str(models / "hf-model")) == str(models / "hf-model")
    assert model_choice(str(models / "photos")) is None
    assert model_choice(str(models / "notes.txt")) == str(models)  # models holds a .gguf: the folder opens it


def _press_open(dlg):
    box = dlg.findChild(QDialogButtonBox)
    button = box.button(QDialogButtonBox.Open)
    assert button.isEnabled(), "Open is disabled for this selection"
    button.click()


@pytest.mark.parametrize("pick, want", [("story.gguf", "story.gguf"), ("meta-model", "meta-model"),
                                        ("hf-model", "hf-model")])
def test_one_dialog_opens_a_file_or_a_folder(qtbot, models, pick, want):
    dlg = OpenModelDialog(None, str(models))
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.selectFile(str(models / pick))
    _press_open(dlg)
    assert dlg.result() == QDialog.Accepted and dlg.chosen == str(models / want)


def test_an_ordinary_folder_is_entered_not_chosen(qtbot, models):
    dlg = OpenModelDialog(None, str(models))
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.selectFile(str(models / "photos"))
    _press_open(dlg)
    assert dlg.chosen is None and dlg.isVisible()
    assert dlg.directory().absolutePath() == str(models / "photos")


def test_model_facts_say_which_threads_and_why():
    """The status bar's tooltip and the model info dialog list the worker's thread plan."""
    rows = dict(info_rows({"name": "m", "threads": "prefill 2 / decode 1 threads: probe (...)"}))
    assert rows["Threads"] == "prefill 2 / decode 1 threads: probe (...)"
    assert "Threads" not in dict(info_rows({"name": "m"}))


def test_model_facts_say_which_cpu_kernels_run_or_why_none():
    rows = dict(info_rows({"name": "m", "kernels": "off: no C compiler (set CC, or install gcc or clang)"}))
    assert rows["CPU kernels"].startswith("off: no C compiler")
