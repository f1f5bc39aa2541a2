"""A user's MCP servers where one never answers: the others' tools reach the chats as soon
as they are said to be connected, not when the silent one finally times out."""
from __future__ import annotations

import json

from core.history.store import History
from gui.chat.chat_tools import ChatTools
from gui.chat.conversation import ConversationModel
from gui.chat.tool_sources import ToolSources
from tests.core.tools.mcp_servers import running_http_server
from tests.gui.ui_helpers import loop, run, until  # noqa: F401 (fixtures)
from tests.helpers import free_port


def test_a_connected_server_is_usable_while_another_never_answers(loop, tmp_path):
    # a few seconds: a real HTTP MCP server in this process (the silent one is just a process)
    url, stop = running_http_server(free_port())
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "silent": {"command": "sleep", "args": ["600"], "startTimeout": 120},  # starts, never speaks MCP
        "local": {"url": url}}}))
    h = History(tmp_path / "h.sqlite3")
    tools = ChatTools(conversation=ConversationModel(history=h))
    src = ToolSources(chat_tools=tools, path=path)
    try:
        assert src.load()
        task = src.connect()
        run(loop, until(lambda: src.status["local"]["state"] == "connected", 20, "local to connect"), 25)
        run(loop, until(lambda: "mcp:local" in tools.providers, 5, "local's tools in the chats"), 10)
        assert src.status["silent"]["state"] == "connecting" and "mcp:silent" not in tools.providers
        assert "add" in {t.name for t in tools.available()} and "calculator" in {t.name for t in tools.available()}
        task.cancel()
    finally:
        for s in src.servers.values():
            s.close()
        h.close()
        stop()
