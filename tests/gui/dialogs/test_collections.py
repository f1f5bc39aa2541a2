"""Documents → Collections…: folders indexed in the background with progress, pause,
cancel, incremental re-index and removal; real folders written here."""
from __future__ import annotations

import os

import pytest

from core.documents import DocumentIndex
from gui.dialogs.collections import CollectionsController, CollectionsDialog
from tests.gui.ui_helpers import bridge, data_dir, loop, settings, window  # noqa: F401 (fixtures)


@pytest.fixture
def index(tmp_path):
    ix = DocumentIndex(tmp_path / "h.sqlite3")
    yield ix
    ix.close()


@pytest.fixture
def ctl(index):
    c = CollectionsController(lambda: index)
    yield c
    c.close()


def folder(root, n=3):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"note{i}.md").write_text(f"# Note {i}\n\nThe lighthouse keeper counted {i} ships.\n")
    (root / "data.txt").write_bytes(bytes(range(256)) * 40)  # binary named .txt: skipped, with why
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "deep.txt").write_text("A fox crossed the frozen river.\n")
    os.symlink(root, root / "sub" / "loop")  # a symlink loop is not followed forever
    return root


def finished(qtbot, ctl, root, timeout=20000):
    seen = []
    ctl.progress.connect(seen.append)
    qtbot.waitUntil(lambda: any(p.finished and p.root == str(root) for p in seen), timeout=timeout)
    return [p for p in seen if p.finished][-1]


def test_a_folder_is_indexed_in_the_background_then_incrementally(qtbot, ctl, index, tmp_path):
    root = folder(tmp_path / "notes")
    assert ctl.add(str(root))
    end = finished(qtbot, ctl, root)
    assert end.state == "done" and end.files_read == 4
    [c] = ctl.collections()
    assert c.files >= 4 and c.chunks >= 4
    assert any("data.txt" in p and "binary" in why.lower() for p, why in index.skipped(c.id))
    (root / "note0.md").write_text("# Note 0\n\nThe keeper painted the door red.\n")
    (root / "new.md").write_text("Fresh notes about tides.\n")
    (root / "note1.md").unlink()
    ctl.reindex(c.root)
    again = finished(qtbot, ctl, root)
    assert again.state == "done" and again.files_read == 2 and again.removed == 1


def test_missing_folder_pause_resume_cancel_and_remove(qtbot, ctl, tmp_path):
    notices = []
    ctl.notice.connect(notices.append)
    assert not ctl.add(str(tmp_path / "unplugged-drive"))
    assert "not a folder" in notices[-1]
    big = folder(tmp_path / "big", n=400)
    seen = []
    ctl.progress.connect(seen.append)
    ctl.add(str(big))
    ctl.pause(str(big))
    qtbot.waitUntil(lambda: any(p.state == "paused" for p in seen), timeout=10000)
    paused = [p for p in seen if p.state == "paused"][-1]
    assert paused.files_done < paused.files_total or paused.files_total == 0
    ctl.resume(str(big))
    ctl.cancel(str(big))
    end = finished(qtbot, ctl, big)
    assert end.state in ("cancelled", "done")
    ctl.reindex(str(big))
    ctl.remove(str(big))  # while it runs: removed once it has stopped
    qtbot.waitUntil(lambda: not ctl.collections(), timeout=20000)


def test_dialog_shows_progress_and_state(qtbot, ctl, tmp_path):
    root = folder(tmp_path / "notes")
    dlg = CollectionsDialog(ctl)
    qtbot.addWidget(dlg)
    dlg.show()
    ctl.add(str(root))
    finished(qtbot, ctl, root)
    qtbot.waitUntil(lambda: dlg.tree.topLevelItemCount() == 1 and dlg.tree.topLevelItem(0).text(1) == "up to date")
    item = dlg.tree.topLevelItem(0)
    assert item.text(0) == "notes" and int(item.text(3)) >= 4
    assert "data.txt" in dlg.detail.text()
    assert not dlg.buttons["pause"].isEnabled() and dlg.buttons["reindex"].isEnabled()
    dlg.grab().save("/tmp/docsgui-collections.png")


def test_documents_menu_opens_collections_beside_the_window(qtbot, window, tmp_path):
    from PySide6.QtGui import QAction
    act = window.findChild(QAction, "collectionsAction")
    assert act is not None and window.findChild(QAction, "attachAction") is not None
    act.trigger()
    dlg = window.attach_bar.dialog
    assert dlg is not None and dlg.isVisible() and not dlg.isModal()
    window.chats.collections.add(str(folder(tmp_path / "notes")))
    qtbot.waitUntil(lambda: dlg.tree.topLevelItemCount() == 1 and dlg.tree.topLevelItem(0).text(1) == "up to date",
                    timeout=20000)
    menu = window.attach_bar.collections_menu
    menu.aboutToShow.emit()
    entry = next(a for a in menu.actions() if a.text().startswith("notes"))
    entry.setChecked(True)  # the next message searches this collection
    assert window.chats.attachments.collections == [str(tmp_path / "notes")]
    assert "notes" in window.attach_bar.chips.text()
    window.grab().save("/tmp/docsgui-window.png")
