"""Model → Library…: the models table (scan, search, sort), Open, Show in Folder, Delete, folders.

Everything runs on the real core.library.library against files on disk (the shipped stories260K.gguf,
copied into a temporary models folder, and a damaged one); the scan runs off the UI thread.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
from PySide6.QtCore import Qt

from core.library import library
from core.library.library import LibraryState, human_params, human_size
from gui.actions import MODEL
from gui.library.library_table import short_location, tilde
from tests.hubserver import GGUF_REPO
from tests.gui.ui_helpers import (bridge, data_dir, loop, make_window, run, send, settings,  # noqa: F401
                                  snapshot, until)


@pytest.fixture
def models(data_dir, fixtures):
    """The default models folder holding stories260K.gguf and a file that is not a GGUF."""
    folder = data_dir / "models"
    folder.mkdir()
    shutil.copy(fixtures / "stories260K.gguf", folder / "stories260K.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\x00" * 60)
    return folder


def table_rows(view) -> list[dict]:
    """What the table shows, as {header: text} per visible row."""
    m = view.table.model()
    heads = [m.headerData(c, Qt.Horizontal) for c in range(m.columnCount())]
    return [{heads[c]: m.index(r, c).data() for c in range(m.columnCount())} for r in range(m.rowCount())]


async def opened(w):
    lw = w.open_library()
    await until(lambda: not w.library.service.scanning and lw.library.model.entries, 30, "the first scan")
    return lw


def test_library_lists_what_is_on_disk_and_searches(qtbot, loop, bridge, settings, data_dir, models):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)

    async def scenario():
        lw = await opened(w)
        view = lw.library
        rows = {r["Name"]: r for r in table_rows(view)}
        assert set(rows) == {"stories260K", "broken"}
        # The facts the file itself states, read here with gguf's own reader.
        reader = gguf.GGUFReader(str(models / "stories260K.gguf"))
        ctx = int(reader.fields["llama.context_length"].parts[-1][0])
        params = sum(int(t.n_elements) for t in reader.tensors)
        good = rows["stories260K"]
        assert good["Format"] == "gguf" and good["Quantization"] == "F32"
        assert good["Context"] == f"{ctx:,}" and good["Parameters"] == human_params(params)
        assert good["Size"] == human_size((models / "stories260K.gguf").stat().st_size)
        assert good["Last used"] == "never"
        # The damaged file is listed, greyed, with the reason, and cannot be opened.
        bad = rows["broken"]
        assert bad["Parameters"] == "—"
        view.select_path(models / "broken.gguf")
        assert "Cannot be opened" in view.table.selectionModel().selectedRows()[0].data(Qt.ToolTipRole)
        assert not view.open_button.isEnabled() and view.delete_button.isEnabled()
        # Search: every word must match some column; the path counts too.
        qtbot.keyClicks(view.search, "stories f32")
        assert [r["Name"] for r in table_rows(view)] == ["stories260K"]
        view.search.clear()
        qtbot.keyClicks(view.search, "q4_k_m")
        assert table_rows(view) == []
        view.search.clear()
        # Sorting by size puts the 64-byte file first.
        view.table.sortByColumn(6, Qt.AscendingOrder)
        assert [r["Name"] for r in table_rows(view)] == ["broken", "stories260K"]
        assert str(models) in view.status.text() and "2 models" in view.status.text()
        return lw

    # a person looks at this one (outside the coroutine: grabbing runs Qt's event loop)
    snapshot(run(loop, scenario()), "library_tab")


def test_open_from_library_loads_and_generates(qtbot, loop, bridge, settings, data_dir, models):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    assert w.info is None

    async def scenario():
        lw = await opened(w)
        assert lw.library.select_path(models / "stories260K.gguf")
        qtbot.mouseClick(lw.library.open_button, Qt.LeftButton)
        await until(lambda: w.info is not None, 30, "the model to load")
        assert w.info["path"] == str(models / "stories260K.gguf")
        reply = await send(qtbot, w, "Once upon a time", max_tokens=12)
        assert reply["text"].strip() and reply["stats"]["generated_tokens"] > 0
        # Opening it recorded its use: the state file (which the CLI reads too) and the table say so.
        await until(lambda: LibraryState(data_dir / "library.json").last_used(), 10, "last use recorded")
        w.library.service.rescan()
        await until(lambda: any(r["Last used"] == "just now" for r in table_rows(lw.library)), 20, "just now")

    run(loop, scenario(), timeout=90)


def test_generic_names_a_folder_column_and_last_used_however_opened(qtbot, loop, bridge, settings, data_dir, models):
    """A model file named model.gguf is listed under its folder's name, the Folder column says
    where each model is, and opening one with File → Open (not from the library) updates its
    "Last used" in the open table at once and in the state file the CLI reads."""
    tiny = models / "Tiny-Stories" / "model.gguf"
    tiny.parent.mkdir()
    shutil.copy(models / "stories260K.gguf", tiny)
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)

    async def scenario():
        lw = await opened(w)
        rows = {r["Name"]: r for r in table_rows(lw.library)}
        assert set(rows) == {"stories260K", "broken", "Tiny-Stories"}
        assert (rows["Tiny-Stories"]["Folder"], rows["stories260K"]["Folder"]) == ("models/Tiny-Stories", "models")
        assert rows["Tiny-Stories"]["Last used"] == "never"
        w.ask_model_path = lambda: str(tiny)  # File → Open's dialog answer
        w.open_model_dialog()
        await until(lambda: w.info is not None, 30, "the model to load")
        await until(lambda: {r["Name"]: r["Last used"] for r in table_rows(lw.library)}["Tiny-Stories"] == "just now",
                    10, "Last used in the open table")
        await until(lambda: library.path_key(tiny) in LibraryState(data_dir / "library.json").last_used(), 10,
                    "the use recorded")
        assert table_rows(lw.library)[0]["Name"] == "Tiny-Stories"  # last used first
        return lw

    snapshot(run(loop, scenario(), timeout=60), "library_folder_column")


def test_short_location():
    home = Path.home()
    assert short_location(home / "llms" / "a", [home / "llms", home / "llms" / "a"]) == "a"  # the nearest root
    assert short_location(home / "llms" / "a" / "b", [home / "llms"]) == "llms/a/b"
    assert short_location(home / "elsewhere", [home / "llms"]) == "~/elsewhere"
    assert short_location("/opt/m", []) == "/opt/m"


def test_delete_asks_first_and_removes_the_file(qtbot, loop, bridge, settings, data_dir, models):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)

    async def scenario():
        view = (await opened(w)).library
        asked = []
        answer = [False]
        view.confirm = lambda title, text: asked.append(text) or answer[0]
        view.select_path(models / "stories260K.gguf")
        qtbot.mouseClick(view.delete_button, Qt.LeftButton)
        assert len(asked) == 1 and "stories260K" in asked[0] and "cannot be undone" in asked[0]
        assert (models / "stories260K.gguf").exists()  # "No" deletes nothing
        answer[0] = True
        view.select_path(models / "stories260K.gguf")
        task = view.delete_selected()
        await task
        assert not (models / "stories260K.gguf").exists()
        await until(lambda: not w.library.service.scanning, 20, "the rescan")
        assert [r["Name"] for r in table_rows(view)] == ["broken"]
        assert "Deleted stories260K" in view.status.text()

    run(loop, scenario())


def test_show_in_folder_and_changing_folders(qtbot, loop, bridge, settings, data_dir, models, tmp_path, fixtures):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(fixtures / "stories260K.gguf", other / "another.gguf")

    async def scenario():
        view = (await opened(w)).library
        urls = []
        view.open_url = urls.append
        view.select_path(models / "stories260K.gguf")
        qtbot.mouseClick(view.show_button, Qt.LeftButton)
        assert [u.toLocalFile() for u in urls] == [str(models)]
        # An extra folder is scanned too, and saved where the CLI reads it.
        view.ask_folder = lambda title: str(other)
        view.folders_menu.aboutToShow.emit()  # what opening the Folders menu does
        [add] = [a for a in view.folders_menu.actions() if a.text().startswith("Add a Folder")]
        add.trigger()
        await until(lambda: len(view.model.entries) == 3, 20, "the extra folder's model")
        state = json.loads((data_dir / "library.json").read_text())
        assert state["extra_folders"] == [str(other)]
        # Changing the models folder: only the new one and the extra folder are listed.
        new = tmp_path / "new-models"
        new.mkdir()
        view.ask_folder = lambda title: str(new)
        view.folders_menu.aboutToShow.emit()
        [change] = [a for a in view.folders_menu.actions() if a.text().startswith("Change Models Folder")]
        change.trigger()
        await until(lambda: not w.library.service.scanning and len(view.model.entries) == 1, 20, "the new folder's scan")
        assert [e.name for e in view.model.entries] == ["another"]
        assert LibraryState(data_dir / "library.json").models_folder() == new

    run(loop, scenario())


def test_empty_state_links_to_the_library(qtbot, loop, bridge, settings, data_dir, hub_server):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    w.library.service.set_endpoint(hub_server.url)  # the Hub tab lists popular repositories when first shown
    assert "href='library'" in w.chat.empty_hint.text() and w.chat.empty_hint.isVisible()
    model_menu = next(a.menu() for a in w.menuBar().actions() if a.text() == MODEL)  # by title: menus get added
    assert w.action("library") in model_menu.actions()

    async def scenario():
        w.chat.empty_hint.linkActivated.emit("library")
        lw = w.library.window
        assert lw is not None and lw.isVisible()
        await until(lambda: not w.library.service.scanning, 20, "the scan")
        assert lw.library.empty.isVisible() and "Hub" in lw.library.empty.text()
        lw.library.empty.linkActivated.emit("hub")
        assert lw.tabs.currentWidget() is lw.hub
        # shown for the first time, it lists the most downloaded Llama GGUF repositories
        await until(lambda: lw.hub.results_model.rowCount() and not lw.hub.busy, 20, "the first search")
        assert [r.repo_id for r in lw.hub.results_model.repos][0] == GGUF_REPO

    run(loop, scenario())
