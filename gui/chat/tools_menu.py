"""The Tools menu: what the open chat offers, MCP prompts and resources for the prompt, the
options of tool calls, and Tools → MCP Servers….

:class:`ToolsMenu` fills the menu's submenus each time they open (from
:class:`~gui.chat.chat_tools.ChatTools` and :class:`~gui.chat.tool_sources.ToolSources`),
keeps the global options in the app's settings ("ask every time", rounds per reply, the
folders read_file may read) and sets them on the conversation's
:class:`~gui.chat.tool_round.ToolRound`. Fetching a prompt or a resource runs off the UI
thread; what goes wrong is said in the status bar.
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMenu

from core.errors import one_line
from core.tools.builtin import BUILTIN_TOOLS

from gui.chat.chat_tools import BUILTIN
from gui.chat.tool_round import DEFAULT_MAX_ROUNDS
from gui.chat.tool_sources import ToolSources
from gui.dialogs.mcp_dialog import McpServersDialog, status_line

ASK_KEY, ROUNDS_KEY, FOLDERS_KEY = "tools/ask_every_time", "tools/max_rounds", "tools/folders"
ROUND_CHOICES = (1, 2, 4, 8, 16, 32)
BUILTIN_LABELS = {"calculator": "Calculator", "current_time": "Date and Time", "read_file": "Read a File",
                  "fetch_url": "Fetch a URL"}


class ToolsMenu(QObject):
    """The Tools menu's entries and options for ``window`` (the main window: its ``chats``,
    ``settings``, ``prompt`` and status bar)."""

    def __init__(self, window, *, mcp_path=None):
        super().__init__(window)
        self.window = window
        self.settings = window.settings
        self.chats = window.chats
        self.round = window.chats.tool_round
        self.round.ask_every_time = self.settings.value(ASK_KEY, False, type=bool)
        self.round.max_rounds = int(self.settings.value(ROUNDS_KEY, DEFAULT_MAX_ROUNDS, type=int))
        self.sources = ToolSources(chat_tools=self.chats.tools, path=mcp_path, folders=self.folders(), parent=self)
        self.sources.problem.connect(self.say)
        self.dialog: McpServersDialog | None = None
        # Built-in tools are there at once; MCP servers connect once the event loop runs.
        self.chats.tools.set_providers({BUILTIN: self.sources.builtin})
        if self.sources.load() and self.sources.config.servers:
            QTimer.singleShot(0, self.sources.connect)

    def say(self, text: str) -> None:
        self.window.statusBar().showMessage(text, 10000)

    def folders(self) -> list[str]:
        value = self.settings.value(FOLDERS_KEY, [])
        return [str(v) for v in ([value] if isinstance(value, str) else value or [])]

    # ------------------------------------------------------------------ Enable in This Chat

    def fill_chat(self, menu: QMenu) -> None:
        """One switch per built-in tool and per MCP server, for the open chat."""
        menu.clear()
        on = self.chats.tools.enabled()
        menu.addSection("Built-in tools")
        for name in BUILTIN_TOOLS:
            notes = " (allow a folder first: Tools → Options)" if name == "read_file" and not self.folders() else ""
            self._switch(menu, f"{BUILTIN}:{name}", BUILTIN_LABELS.get(name, name) + notes, on)
        menu.addSection("MCP servers")
        if not self.sources.config.servers:
            menu.addAction("No MCP servers yet: Tools → MCP Servers…").setEnabled(False)
        for name, cfg in self.sources.config.servers.items():
            a = self._switch(menu, f"mcp:{name}", f"{name} — {status_line(self.sources.status.get(name))}", on)
            a.setEnabled(not cfg.disabled)

    def _switch(self, menu: QMenu, key: str, text: str, on: set[str]):
        a = menu.addAction(text)
        a.setObjectName(f"toolSwitch_{key}")
        a.setCheckable(True)
        a.setChecked(key in on)
        a.toggled.connect(lambda checked, key=key: self.chats.tools.set_enabled(key, checked))
        return a

    # ------------------------------------------------------------------ options

    def fill_options(self, menu: QMenu) -> None:
        menu.clear()
        ask = menu.addAction("Ask Before Every Tool Call")
        ask.setObjectName("askEveryTimeAction")
        ask.setToolTip("Even tools a chat always allows ask first")
        ask.setCheckable(True)
        ask.setChecked(self.round.ask_every_time)
        ask.toggled.connect(self.set_ask_every_time)
        rounds = menu.addMenu("Rounds of Calls per Reply")
        for n in ROUND_CHOICES:
            a = rounds.addAction(str(n))
            a.setCheckable(True)
            a.setChecked(n == self.round.max_rounds)
            a.triggered.connect(lambda _c=False, n=n: self.set_max_rounds(n))
        menu.addSeparator()
        menu.addAction("Allow a Folder for Read a File…", self.add_folder)
        for f in self.folders():
            menu.addAction(f"Stop Allowing {f}", lambda f=f: self.set_folders([x for x in self.folders() if x != f]))

    def set_ask_every_time(self, on: bool) -> None:
        self.round.ask_every_time = bool(on)
        self.settings.setValue(ASK_KEY, bool(on))

    def set_max_rounds(self, n: int) -> None:
        self.round.max_rounds = int(n)
        self.settings.setValue(ROUNDS_KEY, int(n))

    def add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.window, "Allow a Folder for Read a File")
        if folder:
            self.set_folders([*self.folders(), folder])

    def set_folders(self, folders: list[str]) -> None:
        self.settings.setValue(FOLDERS_KEY, list(dict.fromkeys(folders)))
        self.sources.set_folders(self.folders())

    # ------------------------------------------------------------------ MCP servers

    def open_servers(self) -> McpServersDialog:
        """Tools → MCP Servers…: the dialog (non-blocking), its statuses kept current."""
        if self.dialog is not None and self.dialog.isVisible():
            self.dialog.raise_()
            return self.dialog
        self.dialog = McpServersDialog(config=self.sources.config, status=self.sources.status,
                                       save=self.sources.save, parent=self.window)
        self.sources.statusChanged.connect(self.dialog.set_status)
        self.sources.problem.connect(lambda text, d=self.dialog: d.problem.setText(f"⚠ {text}"))
        self.dialog.show()
        return self.dialog

    def fill_prompts(self, menu: QMenu) -> None:
        """The connected servers' prompts: one fills in the prompt editor."""
        menu.clear()
        for p in self.sources.prompts:
            a = menu.addAction(f"{p.name} · {p.server}", lambda p=p: self.insert_prompt(p))
            a.setToolTip(p.description)
        if not self.sources.prompts:
            menu.addAction("No MCP server offers prompts").setEnabled(False)

    def fill_resources(self, menu: QMenu) -> None:
        """The connected servers' resources: one is attached to the message being written."""
        menu.clear()
        for r in self.sources.resources:
            a = menu.addAction(f"{r.name} · {r.server}", lambda r=r: self.attach(r))
            a.setToolTip(f"{r.uri}\n{r.description}".strip())
        if not self.sources.resources:
            menu.addAction("No MCP server offers resources").setEnabled(False)

    def insert_prompt(self, prompt, arguments: dict | None = None) -> asyncio.Task | None:
        """Ask for the prompt's arguments (unless given), then fill it in off the UI thread."""
        if arguments is None:
            arguments = {}
            for arg in prompt.arguments:
                value, ok = QInputDialog.getText(self.window, prompt.name,
                                                 f"{arg.name}{' (required)' if arg.required else ''}: "
                                                 f"{arg.description}".rstrip(": "))
                if not ok:
                    return None
                if value or arg.required:
                    arguments[arg.name] = value
        return asyncio.ensure_future(self._insert(self.sources.prompt_text(prompt, arguments), prompt.name))

    def attach(self, resource) -> None:
        """Attach the resource to the message being written: a chip above the prompt (its
        text is read now, off the UI thread, and stored with the message when it is sent)."""
        self.chats.attachments.add_resource(resource, self.sources.read_resource)

    async def _insert(self, fetch, what: str) -> None:
        try:
            text = await fetch
        except Exception as e:  # noqa: BLE001 — McpError, a server gone: said, the editor untouched
            self.say(f"Could not get {what}: {one_line(e)}")
            return
        editor = self.window.prompt
        typed = editor.text()
        editor.set_text(f"{typed.rstrip()}\n\n{text}" if typed.strip() else text)
        editor.focus()

    def close(self) -> None:
        self.sources.close()
