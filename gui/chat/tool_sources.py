"""Where the chat's tools come from: the built-in tools and the user's MCP servers.

:class:`ToolSources` reads ``mcp.json`` (:mod:`core.tools.config`), keeps one
:class:`~core.tools.mcp_client.McpServer` per enabled server and one
:class:`~core.tools.builtin.BuiltinTools`, and connects them OFF the UI thread: each
server starts, lists its tools, prompts and resources in a thread (``asyncio.to_thread``),
and its status ("connecting", "connected" with N tools, "failed" with the reason,
"disabled") is said per server as it changes. What connected is handed to
:class:`~gui.chat.chat_tools.ChatTools`, which each chat picks from. MCP prompts and
resources are fetched here too, off the UI thread, for the prompt editor.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.errors import one_line
from core.tools import config as mcp_config
from core.tools.builtin import BUILTIN_TOOLS, BuiltinTools
from core.tools.mcp_client import McpServer
from core.tools.mcp_shapes import McpPrompt, McpResource, ResourceText, prompt_text

from gui.chat.attached_resources import block
from gui.chat.chat_tools import BUILTIN, ChatTools

LIST_TIMEOUT = 30.0  # seconds to list one server's prompts or resources


class ToolSources(QObject):
    """The providers of tools, prompts and resources.

    Args:
        chat_tools: where the connected providers go.
        path: the ``mcp.json`` file (default: the config folder's).
        folders: the folders read_file may read (the user's choice).

    Signals:
        statusChanged(str, dict): a server's status: {"state", "tools", "error", "target", "listing"
            (the tools as OpenAI functions: name, description, parameters)}.
        problem(str): the configuration cannot be read or saved (one line).
    """

    statusChanged = Signal(str, dict)
    problem = Signal(str)

    def __init__(self, *, chat_tools: ChatTools, path: str | Path | None = None, folders=(), parent=None):
        super().__init__(parent)
        self.chat_tools = chat_tools
        self.path = Path(path) if path is not None else mcp_config.default_path()
        self.config = mcp_config.McpConfig()
        self.builtin = BuiltinTools(tuple(BUILTIN_TOOLS), folders=tuple(folders))
        self.servers: dict[str, McpServer] = {}
        self.status: dict[str, dict] = {}
        self.prompts: list[McpPrompt] = []
        self.resources: list[McpResource] = []
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ the configuration

    def load(self) -> bool:
        """Read ``mcp.json``; False (and ``problem``) when it cannot be used."""
        try:
            self.config = mcp_config.load(self.path)
        except (mcp_config.McpConfigError, OSError) as e:
            self.problem.emit(f"MCP servers: {one_line(e)}")
            return False
        return True

    def save(self, config: mcp_config.McpConfig) -> bool:
        """Write ``config`` to ``mcp.json`` and reconnect; False (and ``problem``) when it
        cannot be written (nothing changes then)."""
        try:
            mcp_config.save(config, self.path)
        except (mcp_config.McpConfigError, OSError) as e:
            self.problem.emit(f"MCP servers: could not save {self.path.name}: {one_line(e)}")
            return False
        self.config = config
        self.connect()
        return True

    def set_folders(self, folders) -> None:
        """The folders read_file may read changed."""
        self.builtin = BuiltinTools(tuple(BUILTIN_TOOLS), folders=tuple(folders))
        self.connect()

    # ------------------------------------------------------------------ connecting

    def connect(self) -> asyncio.Task:
        """(Re)connect every enabled server and hand the providers on; returns the task."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        wanted = {s.name: s for s in self.config.enabled()}
        for name, server in list(self.servers.items()):
            if name not in wanted or server.config != wanted[name]:  # removed or changed: stopped
                del self.servers[name]
                asyncio.ensure_future(asyncio.to_thread(server.close))
        self.status = {n: s for n, s in self.status.items() if n in self.config.servers}
        for name, cfg in self.config.servers.items():
            if cfg.disabled:
                self._say(name, "disabled")
            else:
                self.servers.setdefault(name, McpServer(cfg))
                self._say(name, "connecting")
        self._task = asyncio.ensure_future(self._connect())
        return self._task

    def _say(self, name: str, state: str, *, tools: int = 0, error: str = "", listing: list | None = None) -> None:
        cfg = self.config.servers.get(name)
        self.status[name] = {"state": state, "tools": tools, "error": error, "target": cfg.target if cfg else "",
                             "listing": listing or []}
        self.statusChanged.emit(name, dict(self.status[name]))

    async def _connect(self) -> None:
        servers = list(self.servers.values())
        builtin = await asyncio.to_thread(self.builtin.tools)
        listed: dict[str, tuple[list, list, list]] = {}

        async def one(server: McpServer) -> None:
            listed[server.source] = await self._list(server)
            self._hand_on(servers, builtin, listed)
        # each server's tools go to the chats as soon as it has listed them: a server that
        # never answers must not hold back the ones already said to be connected
        self._hand_on(servers, builtin, listed)
        await asyncio.gather(*(one(s) for s in servers))

    def _hand_on(self, servers: list[McpServer], builtin: list, listed: dict) -> None:
        """The built-in tools and the servers listed so far (in the configuration's order) to the chats."""
        done = [s for s in servers if s.source in listed]
        self.prompts = [p for s in done for p in listed[s.source][1]]
        self.resources = [r for s in done for r in listed[s.source][2]]
        self.chat_tools.set_providers({BUILTIN: self.builtin, **{s.source: s for s in done}},
                                      {BUILTIN: builtin, **{s.source: listed[s.source][0] for s in done}})

    async def _list(self, server: McpServer) -> tuple[list, list, list]:
        """One server's tools, prompts and resources (what it cannot list: none), its status said."""
        try:
            tools = await asyncio.to_thread(server.list_tools)
        except Exception as e:  # noqa: BLE001 — McpError, or anything the SDK let through
            self._say(server.name, "failed", error=one_line(e))
            return [], [], []
        extras = []
        for what in (server.prompts, server.resources):
            try:
                extras.append(await asyncio.to_thread(what, timeout=LIST_TIMEOUT))
            except Exception:  # noqa: BLE001 — a server without prompts or resources says so by failing
                extras.append([])
        self._say(server.name, "connected", tools=len(tools), listing=[t.to_openai()["function"] for t in tools])
        return tools, extras[0], extras[1]

    # ------------------------------------------------------------------ prompts and resources

    async def prompt_text(self, prompt: McpPrompt, arguments: dict[str, str]) -> str:
        """The prompt filled in, as text for the editor (its messages' contents)."""
        server = self.servers.get(prompt.server)
        if server is None:
            raise LookupError(f"MCP server '{prompt.server}' is no longer connected")
        return prompt_text(await asyncio.to_thread(server.get_prompt, prompt.name, arguments))

    async def read_resource(self, resource: McpResource) -> ResourceText:
        """The resource's text, read on a thread (cut at the client's limit, saying so)."""
        server = self.servers.get(resource.server)
        if server is None:
            raise LookupError(f"MCP server '{resource.server}' is no longer connected")
        return await asyncio.to_thread(server.read_resource, resource.uri)

    async def resource_text(self, resource: McpResource) -> str:
        """The resource as the block the model reads after a message (name, address, text)."""
        got = await self.read_resource(resource)
        return block({"name": resource.name, "uri": resource.uri, "text": got.text})

    def close(self) -> None:
        """The app is closing: stop connecting (the hub stops the servers at exit)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
