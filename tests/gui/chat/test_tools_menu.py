"""The Tools menu of the main window: per-chat switches for built-in tools and MCP servers,
the options kept in the settings, an MCP prompt filled into the editor (issue 25)."""
from __future__ import annotations

from core.tools.mcp_shapes import McpPrompt
from gui.chat.tools_menu import ASK_KEY, ROUNDS_KEY
from tests.gui.ui_helpers import bridge, data_dir, loop, run, settings, window  # noqa: F401 (fixtures)


def test_switches_options_and_a_prompt_for_the_editor(qtbot, loop, window, settings, monkeypatch):
    menu = window.menu("chat_tools")
    menu.aboutToShow.emit()
    switch = next(a for a in menu.actions() if a.objectName() == "toolSwitch_builtin:calculator")
    assert not switch.isChecked() and window.chats.tools.tools() == []  # every tool off by default
    switch.trigger()
    assert [t.name for t in window.chats.tools.tools()] == ["calculator"]
    assert any("No MCP servers yet" in a.text() for a in menu.actions())
    options = window.menu("tool_options")
    options.aboutToShow.emit()
    ask = next(a for a in options.actions() if a.objectName() == "askEveryTimeAction")
    ask.trigger()
    window.tools_menu.set_max_rounds(4)
    assert window.chats.tool_round.ask_every_time and window.chats.tool_round.max_rounds == 4
    assert settings.value(ASK_KEY, type=bool) and settings.value(ROUNDS_KEY, type=int) == 4

    async def filled(prompt, args):
        return f"Review this {args.get('language', 'python')} code:\n{args['code']}"
    monkeypatch.setattr(window.tools_menu.sources, "prompt_text", filled)
    window.prompt.set_text("Please:")
    task = window.tools_menu.insert_prompt(McpPrompt("local", "review"), {"code": "x = 1"})
    run(loop, task)
    assert window.prompt.text() == "Please:\n\nReview this python code:\nx = 1"

    async def gone(prompt, args):
        raise LookupError("MCP server 'local' is no longer connected")
    monkeypatch.setattr(window.tools_menu.sources, "prompt_text", gone)
    run(loop, window.tools_menu.insert_prompt(McpPrompt("local", "review"), {}))
    assert "no longer connected" in window.statusBar().currentMessage()
    assert window.prompt.text().endswith("x = 1")  # the editor keeps what it had
