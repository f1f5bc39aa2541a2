"""gui/actions.py's table on its own, and the NoticeBar: no main window needed."""
from __future__ import annotations

from PySide6.QtWidgets import QMainWindow, QMenu

from gui import actions
from gui.chat.attach_bar import AttachBar
from gui.chat.controller import ConversationController
from gui.chat.prompt_editor import PromptEditor
from gui.chat.sidebar import ConversationSidebar
from gui.chat.tools_menu import ToolsMenu
from gui.main_window import MainWindow
from gui.model_controller import ModelController
from gui.widgets.notice_bar import NoticeBar

# The window's children a dotted slot reaches, by attribute name.
CHILDREN = {"prompt": PromptEditor, "models": ModelController, "chats": ConversationController,
            "sidebar": ConversationSidebar, "attach_bar": AttachBar, "tools_menu": ToolsMenu}


def rows(kind):
    return [r for r in actions.ACTIONS if isinstance(r, kind)]


def test_every_row_names_a_slot_the_window_has_and_a_menu_there_is():
    names = [r.name for r in rows(actions.Action)] + [r.name for r in rows(actions.Submenu)]
    assert len(names) == len(set(names))
    for row in rows(actions.Action):
        owner, _, slot = row.slot.rpartition(".")
        assert callable(getattr(CHILDREN[owner] if owner else MainWindow, slot)), row
        assert row.menu in actions.MENUS or (row.menu == "" and row.name in actions.TOOLBAR), row
    for row in rows(actions.Submenu):
        owner, _, fill = row.fill.rpartition(".")
        assert callable(getattr(CHILDREN[owner] if owner else MainWindow, fill)) and row.menu in actions.MENUS
    assert {r.menu for r in rows(actions.Separator)} <= set(actions.MENUS)
    on_bar = [n for n in actions.TOOLBAR if n not in ("-", actions.STRETCH)]
    assert set(on_bar) <= {r.name for r in rows(actions.Action)} and set(actions.NAMED_BUTTONS) <= set(on_bar)


def test_the_table_builds_menus_toolbar_and_shortcuts(qtbot):
    class Host(QMainWindow):
        """Records which slot each command calls."""

        def __init__(self):
            super().__init__()
            self.calls = []
            for owner in CHILDREN:
                setattr(self, owner, self)

        def __getattr__(self, name):
            if name.startswith("fill_"):
                return lambda menu: menu.addAction(name)
            return lambda *args: self.calls.append((name, *args))

    host = Host()
    qtbot.addWidget(host)
    built, menus, toolbar = actions.build(host, checked={"compile": True})
    assert [a.text() for a in host.menuBar().actions()] == list(actions.MENUS)
    assert set(menus) == {r.name for r in rows(actions.Submenu)}
    assert isinstance(menus["recent"], QMenu) and menus["recent"].objectName() == "recentMenu"
    assert built["compile"].isChecked() and built["toggle_panel"].isChecked() and not built["use_local"].isEnabled()
    built["export_md"].trigger()
    built["compile"].setChecked(False)
    assert host.calls == [("export_conversation", "md"), ("set_compile", False)]
    assert toolbar.widgetForAction(built["compare"]).objectName() == "compareButton"
    assert built["send"].shortcuts()[0].toString() == "Ctrl+Return" and len(built["send"].shortcuts()) == 2


def test_choices_and_recent_menus(qtbot):
    menu = QMenu()
    picked = []
    actions.fill_choices(menu, ["cpu", "cuda"], "cuda", picked.append, name="device")
    assert [(a.objectName(), a.isChecked()) for a in menu.actions()] == [("device_cpu", False), ("device_cuda", True)]
    menu.actions()[0].trigger()
    assert picked == ["cpu"] and menu.actions()[0].isChecked() and not menu.actions()[1].isChecked()
    recent, cleared = QMenu(), []
    actions.fill_recent(recent, [], picked.append, lambda: cleared.append(True))
    assert [(a.text(), a.isEnabled()) for a in recent.actions()] == [("No recent models", False)]
    actions.fill_recent(recent, ["/m/a.gguf"], picked.append, lambda: cleared.append(True))
    recent.actions()[0].trigger()
    recent.actions()[-1].trigger()
    assert picked[-1] == "/m/a.gguf" and cleared == [True]


def test_a_notice_bar_says_offers_and_dismisses(qtbot):
    bar = NoticeBar(name="replyNotice", label_name="replyNoticeText", action="Retry", action_name="retryReplyButton",
                    selectable=True)
    qtbot.addWidget(bar)
    seen = []
    bar.actionTriggered.connect(lambda: seen.append("action"))
    bar.dismissed.connect(lambda: seen.append("dismissed"))
    assert bar.isHidden() and bar.objectName() == "replyNotice" and bar.button.objectName() == "retryReplyButton"
    bar.show_notice("⚠ cut mid-reply", "cut")
    assert not bar.isHidden() and bar.text() == "⚠ cut mid-reply" and bar.property("kind") == "cut"
    bar.button.click()
    bar.dismiss_button.click()
    assert seen == ["action", "dismissed"] and bar.isHidden()
    undo = NoticeBar(name="undoNotice", action="Undo", action_name="undoDeleteButton", dismissible=False, wrap=False)
    qtbot.addWidget(undo)
    assert undo.dismiss_button is None and not undo.label.wordWrap()
