"""Which tools the open chat offers, and which it runs without asking.

The app has providers (the built-in tools, one per MCP server: ``source`` "builtin" or
"mcp:NAME"); each chat turns on what it offers, every built-in tool on its own and each
MCP server as a whole, all off by default. What a chat turned on, and the tools the user
said to always allow in it, live in the conversation's meta::

    {"tools": {"enabled": ["builtin:calculator", "mcp:weather"], "always": ["get_weather"]}}

A fresh chat (not stored yet) keeps its choice here until its first message stores it.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from core.history.records import HistoryError
from core.tools.spec import Tool, ToolProvider

from gui.chat.conversation import ConversationModel

BUILTIN = "builtin"


def _listed(provider: ToolProvider) -> list[Tool]:
    try:
        return list(provider.tools())
    except Exception:  # noqa: BLE001 — a provider that cannot list offers nothing (its status says why)
        return []


def switch_key(tool: Tool) -> str:
    """What turns ``tool`` on in a chat: a built-in tool by itself, an MCP server whole."""
    return f"{BUILTIN}:{tool.name}" if tool.source == BUILTIN else tool.source


class ChatTools(QObject):
    """The providers the app has and each chat's choice of them.

    Signals:
        changed(): the providers or the open chat's choice changed (menus refill).
    """

    changed = Signal()

    def __init__(self, *, conversation: ConversationModel, parent=None):
        super().__init__(parent)
        self.conversation = conversation
        self.providers: dict[str, ToolProvider] = {}
        self._listed: dict[str, list[Tool]] = {}  # by source, as last listed
        self._fresh: dict = {"enabled": [], "always": []}  # a chat not stored yet
        self._conv = conversation.conv_id
        conversation.currentChanged.connect(self._on_current)

    def set_providers(self, providers: dict[str, ToolProvider], listed: dict[str, list[Tool]] | None = None) -> None:
        """Replace the providers by source, with the tools each listed (listing an MCP server
        is I/O: the caller lists them off the UI thread, see :meth:`refresh`; without
        ``listed`` each provider is asked here, for providers that answer at once)."""
        self.providers = dict(providers)
        if listed is None:
            listed = {source: _listed(p) for source, p in self.providers.items()}
        self._listed = {source: [t if t.source == source else replace(t, source=source) for t in tools]
                        for source, tools in listed.items() if source in self.providers}
        self.changed.emit()

    async def refresh(self) -> None:
        """List every provider's tools again, off the UI thread."""
        providers = dict(self.providers)
        listed = {source: await asyncio.to_thread(_listed, p) for source, p in providers.items()}
        if providers == self.providers:  # not replaced meanwhile
            self.set_providers(providers, listed)

    def provider(self, source: str) -> ToolProvider | None:
        return self.providers.get(source)

    def available(self) -> list[Tool]:
        """Every tool the providers listed (a provider that could not list has none)."""
        return [t for tools in self._listed.values() for t in tools]

    # ------------------------------------------------------------------ a chat's choice

    def _prefs(self, conv_id: int | None) -> dict:
        if conv_id is None:
            return self._fresh
        try:
            prefs = self.conversation.history.conversation(conv_id).meta.get("tools")
        except HistoryError:
            prefs = None
        return prefs if isinstance(prefs, dict) else {"enabled": [], "always": []}

    def _on_current(self) -> None:
        """A fresh chat's first message stored it: it keeps the switches it was typed with
        (and the next fresh chat starts with them too)."""
        new, old = self.conversation.conv_id, self._conv
        self._conv = new
        if old is None and new is not None and (self._fresh["enabled"] or self._fresh["always"]):
            try:
                if not self.conversation.history.messages(new):
                    self._write(new, dict(self._fresh))
            except HistoryError:  # the chat cannot be written: it offers nothing
                pass
        self.changed.emit()

    def _write(self, conv_id: int | None, prefs: dict) -> None:
        if conv_id is None:
            self._fresh = prefs
            return
        meta = dict(self.conversation.history.conversation(conv_id).meta)
        meta["tools"] = prefs
        self.conversation.history.set_meta(conv_id, meta)

    def enabled(self, conv_id: int | None = ...) -> set[str]:  # type: ignore[assignment]
        """The switches on in chat ``conv_id`` (default: the open one)."""
        conv_id = self.conversation.conv_id if conv_id is ... else conv_id
        return {str(k) for k in self._prefs(conv_id).get("enabled") or []}

    def set_enabled(self, key: str, on: bool) -> None:
        """Turn a built-in tool ("builtin:NAME") or an MCP server ("mcp:NAME") on or off in
        the open chat."""
        conv_id = self.conversation.conv_id
        prefs = dict(self._prefs(conv_id))
        keys = [k for k in prefs.get("enabled") or [] if k != key] + ([key] if on else [])
        self._write(conv_id, {**prefs, "enabled": keys})
        self.changed.emit()

    def tools(self) -> list[Tool]:
        """The tools the open chat offers the model now (a name two providers share: the
        first one's, so the model never sees two tools of one name)."""
        on = self.enabled()
        out: dict[str, Tool] = {}
        for t in self.available() if on else []:
            if switch_key(t) in on:
                out.setdefault(t.name, t)
        return list(out.values())

    def always(self, conv_id: int | None) -> set[str]:
        return {str(n) for n in self._prefs(conv_id).get("always") or []}

    def allow_always(self, conv_id: int | None, name: str) -> None:
        """Run tool ``name`` without asking in chat ``conv_id`` from now on."""
        prefs = dict(self._prefs(conv_id))
        if name not in (prefs.get("always") or []):
            self._write(conv_id, {**prefs, "always": [*(prefs.get("always") or []), name]})
