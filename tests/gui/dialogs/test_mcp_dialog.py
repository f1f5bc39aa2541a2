"""Tools → MCP Servers…: the dialog's form, paste and remove, checked before saving; and
ToolSources connecting a real SDK server (stdio) and a broken one off the UI thread, the
statuses in the dialog, a chat's call through the real server, its prompt and resource."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from core.history.store import History
from core.tools import config as mcp_config
from core.tools.spec import ToolCall
from gui.chat.chat_tools import ChatTools
from gui.chat.conversation import ConversationModel
from gui.chat.tool_sources import ToolSources
from gui.dialogs.mcp_dialog import McpServersDialog, status_line
from tests.gui.ui_helpers import loop, run, until  # noqa: F401 (fixtures)

SCRIPT = str(Path(__file__).resolve().parents[2] / "core" / "tools" / "mcp_servers.py")
CLAUDE = {"mcpServers": {"files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
                         "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}}}}


def dialog(qtbot, config=None, status=None, ok=True):
    saved = []

    def save(cfg):
        saved.append(cfg)
        return ok
    d = McpServersDialog(config=config or mcp_config.McpConfig(), status=status or {}, save=save)
    qtbot.addWidget(d)
    return d, saved


def test_the_form_adds_a_stdio_server_and_refuses_a_bad_one_in_place(qtbot):
    d, saved = dialog(qtbot)
    qtbot.mouseClick(d.findChild(type(d.apply), "mcpAddButton"), Qt.LeftButton)
    d.name.setText("weather")
    d.command.setText(sys.executable)
    d.args.setText("server.py --port '8 0'")
    d.env.setPlainText("API_KEY=abc\n\nDEBUG=1")
    qtbot.mouseClick(d.apply, Qt.LeftButton)
    (cfg,) = saved
    s = cfg.servers["weather"]
    assert s.args == ("server.py", "--port", "8 0") and s.env == {"API_KEY": "abc", "DEBUG": "1"}
    assert d.list.count() == 1 and d.problem.text() == ""
    d.new_server()
    d.name.setText("broken")
    d.command.setText("")  # no command: said under the form, nothing saved
    assert not d.save_form()
    assert len(saved) == 1 and "command" in d.problem.text() and d.problem.text().startswith("⚠")
    d.kind.setCurrentIndex(1)
    assert d.url.isVisibleTo(d) and not d.command.isVisibleTo(d)


def test_paste_a_claude_desktop_blob_edit_and_remove(qtbot):
    d, saved = dialog(qtbot, status={"files": {"state": "failed", "error": "npx: not found"}})
    assert d.add_json(json.dumps(CLAUDE))
    cfg = saved[-1]
    assert list(cfg.servers) == ["files", "search"] and cfg.servers["search"].headers == {"Authorization": "Bearer x"}
    texts = [d.list.item(i).text() for i in range(d.list.count())]
    assert texts == ["files — failed: npx: not found", "search — not connected"]
    assert not d.add_json('{"mcpServers": {"x": {"command": 3}}}') and "command" in d.problem.text()
    d.list.setCurrentRow(1)
    assert d.url.text() == "https://example.com/mcp" and "Authorization: Bearer x" in d.headers.toPlainText()
    d.set_status("search", {"state": "connected", "tools": 3})
    assert d.list.item(1).text() == "search — connected · 3 tools" and d.state.text() == "connected · 3 tools"
    assert d.remove()
    assert list(saved[-1].servers) == ["files"]
    d.resize(760, 440)
    d.grab().save("/tmp/toolgui-mcp-dialog.png")


def test_a_save_that_fails_changes_nothing(qtbot):
    d, saved = dialog(qtbot, ok=False)
    assert not d.add_json(json.dumps(CLAUDE))
    assert saved and d.config.servers == {} and d.list.count() == 0


@pytest.fixture
def sources(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    conv = ConversationModel(history=h)
    tools = ChatTools(conversation=conv)
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "local": {"command": sys.executable, "args": [SCRIPT, "stdio"], "timeout": 20},
        "missing": {"command": str(tmp_path / "no-such-server")},
        "off": {"command": "x", "disabled": True}}}))
    src = ToolSources(chat_tools=tools, path=path)
    yield conv, tools, src
    for s in src.servers.values():
        s.close()
    h.close()


def test_a_real_sdk_server_connects_off_the_ui_thread_and_a_broken_one_says_why(qtbot, loop, sources):
    # A few seconds: a real MCP server process starts (python + the SDK) and answers over stdio.
    conv, tools, src = sources
    assert src.load()
    d = McpServersDialog(config=src.config, status=src.status, save=src.save)
    qtbot.addWidget(d)
    src.statusChanged.connect(d.set_status)
    task = src.connect()
    assert src.status["local"]["state"] == "connecting"  # said at once; the UI thread is free
    run(loop, task, 60)
    assert status_line(src.status["local"]).startswith("connected · ")
    assert src.status["missing"]["state"] == "failed" and src.status["missing"]["error"]
    assert src.status["off"]["state"] == "disabled"
    assert d.list.item(0).text().startswith("local — connected") and "failed" in d.list.item(1).text()
    d.list.setCurrentRow(0)  # the server's tools, each with its schema on hover (issue 25 item 3)
    shown = {d.tools.item(i).text().split(" — ")[0]: d.tools.item(i) for i in range(d.tools.count())}
    assert "add" in shown and len(shown) == src.status["local"]["tools"]
    assert '"properties"' in shown["add"].toolTip() and '"a"' in shown["add"].toolTip()
    d.list.setCurrentRow(1)
    assert d.tools.count() == 0  # a server that failed offers nothing
    assert d.list.item(1).toolTip() == status_line(src.status["missing"])  # its reason whole
    tools.set_enabled("mcp:local", True)
    assert "add" in {t.name for t in tools.tools()}
    assert all(t.source == "mcp:local" for t in tools.tools())
    provider = tools.provider("mcp:local")
    got = run(loop, _call(provider, ToolCall("add", {"a": 2, "b": 40})), 30)
    assert got.content == "42" and not got.is_error
    (review,) = [p for p in src.prompts if p.name == "review"]
    text = run(loop, src.prompt_text(review, {"code": "x = 1"}), 30)
    assert "Review this python code:\nx = 1" in text
    (readme,) = [r for r in src.resources if r.uri == "note://readme"]
    block = run(loop, src.resource_text(readme), 30)
    assert "note://readme" in block and "hello from the server" in block


async def _call(provider, call):
    import asyncio
    return await asyncio.to_thread(provider.call, call, cancel=threading.Event(), timeout=20)
